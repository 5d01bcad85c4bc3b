"""The dedup stage's scratch files: written once, read once by the next phase in the same run, then removed.

They skip compression and column statistics, which cost more than the disk they save for files this short-lived
(benchmarks/dedup.py measures the stage with them).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl


def write_scratch(df: pl.DataFrame, path: Path) -> None:
    df.write_parquet(path, compression="uncompressed", statistics=False)


def write_buckets(df: pl.DataFrame, bucket: np.ndarray, root: Path, part_idx: int, buckets: int) -> None:
    """One file per bucket under ``root/b=<bucket>/`` (an empty one where no row falls: the reduce reads every
    bucket), split in one pass."""
    parts = df.with_columns(pl.Series("_b", bucket)).partition_by("_b", as_dict=True, include_key=False)
    empty = df.clear()
    for b in range(buckets):
        d = root / f"b={b}"
        d.mkdir(parents=True, exist_ok=True)
        write_scratch(parts.get((b,), empty), d / f"p{part_idx:05d}.parquet")
