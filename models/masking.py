"""Which tokens to corrupt and with what, drawn from per-row noise.

Every random number a row needs (which positions to mask, the generator's
sample, BERT's 80/10/10 choice) comes from ``row_noise``: uniforms seeded by
(seed, step, micro-batch, the row's index in the *global* batch).  So a row is
corrupted the same way whichever rank holds it and whatever else is in its
batch: two ranks with ZeRO give the same losses as one rank with the same
global batch, and a resumed run continues exactly.
"""

from __future__ import annotations

import numpy as np
import torch

# uniforms per position: mask choice, sample / 80-10-10 choice, replacement token, and a plane for
# row-level choices (InfoXLM's mixup reads its first positions).  A row's planes are drawn one after
# the other, so adding a plane at the end leaves the earlier planes' values as they were.
PLANES = 4


def row_noise(seed: int, step: int, micro: int, rows: list[int], lengths: list[int], width: int) -> torch.Tensor:
    """(PLANES, B, width) uniforms; row k uses the stream of global row ``rows[k]``.
    Positions past a row's length (padding) get 2.0, which no threshold selects."""
    out = np.full((PLANES, len(rows), width), 2.0, dtype=np.float32)
    for k, (gi, n) in enumerate(zip(rows, lengths)):
        out[:, k, :n] = np.random.default_rng([seed, step, micro, gi]).random((PLANES, n), dtype=np.float32)
    return torch.from_numpy(out)


def maskable(ids: torch.Tensor, special_ids: tuple[int, ...]) -> torch.Tensor:
    """True where a token may be masked: anything but the tokenizer's special ids."""
    out = torch.ones_like(ids, dtype=torch.bool)
    for s in special_ids:
        out &= ids != s
    return out


def choose_masked(ids: torch.Tensor, segments: torch.Tensor | None, prob: float, noise: torch.Tensor,
                  special_ids: tuple[int, ...]) -> torch.Tensor:
    """Boolean mask of the positions to corrupt: round(prob × n) of each segment's n
    maskable tokens (at least one where a segment has any), the ones with the smallest noise."""
    can = maskable(ids, special_ids)
    noise = noise.masked_fill(~can, 2.0)
    chosen = torch.zeros_like(can)
    for s in ([None] if segments is None else [0, 1]):
        in_seg = can if s is None else can & (segments == s)
        n = in_seg.sum(dim=1)
        k = torch.where(n > 0, torch.clamp((n.float() * prob).round().long(), min=1), torch.zeros_like(n))
        ranks = noise.masked_fill(~in_seg, 2.0).argsort(dim=1, stable=True).argsort(dim=1)
        chosen |= (ranks < k[:, None]) & in_seg
    return chosen


def masked_count(ids: np.ndarray, segments: np.ndarray | None, prob: float, special_ids: tuple[int, ...]) -> int:
    """How many positions :func:`choose_masked` picks in the numpy batch ``ids``, computed on the host
    (the noise decides which, never how many): the step gathers that many rows without asking the
    device.  float32 and round-half-to-even, as torch computes the per-segment counts."""
    can = ~np.isin(ids, special_ids)
    total = 0
    for in_seg in ([can] if segments is None else [can & (segments == 0), can & (segments == 1)]):
        n = in_seg.sum(axis=1)
        k = np.rint(n.astype(np.float32) * np.float32(prob)).astype(np.int64)
        total += int(np.where(n > 0, np.maximum(k, 1), 0).sum())
    return total


def positions(where: torch.Tensor, k: int) -> torch.Tensor:
    """The flat positions of the ``k`` True entries of the (B, T) ``where``, in row-major order: what
    boolean indexing selects, as one fixed-size gather.  A stable sort, not ``nonzero``: ``k`` is known
    on the host (:func:`masked_count`, the batch's real tokens), so the device is never waited on."""
    return torch.argsort((~where.flatten()).to(torch.uint8), stable=True)[:k]


def sample_tokens(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of ``logits`` from softmax(logits) (temperature 1), by inverting
    the CDF at the uniforms ``u``: a multinomial sample whose randomness is ``u``."""
    probs = torch.softmax(logits.float(), dim=-1)
    cdf = probs.cumsum(dim=-1)
    idx = torch.searchsorted(cdf, (u.float() * cdf[:, -1]).unsqueeze(-1)).squeeze(-1)
    return idx.clamp(max=logits.shape[-1] - 1)


def corrupt(ids: torch.Tensor, at: torch.Tensor, sampled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Put the generator's samples at the flat positions ``at`` (distinct: a scatter with no order
    to depend on); a position is *replaced* only where the sample differs from the original."""
    corrupted = ids.flatten().scatter(0, at, sampled).view_as(ids)
    return corrupted, corrupted != ids


def bert_corrupt(ids: torch.Tensor, masked: torch.Tensor, noise: torch.Tensor, vocab_size: int, mask_id: int,
                 first_regular_id: int) -> torch.Tensor:
    """BERT's 80/10/10 on the chosen positions: <mask>, a random regular token (ids from
    ``first_regular_id``: the tokenizer puts its special pieces first), or unchanged."""
    choice, token = noise[1], noise[2]
    out = ids.clone()
    out[masked & (choice < 0.8)] = mask_id
    rand = masked & (choice >= 0.8) & (choice < 0.9)
    span = vocab_size - first_regular_id
    out[rand] = first_regular_id + (token[rand] * span).long().clamp(max=span - 1)
    return out
