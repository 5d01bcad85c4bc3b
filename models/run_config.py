"""train.json: everything one training run needs, written by the pretrain stage
(:func:`tasks.pretrain.train_json.train_config`) and read by every rank (plain JSON,
so a Slurm job can be launched from it).

No field has a default here: the spec (``xylent.spec.PretrainConfig``) is the one
place defaults live, and a train.json that lacks a field is refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass
class DroConfig:
    """The audit's adversary (models.adversary), from the spec's ``audit`` section
    (tasks.audit.train_config)."""
    rho: float
    min_ratio: float
    ema: float
    resamples: int
    weights: list[float]        # (w_G, w_D): each pair's loss is w_G·L_G + w_D·L_D
    baseline: str | None        # pair_loss excess: models.adversary.BASELINES; None: the loss itself
    baseline_every: int
    language_every: int         # the language baseline on every Nth baseline_every period (the -larger kinds)
    holdout: float              # baseline heldout(-larger): each pair's share held out of training; else 0
    state_file: str             # where rank 0 writes the adversary's final state


@dataclass
class TrainConfig:
    """A training knob (``cfg.steps``, ``cfg.mask_prob``, …) is read from ``resolved`` where this
    run decided it, else from ``pretrain``, the spec's section as written; setting one records it
    in ``resolved``.  So a new knob in xylent.spec.PretrainConfig reaches the ranks as it is."""
    # where things are
    shards_dir: str
    sampling_dir: str
    checkpoint_dir: str
    metrics_file: str
    deepspeed_config: str       # the JSON actually used (xylent's zero<N>.json or the user's)
    zero_stage: int             # read from that JSON: reported, never written back into it
    model: dict                 # models.config.EncoderConfig fields, tokenizer's special ids included
    # what to train
    pretrain: dict              # the spec's pretrain section whole (xylent.spec.PretrainConfig, as JSON)
    resolved: dict              # what the stage decided over it: lr and clip for the model size, the seed, the
                                # objective's options (objective_options), the audit's steps, warmup, checkpoints
    init_from: str | None       # a safetensors file of every weight to start from (the audit's init: pretrain)
    dro: DroConfig | None       # the audit's adversary; None in a plain pretrain run
    # how it is observed
    mlflow_tracking_uri: str | None
    mlflow_run_id: str | None

    def __getattr__(self, name: str):
        if not name.startswith("__"):  # copy and pickle probe dunders before __init__ ran
            for part in ("resolved", "pretrain"):
                knobs = self.__dict__.get(part) or {}
                if name in knobs:
                    return knobs[name]
        raise AttributeError(f"train.json has no {name!r}: it is neither a field, a resolved value nor a knob of "
                             "the spec's pretrain section")

    def __setattr__(self, name: str, value) -> None:
        if name in _FIELDS:
            object.__setattr__(self, name, value)
            return
        if self.__dict__.get("resolved") is None:
            object.__setattr__(self, "resolved", {})
        self.resolved[name] = value

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


_FIELDS = frozenset(f.name for f in fields(TrainConfig))


def task_plan(cfg: TrainConfig, step: int) -> list[str]:
    """The tasks of each micro-batch of optimizer step ``step``."""
    tasks = cfg.tasks
    if len(tasks) == 1:
        return tasks * cfg.grad_accum
    if cfg.task_schedule == "mix":
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
    if "trtd" not in cfg.tasks:
        return None
    if len(cfg.tasks) == 1 or cfg.task_schedule == "mix":
        return 0
    if cfg.trtd_ratio <= 0:
        return None
    return max(0, math.ceil((1 - 1e-9) / cfg.trtd_ratio) - 1)  # the first s with int((s + 1) * r + 1e-9) >= 1
