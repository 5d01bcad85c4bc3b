"""Assemble the dedup stage's output after its phases: statistics, evidence
(removed samples with the row kept instead, top hubs), plot and report."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from xylent.markdown import markdown_table
from xylent.stage import StageOutcome

from xylent.tasks.dedup.keys import split_rid
from xylent.tasks.dedup.plots import removal_bars
from xylent.tasks.dedup.contract import (
    BITEXT_REASONS, HUBS_FILE, HUBS_SCHEMA, MONO_REASONS, SAMPLES_FILE, SAMPLES_SCHEMA, STAT_COLUMNS, write_stats,
)


def _hubs(work: Path, names: list[tuple[str, str]]) -> pl.DataFrame:
    hubs = []
    for kind, name in names:
        if kind == "bitext":
            files = sorted((work / kind / name / "drops").glob("hubs-*.parquet"))
            if files:
                h = pl.read_parquet(files)
                if len(h):
                    hubs.append(h.with_columns(pl.lit(name).alias("pair")))
    if not hubs:
        return pl.DataFrame(schema=HUBS_SCHEMA)
    return (pl.concat(hubs).sort(["pair", "partners", "pairs", "side", "text"], descending=[False, True, True, False, False])
              .group_by("pair", maintain_order=True).head(10))


def _kept_texts(items: list[dict], wanted: list[tuple[str, str, int]]) -> list[str | None]:
    """The text of each kept row (kind, name, rid), rid < 0: none. Each part file is read once, however
    many of its rows are wanted (a demo dedup wants thousands)."""
    parts = {(it["kind"], it["name"], it["idx"]): it["part"] for it in items}
    rows: dict[tuple[str, str, int], list[int]] = {}
    for kind, name, rid in wanted:
        if rid >= 0:
            part_idx, row = split_rid(rid)
            rows.setdefault((kind, name, part_idx), []).append(row)
    texts: dict[tuple[str, str, int, int], str] = {}
    for (kind, name, part_idx), want in rows.items():
        cols = ["text"] if kind == "mono" else ["src", "tgt"]
        table = pq.read_table(parts[(kind, name, part_idx)], columns=cols).take(sorted(set(want)))
        got = table.column("text").to_pylist() if kind == "mono" else \
            [f"{s} ||| {t}" for s, t in zip(table.column("src").to_pylist(), table.column("tgt").to_pylist())]
        for row, text in zip(sorted(set(want)), got):
            texts[(kind, name, part_idx, row)] = text
    return [texts[(kind, name, *split_rid(rid))] if rid >= 0 else None for kind, name, rid in wanted]


def _samples(items: list[dict], samples: list[pl.DataFrame], per_reason: int) -> pl.DataFrame:
    if not samples:
        return pl.DataFrame(schema=SAMPLES_SCHEMA)
    df = (pl.concat(samples).sort("kind", "name", "reason", "rid")
            .group_by("kind", "name", "reason", maintain_order=True).head(per_reason))
    kept = _kept_texts(items, list(df.select("kind", "name", "kept").iter_rows()))
    return df.with_columns(pl.Series("kept_text", kept, dtype=pl.String)).select(list(SAMPLES_SCHEMA))


def report(stats: pl.DataFrame, hubs: pl.DataFrame, samples: pl.DataFrame) -> tuple[dict, str]:
    metrics: dict[str, float] = {}
    for kind in ("mono", "bitext"):
        s = stats.filter(pl.col("kind") == kind)
        if not len(s):
            continue
        total = max(int(s["in"].sum()), 1)
        metrics[f"{kind}.in"] = float(s["in"].sum())
        metrics[f"{kind}.out"] = float(s["out"].sum())
        for r in (MONO_REASONS if kind == "mono" else BITEXT_REASONS):
            metrics[f"{kind}.removed.{r}"] = float(s[r].sum())
            metrics[f"{kind}.rate.{r}"] = float(s[r].sum()) / total
        for name, n_in, n_out in s.select("name", "in", "out").iter_rows():
            metrics[f"{kind}.kept_fraction.{name}"] = n_out / max(n_in, 1)
    lines = ["Removed rows by reason (each row counted under its first reason):", "",
             markdown_table(stats.to_dicts())]
    if len(hubs):
        lines += ["", "Top hub sentences (one side aligned to many distinct others):", "",
                  markdown_table(hubs.select("pair", "side", "partners", "pairs", "text").head(20).to_dicts())]
    if len(samples):
        lines += ["", "Samples of removed rows (all in removed_samples.parquet):", "",
                  markdown_table(samples.group_by("reason", maintain_order=True).head(3).to_dicts())]
    return metrics, "\n".join(lines)


def assemble(items: list[dict], applied: list[tuple[dict, dict, pl.DataFrame]], work: Path, out: Path,
             per_reason: int) -> StageOutcome:
    names = sorted({(it["kind"], it["name"]) for it in items})
    hubs = _hubs(work, names)
    if work.exists():  # nothing is written when every rule is switched off
        shutil.rmtree(work)
    rows: dict[tuple[str, str], dict] = {}
    samples = []
    for it, counts, removed in sorted(applied, key=lambda r: (r[0]["kind"], r[0]["name"], r[0]["idx"])):
        row = rows.setdefault((it["kind"], it["name"]), {c: 0 for c in STAT_COLUMNS[2:]})
        for c, v in counts.items():
            row[c] += v
        if len(removed):
            samples.append(removed.with_columns(pl.lit(it["kind"]).alias("kind"), pl.lit(it["name"]).alias("name")))
    stats = write_stats(rows, out)
    sample_df = _samples(items, samples, per_reason)
    sample_df.write_parquet(out / SAMPLES_FILE)
    hubs.write_parquet(out / HUBS_FILE)
    removal_bars(stats, out / "removal_reasons.png")
    metrics, summary = report(stats, hubs, sample_df)
    (out / "report.md").write_text(summary)
    return StageOutcome(metrics=metrics, table=stats.to_dicts(), summary=summary)
