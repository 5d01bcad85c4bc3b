"""models: the flex kernel of the gated relative bias against the materialised reference (CPU).

PyTorch runs compiled FlexAttention forward on CPU but has no backward there: the
backward is compared on a GPU by the GPU check's self-test (benchmarks/pretrain.py
``flex_self_test``), which refuses to time a flex path that differs."""

from __future__ import annotations

import pytest
import torch

from xylent.models.attention import FlexBias, RelativePositionTable, relative_buckets
from xylent.models.config import preset
from xylent.models.encoder import Encoder
from xylent.models.weight_init import init_weights


def encoders(gate: str, layers: int = 2):
    """(materialised, flex) encoders with the same weights."""
    torch.manual_seed(0)
    ref = Encoder(preset("tiny", gate=gate, attention="materialised"), layers, 0.0).apply(init_weights).eval()
    with torch.no_grad():  # a gate away from its start, so the gate's terms matter
        for m in ref.modules():
            if hasattr(m, "uv"):
                m.uv.weight.normal_()
                m.w.fill_(0.7)
        ref.rel.table.weight.normal_()
    flex = Encoder(preset("tiny", gate=gate, attention="flex"), layers, 0.0).eval()
    flex.load_state_dict(ref.state_dict())
    return ref, flex


def padded_batch(width: int = 130):
    """Rows of different real lengths, a width that is not a multiple of flex's block; the shapes of
    the GPU check's self-test on CPU, so its compiled kernel is reused (each compile costs ~25 s here)."""
    emb = torch.randn(2, width, 64)
    pad = torch.zeros(2, width, dtype=torch.bool)
    pad[1, 7:] = True
    return emb, pad


@pytest.mark.parametrize("gate", ["xlm-e", "wavlm"])
def test_flex_forward_equals_the_materialised_forward(gate):
    ref, flex = encoders(gate)
    emb, pad = padded_batch()
    with torch.no_grad():
        want, want_layers = ref(emb, pad, return_layers=True)
        got, got_layers = flex(emb, pad, return_layers=True)
    assert got.shape == want.shape and len(got_layers) == len(want_layers)
    real = ~pad  # padded positions' states are not read by anything; compare the real ones
    assert (got - want)[real].abs().max().item() < 1e-5
    for g, w in zip(got_layers, want_layers):
        assert g.shape == w.shape and (g - w)[real].abs().max().item() < 1e-5


def test_the_encoders_trace_as_one_graph_on_either_kernel():
    ref, flex = encoders("xlm-e")
    emb, pad = padded_batch()
    with torch.no_grad():
        for enc in (ref, flex):
            torch._dynamo.reset()
            ex = torch._dynamo.explain(enc)(emb, pad)
            assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex.break_reasons


def test_auto_is_materialised_on_cpu_and_flex_refuses_to_train_there():
    emb, pad = padded_batch()
    auto = Encoder(preset("tiny"), 1, 0.0)
    assert preset("tiny").attention == "auto" and not auto.uses_flex(emb)
    assert isinstance(auto.attention_inputs(emb, pad)[2], torch.Tensor)  # the (H, L, L) bias
    flex = Encoder(preset("tiny", attention="flex"), 1, 0.0)
    with pytest.raises(RuntimeError, match="flex trains on CUDA only"):
        flex(emb, pad)
    with torch.no_grad():
        x, p, rel = flex.attention_inputs(emb, pad)
    assert isinstance(rel, FlexBias) and x.shape[1] == p.shape[1] == 256 and p[:, 130:].all()
    with pytest.raises(ValueError, match="attention 'fast'"):
        preset("tiny", attention="fast")


def test_the_bucket_table_is_computed_once_and_saved_nowhere():
    table = RelativePositionTable(num_heads=3, max_position=300)
    assert set(table.state_dict()) == {"table.weight"}  # exports and checkpoints unchanged
    assert torch.equal(table.square[:77, :77], relative_buckets(77, 77))
    with torch.no_grad():
        d = table.distances()  # (H, 2P − 1): the bias at distance j − i
        full = table(300)
    i, j = 40, 250
    assert torch.equal(d[:, j - i + 299], full[:, i, j]) and torch.equal(d[:, i - j + 299], full[:, j, i])
    assert torch.equal(table(400), table.table(relative_buckets(400, 400)).permute(2, 0, 1))  # past P: computed


def test_the_materialised_bias_is_built_in_the_compute_dtype():
    ref, _ = encoders("xlm-e", layers=1)
    emb, pad = padded_batch(16)
    attn = ref.layers[0].attn
    x = ref.ln(emb)
    seen = {}
    hook = attn.gate.register_forward_hook(lambda m, args, out: seen.update(dtype=out.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        attn(x, ref.rel(16), pad)
    hook.remove()
    assert seen["dtype"] == torch.bfloat16  # not fp32 from the fp32 w and table


def test_the_gpu_checks_self_test_passes_here_on_the_forward():
    """benchmarks/pretrain.py's flex_self_test, which gates the GPU check's flex rows, runs on CPU too:
    forward only, in fp32 and bf16, and says so."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from pretrain import flex_self_test

    test = flex_self_test(torch.device("cpu"), "tiny")
    assert test["passed"] and test["backward"].startswith("not run")
    assert test["checks"]["fp32"]["forward"] < 1e-6 and test["checks"]["bf16"]["forward"] < 2e-2


def test_the_trainer_compiles_the_encoders_on_cuda_unless_told_otherwise():
    from types import SimpleNamespace

    from xylent.models.training.trainer import should_compile

    assert should_compile(SimpleNamespace(compile="auto"), cuda=True)
    assert not should_compile(SimpleNamespace(compile="auto"), cuda=False)  # CPU: Inductor's compile costs more
    assert should_compile(SimpleNamespace(compile="on"), cuda=False)
    assert not should_compile(SimpleNamespace(compile="off"), cuda=True)
