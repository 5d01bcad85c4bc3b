"""dedup stage: exact and near-duplicate removal for monolingual text, and
bitext cleaning (pair duplicates, copies, length-ratio outliers, hubs,
language identification), as map/reduce over Parquet parts.

Public API: :func:`minhash_signatures`, :func:`near_duplicate_clusters`.
"""

from __future__ import annotations

import numpy as np

from tasks.dedup.clusters import candidate_pairs, cluster_representatives
from tasks.dedup.minhash import EMPTY, band_keys, estimated_jaccard, lsh_params, minhash_signatures

__all__ = ["minhash_signatures", "near_duplicate_clusters"]


def near_duplicate_clusters(texts: list[str], *, threshold: float = 0.8, **minhash_kwargs) -> np.ndarray:
    """One cluster id per text (the smallest index in its cluster); equal ids are
    near-duplicates (estimated Jaccard of shingle sets >= threshold).  Texts with
    no shingles (empty) are singletons."""
    sig = minhash_signatures(texts, **minhash_kwargs)
    n = len(texts)
    bands, rows = lsh_params(sig.shape[1], threshold)
    keys = band_keys(sig, bands, rows)
    live = np.flatnonzero(sig[:, 0] != EMPTY) if n else np.empty(0, dtype=np.int64)
    band = np.broadcast_to(np.arange(bands), (len(live), bands))
    rid = np.broadcast_to(live[:, None], (len(live), bands))
    left, right = candidate_pairs(band.ravel(), keys[live].ravel(), rid.ravel())
    ok = estimated_jaccard(sig, left, right) >= threshold
    reps = cluster_representatives(left[ok], right[ok])
    return np.array([reps.get(i, i) for i in range(n)], dtype=np.int64)
