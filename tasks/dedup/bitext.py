"""Bitext cleaning for one language pair, as map / reduce / apply over its parts.

Row rules (map): copies (the two sides identical or nearly so: character
similarity >= copy_threshold), length-ratio outliers (OpusFilter-style, chars
or words), language identification of each side (lingua).  Group rules
(reduce, per hash bucket): exact pair duplicates (the smallest row id is kept)
and hubs — a sentence aligned to >= hub_min_partners distinct other sentences,
as mined bitexts produce (XY-LENT's en–xh); all its pairs are dropped.

A dropped row counts under its first reason in REASONS order.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
from rapidfuzz import fuzz, process

from xylent.errors import XylentError
from xylent.spec import DedupConfig

from xylent.tasks.dedup.keys import bucket_of, normalize_expr, part_range, rids, stable_hash
from xylent.tasks.dedup.scratch import read_bucket, write_buckets, write_scratch

REASONS = ["exact", "copy", "ratio", "hub", "langid"]
HUB_TEXT_CHARS = 200


def side_lengths(col: pl.Series, unit: str, lang: str, char_languages: list[str]) -> np.ndarray:
    """The length rule's unit per side: ``auto`` counts characters for char_languages, words
    otherwise (as OpusFilter).  Public: the audit measures length outliers with the same rule."""
    if unit == "auto":
        unit = "chars" if lang in char_languages else "words"
    if unit == "words":
        return col.str.count_matches(r"\S+").to_numpy()
    return col.str.len_chars().to_numpy()


def length_outliers(src: pl.Series, tgt: pl.Series, src_lang: str, tgt_lang: str, unit: str,
                    char_languages: list[str], max_ratio: float) -> np.ndarray:
    """Rows whose longer side is more than ``max_ratio`` times the shorter (an
    empty side counts as 1).  Public: the audit's evidence uses the same rule.

    ``auto`` with a side written without spaces (Thai, Chinese, Japanese ...):
    counting its characters against the other side's words would flag most
    good pairs (a Thai sentence has ~6 characters per English word), and even
    characters against characters differ by script (Thai vs Chinese ~2.5), so
    both sides count characters and their ratio is taken relative to the rows'
    median ratio, the pair's own script density (as length-based sentence
    aligners do).  Two spaced languages keep OpusFilter's word counts."""
    if unit == "auto" and (src_lang in char_languages or tgt_lang in char_languages):
        ls = np.maximum(side_lengths(src, "chars", src_lang, char_languages), 1).astype(float)
        lt = np.maximum(side_lengths(tgt, "chars", tgt_lang, char_languages), 1).astype(float)
        ratio = (ls / lt) / np.median(ls / lt) if len(ls) else ls
        return np.maximum(ratio, 1 / np.maximum(ratio, 1e-12)) > max_ratio
    ls = side_lengths(src, unit, src_lang, char_languages)
    lt = side_lengths(tgt, unit, tgt_lang, char_languages)
    return np.maximum(ls, lt) > max_ratio * np.maximum(np.minimum(ls, lt), 1)


@lru_cache(maxsize=8)
def _detector(codes: tuple[str, ...]):
    try:
        from lingua import IsoCode639_1, LanguageDetectorBuilder
    except ImportError:
        raise XylentError("dedup.langid is on but lingua is not installed", where="spec field dedup.langid",
                          fix="pip install -e '.[langid]' (lingua-language-detector), or set dedup.langid: false") from None
    isos = []
    for code in codes:
        base = code.split("_")[0].upper()
        if hasattr(IsoCode639_1, base):
            isos.append(getattr(IsoCode639_1, base))
    if len(isos) < 2:
        return None
    return LanguageDetectorBuilder.from_iso_codes_639_1(*isos).with_preloaded_language_models().build()


