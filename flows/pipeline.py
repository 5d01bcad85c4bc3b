"""The whole pipeline as one Prefect flow; each stage runs as a subflow."""

from __future__ import annotations

import contextlib

from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from xylent.flows.kit.stage import Invocation, flow_run_namer, one_line_in_deployments
from xylent.flows.registry import STAGE_NAMES, STAGES, stage_flow_of
from xylent.stage import find_stage


@flow(name="pipeline", log_prints=True, flow_run_name=flow_run_namer("pipeline"))
@one_line_in_deployments
def pipeline(spec_file: str, workspace: str | None = None, overrides: list[str] | None = None,
             force: bool = False, until: str | None = None):
    """Run every stage in pipeline order (or every stage up to and including ``until``); cached
    stages are skipped."""
    last = STAGE_NAMES.index(find_stage(STAGES, until).name) if until else len(STAGE_NAMES) - 1
    inv = Invocation.open(spec_file, workspace, overrides, "pipeline", STAGES, until=STAGE_NAMES[last], force=force)
    ok = False
    try:
        with inv.ws.lock():
            for stage in STAGES[: last + 1]:
                with _without_heartbeat() if not force and inv.built(stage.name) else contextlib.nullcontext():
                    inv.record(stage_flow_of(stage.name)(**inv.flow_kwargs(), force=force))
        ok = True
    finally:
        inv.finish(ok)
    return inv.result()


def _without_heartbeat():
    """A stage already built is a cache hit of a fraction of a second: its flow run sends no
    heartbeats (they tell a crashed run from a long one), whose thread Prefect waits up to
    a second for when the run ends."""
    return temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})
