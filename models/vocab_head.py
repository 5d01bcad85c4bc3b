"""The generator's output layer over the whole vocabulary without a (masked × V) fp32 copy.

At V = 250 002 and 2 458 masked tokens (32 × 512 × 0.15) every fp32 (K, V) tensor is
2.5 GB, and the plain head made four: the logits in fp32, their log-softmax kept for
the backward, the softmax and its cumulative sum for sampling.  Here the forward runs
over chunks of rows, each chunk's logits in the compute dtype and its fp32 work freed
before the next; it keeps only each row's log-sum-exp.  The backward runs over chunks
of the vocabulary and recomputes the logits of all rows for that slice: each slice of
the embedding gradient is then one matrix product over the K rows, as before, and no
(V, H) fp32 buffer is needed for bf16 weights.

Per row, the loss is ``F.cross_entropy``'s, the sample the same inverse-CDF draw as
``xylent.models.masking.sample_tokens`` from the same uniform, and the prediction the same
argmax.  On the CPU, in chunks of 64 rows or more, they are bit-identical to the
unchunked head's (narrower chunks take another GEMM kernel, whose logits differ in
the last bit).  The gradient is softmax − one-hot as before, formed from the kept
log-sum-exp: equal within float rounding (tests/test_electra_step.py states how close).

Only a head too large to hold whole is chunked (:data:`WHOLE_LOGITS_ELEMENTS`): below it the
plain head is faster (the chunked backward computes the logits twice) and is the step that the
acceptance results were measured with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xylent.models.masking import sample_tokens

# the masked rows × V above which the head runs in chunks: 512 MiB per fp32 copy of the logits, of which the
# plain head holds about four.  Base size at 32k (2 458 × 32 000) stays plain; at V = 250 002, past 536 rows
WHOLE_LOGITS_ELEMENTS = 1 << 27
# elements of one chunk's logits: 128 MiB per fp32 copy, about three alive at once.  At V = 250 002
# that is 128 rows a chunk (a multiple of 64, for GPU tiles); at 32k, 1 024
CHUNK_ELEMENTS = 1 << 25


def rows_per_chunk(vocab: int, budget: int) -> int:
    rows = max(1, budget // vocab)
    return rows - rows % 64 if rows >= 64 else rows


class _TiedLogitsLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, target, u, budget: int, sample: bool):
        k, vocab = h.shape[0], weight.shape[0]
        loss = h.new_empty(k, dtype=torch.float32)
        lse = h.new_empty(k, dtype=torch.float32)
        sampled, predicted = torch.zeros_like(target), torch.empty_like(target)
        rows, ctx.dtype = rows_per_chunk(vocab, budget), h.dtype
        for a in range(0, k, rows):
            b = min(a + rows, k)
            logits = F.linear(h[a:b], weight, bias)
            lf, ctx.dtype = logits.float(), logits.dtype  # bf16 under autocast: the backward's too
            t = target[a:b, None]
            loss[a:b] = -torch.log_softmax(lf, dim=-1).gather(1, t).squeeze(1)
            # log-sum-exp = logit − log-probability at any token: at the target, two gathers, not a pass over V
            lse[a:b] = lf.gather(1, t).squeeze(1) + loss[a:b]
            predicted[a:b] = logits.argmax(-1)
            if sample:
                cdf = torch.softmax(lf, dim=-1).cumsum(dim=-1)
                at = torch.searchsorted(cdf, (u[a:b].float() * cdf[:, -1]).unsqueeze(-1)).squeeze(-1)
                sampled[a:b] = at.clamp(max=vocab - 1)
        ctx.save_for_backward(h, weight, bias, target, lse)
        ctx.budget = budget
        ctx.mark_non_differentiable(sampled, predicted)
        return loss, sampled, predicted

    @staticmethod
    def backward(ctx, dloss, _sampled, _predicted):
        h, weight, bias, target, lse = ctx.saved_tensors
        k, vocab = h.shape[0], weight.shape[0]
        # autocast is not on in a backward: the forward's compute dtype, explicitly
        hc, dt = h.to(ctx.dtype), ctx.dtype
        dh = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
        dweight, dbias = torch.empty_like(weight), torch.empty_like(bias)
        cols = max(1, ctx.budget // max(k, 1))
        dloss = dloss.float()
        for a in range(0, vocab, cols):
            b = min(a + cols, vocab)
            w = weight[a:b].to(dt)
            g = F.linear(hc, w, bias[a:b].to(dt)).float().sub_(lse[:, None]).exp_().mul_(dloss[:, None])
            inside = (target >= a) & (target < b)
            col = (target - a).clamp(0, b - a - 1)[:, None]
            g.scatter_add_(1, col, torch.where(inside, -dloss, 0.0)[:, None])  # one column a row: no race
            g = g.to(dt)
            if dt == weight.dtype:
                torch.mm(g.t(), hc, out=dweight[a:b])  # into the slice: no (V, H) copy
                torch.sum(g, 0, out=dbias[a:b])
            else:  # fp32 weights under autocast: their gradient, cast back
                dweight[a:b], dbias[a:b] = g.t() @ hc, g.sum(0)
            if dt == dh.dtype:
                dh.addmm_(g, w)
            else:  # bf16 products, summed over the slices in fp32
                dh += (g @ w).float()
        return dh.to(h.dtype), dweight, dbias, None, None, None, None



def generator_outputs(head, x: torch.Tensor, embedding: torch.Tensor, target: torch.Tensor, u: torch.Tensor, *,
                      sample: bool, per_token: bool):
    """The tied output layer ``head`` (xylent.models.electra.TiedLMHead) at the masked rows ``x``: (Σ cross-entropy,
    the per-token losses or None unless ``per_token``, the tokens sampled at the uniforms ``u`` or None
    unless ``sample``, the argmax).  While rows × V ≤ :data:`WHOLE_LOGITS_ELEMENTS` the logits are made
    whole, the very ops of the step before issue 61 (bit for bit on the CPU: what the acceptance replay
    holds); above it, in chunks (:func:`tied_lm_loss`)."""
    if x.shape[0] * embedding.shape[0] <= WHOLE_LOGITS_ELEMENTS:
        logits = head(x, embedding)
        tok = F.cross_entropy(logits.float(), target, reduction="none" if per_token else "sum")
        with torch.no_grad():  # no gradient through the sample
            sampled = sample_tokens(logits, u) if sample else None
            predicted = logits.argmax(-1)
        return (tok.sum(), tok) if per_token else (tok, None), sampled, predicted
    tok, sampled, predicted = tied_lm_loss(head.hidden(x), embedding, head.bias, target, u, sample=sample)
    return (tok.sum(), tok if per_token else None), (sampled if sample else None), predicted


def tied_lm_loss(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, target: torch.Tensor, u: torch.Tensor,
                 sample: bool = True, budget: int = CHUNK_ELEMENTS) -> tuple[torch.Tensor, ...]:
    """(cross-entropy per row in fp32, the token sampled at the uniform ``u`` (temperature 1; no
    gradient), the argmax) of the logits ``h @ weight.T + bias``, never all of them at once.
    ``sample=False``: no sampling, the samples are 0 (a replayed pass takes its replacements as given)."""
    return _TiedLogitsLoss.apply(h, weight, bias, target, u, budget, sample)
