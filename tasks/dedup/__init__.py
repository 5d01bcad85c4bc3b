"""dedup stage: exact and near-duplicate removal for monolingual text, and
bitext cleaning (pair duplicates, copies, length-ratio outliers, hubs,
language identification), as map/reduce over Parquet parts.

    run.py      the four phases the flow calls (map, reduce, resolve, apply) and
                :func:`near_duplicate_clusters`: the same path over a list of texts, in this process
    mono.py     monolingual exact and near (MinHash LSH) dedup; bitext.py the bitext rules
    minhash.py  :func:`minhash_signatures`, shingles and LSH band keys
    stats.py    the output contract: the stats file and its reader; report.py the report

Names are re-exported on first use: importing one module of the package loads no other.
"""

from __future__ import annotations

import importlib

_HOME = {"minhash_signatures": "tasks.dedup.minhash", "near_duplicate_clusters": "tasks.dedup.run"}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'tasks.dedup' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
