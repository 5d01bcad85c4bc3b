"""sampling stage: language and language-pair sampling tables with diagnostics.

    run.py     what the flow calls: :func:`build_tables` (statistics -> the two tables + metrics),
               :class:`SamplingTables`, :func:`read_pair_counts`, :func:`write_output` (the tables, plots
               and report written)
    tables.py  the pair distributions: :func:`sinkhorn_pair_distribution`, :func:`m2m_pair_distribution`,
               :func:`smoothed_pair_distribution`
The output contract (file names, the loader's readers) is xylent/data/sampling.py: the training
ranks read it without this stage's code.  Names are re-exported on first use: importing the
package loads neither polars nor the spec.
"""

from __future__ import annotations

from xylent.reexport import on_first_use

_HOME = {
    "SamplingTables": "xylent.tasks.sampling.run", "build_tables": "xylent.tasks.sampling.run",
    "read_pair_counts": "xylent.tasks.sampling.run", "language_distribution": "xylent.distributions",
    "m2m_pair_distribution": "xylent.tasks.sampling.tables", "sinkhorn_pair_distribution": "xylent.tasks.sampling.tables",
    "smoothed_pair_distribution": "xylent.tasks.sampling.tables",
}
__getattr__, __all__ = on_first_use(__name__, _HOME)
