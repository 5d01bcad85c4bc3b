"""train.json: everything one training run needs, written by the pretrain stage
(:func:`xylent.tasks.pretrain.train_json.train_config`) and read by every rank (plain JSON,
so a Slurm job can be launched from it).

No field has a default here: the spec (``xylent.spec.PretrainConfig``) is the one
place defaults live, and a train.json that lacks a field, or has one more, is refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass
class DroConfig:
    """The audit's adversary (xylent.models.training.audit.adversary), from the spec's ``audit`` section
    (xylent.tasks.audit.train_config)."""
    rho: float
    min_ratio: float
    ema: float
    resamples: int
    weights: list[float]        # (w_G, w_D): each pair's loss is w_G·L_G + w_D·L_D
    baseline: str | None        # pair_loss excess: training.audit.adversary.BASELINES; None: the loss itself
    baseline_every: int
    language_every: int         # the language baseline on every Nth baseline_every period (the -larger kinds)
    holdout: float              # baseline heldout(-larger): each pair's share held out of training; else 0
    state_file: str             # where rank 0 writes the adversary's final state


@dataclass
class TrainConfig:
    """Every field a rank reads, declared.  The knobs are the spec's ``pretrain`` fields of the same
    name (xylent.spec.PretrainConfig: their defaults, types and docs), as the stage resolved them
    (:func:`xylent.tasks.pretrain.train_json.train_config`; the audit's :func:`xylent.tasks.audit.train_config.
    audit_train_config` shortens the run); tests/test_pretrain_config.py holds the names to the spec's."""
    # where things are
    shards_dir: str
    sampling_dir: str
    checkpoint_dir: str
    metrics_file: str
    deepspeed_config: str       # the JSON actually used (xylent's zero<N>.json or the user's)
    zero_stage: int             # read from that JSON: reported, never written back into it
    model: dict                 # xylent.models.config.EncoderConfig fields, tokenizer's special ids included
    # what to train: the objective and its data
    objective: str
    objective_options: dict     # the objective's own section (PretrainConfig.objective_options), resolved
    batch_kinds: list[str]
    batch_schedule: str
    trtd_ratio: float
    trtd_max_tokens: int
    mask_prob: float
    disc_weight: float
    # how long, how much
    steps: int
    batch_size: int
    grad_accum: int
    seed: int                   # the spec's top-level seed
    # the optimizer (lr and clip resolved for the model size where the spec leaves them unset)
    lr: float
    clip: float
    warmup_steps: int
    betas: list[float]
    eps: float
    weight_decay: float
    precision: str
    compile: str
    # checkpoints and what starts the run
    checkpoint_every: int
    keep_checkpoints: int
    snapshot_tokens: list[int]  # the encoder exported again at these token counts (xylent.models.training.snapshots)
    init_from: str | None       # a safetensors file of every weight to start from (the audit's init: pretrain)
    dro: DroConfig | None       # the audit's adversary; None in a plain pretrain run
    # how it is observed
    log_every: int
    system_metrics: bool
    system_metrics_interval: float
    peak_tflops: float | None
    mlflow_tracking_uri: str | None
    mlflow_run_id: str | None

    @classmethod
    def load(cls, path: str | Path) -> "TrainConfig":
        data = json.loads(Path(path).read_text())
        known = {f.name for f in fields(cls)}
        unknown, missing = set(data) - known, known - set(data)
        if unknown or missing:
            raise ValueError(f"{path}: unknown train.json keys {sorted(unknown)}, missing {sorted(missing)}; "
                             "it was written by another xylent version: rerun the pretrain stage to rewrite it")
        if data["dro"] is not None:
            known = {f.name for f in fields(DroConfig)}
            if set(data["dro"]) != known:
                raise ValueError(f"{path}: train.json's dro has keys {sorted(data['dro'])}, not {sorted(known)}: "
                                 "it was written by another xylent version: rerun the audit stage to rewrite it")
            data["dro"] = DroConfig(**data["dro"])
        return cls(**data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2))


# the knobs that are the spec's pretrain fields of the same name, copied as the spec has them; lr and clip too
# when the spec sets them (else the model size's defaults), seed from the spec's top level
SPEC_KNOBS = ("objective", "batch_kinds", "batch_schedule", "trtd_ratio", "trtd_max_tokens", "mask_prob", "disc_weight",
              "steps", "batch_size", "grad_accum", "warmup_steps", "betas", "eps", "weight_decay", "precision",
              "compile", "checkpoint_every", "keep_checkpoints", "snapshot_tokens", "log_every", "system_metrics",
              "system_metrics_interval", "peak_tflops")


def task_plan(cfg: TrainConfig, step: int) -> list[str]:
    """The tasks of each micro-batch of optimizer step ``step``."""
    tasks = cfg.batch_kinds
    if len(tasks) == 1:
        return tasks * cfg.grad_accum
    if cfg.batch_schedule == "mix":
        return [t for t in tasks for _ in range(cfg.grad_accum)]
    # alternate: TRTD on the steps where the running share of TRTD steps falls below trtd_ratio
    r = cfg.trtd_ratio
    is_trtd = int((step + 1) * r + 1e-9) > int(step * r + 1e-9)
    return [("trtd" if is_trtd else "mrtd")] * cfg.grad_accum


def trtd_share(cfg: TrainConfig, enough: int = 50) -> float:
    """The share of optimizer steps that train TRTD, counted from the run's start until ``enough`` of
    them (or the run's end)."""
    trained = 0
    for s in range(cfg.steps):
        trained += "trtd" in task_plan(cfg, s)
        if trained >= enough:
            return trained / (s + 1)
    return trained / max(1, cfg.steps)


def first_trtd_step(cfg: TrainConfig) -> int | None:
    """The first optimizer step whose plan (task_plan) trains TRTD, in closed form; None: no step ever does."""
    if "trtd" not in cfg.batch_kinds:
        return None
    if len(cfg.batch_kinds) == 1 or cfg.batch_schedule == "mix":
        return 0
    if cfg.trtd_ratio <= 0:
        return None
    return max(0, math.ceil((1 - 1e-9) / cfg.trtd_ratio) - 1)  # the first s with int((s + 1) * r + 1e-9) >= 1
