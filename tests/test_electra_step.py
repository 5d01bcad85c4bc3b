"""Issue 61's ELECTRA step: the same losses, gradients, sampled and corrupted ids as the step
it replaced (kept as an oracle in tests/reference_electra_step.py), with no boolean indexing,
host reads or graph breaks, and a generator head that never holds a (masked × V) fp32 copy.

With the generator's logits small enough to make whole (xylent.models.vocab_head.WHOLE_LOGITS_ELEMENTS,
every CPU run the acceptance tier measured), everything is bit-identical on the CPU: every count of
Stats, the per-row rows, the sampled and corrupted ids, both losses and every gradient, because the
same values are gathered by positions instead of boolean masks and go through the same ops.

Above it (the full vocabulary at real batch sizes) the head runs in chunks: counts, rows, samples,
corrupted ids and the discriminator's gradients stay bit-identical; the losses within 1e-6 relative
and the other gradients (generator, its head, the shared embeddings) within 1e-5 of each tensor's
largest entry (measured ≤ 1e-6): the chunked backward forms softmax − one-hot from each row's kept
log-sum-exp instead of log_softmax's backward, and sums the embedding gradient a vocabulary slice
at a time.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from xylent.models.config import preset
from xylent.models.electra import ElectraModel
from xylent.models.masking import choose_masked, masked_count, row_noise, sample_tokens
from xylent.models.stats import Norms, Stats
from xylent.models import vocab_head
from xylent.models.vocab_head import tied_lm_loss
from reference_electra_step import reference_forward, reference_loss

SPECIALS = dict(zip(("unk", "bos", "eos", "pad", "mask"), range(5)))
SPECIAL_IDS = tuple(sorted(SPECIALS.values()))
BOS, EOS, PAD = SPECIALS["bos"], SPECIALS["eos"], SPECIALS["pad"]
COUNTS = [f for f in Stats.fields() if f not in Stats.SUMS]


def _model(vocab: int = 300, relative_bias: bool = True) -> ElectraModel:
    torch.manual_seed(0)
    return ElectraModel(preset("tiny", vocab_size=vocab, max_position=128, dropout=0.0, specials=SPECIALS,
                               relative_bias=relative_bias))


def _batch(seed: int, trtd: bool, vocab: int = 300, rows: int = 6, width: int = 48):
    """Rows of different lengths (padding), one of them ``<s> </s>`` alone (nothing to mask);
    TRTD rows are ``<s> x </s> y </s>`` with segment ids."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (rows, width), generator=g)
    lengths = torch.randint(min(8, width), width + 1, (rows,), generator=g).tolist()
    lengths[0], lengths[1] = width, 2
    seg = torch.zeros_like(ids, dtype=torch.int8)
    for r, n in enumerate(lengths):
        ids[r, 0], ids[r, n - 1], ids[r, n:] = BOS, EOS, PAD
        if trtd and n > 4:
            ids[r, n // 2] = EOS
            seg[r, n // 2 + 1: n] = 1
    pad = ids == PAD
    noise = row_noise(seed, 3, 1, [2 * r for r in range(rows)], lengths, width)
    return ids, pad, (seg if trtd else None), noise


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _both(model, ids, pad, seg, noise, per_row, replay=None):
    """(new Stats, new corrupted, new grads, new loss), (old Stats, old corrupted, old grads, old loss)."""
    counts = model.host_counts(ids.numpy(), None if seg is None else seg.numpy(), (~pad).numpy())
    model.zero_grad()
    st = model(ids, pad, seg, noise, per_row=per_row, replay=replay, **counts)
    loss = model.loss(st, Norms.from_reduced(torch.cat([st.sums(), st.counts()]), 1))
    loss.backward()
    new = st, model.corrupted, _grads(model), loss.detach()
    model.zero_grad()
    ref, corrupted, _ = reference_forward(model, ids, pad, seg, noise, per_row=per_row, replay=replay)
    ref_loss = reference_loss(model, ref, max(float(ref.g_count), 1.0), max(float(ref.d_count), 1.0))
    ref_loss.backward()
    return new, (ref, corrupted, _grads(model), ref_loss.detach())


def _assert_equal_step(new, old, chunked: bool = False):
    (st, corrupted, grads, loss), (ref, ref_corrupted, ref_grads, ref_loss) = new, old
    assert torch.equal(corrupted, ref_corrupted), "the same samples at the same positions"
    for f in COUNTS:
        got, want = getattr(st, f), getattr(ref, f)
        assert (got is None and want is None) or torch.equal(got, want), f
    if ref.rows is not None:
        assert torch.equal(st.rows, ref.rows), "the per-row losses and counts, bit for bit"
    assert sorted(grads) == sorted(ref_grads)
    if not chunked:
        for f in ("g_loss", "d_loss"):
            assert torch.equal(getattr(st, f), getattr(ref, f)), f
        assert torch.equal(loss, ref_loss)
        for name, want in ref_grads.items():
            assert torch.equal(grads[name], want), name
        return
    for f in ("g_loss", "d_loss"):
        torch.testing.assert_close(getattr(st, f), getattr(ref, f), rtol=1e-6, atol=0)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    for name, want in ref_grads.items():
        if name.startswith("discriminator"):
            assert torch.equal(grads[name], want), name
        else:
            torch.testing.assert_close(grads[name], want, rtol=0, atol=1e-5 * float(want.abs().max()), msg=name)


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("trtd", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_step_equals_the_one_before_issue_61(seed, trtd, per_row):
    model = _model()
    _assert_equal_step(*_both(model, *_batch(seed, trtd), per_row))


@pytest.mark.parametrize("per_row", [False, True])
def test_a_replayed_pass_equals_the_one_before_issue_61(per_row):
    model = _model()
    ids, pad, seg, noise = _batch(5, True)
    replay = torch.randint(5, 300, ids.shape, generator=torch.Generator().manual_seed(9))
    _assert_equal_step(*_both(model, ids, pad, seg, noise, per_row, replay=replay))


def test_the_full_vocabulary_in_chunks_both_ways_equals_the_step_before_issue_61(monkeypatch):
    """V = 250 002 and 200+ masked rows, with the whole-logits limit lowered below them (at the default, base
    size's 2 458 rows): the head's forward runs two chunks of rows, its backward two slices of the vocabulary,
    and the step still equals the one-shot head's."""
    monkeypatch.setattr(vocab_head, "WHOLE_LOGITS_ELEMENTS", 1 << 20)
    model = _model(vocab=250_002)
    ids, pad, seg, noise = _batch(3, False, vocab=250_002, rows=12, width=128)
    new, old = _both(model, ids, pad, seg, noise, per_row=False)
    assert int(new[0].g_count) > 128, "more masked rows than one chunk holds"
    _assert_equal_step(new, old, chunked=True)


def test_base_size_keeps_the_whole_head_and_the_full_vocabulary_does_not():
    """The choice the step makes at base size (32 × 512 tokens, 2 458 masked): whole logits at 32k, chunks at
    250 002 (a whole fp32 copy there is 2.5 GB)."""
    assert 2458 * 32_000 <= vocab_head.WHOLE_LOGITS_ELEMENTS < 2458 * 250_002


def _head_inputs(k: int = 200, vocab: int = 1000, hidden: int = 16):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(k, hidden, generator=g, requires_grad=True)
    weight = torch.randn(vocab, hidden, generator=g, requires_grad=True)
    bias = torch.randn(vocab, generator=g, requires_grad=True)
    return h, weight, bias, torch.randint(0, vocab, (k,), generator=g), torch.rand(k, generator=g)


def test_the_chunked_head_is_the_plain_head_row_for_row_whatever_the_chunks():
    """Chunks of 64 rows or more (what ``rows_per_chunk`` gives up to V = 524 288): the losses bit for
    bit.  Narrower chunks (a test's budgets only) take another GEMM kernel, whose logits round
    differently in the last bit: the losses within 1e-6, the samples and argmaxes still the same here."""
    h, weight, bias, target, u = _head_inputs()
    logits = torch.nn.functional.linear(h, weight, bias)
    want = torch.nn.functional.cross_entropy(logits, target, reduction="none")
    want.sum().backward()
    want_grads = [t.grad.clone() for t in (h, weight, bias)]
    for budget in (1 << 25, 64 * 1000, 5000, 7):  # one chunk; 64 rows a chunk; 5; a row a chunk, 7 tokens a slice
        for t in (h, weight, bias):
            t.grad = None
        loss, sampled, predicted = tied_lm_loss(h, weight, bias, target, u, budget=budget)
        if budget >= 64 * 1000:
            assert torch.equal(loss, want.detach()), budget
        torch.testing.assert_close(loss, want.detach(), rtol=1e-6, atol=0)
        assert torch.equal(sampled, sample_tokens(logits.detach(), u)), budget
        assert torch.equal(predicted, logits.argmax(-1)), budget
        loss.sum().backward()
        for got, ref in zip((h.grad, weight.grad, bias.grad), want_grads):
            torch.testing.assert_close(got, ref, rtol=0, atol=1e-5 * float(ref.abs().max()))


class _LargestFloat32(TorchDispatchMode):
    """The most elements of any fp32 tensor an op returned while it was on."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.largest = max(self.largest, t.numel())
        return out


def test_no_masked_by_vocabulary_fp32_tensor_exists_forward_or_backward():
    h, weight, bias, target, u = _head_inputs(k=256, vocab=4000)
    budget = 1 << 16  # 16 rows of logits a chunk forward, 256 tokens a slice backward
    with _LargestFloat32() as seen:
        loss, _, _ = tied_lm_loss(h, weight, bias, target, u, budget=budget)
        loss.sum().backward()
    assert seen.largest <= max(budget, weight.numel()), seen.largest  # the embedding's own gradient is V × H
    assert seen.largest < 256 * 4000 // 4
    with _LargestFloat32() as plain:
        torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, weight, bias), target).backward()
    assert plain.largest == 256 * 4000, "what the probe sees in the one-shot head"


@pytest.mark.parametrize("prob", [0.15, 0.5, 0.1])
def test_the_host_counts_the_positions_the_device_masks(prob):
    g = torch.Generator().manual_seed(1)
    for trial in range(30):
        ids, pad, seg, noise = _batch(trial, trial % 2 == 1, rows=8, width=int(torch.randint(3, 90, (1,), generator=g)))
        masked = choose_masked(ids, seg, prob, noise[0], SPECIAL_IDS)
        got = masked_count(ids.numpy(), None if seg is None else seg.numpy(), prob, SPECIAL_IDS)
        assert got == int(masked.sum()), (trial, prob)
    n = np.arange(0, 5000)  # every segment size, the .5 cases among them: float32 and round-half-to-even as torch
    ids = np.where(np.arange(5000)[None, :] < n[:, None], 7, PAD)
    per_row = [masked_count(ids[i: i + 1], None, prob, SPECIAL_IDS) for i in range(0, 5000, 7)]
    want = torch.where(torch.from_numpy(n[::7]) > 0,
                       (torch.from_numpy(n[::7]).float() * prob).round().long().clamp(min=1), 0).tolist()
    assert per_row == want


def test_the_step_has_one_graph_and_no_break_and_compiles_whole_with_its_backward():
    """``torch._dynamo.explain`` on the whole forward (TRTD rows, padding): one graph, no break —
    no boolean indexing, ``nonzero`` or read of a device value; then the forward and the head's
    backward compiled with ``fullgraph=True`` give the eager step's loss and gradients."""
    model = _model(relative_bias=False)
    ids, pad, seg, noise = _batch(0, True)
    counts = model.host_counts(ids.numpy(), seg.numpy(), (~pad).numpy())
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(ids, pad, seg, noise, **counts)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        [r.reason for r in explained.break_reasons]

    def step(module):
        model.zero_grad()
        st = module(ids, pad, seg, noise, **counts)
        loss = model.loss(st, Norms(st.g_count.float().clamp(min=1), st.d_count.float().clamp(min=1)))
        loss.backward()
        return loss.detach(), _grads(model)

    loss, grads = step(model)
    compiled_loss, compiled_grads = step(torch.compile(model, backend="aot_eager", fullgraph=True))
    torch._dynamo.reset()
    assert torch.equal(loss, compiled_loss)
    for name, g in grads.items():
        torch.testing.assert_close(compiled_grads[name], g, rtol=1e-6, atol=1e-7, msg=name)


def test_under_autocast_the_backward_runs_in_the_forwards_dtype():
    """The trainer's bf16 at ZeRO 0 is torch's autocast, which a backward does not run under: the head's
    recomputed logits are cast to the forward's dtype explicitly, as the unchunked head's backward ran."""
    h, weight, bias, target, u = _head_inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = torch.nn.functional.linear(h, weight, bias)
        want = torch.nn.functional.cross_entropy(logits.float(), target, reduction="none")
    want.sum().backward()
    want_grads = [t.grad.clone() for t in (h, weight, bias)]
    for t in (h, weight, bias):
        t.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, sampled, predicted = tied_lm_loss(h, weight, bias, target, u, budget=64 * 1000)
    assert torch.equal(loss, want.detach()) and torch.equal(sampled, sample_tokens(logits.detach(), u))
    assert torch.equal(predicted, logits.argmax(-1))
    loss.sum().backward()
    for got, ref in zip((h.grad, weight.grad, bias.grad), want_grads):
        assert got.dtype == ref.dtype == torch.float32
        # bf16 products rounded in another order: 4e-3 of the largest entry seen, bf16 itself 8e-3 from fp32
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-2 * float(ref.abs().max()))