def _langid_mismatch(texts: pl.Series, lang: str, languages: tuple[str, ...], cfg: DedupConfig) -> np.ndarray:
    """Sides long enough to judge whose declared language gets almost no confidence."""
    det = _detector(languages)
    out = np.zeros(len(texts), dtype=bool)
    if det is None:
        return out
    from lingua import IsoCode639_1, Language

    base = lang.split("_")[0].upper()
    if not hasattr(IsoCode639_1, base):
        return out  # lingua does not know this language: nothing to judge
    target = Language.from_iso_code_639_1(getattr(IsoCode639_1, base))
    long_enough = (texts.str.len_chars() >= cfg.langid_min_chars).to_numpy()
    idx = np.flatnonzero(long_enough)
    if len(idx):
        conf = det.compute_language_confidence_in_parallel(texts.gather(idx).to_list(), target)
        out[idx] = np.asarray(conf) < cfg.langid_max_confidence
    return out


def map_part(part: Path, part_idx: int, work: Path, cfg: DedupConfig, languages: tuple[str, ...]) -> dict:
    df = pl.read_parquet(part, columns=["src", "tgt", "src_lang", "tgt_lang"])
    n = len(df)
    rid = rids(part_idx, n)
    flags = {}
    if n:
        src_lang, tgt_lang = df["src_lang"][0], df["tgt_lang"][0]
        norm = df.select(normalize_expr(pl.col("src"), "lower").alias("s"),
                         normalize_expr(pl.col("tgt"), "lower").alias("t"))
        if cfg.copies:
            sim = process.cpdist(norm["s"].to_list(), norm["t"].to_list(), scorer=fuzz.ratio, workers=1)
            flags["copy"] = np.asarray(sim) >= cfg.copy_threshold * 100
        if cfg.length_ratio:
            flags["ratio"] = length_outliers(df["src"], df["tgt"], src_lang, tgt_lang, cfg.length_unit,
                                             cfg.char_languages, cfg.max_length_ratio)
        if cfg.langid:
            flags["langid"] = (_langid_mismatch(df["src"], src_lang, languages, cfg)
                               | _langid_mismatch(df["tgt"], tgt_lang, languages, cfg))
        key_s = stable_hash(norm["s"])
        key_t = stable_hash(norm["t"])
    else:
        key_s = key_t = np.empty(0, dtype=np.uint64)
    flag_rows = pl.DataFrame({"rid": rid, **{k: v for k, v in flags.items()}})
    (work / "flags").mkdir(parents=True, exist_ok=True)
    write_scratch(flag_rows, work / "flags" / f"p{part_idx:05d}.parquet")
    if cfg.bitext_exact:
        with np.errstate(over="ignore"):
            key = key_s * np.uint64(0x100000001B3) ^ key_t
        table = pl.DataFrame({"key": key, "rid": rid}, schema={"key": pl.UInt64, "rid": pl.Int64})
        write_buckets(table, bucket_of(key, cfg.buckets), work / "exact", part_idx, cfg.buckets)
    if cfg.hubs:
        table = pl.concat([
            pl.DataFrame({"side": np.zeros(n, dtype=np.int8), "key": key_s, "other": key_t, "rid": rid,
                          "text": df["src"].str.slice(0, HUB_TEXT_CHARS)},
                         schema={"side": pl.Int8, "key": pl.UInt64, "other": pl.UInt64, "rid": pl.Int64,
                                 "text": pl.String}),
            pl.DataFrame({"side": np.ones(n, dtype=np.int8), "key": key_t, "other": key_s, "rid": rid,
                          "text": df["tgt"].str.slice(0, HUB_TEXT_CHARS)},
                         schema={"side": pl.Int8, "key": pl.UInt64, "other": pl.UInt64, "rid": pl.Int64,
                                 "text": pl.String}),
        ])
        write_buckets(table, bucket_of(table["key"].to_numpy(), cfg.buckets), work / "hubs", part_idx,
                      cfg.buckets)
    return {"rows": n}


