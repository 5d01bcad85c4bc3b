"""The stage contract, as the core sees it: what a stage is, what its body
returns, and what its fingerprint covers.  Nothing here knows Prefect; the
flows layer (``flows/kit/stage.py``) turns a :class:`StageDef` into a Prefect flow.

A stage's fingerprint hashes its name, its code version, the slice of the spec
it reads and its upstream stages' fingerprints.  Bump ``version`` whenever a
code change alters a stage's output, so old outputs stop being cache hits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from xylent.errors import XylentError
from xylent.tracking import Tracker
from xylent.workspace import Workspace, fingerprint

if TYPE_CHECKING:  # for annotations only: importing this module loads no pydantic
    from xylent.spec import Spec


@dataclass
class StageOutcome:
    """What a stage body hands back: numbers for MLflow, rows for the stats
    table, a markdown summary, extra manifest fields and files it already
    described (so publishing does not hash them again), and warnings: what
    the user must hear about although the stage succeeded (console, run
    summary, manifest and the MLflow run say them)."""

    metrics: dict[str, float] = field(default_factory=dict)
    table: list[dict] = field(default_factory=list)
    summary: str = ""
    manifest: dict[str, Any] = field(default_factory=dict)
    known_files: dict[str, dict] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class StageContext:
    """Everything a stage body may use: its spec, workspace, the temporary folder
    it writes its output into, its upstream stages' published outputs, its
    MLflow run (and the tracker to reach it) and whether the user asked to
    recompute (``--force``)."""

    spec: Spec
    ws: Workspace
    out: Path
    upstream: dict[str, Path]
    fingerprint: str
    run_id: str
    tracker: Tracker
    force: bool = False
    stage: str = ""  # the stage's name (its workspace folder)


def section_identity(value: Any) -> Any:
    """The JSON form of a spec section for fingerprints and MLflow params; a
    section's ``OPERATIONAL`` fields (how to run, not what) are left out, and its
    ``ADDED_LATER`` fields while they hold their default (a new knob whose default
    changes nothing must not invalidate every workspace's outputs), and the fields
    its ``unread_fields()`` names (e.g. the sections of objectives not trained); a field
    renamed (``RENAMED``) under its old name, so a rename moves no fingerprint."""
    if isinstance(value, list):
        return [section_identity(v) for v in value]
    if hasattr(value, "model_dump"):
        # fields added later are left out while at their default, so existing outputs stay cache hits
        fields = type(value).model_fields
        later = {f for f in getattr(value, "ADDED_LATER", ())
                 if getattr(value, f) == fields[f].get_default(call_default_factory=True)}
        unread = set(value.unread_fields()) if hasattr(value, "unread_fields") else set()
        dumped = value.model_dump(mode="json", exclude=set(getattr(value, "OPERATIONAL", ())) | later | unread)
        for new, old in getattr(value, "RENAMED", {}).items():  # a renamed field keeps its first name here
            if new in dumped:
                dumped[old] = dumped.pop(new)
        for name in dumped:  # nested sections (evaluate.tasks[], their finetune) follow the same rules
            inner = getattr(value, name, None)  # None: a field dumped by its alias (pretrain.init.from), a value
            if hasattr(inner, "model_dump") or (isinstance(inner, list) and any(hasattr(x, "model_dump")
                                                                                for x in inner)):
                dumped[name] = section_identity(inner)
        return dumped
    return value


@dataclass(frozen=True)
class StageDef:
    """One stage, declared once.

    ``reads`` names the spec fields (top-level sections or values) the stage's
    output depends on; ``config`` replaces that default slice where a stage
    depends on more than the spec (download: the identity of local files and
    installed packages).  ``identity`` adds what it depends on that only the
    workspace can tell (pretrain.init: the source model's files, a registered
    model's version in the workspace's MLflow store): ``identity(spec, ws) -> dict``,
    hashed (under ``_identity``) only when not empty.  ``body`` is the flow-side
    callable that builds the output: ``body(ctx: StageContext) -> StageOutcome``.
    ``on_cached`` does what a cache hit still owes the spec's operational fields
    (pretrain.register_name: the model registered under the name asked for):
    ``on_cached(spec, manifest, tracker) -> dict`` of fields added to the stage's result.
    """

    name: str
    description: str
    version: str
    reads: tuple[str, ...]
    body: Callable[[StageContext], StageOutcome]
    upstream: tuple[str, ...] = ()
    config: Callable[[Spec], dict] | None = None
    # upstream stages read only when the spec says so: (name, spec -> bool)
    conditions: tuple[tuple[str, Callable[[Spec], bool]], ...] = ()
    identity: Callable[[Spec, Workspace], dict] | None = None
    on_cached: Callable[[Spec, dict, Any], dict] | None = None

    def upstream_of(self, spec: Spec) -> tuple[str, ...]:
        """The upstream stages this spec makes the stage read (a conditional one only when its test holds)."""
        tests = dict(self.conditions)
        return tuple(u for u in self.upstream if u not in tests or tests[u](spec))

    def spec_slice(self, spec: Spec, ws: Workspace | None = None) -> dict:
        if self.config is not None:
            out = self.config(spec)
        else:
            out = {name: section_identity(getattr(spec, name)) for name in self.reads}
        if self.identity is not None:
            extra = self.identity(spec, ws if ws is not None else workspace_for(spec))
            if extra:
                out = {**out, "_identity": extra}
        return out


def order_stages(stages: Iterable[StageDef]) -> list[StageDef]:
    """Check a stage list is a valid pipeline: unique names, every upstream
    declared earlier in the list."""
    seen: dict[str, StageDef] = {}
    for s in stages:
        if s.name in seen:
            raise ValueError(f"stage {s.name!r} is declared twice")
        missing = [u for u in s.upstream if u not in seen]
        if missing:
            raise ValueError(f"stage {s.name!r} needs {missing} declared before it")
        seen[s.name] = s
    return list(seen.values())


def find_stage(stages: Iterable[StageDef], name: str) -> StageDef:
    stages = list(stages)
    for s in stages:
        if s.name == name:
            return s
    raise XylentError(
        f"unknown stage {name!r}",
        fix=f"choose one of: {', '.join(s.name for s in stages)} (or 'pipeline'); `xylent stages` lists them",
    )


def stage_fingerprints(stages: Iterable[StageDef], spec: Spec, ws: Workspace | None = None) -> dict[str, str]:
    """Fingerprint of every stage, in order (``ws``: the run's workspace, default ``workspace_for(spec)``)."""
    fps: dict[str, str] = {}
    for s in stages:
        fps[s.name] = fingerprint({
            "stage": s.name, "version": s.version, "config": s.spec_slice(spec, ws),
            "upstream": {u: fps[u] for u in s.upstream_of(spec)},
        })
    return fps


def workspace_for(spec: Spec, override: str | None = None) -> Workspace:
    """The workspace of a run: ``--workspace``, else the spec's, else ./workspace."""
    return Workspace(override or spec.workspace or "workspace")
