"""prepare flow: downloaded files -> cleaned mono/ and bitext/ Parquet plus statistics."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed

from xylent.flows.kit.stage import StageContext, StageOutcome, stage_flow
from xylent.flows.registry import STAGE_BY_NAME
from xylent.flows.kit.runners import run_tasks
from xylent.spec import PrepareConfig
from xylent.workspace import Workspace


@task(name="prepare-unit", task_run_name="prepare {key}", cache_policy=NO_CACHE)
def prepare_unit_task(key: str, records: list[dict], ws_root: str, cfg: PrepareConfig, source_cfg: dict,
                      force: bool = False):
    import xylent.tasks.prepare.run as prep

    manifest, cached = prep.prepare_unit(records, Workspace(ws_root), cfg, source_cfg, force=force)
    if cached:
        return Completed(name="Cached", message="unit up to date", data=manifest)
    return manifest


@stage_flow(STAGE_BY_NAME["prepare"])
def prepare(ctx: StageContext) -> StageOutcome:
    import xylent.tasks.prepare.run as prep
    from xylent.tasks.download.contract import read_records
    from xylent.tasks.prepare.run import assemble, source_options

    units = prep.group_units(read_records(ctx.upstream["download"]))
    calls = [{"key": f"{u[0]['source']}/{u[0].get('lang') or u[0].get('pair') or 'catalogs'}", "records": u,
              "ws_root": ctx.ws.location, "cfg": ctx.spec.prepare,
              "source_cfg": source_options(ctx.spec, u[0]["source"]), "force": ctx.force} for u in units]
    manifests = list(run_tasks(prepare_unit_task, calls, runner=ctx.spec.runner, title="prepare", unit="units",
                               key="prepare-progress"))
    return assemble(manifests, ctx.ws, ctx.out)
