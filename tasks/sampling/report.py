"""The sampling stage's tables, plots and report, written into its output (the file names:
:mod:`tasks.sampling.contract`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tasks.sampling.contract import MONO_TABLE, PAIR_TABLE
from xylent.markdown import markdown_table
from xylent.stage import StageOutcome

if TYPE_CHECKING:
    from xylent.spec import SamplingConfig

    from tasks.sampling.run import SamplingTables


def summary(t: SamplingTables, cfg: SamplingConfig) -> str:
    m = t.metrics
    if t.bitext.is_empty():
        lines = ["No bitext: the pair table is empty (MRTD only)."]
        lines += ["", *[f"- {n}" for n in t.notes], "", "Languages:", "", markdown_table(t.mono.to_dicts())]
        return "\n".join(lines)
    lines = [f"Pair table used by the loader: **{cfg.pair_method}** (T = {cfg.temperature}, "
             f"budget {cfg.bitext_budget:,} sentence pairs).", "",
             "| | pairs > 0 | support kept | entropy | max marginal error | data never seen |",
             "|---|---|---|---|---|---|",
             f"| data Q | {m['pairs.nonzero_q']:.0f} | 1 | {m['entropy.q']:.3f} | | |"]
    for key, label in (("star", "XY-LENT P*"), ("m2m", "M2M-100 LP")):
        if f"entropy.{key}" in m:
            lines.append(f"| {label} | {m[f'pairs.nonzero_{key}']:.0f} | {m[f'support_kept.{key}']:.3f} | "
                         f"{m[f'entropy.{key}']:.3f} | {m[f'max_marginal_error.{key}']:.1e} | "
                         f"{m[f'wastage.{key}']:.1%} |")
    if t.notes:
        lines += ["", *[f"- {n}" for n in t.notes]]
    lines += ["", "Languages:", "", markdown_table(t.mono.to_dicts())]
    return "\n".join(lines)


def write_output(t: SamplingTables, cfg: SamplingConfig, out: Path) -> StageOutcome:
    import polars as pl

    from tasks.sampling.plots import heatmaps, sorted_pair_probabilities  # matplotlib: not for the loader's ranks

    t.mono.write_parquet(out / MONO_TABLE)
    t.bitext.write_parquet(out / PAIR_TABLE)
    if t.matrices:  # no pictures of an empty pair table
        heatmaps(t.matrices, t.languages, out / "pair_heatmaps.png")
        sorted_pair_probabilities(t.bitext, out / "pair_probabilities.png")
    text = summary(t, cfg)
    (out / "report.md").write_text(text)
    table = t.bitext.head(200).with_columns(pl.col(pl.Float64).round(8)).to_dicts()
    return StageOutcome(metrics=t.metrics, table=table, summary=text, manifest={"notes": t.notes})
