"""sampling flow: statistics of the cleaned data -> sampling tables, diagnostics, plots."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.stage import Invocation, StageOutcome, markdown_table, run_stage_flow
from tasks.sampling import SamplingTables, build_tables
from tasks.sampling.plots import heatmaps, sorted_pair_probabilities
from xylent.spec import SamplingConfig


def read_counts(stats_file: Path) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """Examples per language and sentence pairs per pair from dedup's
    dedup_stats.parquet (column ``out``) or prepare's stats.parquet (``rows_out``)."""
    stats = pl.read_parquet(stats_file)
    n = "out" if "out" in stats.columns else "rows_out"
    mono = stats.filter(pl.col("kind") == "mono").group_by("name").agg(pl.col(n).sum())
    bitext = stats.filter(pl.col("kind") == "bitext").group_by("name").agg(pl.col(n).sum())
    pairs = {tuple(name.split("-")): int(n) for name, n in bitext.iter_rows()}
    return {name: int(n) for name, n in mono.iter_rows()}, pairs


@task(name="sampling-tables", cache_policy=NO_CACHE)
def tables_task(stats_file: str, cfg: SamplingConfig) -> SamplingTables:
    mono, pairs = read_counts(Path(stats_file))
    return build_tables(mono, pairs, cfg)


def _summary(t: SamplingTables, cfg: SamplingConfig) -> str:
    m = t.metrics
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


def _body(inv: Invocation):
    cfg = inv.spec.sampling

    def body(tmp: Path, upstream: dict, run_id: str) -> StageOutcome:
        t = tables_task.submit(str(upstream["dedup"] / "dedup_stats.parquet"), cfg).result()
        t.mono.write_parquet(tmp / "mono_sampling.parquet")
        t.bitext.write_parquet(tmp / "bitext_sampling.parquet")
        heatmaps(t.matrices, t.languages, tmp / "pair_heatmaps.png")
        sorted_pair_probabilities(t.bitext, tmp / "pair_probabilities.png")
        summary = _summary(t, cfg)
        (tmp / "report.md").write_text(summary)
        table = t.bitext.head(200).with_columns(pl.col(pl.Float64).round(8)).to_dicts()
        return StageOutcome(metrics=t.metrics, table=table, summary=summary, manifest={"notes": t.notes})

    return body


@flow(name="sampling", log_prints=True)
def sampling(spec_file: str, workspace: str | None = None, overrides: list[str] | None = None,
             force: bool = False, mlflow_parent_run_id: str | None = None):
    """Language and pair sampling tables: α-smoothing, the M2M-100 LP and XY-LENT's Sinkhorn."""
    inv = Invocation.open(spec_file, workspace, overrides, mlflow_parent_run_id, "sampling")
    return run_stage_flow(inv, "sampling", force, _body(inv))
