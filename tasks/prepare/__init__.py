"""prepare stage: raw files -> cleaned, hive-partitioned Parquet.

    run.py       :func:`prepare_unit` (one unit: read, clean, write, publish), :func:`group_units`,
                 :func:`unit_fingerprint`: what the flow calls
    readers.py   streaming readers per format (text, Moses pairs, TSV, Parquet)
    clean.py     decoding and the cleaning masks
    gettext.py   catalogs as parallel pairs; holdout.py the messages kept out for evaluation
    layout.py    the output contract every reader imports: the hive partitions
    writer.py    the Parquet schemas and the part writer
    assemble.py  the stage's output assembled from its units

Names are re-exported on first use: a reader of the output contract (layout.py) loads neither the
stage's writers nor the spec.
"""

from __future__ import annotations

import importlib

_HOME = {"VERSION": "tasks.prepare.run", "group_units": "tasks.prepare.run", "prepare_unit": "tasks.prepare.run",
         "unit_fingerprint": "tasks.prepare.run"}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'tasks.prepare' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
