"""dedup's output contract beyond the text layout (:mod:`xylent.tasks.prepare.contract`,
which dedup keeps): the statistics every later stage reads, and the evidence files.

    dedup_stats.parquet      kind, name, in, exact, near, copy, ratio, hub, langid, out
                             (one row per language / pair; a removed row counts under its first reason)
    removed_samples.parquet  kind, name, reason, text, kept_text (the row that was kept instead)
    top_hubs.parquet         side, partners, pairs, text, pair
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

STATS_FILE = "dedup_stats.parquet"
SAMPLES_FILE = "removed_samples.parquet"
HUBS_FILE = "top_hubs.parquet"
STAT_COLUMNS = ["kind", "name", "in", "exact", "near", "copy", "ratio", "hub", "langid", "out"]
MONO_REASONS = ("exact", "near")
BITEXT_REASONS = ("exact", "copy", "ratio", "hub", "langid")
SAMPLES_SCHEMA = {"kind": pl.String, "name": pl.String, "reason": pl.String, "text": pl.String,
                  "kept_text": pl.String}
HUBS_SCHEMA = {"side": pl.Int8, "partners": pl.UInt32, "pairs": pl.UInt32, "text": pl.String, "pair": pl.String}


def write_stats(rows: dict[tuple[str, str], dict], out: Path) -> pl.DataFrame:
    """``rows``: (kind, name) -> counts per STAT_COLUMNS[2:]."""
    stats = pl.DataFrame([{"kind": k, "name": n, **v} for (k, n), v in sorted(rows.items())],
                         schema={c: (pl.String if c in ("kind", "name") else pl.Int64) for c in STAT_COLUMNS})
    stats.write_parquet(Path(out) / STATS_FILE)
    return stats


def read_counts(dedup_dir: Path) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """Rows kept per language and sentence pairs kept per pair (canonical order)."""
    stats = pl.read_parquet(Path(dedup_dir) / STATS_FILE)
    mono = {name: int(n) for name, n in stats.filter(pl.col("kind") == "mono").select("name", "out").iter_rows()}
    pairs = {tuple(name.split("-")): int(n)
             for name, n in stats.filter(pl.col("kind") == "bitext").select("name", "out").iter_rows()}
    return mono, pairs
