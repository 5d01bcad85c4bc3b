"""What every stage flow does around its own work.

``StageRun.execute`` checks the cache, runs the body into a temporary output
directory, publishes it with its manifest, and records everything in MLflow (a
nested run under the invocation's parent run) and in Prefect (markdown summary,
stats table, link to the MLflow run).
"""

from __future__ import annotations

import importlib
import platform
import time
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable

from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from prefect.states import Completed, State

import xylent
from xylent.spec import Spec, load_spec
from xylent.stages import get_stage, stage_config, stage_fingerprints
from xylent.tracking import Tracker, tracking_uri_for
from xylent.workspace import Workspace, read_manifest


def _versions() -> dict[str, str]:
    out = {"xylent": xylent.__version__, "python": platform.python_version()}
    for pkg in ("prefect", "mlflow", "pyarrow", "polars"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            continue  # not installed here: nothing to record
    return out


@dataclass
class StageOutcome:
    """What a stage body hands back: numbers for MLflow, rows for the stats
    table, extra files to log, and manifest fields."""

    metrics: dict[str, float] = field(default_factory=dict)
    table: list[dict] = field(default_factory=list)
    summary: str = ""
    manifest: dict[str, Any] = field(default_factory=dict)
    known_files: dict[str, dict] = field(default_factory=dict)


@dataclass
class Invocation:
    """One `xylent run` (or one Prefect flow run started from the UI): the spec,
    the workspace and the MLflow parent run every stage nests under."""

    spec: Spec
    spec_file: str
    overrides: list[str]
    ws: Workspace
    tracker: Tracker
    parent_run_id: str
    owns_parent: bool
    fingerprints: dict[str, str]
    results: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def open(cls, spec_file: str, workspace: str | None, overrides: list[str] | None,
             parent_run_id: str | None, name: str) -> "Invocation":
        spec = load_spec(spec_file, overrides or [])
        ws = Workspace(workspace or spec.workspace or "workspace")
        uri = tracking_uri_for(ws.root, spec.tracking.tracking_uri)
        tracker = Tracker(uri, spec.tracking.experiment, artifact_root=ws.root / "mlartifacts")
        owns = parent_run_id is None
        if owns:
            parent_run_id = tracker.start_run(
                f"{spec.name}:{name}",
                tags={"xylent.spec": str(Path(spec_file).resolve()), "xylent.target": name,
                      "xylent.workspace": str(ws.root), **_prefect_tags()},
                params={"spec": spec.dump(), "overrides": " ".join(overrides or [])},
            )
        return cls(spec, spec_file, list(overrides or []), ws, tracker, parent_run_id, owns,
                   stage_fingerprints(spec))

    def flow_kwargs(self) -> dict:
        return {"spec_file": self.spec_file, "workspace": str(self.ws.root), "overrides": self.overrides,
                "mlflow_parent_run_id": self.parent_run_id}

    def finish(self, ok: bool) -> None:
        if self.owns_parent:
            self.tracker.end_run(self.parent_run_id, "FINISHED" if ok else "FAILED")

    def upstream_dirs(self, stage: str) -> dict[str, Path]:
        """Output folders of a stage's upstream stages, running any that are missing
        (as subflows, so the Prefect UI shows them)."""
        dirs = {}
        for up in get_stage(stage).upstream:
            out = self.ws.output_dir(up, self.fingerprints[up])
            if read_manifest(out) is None:
                mod, fn = get_stage(up).flow.split(":")
                result = getattr(importlib.import_module(mod), fn)(**self.flow_kwargs())
                for name, r in result["stages"].items():
                    self.results.setdefault(name, r)
            else:
                self.results.setdefault(up, _result(up, out, read_manifest(out), cached=True))
            dirs[up] = out
        return dirs


def flow_run_url() -> str | None:
    """The flow run's page in the Prefect UI, when a UI URL is configured."""
    from prefect.settings import PREFECT_UI_URL

    if flow_run.id and PREFECT_UI_URL.value():
        return flow_run.ui_url
    return None


def _prefect_tags() -> dict[str, str]:
    tags = {}
    if flow_run.id:
        tags["prefect.flow_run_id"] = flow_run.id
        if flow_run_url():
            tags["prefect.flow_run_url"] = flow_run_url()
    return tags


def _result(stage: str, out: Path, manifest: dict, *, cached: bool) -> dict:
    return {"output_dir": str(out), "fingerprint": manifest["fingerprint"], "cached": cached,
            "mlflow_run_id": manifest.get("mlflow_run_id")}


def _cell(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))


