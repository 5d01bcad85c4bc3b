"""The stage kit: what every stage flow does around its own work.

:func:`stage_flow` turns a :class:`~xylent.stage.StageDef` into a Prefect flow
that checks the cache, runs the stage's body into a temporary output folder,
publishes it with its manifest, and records everything in MLflow (a nested run
under the invocation's parent run) and in Prefect (markdown summary, stats
table, link to the MLflow run).  A stage file gives its declared stage
(``flows/registry.py``) a body and orchestrates its tasks; see docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import platform
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable

from prefect import flow
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from prefect.states import Completed, State

import xylent
from xylent.flows.kit.deployment_steps import workspace_slot
from xylent.flows.registry import STAGE_BY_NAME, stage_flow_of
from xylent.flows.kit.progress import KEY_PREFIX, artifact_key, heartbeat, say
from xylent.flows.kit.run_record import (effective_params, headline, log_spec_file, log_stage_inputs, override_tags,
                                         run_name, source_tags)
from xylent.flows.kit.runners import cluster_tags, shared_cluster
from xylent import interrupt
from xylent.errors import XylentError, environment_error
from xylent.redact import redact_text
from xylent.spec import Spec, load_spec
from xylent.stage import StageContext, StageDef, StageOutcome, stage_fingerprints, workspace_for
from xylent.flows.kit.preflight import accepts_host
from xylent.tracking import (Tracker, artifact_root_for, charted_after_curves, scheme_of, tracking_source,
                             tracking_uri_for)
from xylent.workspace import Workspace, read_manifest

__all__ = ["Invocation", "StageContext", "StageOutcome", "stage_flow"]


def _versions() -> dict[str, str]:
    out = {"xylent": xylent.__version__, "python": platform.python_version()}
    for pkg in ("prefect", "mlflow", "pyarrow", "polars"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            continue  # not installed here: nothing to record
    return out


def lineage(stages: list[StageDef]) -> list[StageDef]:
    """The given stages and every stage they read, upstream first (each once)."""
    out: dict[str, StageDef] = {}

    def visit(s: StageDef) -> None:
        for up in s.upstream:
            visit(STAGE_BY_NAME[up])
        out.setdefault(s.name, s)

    for s in stages:
        visit(s)
    return list(out.values())


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
    stages: dict[str, StageDef]  # every stage this invocation may run, by name
    name: str = ""  # its runs' name (MLflow's parent run, Prefect's flow run), without "cached"
    results: dict[str, dict] = field(default_factory=dict)
    _slot: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _parent_token: Any = None
    _key_token: Any = None

    @classmethod
    def open(cls, spec_file: str, workspace: str | None, overrides: list[str] | None, name: str,
             stages: list[StageDef], until: str | None = None, force: bool = False) -> "Invocation":
        """``stages``: the stages this invocation runs (their upstream stages are added);
        ``until``: the last of them it builds (default: the last one), ``force``: whether it
        rebuilds what is built (both go into its runs' names).  Inside another invocation's flow
        (a stage the pipeline runs) its runs nest under that one's."""
        spec = load_spec(spec_file, overrides or [])
        ws = workspace_for(spec, workspace)
        ws.ensure_writable()
        parent_run_id, tracker = _PARENT_RUN.get() or (None, None)
        if parent_run_id is None:  # a run started anew (CLI, deployment, notebook, worker): unrequested
            interrupt.clear()
        slot = contextlib.ExitStack()
        if parent_run_id is None:
            slot.enter_context(workspace_slot(ws.location))
        try:
            if parent_run_id is None:  # every stage of this invocation fans out over one cluster
                slot.enter_context(shared_cluster(spec.runner))  # a failure before the invocation exists must not keep the workspace's slot
            if tracker is None:  # a nested invocation (same spec and workspace) uses its parent's
                uri = tracking_uri_for(ws.root, spec.tracking.tracking_uri)
                if scheme_of(uri) in ("http", "https"):  # a deployment's run has no CLI preflight
                    accepts_host(uri, tracking_source(spec.tracking.tracking_uri))
                tracker = Tracker(uri, spec.tracking.experiment, artifact_root=artifact_root_for(ws.root, uri),
                                  workspace=ws.root)
                tracker.end_orphaned_runs()  # runs of invocations killed with -9 would say RUNNING forever
            chain = lineage(stages)
            fingerprints = stage_fingerprints(chain, spec, ws)
            owns = parent_run_id is None
            last = until or stages[-1].name  # what the invocation builds, named by its fingerprint
            partial = until if until and until != stages[-1].name else None
            title = run_name(spec, name, fingerprints.get(last), overrides, until=partial, force=force)
            if owns:
                parent_run_id = tracker.start_run(
                    title,
                    tags={"xylent.spec": str(Path(spec_file).resolve()), "xylent.target": name,
                          "xylent.workspace": ws.location, "xylent.force": str(force).lower(),
                          **({"xylent.until": until} if partial else {}), **override_tags(overrides),
                          **source_tags(spec_file), **_prefect_tags()},
                    params={"spec": spec.dump(), "overrides": " ".join(overrides or [])},
                )
                log_spec_file(tracker, parent_run_id, Path(spec_file))
            inv = cls(spec, spec_file, list(overrides or []), ws, tracker, parent_run_id, owns, fingerprints,
                      {s.name: s for s in chain}, title, _slot=slot)
            if owns:
                inv._parent_token = _PARENT_RUN.set((parent_run_id, tracker))
                inv._key_token = KEY_PREFIX.set(ws.slug)
            name_flow_run(title, prefect_run_tags(spec, ws, overrides, force=force, until=partial))
            return inv
        except BaseException:
            slot.close()
            raise

    def flow_kwargs(self) -> dict:
        return {"spec_file": self.spec_file, "workspace": self.ws.location, "overrides": self.overrides}

    def finish(self, ok: bool) -> None:
        self._slot.close()
        if ok and self.all_cached():
            name_flow_run(f"cached {self.name}", ())
        if self._parent_token is not None:
            _PARENT_RUN.reset(self._parent_token)
            KEY_PREFIX.reset(self._key_token)
        if self.owns_parent:
            if ok:
                self.tracker.log_metrics(self.parent_run_id, self.headlines())
                if self.all_cached():
                    # a rerun that found everything built reads as one in the run list, beside a rebuild
                    self.tracker.set_tags(self.parent_run_id, {"mlflow.runName": f"cached {self.name}",
                                                               "xylent.cached": "true"})
                self.tracker.end_run(self.parent_run_id)
            else:
                self.tracker.end_failed_run(self.parent_run_id, "KILLED" if interrupt.requested() else "FAILED")

    def all_cached(self) -> bool:
        return bool(self.results) and all(r.get("cached") for r in self.results.values())

    def record(self, result: dict) -> None:
        """Take the stages a (sub)flow reports; the first report of a stage is what this run did."""
        for name, r in result["stages"].items():
            self.results.setdefault(name, r)

    def headlines(self) -> dict[str, float]:
        """Each stage's headline numbers (``pretrain.final.trtd/discriminator_loss`` ...), built or cached."""
        out = {}
        for name, r in self.results.items():
            manifest = read_manifest(Path(r["output_dir"])) or {}
            out.update({f"{name}.{k}": v for k, v in headline(name, manifest.get("metrics", {})).items()})
        return out

    def upstream_chain(self, stage: StageDef) -> dict[str, str]:
        """Every stage ``stage`` reads, directly or not -> its fingerprint."""
        out: dict[str, str] = {}
        todo = list(stage.upstream_of(self.spec))
        while todo:
            up = todo.pop()
            if up not in out:
                out[up] = self.fingerprints[up]
                todo.extend(self.stages[up].upstream_of(self.spec))
        return out

    def result(self) -> dict:
        return {"stages": self.results, "mlflow_parent_run_id": self.parent_run_id,
                "mlflow_parent_run_url": self.tracker.run_url(self.parent_run_id) if self.parent_run_id else None,
                "prefect_flow_run_id": flow_run.id, "prefect_flow_run_url": flow_run_url()}

    def built(self, stage: str) -> bool:
        """Whether the stage's output is published and intact (what makes it a cache hit)."""
        return self.ws.verified(self.ws.output_dir(stage, self.fingerprints[stage]), stage) is not None

    def upstream_dirs(self, stage: StageDef) -> dict[str, Path]:
        """Output folders of a stage's upstream stages, running any that are missing
        (as subflows, so the Prefect UI shows them)."""
        dirs = {}
        for up in stage.upstream_of(self.spec):
            out = self.ws.output_dir(up, self.fingerprints[up])
            manifest = self.ws.verified(out, up)
            if manifest is None:
                self.record(stage_flow_of(up)(**self.flow_kwargs()))
            else:
                self.results.setdefault(up, _result(out, manifest, cached=True))
            dirs[up] = out
        return dirs


# The MLflow parent run of the invocation whose flow is running, and its tracker: the
# stage flows it calls (Prefect subflows, run in this context) nest their runs under it.
# Not a flow parameter, so the Prefect UI's run form does not show it.
_PARENT_RUN: ContextVar[tuple[str, Tracker] | None] = ContextVar("xylent_mlflow_parent_run", default=None)


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


def prefect_run_tags(spec: Spec, ws: Workspace, overrides: list[str] | None, *, force: bool,
                     until: str | None) -> list[str]:
    """A flow run's tags, for the Prefect UI's tag filter: the spec, the workspace (every checkout on
    a machine shares one Prefect database), each override, a forced or partial run."""
    tags = [f"spec:{spec.name}", f"workspace:{ws.slug}",
            *(f"set:{redact_text(o)}" for o in overrides or [])]
    return tags + (["force"] if force else []) + ([f"until:{until}"] if until else [])


def name_flow_run(name: str, tags) -> None:
    """Name this flow run as its MLflow run is named (the namer ran before the fingerprints were
    known) and add ``tags``.  Outside a flow run (library use), nothing."""
    if flow_run.id is None:
        return
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:  # the tags are replaced, not merged: none given, none sent
            client.update_flow_run(flow_run.id, name=name, tags=sorted({*flow_run.tags, *tags}) if tags else None)
    except Exception as exc:  # a name is a nicety: a server's hiccup must not fail the stage
        import logging

        logging.getLogger("xylent").debug("flow run not renamed: %s", exc)


def _result(out: Path, manifest: dict, *, cached: bool) -> dict:
    return {"output_dir": str(out), "fingerprint": manifest["fingerprint"], "cached": cached,
            "mlflow_run_id": manifest.get("mlflow_run_id"), "warnings": manifest.get("warnings", [])}


def _console_warning(stage: str, text: str) -> None:
    """A stage's warning on the console as it happens (the run summary repeats it at the end)."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        get_run_logger().warning("%s: %s", stage, text)
    except MissingContextError:  # the body called outside a flow run (library use): plain logging
        import logging

        logging.getLogger("xylent").warning("%s: %s", stage, text)


def execute(inv: Invocation, stage: StageDef, force: bool):
    """Run the stage's body into a temporary folder unless its output is cached."""
    fp = inv.fingerprints[stage.name]
    out = inv.ws.output_dir(stage.name, fp)
    config = stage.spec_slice(inv.spec, inv.ws)
    params = effective_params(inv.spec, fp, inv.upstream_chain(stage))
    name = run_name(inv.spec, stage.name, fp, force=force)
    tags = {"xylent.stage": stage.name, "xylent.fingerprint": fp, "xylent.output_dir": str(out),
            **source_tags(inv.spec_file), **_prefect_tags(), **cluster_tags()}
    with inv.ws.lock():
        upstream = inv.upstream_dirs(stage)
        manifest = None if force else inv.ws.verified(out, stage.name)
        if manifest is not None and not force:
            # no run of its own (a cached rerun would add a whole tree): a tag on the invocation's run
            # names the run that built the output
            built_by = manifest.get("mlflow_run_id") or ""
            inv.tracker.set_tags(inv.parent_run_id, {f"xylent.cached.{stage.name}": built_by or fp})
            _cached_artifacts(inv, stage.name, fp, out, built_by or inv.parent_run_id)
            result = _result(out, manifest, cached=True)
            if stage.on_cached is not None:
                result.update(stage.on_cached(inv.spec, manifest, inv.tracker))
            inv.results[stage.name] = result
            say(f"{stage.name} {fp[:8]}: cached, nothing to do")
            return Completed(name="Cached", message=f"{stage.name} output {fp} is up to date", data=result)

        run_id = inv.tracker.start_run(name, parent_run_id=inv.parent_run_id, params=params,
                                       tags={**tags, "xylent.cached": "false"})
        log_stage_inputs(inv.tracker.client, run_id, {u: (d, inv.fingerprints[u]) for u, d in upstream.items()})
        started = time.time()
        say(f"{stage.name} {fp[:8]}: " + ("rebuilding (--force)" if force else "building"))
        try:
            with inv.ws.building(out) as tmp, heartbeat(f"{stage.name} {fp[:8]}"):
                outcome = stage.body(StageContext(inv.spec, inv.ws, tmp, upstream, fp, run_id, inv.tracker, force,
                                                  stage.name))
                manifest = inv.ws.publish(tmp, out, {
                    "stage": stage.name, "fingerprint": fp, "code_version": stage.version,
                    "inputs": {u: inv.fingerprints[u] for u in stage.upstream_of(inv.spec)}, "config": config,
                    "metrics": outcome.metrics, "versions": _versions(),
                    "started": started, "seconds": round(time.time() - started, 3),
                    "mlflow_run_id": run_id, "prefect_flow_run_id": flow_run.id, **outcome.manifest,
                    **({"warnings": outcome.warnings} if outcome.warnings else {}),
                }, known_files=outcome.known_files)
        except BaseException as exc:
            say(f"{stage.name} {fp[:8]}: failed after {time.time() - started:.1f} s")
            if not isinstance(exc, Exception):  # Ctrl-C, SIGTERM (Prefect's TerminationSignal): stop the task
                interrupt.request()             # threads too, or the flow waits for their whole run
            # a stopped run is KILLED, as MLflow's UI names a run someone stopped, not FAILED
            inv.tracker.end_failed_run(run_id, "KILLED" if interrupt.requested() else "FAILED")
            if isinstance(exc, Exception) and not isinstance(exc, XylentError):
                env = environment_error(exc, str(inv.ws.root))
                if env is not None:
                    raise env from exc  # a full disk is the user's to fix, not a bug to report
            raise
        say(f"{stage.name} {fp[:8]}: done in {manifest['seconds']:.1f} s")
        inv.tracker.log_metrics(run_id, charted_after_curves({**outcome.metrics, "seconds": manifest["seconds"]}))
        if outcome.warnings:
            inv.tracker.set_tags(run_id, {"xylent.warnings": "\n".join(outcome.warnings)})
            for w in outcome.warnings:
                _console_warning(stage.name, w)
        inv.tracker.log_artifact(run_id, out / "_manifest.json")
        for extra in sorted(out.glob("*.parquet")) + sorted(out.glob("*.md")) + sorted(out.glob("*.png")):
            inv.tracker.log_artifact(run_id, extra)
        inv.tracker.end_run(run_id)
        _prefect_artifacts(inv, stage.name, fp, out, run_id, outcome)
        result = _result(out, manifest, cached=False)
        inv.results[stage.name] = result
        return result


def _prefect_artifacts(inv: Invocation, stage: str, fp: str, out: Path, run_id: str, outcome: StageOutcome):
    if flow_run.id is None:
        return
    link = inv.tracker.run_url(run_id)
    view = inv.tracker.how_to_view()
    create_markdown_artifact(
        key=artifact_key(stage, "summary"),
        markdown=f"# {stage} `{fp}`\n\nOutput: `{out}`\n\nMLflow run: [{run_id}]({link}) ({view})\n\n"
        f"{outcome.summary}",
        description=f"{stage}: summary",
    )
    if outcome.table:
        create_table_artifact(key=artifact_key(stage, "stats"), table=outcome.table, description=f"{stage}: statistics")
    create_link_artifact(key=artifact_key(stage, "mlflow"), link=link, link_text=f"MLflow run {run_id}",
                         description=f"{stage}: MLflow run ({view})")


def _cached_artifacts(inv: Invocation, stage: str, fp: str, out: Path, built_by: str) -> None:
    """A cached stage's flow run says where its output is and links the run that built it."""
    if flow_run.id is None:
        return
    link = inv.tracker.run_url(built_by)
    create_markdown_artifact(key=artifact_key(stage, "summary"), description=f"{stage}: cached",
                             markdown=f"# {stage} `{fp}` (cached)\n\nOutput: `{out}`, up to date: nothing ran.\n\n"
                             f"Built by MLflow run [{built_by}]({link}) ({inv.tracker.how_to_view()})\n")
    create_link_artifact(key=artifact_key(stage, "mlflow"), link=link,
                         link_text=f"MLflow run {built_by} (built the output)",
                         description=f"{stage}: the MLflow run that built the cached output")


def one_line_in_deployments(run: Callable) -> Callable:
    """A flow body whose user error, in a deployment's run, ends the run Failed with the error as
    its message, logged once, without a traceback (a workspace the worker cannot make was a raw
    traceback in the worker's log, twice).  From the CLI it propagates: the CLI prints it; inside
    another invocation's flow it propagates to that one."""
    # the wrapper is pickled by value with every task a process, Dask or Ray runner ships (it is the
    # flow's function): it may name module-level functions only, never a ContextVar
    @functools.wraps(run)
    def body(*args, **kwargs):
        try:
            return run(*args, **kwargs)
        except XylentError as exc:
            return _failed_in_one_line(exc)
    return body


def _failed_in_one_line(exc: XylentError):
    from prefect import get_run_logger
    from prefect.runtime import deployment
    from prefect.states import Failed

    if deployment.id is None or _PARENT_RUN.get() is not None:
        raise exc
    get_run_logger().error("%s", exc.render())
    message = exc.one_line()
    # Prefect's engine re-raises the Failed state it is handed as FailedRun and logs that with its
    # traceback, after the body returns (CI saw it in the worker's log): drop that one record
    logging.getLogger("prefect.flow_runs").addFilter(_NotTheEngineRetelling(message))
    return Failed(message=message)


class _NotTheEngineRetelling(logging.Filter):
    """Drops the engine's "exited with unexpected exception" record for the one message already
    logged; any other failure keeps its traceback."""

    def __init__(self, message: str):
        super().__init__()
        self.message = message

    def filter(self, record: logging.LogRecord) -> bool:
        from prefect.exceptions import FailedRun

        raised = record.exc_info[1] if record.exc_info else None
        return not (isinstance(raised, FailedRun) and str(raised) == self.message)


def flow_run_namer(flow_name: str) -> Callable[[], str]:
    """Prefect's name for a run: the flow and the spec it ran (``prepare · demo``), not two random
    words, so a run list reads at a glance."""
    def name() -> str:
        spec = Path(str(flow_run.parameters.get("spec_file") or "")).stem or "spec"
        return f"{flow_name} · {spec}"
    return name


def stage_flow(stage: StageDef):
    """Make the Prefect flow of a declared stage (``flows/registry.py``); decorate the stage's body:

        @stage_flow(STAGE_BY_NAME["sampling"])
        def sampling(ctx: StageContext) -> StageOutcome: ...

    The decorated name is the Prefect flow (``sampling(spec_file=..., ...)``); its
    :class:`StageDef` is ``sampling.stage`` and its body ``sampling.body``.  Upstream
    stages whose output is missing run first, as subflows.  A cached stage ends its
    flow in a ``Cached`` state; every flow returns every stage it touched.
    """

    def wrap(body: Callable[[StageContext], StageOutcome]):
        def run(spec_file: str, workspace: str | None = None, overrides: list[str] | None = None,
                force: bool = False) -> Any:
            inv = Invocation.open(spec_file, workspace, overrides, stage.name, [stage], force=force)
            ok = False
            try:
                state = execute(inv, stage, force)
                ok = True
            finally:
                inv.finish(ok)
            if isinstance(state, State):
                return Completed(name="Cached", message=state.message, data=inv.result())
            return inv.result()

        run.__doc__ = f"{stage.description[:1].upper()}{stage.description[1:]}."
        run.__name__ = run.__qualname__ = stage.name
        stage_run = flow(name=stage.name, log_prints=True,
                         flow_run_name=flow_run_namer(stage.name))(one_line_in_deployments(run))
        stage_run.stage = stage
        stage_run.body = body
        return stage_run

    return wrap