def reduce_bucket(work: Path, bucket: int, cfg: DedupConfig) -> dict:
    (work / "drops").mkdir(parents=True, exist_ok=True)
    exact = read_bucket(work / "exact", bucket)
    drops = [pl.DataFrame(schema={"rid": pl.Int64, "reason": pl.String, "kept": pl.Int64})]
    if exact is not None and len(exact):
        drops.append(exact.with_columns(pl.col("rid").min().over("key").alias("kept"))
                          .filter(pl.col("rid") != pl.col("kept"))
                          .select("rid", pl.lit("exact").alias("reason"), "kept"))
    hubs = read_bucket(work / "hubs", bucket)
    hub_report = pl.DataFrame(schema={"side": pl.Int8, "partners": pl.UInt32, "pairs": pl.UInt32, "text": pl.String})
    if hubs is not None and len(hubs):
        groups = hubs.group_by("side", "key").agg(
            pl.col("other").n_unique().alias("partners"), pl.len().alias("pairs"),
            pl.col("text").first(), pl.col("rid"))
        hub_groups = groups.filter(pl.col("partners") >= cfg.hub_min_partners)
        if len(hub_groups):
            drops.append(hub_groups.explode("rid").select("rid", pl.lit("hub").alias("reason"),
                                                          pl.lit(-1, dtype=pl.Int64).alias("kept")).unique("rid"))
            hub_report = hub_groups.select("side", pl.col("partners").cast(pl.UInt32),
                                           pl.col("pairs").cast(pl.UInt32), "text")
    out = pl.concat(drops).sort("rid", "reason")
    write_scratch(out, work / "drops" / f"b{bucket:04d}.parquet")
    write_scratch(hub_report, work / "drops" / f"hubs-b{bucket:04d}.parquet")
    return {"drops": len(out)}


def apply_part(part: Path, part_idx: int, out: Path, work: Path) -> tuple[dict, pl.DataFrame]:
    table = pq.read_table(part)
    df = pl.from_arrow(table)
    n = len(df)
    rid = rids(part_idx, n)
    lo, hi = part_range(part_idx)
    files = sorted((work / "drops").glob("b*.parquet"))
    grouped = (pl.scan_parquet(files).filter((pl.col("rid") >= lo) & (pl.col("rid") < hi)).collect()
               if files else pl.DataFrame(schema={"rid": pl.Int64, "reason": pl.String, "kept": pl.Int64}))
    flags = pl.read_parquet(work / "flags" / f"p{part_idx:05d}.parquet")
    masks = {r: np.zeros(n, dtype=bool) for r in REASONS}
    kept_of = dict(zip(grouped.filter(pl.col("reason") == "exact")["rid"].to_list(),
                       grouped.filter(pl.col("reason") == "exact")["kept"].to_list()))
    for r in ("exact", "hub"):
        masks[r] = np.isin(rid, grouped.filter(pl.col("reason") == r)["rid"].to_numpy())
    for r in ("copy", "ratio", "langid"):
        if r in flags.columns:
            masks[r] = flags[r].to_numpy()
    reason = np.full(n, None, dtype=object)
    for r in REASONS:
        reason[(reason == None) & masks[r]] = r  # noqa: E711
    dropped = reason != None  # noqa: E711
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.filter(~dropped), out, compression="zstd")
    sel = pl.Series(dropped)
    removed = pl.DataFrame({
        "rid": rid[dropped], "reason": reason[dropped].astype(str),
        "kept": np.array([kept_of.get(int(x), -1) for x in rid[dropped]], dtype=np.int64),
        "text": (df["src"].filter(sel) + " ||| " + df["tgt"].filter(sel)),
    }, schema={"rid": pl.Int64, "reason": pl.String, "kept": pl.Int64, "text": pl.String})
    counts = {"in": n, **{r: int((reason == r).sum()) for r in REASONS}, "out": int((~dropped).sum())}
    return counts, removed
