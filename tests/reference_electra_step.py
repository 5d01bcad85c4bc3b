"""The ELECTRA step as it was before issue 61, kept ONLY as a test oracle.

Issue 61 rewrote models/electra.py's step without boolean indexing or host syncs and
with a chunked generator head (no masked × V fp32 copy).  The issue asks for the same
losses, gradients and sampled ids as the code it replaced; this file is that code's
arithmetic, copied from models/electra.py and models/masking.py at 3948a21 and
reading the model's parameters directly, so that later changes to the model's
modules cannot move the oracle along with them.  Nothing outside tests/ imports it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xylent.models.stats import Stats


def _maskable(ids, special_ids):
    out = torch.ones_like(ids, dtype=torch.bool)
    for s in special_ids:
        out &= ids != s
    return out


def _choose_masked(ids, segments, prob, noise, special_ids):
    can = _maskable(ids, special_ids)
    noise = noise.masked_fill(~can, 2.0)
    chosen = torch.zeros_like(can)
    for s in ([None] if segments is None else [0, 1]):
        in_seg = can if s is None else can & (segments == s)
        n = in_seg.sum(dim=1)
        k = torch.where(n > 0, torch.clamp((n.float() * prob).round().long(), min=1), torch.zeros_like(n))
        ranks = noise.masked_fill(~in_seg, 2.0).argsort(dim=1, stable=True).argsort(dim=1)
        chosen |= (ranks < k[:, None]) & in_seg
    return chosen


def _sample_tokens(logits, u):
    probs = torch.softmax(logits.float(), dim=-1)
    cdf = probs.cumsum(dim=-1)
    idx = torch.searchsorted(cdf, (u.float() * cdf[:, -1]).unsqueeze(-1)).squeeze(-1)
    return idx.clamp(max=logits.shape[-1] - 1)


def _row_sums(values, where):
    dense = torch.zeros(where.shape, dtype=torch.float32, device=values.device)
    dense[where] = values.float()
    return dense.sum(1)


def reference_forward(model, ids, pad, segments, noise, per_row=False, replay=None):
    """(Stats, corrupted ids, sampled ids) of the pre-issue-61 ElectraModel.forward on ``model``'s weights."""
    head, emb = model.generator_head, model.embeddings
    masked = _choose_masked(ids, segments, model.mask_prob, noise[0], model.special_ids)
    g_hidden = model.generator(emb(ids.masked_fill(masked, model.mask_id)), pad)
    g_logits = F.linear(head.ln(F.gelu(head.dense(g_hidden[masked]))), emb.tokens.weight, head.bias)
    target = ids[masked]
    if per_row:
        g_tok = F.cross_entropy(g_logits.float(), target, reduction="none")
        g_loss = g_tok.sum()
    else:
        g_loss = F.cross_entropy(g_logits.float(), target, reduction="sum")
    with torch.no_grad():
        sampled = _sample_tokens(g_logits, noise[1][masked]) if replay is None else replay[masked]
        g_correct = (g_logits.argmax(-1) == target).sum()
    corrupted = ids.clone()
    corrupted[masked] = sampled
    replaced = corrupted != ids
    d_logits = model.discriminator_head(model.discriminator(emb(corrupted), pad))
    real = ~pad
    y = replaced[real]
    if per_row:
        d_tok = F.binary_cross_entropy_with_logits(d_logits[real].float(), y.float(), reduction="none")
        d_loss = d_tok.sum()
    else:
        d_loss = F.binary_cross_entropy_with_logits(d_logits[real].float(), y.float(), reduction="sum")
    with torch.no_grad():
        pred = d_logits[real] > 0
        rows = None
        if per_row:
            rows = torch.stack([_row_sums(g_tok.detach(), masked), masked.sum(1).float(),
                                _row_sums(d_tok.detach(), real), real.sum(1).float(), replaced.sum(1).float()])
    st = Stats(g_loss, d_loss, masked.sum(), g_correct, real.sum(), (pred == y).sum(), (pred & y).sum(),
               pred.sum(), y.sum(), real.sum(), rows)
    return st, corrupted, sampled


def reference_loss(model, st, g_norm: float, d_norm: float):
    """ElectraModel.loss with the Python-float norms the trainer divided by before issue 61."""
    return st.g_loss / g_norm + model.disc_weight * st.d_loss / d_norm
