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
from pathlib import Path

import numpy as np
import polars as pl

from xylent.spec import DedupConfig

from tasks.dedup import mono
from tasks.dedup.minhash import minhash_signatures

__all__ = ["minhash_signatures", "near_duplicate_clusters"]


def near_duplicate_clusters(texts: list[str], cfg: DedupConfig | None = None, *,
                            char_ngrams: bool = False) -> np.ndarray:
    """One cluster id per text (the smallest index in its cluster); equal ids are
    near-duplicates (estimated Jaccard of shingle sets >= ``cfg.threshold``).
    Texts with no shingles (empty) are singletons.  ``char_ngrams``: shingle
    characters, as the stage does for ``cfg.char_languages``."""
    base = cfg or DedupConfig()
    lang = "xx"
    cfg = base.model_copy(update={"exact": False, "near": True, "near_level": "line",
                                  "char_languages": [lang] if char_ngrams else []})
    with tempfile.TemporaryDirectory(prefix="xylent-near-") as tmp:
        part, work = Path(tmp) / "part-00000.parquet", Path(tmp) / "work"
        pl.DataFrame({"doc_id": np.arange(len(texts), dtype=np.int64), "text": list(texts)},
                     schema={"doc_id": pl.Int64, "text": pl.String}).write_parquet(part)
        mono.map_part(part, 0, lang, work, cfg)
        for bucket in range(cfg.buckets):
            mono.reduce_near(work, bucket, cfg)
        mono.resolve_near(work)
        drops = pl.read_parquet(work / "drops" / "near.parquet")
    ids = np.arange(len(texts), dtype=np.int64)
    ids[drops["rid"].to_numpy()] = drops["kept"].to_numpy()  # part 0: row ids are row indices
    return ids
