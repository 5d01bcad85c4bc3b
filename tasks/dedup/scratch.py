"""The dedup stage's scratch files: written once, read once by the next phase in the same run, then removed.

They skip compression and column statistics, which cost more than the disk they save for files this short-lived
(benchmarks/dedup.py measures the stage with them).

A map task's keys go to one file per part, not one per part and bucket: a language of P parts has at least P
buckets (run.plan_buckets), and P x P files were 60 000 per phase for a CC-100 language of 250 parts. The file
holds each non-empty bucket's rows as its own Arrow IPC stream, back to back in bucket order, and an index
beside it gives each bucket's byte range, so a reduce reads its bucket's bytes from every part and nothing else.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

INDEX = ".index.npy"  # beside each part's file: bucket b's bytes are [index[b], index[b + 1])


def write_scratch(df: pl.DataFrame, path: Path) -> None:
    df.write_parquet(path, compression="uncompressed", statistics=False)


def write_buckets(df: pl.DataFrame, bucket: np.ndarray, root: Path, part_idx: int, buckets: int) -> None:
    """The part's rows split by ``bucket`` into ``root/p<part>.arrows``, its index written last: a part
    without an index is one whose map did not finish, and a reduce refuses it."""
    root.mkdir(parents=True, exist_ok=True)
    bucket = np.asarray(bucket, dtype=np.int64)
    # one bucket's rows gathered at a time: a copy of the whole sorted part would double the map's memory
    order = np.argsort(bucket, kind="stable")
    counts = np.bincount(bucket, minlength=buckets)
    starts = np.r_[0, np.cumsum(counts)]
    schema = df.head(0).to_arrow().schema
    index = np.zeros(buckets + 1, dtype=np.int64)
    data, done = root / f"p{part_idx:05d}.arrows", root / f"p{part_idx:05d}{INDEX}"
    done.unlink(missing_ok=True)
    # under a name of this process until whole: a task a cluster runs twice (a worker it took for lost)
    # never writes into the file the other's index describes
    part = data.with_name(f"{data.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    with pa.OSFile(str(part), "wb") as sink:
        for b in range(buckets):
            if counts[b]:
                with pa.ipc.new_stream(sink, schema) as writer:
                    writer.write_table(df[order[starts[b]:starts[b + 1]]].to_arrow())
            index[b + 1] = sink.tell()
    part.replace(data)
    tmp = part.with_name(f"{part.name}.index.npy")  # not a p*.index.npy name until replaced
    np.save(tmp, index)
    tmp.replace(done)


def read_bucket(root: Path, bucket: int) -> pl.DataFrame | None:
    """Bucket ``bucket``'s rows from every finished part under ``root`` (read, not mapped: mapped pages would
    count as resident memory for as long as the rows live); None where no part has any."""
    tables = []
    for data in sorted(root.glob("p*.arrows")):
        done = data.with_name(data.name.removesuffix(".arrows") + INDEX)
        if not done.exists():  # its map stopped between the two: its keys are not all there
            raise RuntimeError(f"{data}: the map of this part did not finish (no {done.name}); rerun the stage")
        lo, hi = (int(x) for x in np.load(done, mmap_mode="r")[bucket:bucket + 2])
        if hi > lo:
            with pa.OSFile(str(data)) as f:
                tables.append(pa.ipc.open_stream(f.read_at(hi - lo, lo)).read_all())
    if not tables:
        return None
    return pl.from_arrow(pa.concat_tables(tables), rechunk=True)
