"""Monolingual dedup as map / reduce / apply over one language's Parquet parts.

map (per part)     exact keys and MinHash band keys, partitioned by hash bucket
                   to disk; signatures saved beside them
reduce (per bucket) exact groups -> drops; LSH candidates -> verified edges
resolve (per lang) connected components of the edges -> near-duplicate drops
apply (per part)   the part without its dropped rows, same file name

Memory is set by one part or one bucket (a language has at least one bucket per part:
run.plan_buckets), never by the language's text; resolve alone holds the language's
verified edges, which follow its near-duplicates (docs/stages/dedup.md states the bounds).  Row ids are
``part << 32 | row`` (:mod:`xylent.tasks.dedup.keys`); a unit (line or document) is named by its first row.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from xylent.spec import DedupConfig

from xylent.tasks.dedup.clusters import candidate_pairs, cluster_representatives
from xylent.tasks.dedup.keys import bucket_of, normalize_expr, part_range, rids, split_rid, stable_hash
from xylent.tasks.dedup.minhash import (EMPTY, band_keys, signatures_from_shingles, shingle_hashes, token_hashes,
                                 usable_threads)
from xylent.tasks.dedup.scratch import read_bucket, write_buckets, write_scratch

DROP_SCHEMA = {"rid": pl.Int64, "reason": pl.String, "kept": pl.Int64}
_SIG_BATCH = 16_384  # units per MinHash batch within a part


def _units(df: pl.DataFrame, level: str) -> pl.DataFrame:
    """(unit_row, text) per line or per document (rows of a document joined)."""
    df = df.with_row_index("row")
    if level == "line":
        return df.select(pl.col("row").cast(pl.Int64).alias("unit_row"), "text")
    return (df.group_by("doc_id", maintain_order=True)
              .agg(pl.col("row").first().cast(pl.Int64).alias("unit_row"), pl.col("text").str.join("\n"))
              .select("unit_row", "text"))


def unit_rows(df: pl.DataFrame, level: str) -> np.ndarray:
    """For each row, the row index of its unit's first row."""
    if level == "line":
        return np.arange(len(df), dtype=np.int64)
    return (df.with_row_index("row").select(pl.col("row").first().over("doc_id").cast(pl.Int64))
              .to_series().to_numpy())


