"""The audit stage's work around its ranks (flows/audit.py launches them, then gathers the
evidence): :func:`configure` is pretrain's train.json plus the adversary, :func:`export` the
audit's own model and the adversary's final state, :func:`evidence` what dedup's output says of each
pair, :func:`assemble` the ranking, report and plots."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl

from xylent.models.training.audit.adversary import STATE_FILE
from xylent.models.training.run_config import TrainConfig
from xylent.spec import Spec
from xylent.stage import StageOutcome

from xylent.tasks.audit.evidence import pair_evidence
from xylent.tasks.audit.report import write_output
from xylent.tasks.audit.train_config import audit_train_config
from xylent.tasks.pretrain import publish as pub


def configure(spec: Spec, upstream: dict[str, Path], ckdir: Path, run_id: str | None, tracking_uri: str | None,
              shards_source: str | None) -> TrainConfig:
    return audit_train_config(spec, upstream, ckdir, run_id, tracking_uri, shards_source=shards_source)


def audit_model_name(spec: Spec) -> str:
    return f"{pub.model_name(spec)}-audit"


def export(spec: Spec, cfg: TrainConfig, resumed_from_step: int, ckdir: Path, upstream: dict[str, Path], out: Path,
           tracker, run_id: str, fingerprint: str) -> tuple[dict, pub.Published]:
    """(the adversary's final state, the exported and registered audit model)."""
    p = spec.pretrain
    name = audit_model_name(spec)
    done = pub.export_and_register(cfg, ckdir, upstream, out, {
        "objective": p.objective, "steps": cfg.steps, "fingerprint": fingerprint, "registered_model": name,
        "audit": spec.audit.model_dump(mode="json")}, tracker, run_id, resumed_from_step, spec_yaml=spec.to_yaml())
    shutil.copy2(ckdir / STATE_FILE, out / STATE_FILE)
    return json.loads((ckdir / STATE_FILE).read_text()), done


def evidence(spec: Spec, dedup_dir: Path, pairs: list[str]) -> pl.DataFrame:
    """Each pair's copy, hub and length evidence, by the same rules dedup applies."""
    return pair_evidence(dedup_dir, pairs, hub_min_sources=spec.dedup.hub_min_partners,
                         max_length_ratio=spec.dedup.max_length_ratio)


def assemble(state: dict, evidence: pl.DataFrame, done: pub.Published, spec: Spec, resumed_from_step: int,
             ckdir: Path, upstream: dict[str, Path], out: Path) -> StageOutcome:
    outcome = write_output(state, evidence, upstream["dedup"], spec, done.metrics, out)
    outcome.manifest.update({"checkpoints": str(ckdir), "registered_model": done.name, "model_uri": done.model_uri,
                             "registered_version": done.version, "resumed_from_step": resumed_from_step})
    return outcome
