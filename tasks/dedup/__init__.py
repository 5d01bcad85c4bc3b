"""dedup stage: exact and near-duplicate removal for monolingual text, and
bitext cleaning (pair duplicates, copies, length-ratio outliers, hubs,
language identification), as map/reduce over Parquet parts.

Public API: :func:`minhash_signatures`; :func:`near_duplicate_clusters` runs the
stage's own map → reduce → resolve path over a list of texts in this process
(for tests and benchmarks: the same code the stage runs, without Prefect).
Output contract: :mod:`tasks.dedup.stats`; phases: :mod:`tasks.dedup.phases`.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl

from xylent.spec import DedupConfig

from tasks.dedup import mono
from tasks.dedup.minhash import minhash_signatures, usable_threads
from tasks.dedup.scratch import write_scratch

__all__ = ["minhash_signatures", "near_duplicate_clusters"]


def near_duplicate_clusters(texts: list[str], cfg: DedupConfig | None = None, *,
                            char_ngrams: bool = False, threads: int | None = None) -> np.ndarray:
    """One cluster id per text (the smallest index in its cluster); equal ids are
    near-duplicates (estimated Jaccard of shingle sets >= ``cfg.threshold``).
    Texts with no shingles (empty) are singletons.  ``char_ngrams``: shingle
    characters, as the stage does for ``cfg.char_languages``.  ``threads``: the
    MinHash threads and the buckets reduced at once (default: the cores this
    process may use; the stage runs its buckets as parallel tasks instead)."""
    threads = usable_threads() if threads is None else threads
    base = cfg or DedupConfig()
    lang = "xx"
    # a bucket per thread: buckets bound a reduce's memory when parts are many; one part's keys are in memory
    cfg = base.model_copy(update={"exact": False, "near": True, "near_level": "line", "buckets": threads,
                                  "char_languages": [lang] if char_ngrams else []})
    with tempfile.TemporaryDirectory(prefix="xylent-near-") as tmp:
        part, work = Path(tmp) / "part-00000.parquet", Path(tmp) / "work"
        write_scratch(pl.DataFrame({"doc_id": np.arange(len(texts), dtype=np.int64), "text": list(texts)},
                                   schema={"doc_id": pl.Int64, "text": pl.String}), part)
        mono.map_part(part, 0, lang, work, cfg, threads=threads)
        with ThreadPoolExecutor(threads) as pool:  # polars and numpy release the GIL; buckets share nothing
            list(pool.map(lambda bucket: mono.reduce_near(work, bucket, cfg), range(cfg.buckets)))
        mono.resolve_near(work)
        drops = pl.read_parquet(work / "drops" / "near.parquet")
    ids = np.arange(len(texts), dtype=np.int64)
    ids[drops["rid"].to_numpy()] = drops["kept"].to_numpy()  # part 0: row ids are row indices
    return ids
