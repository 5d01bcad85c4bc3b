"""From LSH band keys to verified duplicate clusters.

Rows that share a key in any band are candidates; candidates are verified by
estimated Jaccard (the fraction of equal signature values) and joined into
clusters with connected components.  Every cluster is named by its smallest
row id, which is also the row that is kept: deterministic whatever the order
in which buckets were resolved.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

ALL_PAIRS_UP_TO = 32  # larger candidate groups are verified against their smallest id only


def candidate_pairs(band: np.ndarray, key: np.ndarray, rid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of row ids sharing (band, key).  Inputs are parallel 1-d arrays."""
    order = np.lexsort((rid, key, band))
    band, key, rid = band[order], key[order], rid[order]
    new = np.r_[True, (band[1:] != band[:-1]) | (key[1:] != key[:-1])]
    starts = np.flatnonzero(new)
    sizes = np.diff(np.r_[starts, len(rid)])
    left, right = [], []
    # groups of equal size are expanded together (nearly all groups have 2 members)
    for k in np.unique(sizes[(sizes > 1) & (sizes <= ALL_PAIRS_UP_TO)]):
        members = rid[starts[sizes == k][:, None] + np.arange(k)]
        i, j = np.triu_indices(k, k=1)
        left.append(members[:, i].ravel())
        right.append(members[:, j].ravel())
    for s, n in zip(starts[sizes > ALL_PAIRS_UP_TO], sizes[sizes > ALL_PAIRS_UP_TO]):
        left.append(np.full(n - 1, rid[s]))  # star: every member against the smallest id
        right.append(rid[s + 1 : s + n])
    if not left:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    a, b = np.concatenate(left), np.concatenate(right)
    pairs = np.unique(np.stack([np.minimum(a, b), np.maximum(a, b)], axis=1), axis=0)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    return pairs[:, 0], pairs[:, 1]


def cluster_representatives(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Connected components of the verified edges: every row id on an edge (sorted) and the smallest id
    of its component.  Arrays, not a dict: a language's edges follow its duplicates, and a Python dict
    costs ~100 bytes an entry where these cost 16."""
    if len(left) == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    nodes, inv = np.unique(np.concatenate([left, right]), return_inverse=True)
    n = len(nodes)
    m = len(left)
    graph = coo_matrix((np.ones(m, dtype=np.int8), (inv[:m], inv[m:])), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    rep = np.full(labels.max() + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(rep, labels, nodes)
    return nodes.astype(np.int64), rep[labels]
