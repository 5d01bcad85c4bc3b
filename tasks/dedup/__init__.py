"""dedup stage: exact and near-duplicate removal for monolingual text, and
bitext cleaning (pair duplicates, copies, length-ratio outliers, hubs,
language identification), as map/reduce over Parquet parts.

    run.py      what the flow calls: the four phases (map, reduce, resolve, apply), then report.py's
                :func:`assemble`; and :func:`near_duplicate_clusters`: the same path over a list of texts,
                in this process
    mono.py     monolingual exact and near (MinHash LSH) dedup; bitext.py the bitext rules
    minhash.py  :func:`minhash_signatures`, shingles and LSH band keys
    contract.py the output contract: the stats file and its reader; report.py the report

Names are re-exported on first use: importing one module of the package loads no other.
"""

from __future__ import annotations

from xylent.reexport import on_first_use

_HOME = {"minhash_signatures": "xylent.tasks.dedup.minhash", "near_duplicate_clusters": "xylent.tasks.dedup.run"}
__getattr__, __all__ = on_first_use(__name__, _HOME)
