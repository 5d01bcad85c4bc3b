"""The pretrain stage's work around its ranks (flows/pretrain.py launches them between the two):
:func:`configure` resolves train.json and prepares a warm start, :func:`publish` exports, registers
and reports the trained model."""

from __future__ import annotations

import json
from pathlib import Path

from xylent.models.training.run_config import TrainConfig
from xylent.spec import Spec
from xylent.stage import StageOutcome

from xylent.tasks.pretrain import publish as pub
from xylent.tasks.pretrain.contract import HEALTH_FILE, read_metrics
from xylent.tasks.pretrain.init_source import REPORT_FILE, init_metrics, init_summary, prepare_init
from xylent.tasks.pretrain.train_json import train_config


def configure(spec: Spec, ws, upstream: dict[str, Path], ckdir: Path, run_id: str | None, tracking_uri: str | None,
              shards_source: str | None) -> tuple[TrainConfig, dict | None]:
    """(the run's train.json settings, the warm start's report or None); the warm start's weights
    are written before training, into the checkpoint folder."""
    cfg = train_config(spec, upstream, ckdir, run_id, tracking_uri, shards_source=shards_source)
    init = prepare_init(spec, ws, cfg, upstream, ckdir) if spec.pretrain.init is not None else None
    return cfg, init


def publish(spec: Spec, cfg: TrainConfig, init: dict | None, resumed_from_step: int, ckdir: Path,
            upstream: dict[str, Path], out: Path, tracker, run_id: str, fingerprint: str) -> StageOutcome:
    p = spec.pretrain
    name = pub.model_name(spec)
    meta = {"objective": p.objective, "steps": p.steps, "fingerprint": fingerprint, "registered_model": name,
            **({"init": init["source"]} if init else {})}
    done = pub.export_and_register(cfg, ckdir, upstream, out, meta, tracker, run_id, resumed_from_step, step=p.steps,
                                   spec_yaml=spec.to_yaml())
    snapshots = pub.export_snapshots(cfg, upstream, out, meta) if cfg.snapshot_tokens else {}
    metrics = done.metrics
    summary = pub.summary(metrics, p, cfg, done.encoder, f"{name} v{done.version}", done.model_uri,
                          resumed_from_step)
    if (out / HEALTH_FILE).exists():
        health, lines = pub.health_lines(read_metrics(out / HEALTH_FILE))
        metrics.update(health)
        summary += "".join("\n\n" + ln for ln in lines)
    if init:
        (out / REPORT_FILE).write_text(json.dumps(init, indent=1, ensure_ascii=False))
        tracker.log_artifact(run_id, out / REPORT_FILE)
        metrics.update(init_metrics(init))
        summary += "\n\n" + init_summary(init)
    if cfg.snapshot_tokens:
        summary += "\n\n" + pub.snapshot_line(cfg.snapshot_tokens, snapshots)
    (out / "report.md").write_text(summary)
    table = [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items()} for r in done.rows[-200:]]
    return StageOutcome(metrics=metrics, table=table, summary=summary,
                        manifest={"checkpoints": str(ckdir), "registered_model": name, "model_uri": done.model_uri,
                                  "registered_version": done.version, "resumed_from_step": resumed_from_step,
                                  **({"snapshots": snapshots} if cfg.snapshot_tokens else {})})