def _signatures(texts: pl.Series, char: bool, cfg: DedupConfig, threads: int) -> np.ndarray:
    """MinHash signatures of every text, ``_SIG_BATCH`` texts per thread at a time (token lists of a whole part
    would dominate memory).  Each thread runs tokens, shingles and signatures on its own slice: polars and numpy
    release the GIL, and one series' string operations do not spread over polars' own pool."""
    def one(chunk: pl.Series) -> np.ndarray:
        tokens, offsets = token_hashes(chunk, char_ngrams=char, seed=cfg.seed)
        sh, sh_off = shingle_hashes(tokens, offsets, cfg.char_ngram if char else cfg.ngram)
        return signatures_from_shingles(sh, sh_off, num_perm=cfg.num_perm, seed=cfg.seed, threads=1)

    n = len(texts)
    batch = _SIG_BATCH * threads
    sigs = []
    pool = _pool(threads)
    for start in range(0, max(n, 1), batch):
        size = min(batch, n - start)
        step = max(1, -(-size // threads))
        slices = [texts.slice(start + i, min(step, size - i)) for i in range(0, max(size, 1), step)]
        sigs.extend(pool.map(one, slices))
    return np.concatenate(sigs)


@functools.cache
def _pool(threads: int) -> ThreadPoolExecutor:
    # the same threads part after part: with a new pool per part the map phase's peak grew with the parts
    # (malloc arenas of finished threads keep their freed buffers; 1.25 GB after 16 parts of 100k lines,
    # 0.72 GB with one pool: benchmarks/dedup.py's stage memory)
    return ThreadPoolExecutor(threads, thread_name_prefix="xylent-minhash")


def map_part(part: Path, part_idx: int, lang: str, work: Path, cfg: DedupConfig, *,
             threads: int | None = None) -> dict:
    """``threads``: the MinHash threads (default: the cores this process may use)."""
    df = pl.read_parquet(part, columns=["doc_id", "text"])
    base = part_range(part_idx)[0]
    out = {"rows": len(df)}
    if cfg.exact:
        u = _units(df, cfg.exact_level)
        key = stable_hash(u.select(normalize_expr(pl.col("text"), cfg.normalize)).to_series())
        table = pl.DataFrame({"key": key, "rid": u["unit_row"].to_numpy() + base})
        write_buckets(table, bucket_of(key, cfg.buckets), work / "exact", part_idx, cfg.buckets)
    if cfg.near:
        u = _units(df, cfg.near_level)
        char = lang in cfg.char_languages
        sig = _signatures(u["text"], char, cfg, usable_threads() if threads is None else threads)
        live = sig[:, 0] != EMPTY
        keys = band_keys(sig, cfg.bands, cfg.rows)
        unit_rid = u["unit_row"].to_numpy() + base
        n = int(live.sum())
        table = pl.DataFrame({
            "band": np.tile(np.arange(cfg.bands, dtype=np.int16), n),
            "key": keys[live].ravel(),
            "rid": np.repeat(unit_rid[live], cfg.bands),
            "unit": np.repeat(np.flatnonzero(live).astype(np.int32), cfg.bands),  # its row in the signature file
        })
        (work / "sig").mkdir(parents=True, exist_ok=True)
        np.save(work / "sig" / f"p{part_idx:05d}.npy", sig.astype(np.uint32))
        write_buckets(table, bucket_of(table["key"].to_numpy(), cfg.buckets), work / "near", part_idx,
                       cfg.buckets)
        out["units"] = len(u)
    return out


def _read_all(root: Path) -> pl.DataFrame | None:
    files = sorted(root.glob("*.parquet"))
    return pl.read_parquet(files) if files else None


def reduce_exact(work: Path, bucket: int) -> int:
    df = read_bucket(work / "exact", bucket)
    drops = pl.DataFrame(schema=DROP_SCHEMA)
    if df is not None and len(df):
        drops = (df.with_columns(pl.col("rid").min().over("key").alias("kept"))
                   .filter(pl.col("rid") != pl.col("kept"))
                   .select("rid", pl.lit("exact").alias("reason"), "kept"))
    (work / "drops").mkdir(parents=True, exist_ok=True)
    write_scratch(drops.sort("rid"), work / "drops" / f"exact-b{bucket:04d}.parquet")
    return len(drops)


def _signatures_of(root: Path, rid: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """Signature rows of row ids (``unit``: each one's row in its part's signature file).  Each part's
    file is memory-mapped only while its rows are copied out: mapped pages count as resident memory,
    and keeping every part mapped would make a bucket's memory grow with the corpus."""
    part = split_rid(rid)[0]
    out = None
    for p in np.unique(part):
        sel = part == p
        sig = np.load(root / f"p{p:05d}.npy", mmap_mode="r")
        block = np.array(sig[unit[sel]])
        del sig  # unmapped here
        if out is None:
            out = np.empty((len(rid), block.shape[1]), dtype=block.dtype)
        out[sel] = block
    return out if out is not None else np.empty((0, 0), dtype=np.uint32)


def reduce_near(work: Path, bucket: int, cfg: DedupConfig) -> int:
    df = read_bucket(work / "near", bucket)
    left = right = np.empty(0, dtype=np.int64)
    if df is not None and len(df):
        left, right = candidate_pairs(df["band"].to_numpy(), df["key"].to_numpy(), df["rid"].to_numpy())
        if len(left):
            # each row id's signature row, from this bucket's own rows: no per-part index of the language
            units = df.select("rid", "unit").unique("rid").sort("rid")
            rid_sorted, unit = units["rid"].to_numpy(), units["unit"].to_numpy()
            ids = np.unique(np.concatenate([left, right]))  # each part's signature file mapped once
            sig = _signatures_of(work / "sig", ids, unit[np.searchsorted(rid_sorted, ids)])
            est = (sig[np.searchsorted(ids, left)] == sig[np.searchsorted(ids, right)]).mean(axis=1)
            ok = est >= cfg.threshold
            left, right = left[ok], right[ok]
    (work / "edges").mkdir(parents=True, exist_ok=True)
    write_scratch(pl.DataFrame({"a": left, "b": right}, schema={"a": pl.Int64, "b": pl.Int64}),
                  work / "edges" / f"b{bucket:04d}.parquet")
    return len(left)


def resolve_near(work: Path) -> int:
    edges = _read_all(work / "edges")
    if edges is None:  # a language without near-dup buckets
        edges = pl.DataFrame(schema={"a": pl.Int64, "b": pl.Int64})
    nodes, reps = cluster_representatives(edges["a"].to_numpy(), edges["b"].to_numpy())
    drops = pl.DataFrame({"rid": nodes, "kept": reps}, schema={"rid": pl.Int64, "kept": pl.Int64})
    drops = drops.filter(pl.col("rid") != pl.col("kept")).select("rid", pl.lit("near").alias("reason"), "kept")
    (work / "drops").mkdir(parents=True, exist_ok=True)
    write_scratch(drops.sort("rid"), work / "drops" / "near.parquet")
    return len(drops)


def _drops_for_part(work: Path, part_idx: int, reason: str) -> pl.DataFrame:
    files = sorted((work / "drops").glob(f"{reason}*.parquet"))
    if not files:
        return pl.DataFrame(schema=DROP_SCHEMA)
    lo, hi = part_range(part_idx)
    return pl.scan_parquet(files).filter((pl.col("rid") >= lo) & (pl.col("rid") < hi)).collect()


def apply_part(part: Path, part_idx: int, out: Path, work: Path, cfg: DedupConfig) -> tuple[dict, pl.DataFrame]:
    """Write the part without its dropped rows; return counts and the dropped rows (for samples)."""
    table = pq.read_table(part)
    df = pl.from_arrow(table)
    rid = rids(part_idx, len(df))
    base = part_range(part_idx)[0]
    exact_rid = unit_rows(df, cfg.exact_level) + base
    near_rid = unit_rows(df, cfg.near_level) + base
    reason = np.full(len(df), None, dtype=object)
    kept = np.full(len(df), -1, dtype=np.int64)
    for name, unit_rid in (("exact", exact_rid), ("near", near_rid)):
        d = _drops_for_part(work, part_idx, name)
        if len(d):
            hit = np.isin(unit_rid, d["rid"].to_numpy()) & (reason == None)  # noqa: E711
            lookup = dict(zip(d["rid"].to_list(), d["kept"].to_list()))
            reason[hit] = name
            kept[hit] = [lookup[r] for r in unit_rid[hit]]
    dropped = reason != None  # noqa: E711
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.filter(~dropped), out, compression="zstd")
    removed = pl.DataFrame({"rid": rid[dropped], "reason": reason[dropped].astype(str), "kept": kept[dropped],
                            "text": df["text"].filter(pl.Series(dropped))},
                           schema={"rid": pl.Int64, "reason": pl.String, "kept": pl.Int64, "text": pl.String})
    counts = {"in": len(df), "exact": int((reason == "exact").sum()), "near": int((reason == "near").sum()),
              "out": int((~dropped).sum())}
    return counts, removed
