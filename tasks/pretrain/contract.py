"""The pretrain stage's output contract.

    model/                 model.safetensors (embeddings + discriminator: the encoder downstream tasks use),
                           pretraining.safetensors (every weight), config.json, spm.model, spm.vocab;
                           read with :func:`xylent.models.pretrained.load_pretrained`
    train.json, metrics.jsonl (one line per step), train.log, loss_curves.png, report.md
    embedding_health.jsonl  the token embeddings' health at step 0 and each checkpoint (xylent.models.embedding_health;
                           none under ZeRO-3)
    init_report.json       with ``pretrain.init``: what the warm start matched (:mod:`xylent.tasks.pretrain.init_source`)
    snapshots/tokens-N/    with ``pretrain.snapshot_tokens``: the encoder at N tokens, as model/ but for
                           pretraining.safetensors; config.json's ``snapshot`` holds its step and tokens

Checkpoints stay outside it, in ``<ws>/pretrain/_checkpoints/<fingerprint>/``.
"""

from __future__ import annotations

import json
from pathlib import Path

from xylent.models.embedding_health import FILE as HEALTH_FILE  # noqa: F401  (the ranks write it, this stage copies it)

MODEL_DIR = "model"
SNAPSHOTS_DIR = "snapshots"
METRICS_FILE = "metrics.jsonl"
RUN_FILES = ("train.json", METRICS_FILE, "train.log")


def read_metrics(path: Path) -> list[dict]:
    """``metrics.jsonl``: one dict per logged step."""
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]
