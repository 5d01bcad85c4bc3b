"""prepare stage: raw files -> cleaned, hive-partitioned Parquet.

    run.py       :func:`prepare_unit` (one unit: read, clean, write, publish), :func:`group_units`,
                 :func:`unit_fingerprint`: what the flow calls
    readers.py   streaming readers per format (text, Moses pairs, TSV, Parquet)
    clean.py     decoding and the cleaning masks
    gettext.py   catalogs as parallel pairs; holdout.py the messages kept out for evaluation
    contract.py  the output contract every reader imports: the hive partitions
    writer.py    the Parquet schemas and the part writer
    assemble.py  the stage's output assembled from its units

Names are re-exported on first use: a reader of the output contract (contract.py) loads neither the
stage's writers nor the spec.
"""

from __future__ import annotations

from xylent.reexport import on_first_use

_HOME = {"VERSION": "xylent.tasks.prepare.run", "group_units": "xylent.tasks.prepare.run", "prepare_unit": "xylent.tasks.prepare.run",
         "unit_fingerprint": "xylent.tasks.prepare.run"}
__getattr__, __all__ = on_first_use(__name__, _HOME)
