"""Task heads for fine-tuning an encoder (XTREME's three shapes).

- classification: the first token's state ([CLS] / ``<s>``) -> dropout -> dense
  -> tanh -> dropout -> labels (RoBERTa's / XLM-R's head);
- tagging: dropout -> a label per token (trained and read on first sub-tokens);
- qa: a start and an end logit per token (BERT's span head).

The body is any module mapping (ids, mask) to last hidden states; both the
xylent encoder and a Hugging Face ``AutoModel`` fit through :class:`Body`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IGNORE = -100  # target of positions that carry no label (specials, later sub-tokens, padding)


class Body(nn.Module):
    """(ids, mask) -> last hidden state (B, L, H) of a xylent or Hugging Face encoder."""

    def __init__(self, encoder: nn.Module, hidden: int, huggingface: bool):
        super().__init__()
        self.encoder, self.hidden, self.huggingface = encoder, hidden, huggingface

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.huggingface:
            return self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        return self.encoder(ids, mask)


class TaskModel(nn.Module):
    def __init__(self, body: Body, kind: str, n_labels: int, dropout: float = 0.1):
        super().__init__()
        self.body, self.kind = body, kind
        h = body.hidden
        self.drop = nn.Dropout(dropout)
        if kind == "classification":
            self.dense, self.out = nn.Linear(h, h), nn.Linear(h, n_labels)
        elif kind == "tagging":
            self.out = nn.Linear(h, n_labels)
        elif kind == "qa":
            self.out = nn.Linear(h, 2)
        else:
            raise ValueError(f"unknown head kind {kind!r}")
        for m in (getattr(self, "dense", None), self.out):  # the encoder keeps its (pretrained) weights
            if m is not None:
                nn.init.normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """classification (B, labels); tagging (B, L, labels); qa (B, L, 2)."""
        h = self.body(ids, mask)
        if self.kind == "classification":
            return self.out(self.drop(torch.tanh(self.dense(self.drop(h[:, 0])))))
        return self.out(self.drop(h))

    def loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        logits = logits.float()
        if self.kind == "classification":
            return F.cross_entropy(logits, batch["label"])
        if self.kind == "tagging":
            return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE)
        # padded positions can never be the answer
        masked = logits.masked_fill((batch["mask"] == 0).unsqueeze(-1), torch.finfo(torch.float32).min)
        return (F.cross_entropy(masked[..., 0], batch["start"]) + F.cross_entropy(masked[..., 1], batch["end"])) / 2
