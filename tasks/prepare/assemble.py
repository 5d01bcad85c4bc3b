"""The prepare stage's output: every unit's parts linked into the text layout
(:mod:`xylent.tasks.prepare.contract`), ``stats.parquet`` (one row per kind, name and
source: rows in/out and why rows were dropped) and ``stats.md``."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from xylent.markdown import markdown_table
from xylent.stage import StageOutcome
from xylent.workspace import Workspace, link_or_copy

from xylent.tasks.prepare.contract import STATS_FILE


def source_options(spec, name: str) -> dict:
    """The per-source settings prepare reads (part of a unit's fingerprint)."""
    src = next(s for s in spec.sources if s.name == name)
    opts = {k: getattr(src, k) for k in ("max_lines", "plurals", "source_language") if hasattr(src, k)}
    if getattr(src, "holdout", None) is not None:  # absent when unset: unchanged fingerprints for old specs
        opts["holdout"] = src.holdout.model_dump(mode="json")
    return opts


def assemble(manifests: list[dict], ws: Workspace, out: Path) -> StageOutcome:
    known, stats = {}, []
    for m in manifests:
        unit = ws.ensure_local(ws.unit_dir("prepare", m["fingerprint"]))  # a worker may be elsewhere
        for f in m["files"]:
            link_or_copy(unit / f["path"], out / f["path"])
            known[f["path"]] = f
        stats.extend(m["stats"])
    stats.sort(key=lambda r: (r["kind"], r["name"], r["source"]))
    pq.write_table(pa.Table.from_pylist(stats), out / STATS_FILE)
    (out / "stats.md").write_text(markdown_table(stats))
    mono = [r for r in stats if r["kind"] == "mono"]
    bitext = [r for r in stats if r["kind"] == "bitext"]
    metrics = {
        "mono.rows": sum(r["rows_out"] for r in mono), "bitext.rows": sum(r["rows_out"] for r in bitext),
        "mono.languages": len({r["name"] for r in mono if r["rows_out"]}),
        "bitext.pairs": len({r["name"] for r in bitext if r["rows_out"]}),
        "invalid_utf8": sum(r["invalid_utf8"] for r in stats),
        "dropped.too_short": sum(r["too_short"] for r in stats),
        "dropped.too_long": sum(r["too_long"] for r in stats),
    }
    for r in mono:
        metrics[f"mono.rows.{r['name']}"] = metrics.get(f"mono.rows.{r['name']}", 0) + r["rows_out"]
    for r in bitext:
        metrics[f"bitext.rows.{r['name']}"] = metrics.get(f"bitext.rows.{r['name']}", 0) + r["rows_out"]
    empty = sorted({r["name"] for r in mono} - {r["name"] for r in mono if r["rows_out"]})
    summary = (f"{metrics['mono.rows']:,} monolingual rows in {metrics['mono.languages']} languages, "
               f"{metrics['bitext.rows']:,} sentence pairs in {metrics['bitext.pairs']} pairs.")
    warnings = [f"no monolingual text survived cleaning for {lang}: it gets no vocabulary of its own and no "
                f"MRTD data (see stats.md for why its rows were dropped; check its sources and prepare's "
                f"min_chars/max_chars)" for lang in empty]
    if empty:
        summary += "".join(f"\n\n**Warning:** {w}" for w in warnings)
    return StageOutcome(metrics=metrics, table=stats, summary=summary + "\n\n" + markdown_table(mono),
                        known_files=known, manifest={"units": [m["fingerprint"] for m in manifests]},
                        warnings=warnings)
