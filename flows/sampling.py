"""sampling flow: statistics of the cleaned data -> sampling tables, diagnostics, plots."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prefect import task
from prefect.cache_policies import NO_CACHE

from xylent.flows.kit.stage import StageContext, StageOutcome, stage_flow
from xylent.flows.registry import STAGE_BY_NAME
from xylent.spec import SamplingConfig

if TYPE_CHECKING:
    from xylent.tasks.sampling.run import SamplingTables


@task(name="sampling-tables", cache_policy=NO_CACHE)
def tables_task(dedup_dir: Path, cfg: SamplingConfig) -> SamplingTables:
    from xylent.tasks.dedup.contract import read_counts
    from xylent.tasks.sampling.run import build_tables

    mono, pairs = read_counts(dedup_dir)
    return build_tables(mono, pairs, cfg)


@stage_flow(STAGE_BY_NAME["sampling"])
def sampling(ctx: StageContext) -> StageOutcome:
    from xylent.tasks.sampling.run import write_output

    tables = tables_task.submit(ctx.upstream["dedup"], ctx.spec.sampling).result()
    return write_output(tables, ctx.spec.sampling, ctx.out)
