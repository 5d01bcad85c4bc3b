"""MinHash signatures and LSH banding, vectorised.

Shingles are word n-grams (default 5) or, for scripts written without spaces,
character n-grams.  Tokens are hashed by polars (Rust); n-grams are combined
and MinHashed with numpy: h_j(x) = ((a_j·x + b_j) mod 2^64) >> 32, the
multiply-add-shift family on 32-bit keys (seeded), and the signature is the
per-document minimum.  Documents shorter than n tokens are one shingle; an
empty document has no shingles and never matches anything.

Signatures depend on polars' string hash, which is stable for a given polars
version (the workspace fingerprints record versions).
"""

from __future__ import annotations

import os

import numpy as np
import polars as pl

MASK32 = np.uint64(0xFFFFFFFF)
EMPTY = np.uint64(0xFFFFFFFF)  # signature value of a document without shingles
_CHUNK = 1 << 15  # shingles per vectorised block
_PERMS = 8  # permutations per pass over a block: 8 x 32k x 8 B = 2 MB per thread


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def token_hashes(texts: list[str] | pl.Series, *, char_ngrams: bool, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat uint64 token hashes and per-document offsets (len n + 1)."""
    s = texts if isinstance(texts, pl.Series) else pl.Series(texts, dtype=pl.String)
    s = s.fill_null("")
    if char_ngrams:
        toks = s.str.replace_all(r"\s+", "").str.split("")
    else:
        # the runs of non-whitespace, as a split on " " once every other whitespace is a space: a quarter
        # faster than extract_all(r"\S+") (benchmarks/dedup.py), the same tokens
        toks = s.str.replace_all(r"[^\S ]", " ").str.split(" ")
    raw = toks.list.len().fill_null(0).to_numpy()
    flat = toks.explode()
    keep = (flat != "").fill_null(False).to_numpy()  # empty strings: runs of spaces, an empty document
    lens = np.bincount(np.repeat(np.arange(len(s)), raw)[keep], minlength=len(s)).astype(np.int64)
    hashes = flat.filter(pl.Series(keep)).hash(seed=seed).to_numpy()
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    return hashes.astype(np.uint64, copy=False), offsets


def shingle_hashes(tokens: np.ndarray, offsets: np.ndarray, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """n-gram hashes (uint64) within documents and their per-document offsets."""
    lens = np.diff(offsets)
    total = len(tokens)
    starts = offsets[:-1]
    short = (lens > 0) & (lens < ngram)  # one shingle: all of the document's tokens
    acc = tokens.copy()
    short_vals = np.empty(int(short.sum()), dtype=np.uint64)
    short_len = lens[short]
    short_start = starts[short]
    r = np.uint64(0x100000001B3)
    with np.errstate(over="ignore"):
        for j in range(1, ngram):
            done = short_len == j
            short_vals[done] = acc[short_start[done]]
            if j < total:  # acc[p] becomes the hash of tokens p..p+j (in place: no cross-position reads)
                head = acc[: total - j]
                head *= r
                head += tokens[j:]
    doc_end = np.repeat(offsets[1:], lens)
    keep = np.arange(total) + ngram - 1 < doc_end
    acc[short_start] = short_vals
    keep[short_start] = True
    counts = np.where(lens >= ngram, lens - ngram + 1, np.minimum(lens, 1))
    out_off = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(counts, out=out_off[1:])
    return _splitmix(acc[keep]), out_off


def _perms(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 2**63, size=num_perm, dtype=np.uint64) | np.uint64(1)
    b = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64)
    return a, b


def usable_threads() -> int:
    """The cores this process may use, within polars' pool (POLARS_MAX_THREADS caps both)."""
    return max(1, min(len(os.sched_getaffinity(0)), pl.thread_pool_size()))


def signatures_from_shingles(shingles: np.ndarray, offsets: np.ndarray, *, num_perm: int, seed: int,
                             threads: int | None = None) -> np.ndarray:
    """Per-document minimum of each hash function over its shingles.

    Blocks of whole documents run on ``threads`` threads (default :func:`usable_threads`; numpy releases the
    GIL in its ufuncs)."""
    threads = usable_threads() if threads is None else threads
    n_docs = len(offsets) - 1
    a, b = _perms(num_perm, seed)
    a, b = a[:, None], b[:, None]
    # min commutes with the final ">> 32", so the shift is applied once, to the signature
    sig = np.full((n_docs, num_perm), np.uint64(2**64 - 1), dtype=np.uint64)
    x = (shingles ^ (shingles >> np.uint64(32))) & MASK32
    doc_of = np.repeat(np.arange(n_docs), np.diff(offsets))

    def block(lo: int, hi: int) -> None:
        # permutation-major and in place into one reused buffer: temporaries and
        # page faults, not arithmetic, dominate a naive numpy version (10x slower);
        # _PERMS permutations at a time keep the buffer in a core's L2 (13 % faster than all 112 at once)
        buf = np.empty((min(_PERMS, num_perm), min(_CHUNK, max(hi - lo, 1))), dtype=np.uint64)
        for start in range(lo, hi, _CHUNK):
            xs = x[start : min(start + _CHUNK, hi)]
            docs = doc_of[start : start + len(xs)]
            bounds = np.flatnonzero(np.r_[True, docs[1:] != docs[:-1]])
            mins = np.empty((num_perm, len(bounds)), dtype=np.uint64)
            for p in range(0, num_perm, _PERMS):
                h = buf[: min(_PERMS, num_perm - p), : len(xs)]
                np.multiply(a[p : p + len(h)], xs[None, :], out=h)
                h += b[p : p + len(h)]
                np.minimum.reduceat(h, bounds, axis=1, out=mins[p : p + len(h)])
            d = docs[bounds]
            sig[d] = np.minimum(sig[d], mins.T)  # a document may straddle two chunks

    # split at document boundaries so no two threads write the same signature row
    cuts = [0]
    for t in range(1, max(1, threads)):
        c = int(offsets[np.searchsorted(offsets, len(x) * t // threads)])
        cuts.append(max(c, cuts[-1]))
    cuts.append(len(x))
    spans = [(lo, hi) for lo, hi in zip(cuts[:-1], cuts[1:]) if hi > lo]
    if len(spans) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(spans)) as pool:
            list(pool.map(lambda span: block(*span), spans))
    elif spans:
        block(*spans[0])
    sig >>= np.uint64(32)
    return sig


def minhash_signatures(texts: list[str], *, num_perm: int = 112, ngram: int = 5, char_ngrams: bool = False,
                       seed: int = 0) -> np.ndarray:
    """MinHash signatures, uint64 of shape (len(texts), num_perm) (values < 2^32)."""
    tokens, offsets = token_hashes(texts, char_ngrams=char_ngrams, seed=seed)
    shingles, sh_off = shingle_hashes(tokens, offsets, ngram)
    return signatures_from_shingles(shingles, sh_off, num_perm=num_perm, seed=seed)


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n, bands) uint64 keys; equal keys in a band make a candidate pair.
    A document without shingles gets a unique key per row so it matches nothing."""
    n = len(sig)
    if bands * rows > sig.shape[1]:
        raise ValueError(f"{bands} bands x {rows} rows needs {bands * rows} permutations, have {sig.shape[1]}")
    keys = np.empty((n, bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(bands):
            acc = np.full(n, np.uint64(i + 1), dtype=np.uint64)
            for v in sig[:, i * rows : (i + 1) * rows].T:
                acc = _splitmix(acc * np.uint64(0x100000001B3) + v)
            keys[:, i] = acc
    return keys
