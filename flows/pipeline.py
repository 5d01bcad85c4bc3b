"""The whole pipeline as one Prefect flow; each stage runs as a subflow."""

from __future__ import annotations

import importlib

from prefect import flow
from prefect.runtime import flow_run

from flows.stage import Invocation, flow_run_url
from xylent.stages import STAGES, get_stage


def stage_flow(name: str):
    mod, fn = next(s for s in STAGES if s.name == name).flow.split(":")
    return getattr(importlib.import_module(mod), fn)


@flow(name="pipeline", log_prints=True)
def pipeline(spec_file: str, workspace: str | None = None, overrides: list[str] | None = None,
             force: bool = False, until: str | None = None, mlflow_parent_run_id: str | None = None):
    """Run every stage in pipeline order (or every stage up to and including ``until``); cached
    stages are skipped."""
    inv = Invocation.open(spec_file, workspace, overrides, mlflow_parent_run_id, "pipeline")
    ok = False
    try:
        with inv.ws.lock():
            for info in (STAGES[: STAGES.index(get_stage(until)) + 1] if until else STAGES):
                result = stage_flow(info.name)(**inv.flow_kwargs(), force=force)
                for name, r in result["stages"].items():
                    inv.results.setdefault(name, r)  # the first report of a stage is what this run did
        ok = True
    finally:
        inv.finish(ok)
    return {"stages": inv.results, "mlflow_parent_run_id": inv.parent_run_id,
            "prefect_flow_run_id": flow_run.id, "prefect_flow_run_url": flow_run_url()}
