"""The audit's training run: the pretrain settings (``pretrain.*``, ``model.*``) with the
audit's overrides, written as the same train.json the pretrain stage writes, plus
the adversary's knobs (``dro``) and, with ``audit.init: pretrain``, the pretrain
stage's final weights as the starting point."""

from __future__ import annotations

from pathlib import Path

from models.run_config import TrainConfig
from xylent.errors import XylentError
from xylent.spec import Spec

from tasks.audit.adversary import STATE_FILE
from tasks.pretrain.config import train_config
from tasks.shards.index import has_rows, read_index

FULL_WEIGHTS = "model/pretraining.safetensors"  # every weight of the pretrain stage's model (tasks.pretrain.publish)


def pair_loss_weights(pair_loss: str, objective: str, disc_weight: float) -> list[float]:
    """(w_G, w_D) of each pair's loss; the MLM ablation has no discriminator: its MLM loss alone."""
    if objective != "electra":
        return [1.0, 0.0]
    return [disc_weight, 1.0] if pair_loss == "d_plus_lambda_g" else [1.0, disc_weight]


def audit_train_config(spec: Spec, upstream: dict[str, Path], ckdir: Path, run_id: str | None,
                       tracking_uri: str | None) -> TrainConfig:
    a, p = spec.audit, spec.pretrain
    if "trtd" not in p.tasks:
        raise XylentError("the audit re-weights TRTD language pairs, but pretrain.tasks has no 'trtd'",
                          where="spec field pretrain.tasks", fix="add 'trtd' to pretrain.tasks")
    index = read_index(upstream["shards"])
    if not has_rows(index, "trtd"):
        raise XylentError("the shards hold no TRTD (bitext) data: there are no language pairs to audit",
                          where=str(upstream["shards"]), fix="add bitext sources to the spec")
    cfg = train_config(spec, upstream, ckdir, run_id, tracking_uri)
    cfg.steps = a.steps or p.steps
    cfg.warmup_steps = min(cfg.warmup_steps, max(0, cfg.steps - 1))
    cfg.checkpoint_every = min(cfg.checkpoint_every, cfg.steps)
    cfg.dro = {"rho": a.rho, "min_ratio": a.min_ratio, "ema": a.ema, "resamples": a.resamples,
               "weights": pair_loss_weights(a.pair_loss, p.objective, p.disc_weight),
               "state_file": str(ckdir / STATE_FILE)}
    if a.init == "pretrain":
        weights = Path(upstream["pretrain"]) / FULL_WEIGHTS
        if not weights.is_file():
            raise XylentError("the pretrain output has no full weights to start the audit from", where=str(weights),
                              fix="rerun the pretrain stage (xylent run pretrain --force), or set audit.init: scratch")
        cfg.init_from = str(weights)
    return cfg