def markdown_table(rows: list[dict], limit: int = 200) -> str:
    if not rows:
        return "_no rows_"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows[:limit]:
        lines.append("| " + " | ".join(_cell(r.get(c, "")) for c in cols) + " |")
    if len(rows) > limit:
        lines.append(f"\n… {len(rows) - limit} more rows in the MLflow artifact")
    return "\n".join(lines)


def execute(inv: Invocation, stage: str, force: bool,
            body: Callable[[Path, dict[str, Path], str], StageOutcome]):
    """Run ``body(tmp_dir, upstream_dirs, mlflow_run_id)`` unless its output is cached."""
    info = get_stage(stage)
    fp = inv.fingerprints[stage]
    out = inv.ws.output_dir(stage, fp)
    config = stage_config(inv.spec, info)
    with inv.ws.lock():
        upstream = inv.upstream_dirs(stage)
        manifest = read_manifest(out)
        if manifest is not None and not force:
            run_id = inv.tracker.start_run(
                stage, parent_run_id=inv.parent_run_id, params=config,
                tags={"xylent.stage": stage, "xylent.fingerprint": fp, "xylent.cached": "true",
                      "xylent.output_dir": str(out), "xylent.output_run_id": manifest.get("mlflow_run_id") or "",
                      **_prefect_tags()},
            )
            inv.tracker.log_metrics(run_id, manifest.get("metrics", {}))
            inv.tracker.end_run(run_id)
            result = _result(stage, out, manifest, cached=True)
            inv.results[stage] = result
            return Completed(name="Cached", message=f"{stage} output {fp} is up to date", data=result)

        run_id = inv.tracker.start_run(
            stage, parent_run_id=inv.parent_run_id, params=config,
            tags={"xylent.stage": stage, "xylent.fingerprint": fp, "xylent.cached": "false",
                  "xylent.output_dir": str(out), **_prefect_tags()},
        )
        started = time.time()
        try:
            with inv.ws.building(out) as tmp:
                outcome = body(tmp, upstream, run_id)
                manifest = inv.ws.publish(tmp, out, {
                    "stage": stage, "fingerprint": fp, "code_version": info.version,
                    "inputs": {u: inv.fingerprints[u] for u in info.upstream}, "config": config,
                    "metrics": outcome.metrics, "versions": _versions(),
                    "started": started, "seconds": round(time.time() - started, 3),
                    "mlflow_run_id": run_id, "prefect_flow_run_id": flow_run.id, **outcome.manifest,
                }, known_files=outcome.known_files)
        except BaseException:
            inv.tracker.end_run(run_id, "FAILED")
            raise
        inv.tracker.log_metrics(run_id, {**outcome.metrics, "seconds": manifest["seconds"]})
        inv.tracker.log_artifact(run_id, out / "_manifest.json")
        for extra in sorted(out.glob("*.parquet")) + sorted(out.glob("*.md")) + sorted(out.glob("*.png")):
            inv.tracker.log_artifact(run_id, extra)
        inv.tracker.end_run(run_id)
        _prefect_artifacts(inv, stage, fp, out, run_id, outcome)
        result = _result(stage, out, manifest, cached=False)
        inv.results[stage] = result
        return result


def _prefect_artifacts(inv: Invocation, stage: str, fp: str, out: Path, run_id: str, outcome: StageOutcome):
    if flow_run.id is None:
        return
    link = inv.tracker.run_url(run_id)
    view = inv.tracker.how_to_view()
    create_markdown_artifact(
        key=f"{stage}-summary",
        markdown=f"# {stage} `{fp}`\n\nOutput: `{out}`\n\nMLflow run: [{run_id}]({link}) ({view})\n\n"
        f"{outcome.summary}",
        description=f"{stage}: summary",
    )
    if outcome.table:
        create_table_artifact(key=f"{stage}-stats", table=outcome.table, description=f"{stage}: statistics")
    create_link_artifact(key=f"{stage}-mlflow", link=link, link_text=f"MLflow run {run_id}",
                         description=f"{stage}: MLflow run ({view})")


def run_stage_flow(inv: Invocation, stage: str, force: bool, body) -> Any:
    """The whole of a stage flow: execute, close the parent run if we own it, and
    return every stage touched (a cached stage ends its flow in a Cached state)."""
    ok = False
    try:
        state = execute(inv, stage, force, body)
        ok = True
    finally:
        inv.finish(ok)
    result = {"stages": inv.results, "mlflow_parent_run_id": inv.parent_run_id,
              "prefect_flow_run_id": flow_run.id, "prefect_flow_run_url": flow_run_url()}
    if isinstance(state, State):
        return Completed(name="Cached", message=state.message, data=result)
    return result
