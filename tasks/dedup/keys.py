"""Normalisation and stable hash keys for duplicate detection."""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl


def normalize_expr(col: pl.Expr, mode: str) -> pl.Expr:
    """``ccnet``: lowercase, punctuation, symbols and digits removed, whitespace
    collapsed (CCNet's paragraph normalisation, without its accent stripping);
    ``lower``: lowercase and collapsed whitespace; ``none``: as is."""
    if mode == "none":
        return col
    col = col.str.to_lowercase()
    if mode == "ccnet":
        col = col.str.replace_all(r"[\p{P}\p{S}\p{N}]+", " ")
    return col.str.replace_all(r"\s+", " ").str.strip_chars()


def stable_hash(values: pl.Series | list[str]) -> np.ndarray:
    """64-bit BLAKE2b of each string: identical in every process, machine and
    library version (exact-duplicate keys must match across workers and reruns)."""
    vals = values.to_list() if isinstance(values, pl.Series) else values
    out = np.empty(len(vals), dtype=np.uint64)
    for i, v in enumerate(vals):
        out[i] = int.from_bytes(hashlib.blake2b((v or "").encode(), digest_size=8).digest(), "little")
    return out


ROW_BITS = 32  # a row id is part << ROW_BITS | row: unique across a language's (or pair's) parts
ROW_MASK = (1 << ROW_BITS) - 1


def rids(part_idx: int, n: int) -> np.ndarray:
    """Row ids unique across a language's parts: part index in the high 32 bits."""
    return (np.int64(part_idx) << np.int64(ROW_BITS)) + np.arange(n, dtype=np.int64)


def part_range(part_idx: int) -> tuple[int, int]:
    """[lo, hi) of the row ids of one part."""
    return int(part_idx) << ROW_BITS, (int(part_idx) + 1) << ROW_BITS


def split_rid(rid):
    """(part index, row within the part) of a row id (ints or numpy arrays)."""
    return rid >> ROW_BITS, rid & ROW_MASK


def bucket_of(keys: np.ndarray, buckets: int) -> np.ndarray:
    return (keys % np.uint64(buckets)).astype(np.int64)
