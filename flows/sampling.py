"""sampling flow: statistics of the cleaned data -> sampling tables, diagnostics, plots."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.dedup import dedup
from flows.kit import StageContext, StageOutcome, stage_flow
from tasks.dedup.stats import read_counts
from tasks.sampling import SamplingTables, build_tables
from tasks.sampling.output import write_output
from xylent.spec import SamplingConfig


@task(name="sampling-tables", cache_policy=NO_CACHE)
def tables_task(dedup_dir: Path, cfg: SamplingConfig) -> SamplingTables:
    mono, pairs = read_counts(dedup_dir)
    return build_tables(mono, pairs, cfg)


@stage_flow("sampling", description="language and language-pair sampling tables (alpha-smoothing, M2M-100 LP, "
            "XY-LENT Sinkhorn)", version="1", reads=("sampling",), upstream=(dedup,))
def sampling(ctx: StageContext) -> StageOutcome:
    tables = tables_task.submit(ctx.upstream["dedup"], ctx.spec.sampling).result()
    return write_output(tables, ctx.spec.sampling, ctx.out)
