"""ELECTRA-style pretraining as XLM-E / XY-LENT do it.

- Masking: 15 % of the non-special tokens, uniformly (not spans); <s>, </s>,
  <pad> (and every other control id) are never masked.  TRTD masks each side of
  the pair separately (15 % of each).
- Generator G (no dropout, as XY-LENT following COCO-LM): MLM on the masked
  input.  Its prediction is *sampled* (multinomial, temperature 1, no gradient
  through the sample) to corrupt the input.
- Discriminator D: replaced-token detection on the corrupted input, over every
  non-pad token; a sample equal to the original counts as original.
- Loss = L_G + λ·L_D, λ = 50.  Token and position embeddings are shared.
- Ablations: ``mlm`` / ``tlm`` objectives with BERT's 80/10/10 corruption.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.config import EncoderConfig
from models.encoder import Embeddings, Encoder

SPECIAL_IDS = (0, 1, 2, 3, 4)  # <unk> is maskable text in principle, but never worth predicting
MASK_ID = 4


def maskable(ids: torch.Tensor, special_ids=SPECIAL_IDS) -> torch.Tensor:
    out = torch.ones_like(ids, dtype=torch.bool)
    for s in special_ids:
        out &= ids != s
    return out


def choose_masked(ids: torch.Tensor, segments: torch.Tensor | None, prob: float, generator: torch.Generator | None,
                  special_ids=SPECIAL_IDS) -> torch.Tensor:
    """Boolean mask of positions to corrupt: ``prob`` of each segment's maskable tokens
    (at least one where a segment has any), chosen uniformly."""
    can = maskable(ids, special_ids)
    noise = torch.rand(ids.shape, generator=generator, device=ids.device)
    noise = noise.masked_fill(~can, 2.0)
    chosen = torch.zeros_like(can)
    segs = [None] if segments is None else [0, 1]
    for s in segs:
        in_seg = can if s is None else can & (segments == s)
        n = in_seg.sum(dim=1)
        k = torch.where(n > 0, torch.clamp((n.float() * prob).round().long(), min=1), torch.zeros_like(n))
        seg_noise = noise.masked_fill(~in_seg, 2.0)
        ranks = seg_noise.argsort(dim=1).argsort(dim=1)
        chosen |= (ranks < k[:, None]) & in_seg
    return chosen


def corrupt(ids: torch.Tensor, masked: torch.Tensor, sampled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Put the generator's samples at the masked positions; a position is *replaced*
    only where the sample differs from the original."""
    corrupted = ids.clone()
    corrupted[masked] = sampled
    return corrupted, corrupted != ids


class Head(nn.Module):
    def __init__(self, hidden: int, out: int):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.ln = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, out)
        for lin in (self.dense, self.out):
            nn.init.normal_(lin.weight, std=0.02)
            nn.init.zeros_(lin.bias)

    def forward(self, x):
        return self.out(self.ln(F.gelu(self.dense(x))))


@dataclass
class Losses:
    loss: torch.Tensor
    generator: torch.Tensor
    discriminator: torch.Tensor
    generator_accuracy: torch.Tensor
    replaced: torch.Tensor  # D targets (1 = replaced) over non-pad tokens
    predicted: torch.Tensor  # D predictions over the same tokens


class ElectraModel(nn.Module):
    def __init__(self, cfg: EncoderConfig, disc_weight: float = 50.0):
        super().__init__()
        self.cfg, self.disc_weight = cfg, disc_weight
        self.embeddings = Embeddings(cfg)
        self.generator = Encoder(cfg, cfg.generator_layers, dropout=0.0)
        self.generator_head = Head(cfg.hidden, cfg.vocab_size)
        self.discriminator = Encoder(cfg, cfg.layers, dropout=cfg.dropout)
        self.discriminator_head = Head(cfg.hidden, 1)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor, segments: torch.Tensor | None = None,
                generator: torch.Generator | None = None, mask_prob: float = 0.15) -> Losses:
        masked = choose_masked(ids, segments, mask_prob, generator)
        g_in = ids.masked_fill(masked, MASK_ID)
        g_logits = self.generator_head(self.generator(self.embeddings(g_in), pad))
        g_loss = F.cross_entropy(g_logits[masked], ids[masked])
        with torch.no_grad():  # no gradient through the sample
            probs = F.softmax(g_logits[masked].float(), dim=-1)
            sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            g_acc = (g_logits[masked].argmax(-1) == ids[masked]).float().mean()
        corrupted, replaced = corrupt(ids, masked, sampled)
        d_logits = self.discriminator_head(self.discriminator(self.embeddings(corrupted), pad)).squeeze(-1)
        real = ~pad
        d_loss = F.binary_cross_entropy_with_logits(d_logits[real], replaced[real].float())
        return Losses(g_loss + self.disc_weight * d_loss, g_loss, d_loss, g_acc, replaced[real],
                      (d_logits[real] > 0))

    def encoder(self):
        """The discriminator, what downstream tasks use."""
        return self.discriminator
