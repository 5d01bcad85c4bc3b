"""A fresh fine-tunable model per seed from any encoder the evaluate stage
compares (xylent export, random-init copy, Hugging Face dir).

The bag of subwords has no weights to fine-tune: it gets no model (its row says
"not applicable"); the random-init encoder, fine-tuned the same way, is the
baseline a pretrained encoder must beat.
"""

from __future__ import annotations

from typing import Callable

import torch

from xylent.models.heads import Body, TaskModel
from xylent.tasks.evaluate.finetune.tokens import HuggingFaceTokenizer, SentencePieceTokenizer


def task_model(enc, kind: str, n_labels: int, seed: int) -> tuple[TaskModel, object]:
    """``enc``: a xylent.tasks.evaluate.encoders.SentenceEncoder holding its weights."""
    if enc.kind == "hf":
        body, tok = Body(enc.model, int(enc.model.config.hidden_size), True), HuggingFaceTokenizer(enc.tokenizer)
        # XLM-R declares 514 positions of which 512 are usable; its tokenizer knows the real limit
        limits = [getattr(enc.model.config, "max_position_embeddings", None),
                  getattr(enc.tokenizer, "model_max_length", None)]
        tok.max_positions = min((v for v in limits if isinstance(v, int) and 0 < v < 10**6), default=None)
    else:
        model = enc.model
        body = Body(model, model.config.hidden, False)
        tok = SentencePieceTokenizer(model.tokenizer, model.config.specials)
        tok.max_positions = model.config.max_position
    with torch.random.fork_rng(devices=[]):  # the head's initial weights depend on the seed only
        torch.manual_seed(seed)
        return TaskModel(body, kind, n_labels).to(next(body.parameters()).device).train(), tok


def factory(load: Callable[[], object], kind: str) -> Callable[[int, int], tuple] | None:
    """``load()`` -> a fresh SentenceEncoder; None for encoders without weights."""
    def make(seed: int, n_labels: int):
        return task_model(load(), kind, n_labels, seed)
    return make
