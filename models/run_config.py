"""train.json: everything one training run needs, written by the pretrain flow
and read by every rank (plain JSON, so a Slurm job can be launched from it)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path


@dataclass
class TrainConfig:
    shards_dir: str
    sampling_dir: str
    checkpoint_dir: str
    metrics_file: str
    deepspeed_config: str
    model: dict
    objective: str = "electra"
    tasks: list[str] = field(default_factory=lambda: ["mrtd", "trtd"])
    task_schedule: str = "alternate"
    trtd_ratio: float = 0.5
    steps: int = 100
    batch_size: int = 8           # global: all ranks together
    trtd_max_tokens: int = 2048   # global
    grad_accum: int = 1
    lr: float = 8e-4
    warmup_steps: int = 10
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    weight_decay: float = 0.01
    clip: float = 2.0
    disc_weight: float = 50.0
    mask_prob: float = 0.15
    zero_stage: int = 2
    precision: str = "auto"
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    seed: int = 0
    log_every: int = 10
    mlflow_tracking_uri: str | None = None
    mlflow_run_id: str | None = None
    system_metrics: bool = True
    system_metrics_interval: float = 10.0
    peak_tflops: float | None = None

    @classmethod
    def load(cls, path: str | Path) -> "TrainConfig":
        data = json.loads(Path(path).read_text())
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{path}: unknown train.json keys {sorted(unknown)}")
        return cls(**data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2))
