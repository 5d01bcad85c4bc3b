"""models: gated relative position bias and the size presets (CPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from xylent.models.attention import GatedRelativeBias, RelativePositionTable, SelfAttention, relative_buckets
from xylent.models.config import PRESETS, EncoderConfig, preset
from xylent.models.weight_init import init_weights


def t5_bucket(rel: int, num_buckets: int = 32, max_distance: int = 128) -> int:
    """T5's bidirectional rule, written out for one relative position (j − i)."""
    half = num_buckets // 2
    bucket = half if rel > 0 else 0
    n = abs(rel)
    exact = half // 2
    if n < exact:
        return bucket + n
    large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (half - exact))
    return bucket + min(large, half - 1)


@pytest.mark.parametrize("buckets, distance", [(32, 128), (64, 256)])
def test_buckets_follow_the_t5_rule(buckets, distance):
    got = relative_buckets(300, 300, buckets, distance).numpy()
    for i in range(0, 300, 7):
        for j in range(0, 300, 5):
            assert got[i, j] == t5_bucket(j - i, buckets, distance)
    assert got.max() == buckets - 1 and got.min() == 0


@pytest.mark.parametrize("form", ["xlm-e", "wavlm"])
def test_gate_is_about_1_75_at_initialisation(form):
    torch.manual_seed(0)
    gate = GatedRelativeBias(num_heads=12, head_dim=64, form=form).apply(init_weights)  # as every model does
    x, q = torch.randn(4, 50, 12 * 64), torch.randn(4, 12, 50, 64)
    d = torch.ones(12, 50, 50)
    scale = gate(x, q, d)
    assert scale.mean().item() == pytest.approx(1.75, abs=0.01)
    assert (scale - 1.75).abs().max().item() < 0.1


def test_wavlm_gate_reads_the_layer_input_with_a_w_per_head():
    torch.manual_seed(1)
    heads, dh, n = 3, 8, 6
    gate = GatedRelativeBias(heads, dh, form="wavlm")
    with torch.no_grad():
        gate.uv.weight.normal_()
        gate.w.copy_(torch.tensor([0.5, 1.0, 2.0]))
    x = torch.randn(2, n, heads * dh)
    d = torch.randn(heads, n, n)
    got = gate(x, torch.randn(2, heads, n, dh), d).detach().numpy()  # the query is not read
    u, v = gate.uv.weight.detach().numpy()
    w = gate.w.detach().numpy()
    xs, ds = x.numpy(), d.numpy()
    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    for b in range(2):
        for h in range(heads):
            for i in range(n):
                xh = xs[b, i, h * dh:(h + 1) * dh]
                g_u, g_r = sig(xh @ u), sig(xh @ v)
                for j in range(n):
                    r = ds[h, i, j] + g_u * ds[h, i, j] + (1 - g_u) * w[h] * g_r * ds[h, i, j]
                    assert got[b, h, i, j] == pytest.approx(r, rel=1e-5, abs=1e-6)


def test_attention_is_xlm_e_eqs_6_to_9_written_out():
    """XLM-E §3.3, one element at a time: q, k, v = hW (6); g_u, g_r = σ(q_i·u), σ(q_i·v);
    r~ = w·g_r·d; r = d + g_u·d + (1 − g_u)·r~ (9); a_ij ∝ exp(q_i·k_j/√d_k + r_ij) (7);
    output = Σ_j a_ij v_j (8), then the output projection; padded keys get no weight."""
    torch.manual_seed(2)
    heads, dh, n = 2, 8, 5
    att = SelfAttention(hidden=heads * dh, heads=heads).eval()
    assert att.gate.form == "xlm-e" and att.gate.w.numel() == 1, "the paper's form is the default: one scalar w"
    with torch.no_grad():
        att.gate.uv.weight.normal_()
        att.gate.w.fill_(0.7)
    table = RelativePositionTable(num_heads=heads)
    x = torch.randn(1, n, heads * dh)
    pad = torch.tensor([[False, False, False, True, True]])
    d = table(n).detach().numpy()
    got = att(x, table(n), pad).detach().numpy()
    W, bias = att.qkv.weight.detach().numpy(), att.qkv.bias.detach().numpy()
    u, v = att.gate.uv.weight.detach().numpy()
    w = float(att.gate.w.detach())
    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    h_all = x[0].numpy()
    heads_out = np.zeros((n, heads * dh))
    for h in range(heads):
        rows = lambda part: slice(part * heads * dh + h * dh, part * heads * dh + (h + 1) * dh)  # noqa: E731
        q = h_all @ W[rows(0)].T + bias[rows(0)]
        k = h_all @ W[rows(1)].T + bias[rows(1)]
        val = h_all @ W[rows(2)].T + bias[rows(2)]
        for i in range(n):
            g_u, g_r = sig(q[i] @ u), sig(q[i] @ v)
            logits = []
            for j in range(n):
                r = d[h, i, j] + g_u * d[h, i, j] + (1 - g_u) * (w * g_r * d[h, i, j])
                logits.append(-np.inf if pad[0, j] else q[i] @ k[j] / math.sqrt(dh) + r)
            a = np.exp(np.array(logits) - max(logits))
            a /= a.sum()
            heads_out[i, h * dh:(h + 1) * dh] = a @ val
    want = heads_out @ att.out.weight.detach().numpy().T + att.out.bias.detach().numpy()
    assert np.abs(got[0] - want).max() < 1e-5
    x2 = x.clone()
    x2[0, 3:] = torch.randn(2, heads * dh)  # padding content must not matter to real positions
    assert torch.allclose(att(x2, table(n), pad)[0, :3], torch.from_numpy(got[0, :3]), atol=1e-5)


def test_a_wavlm_export_loads_as_wavlm_and_the_form_is_checked():
    old = {"encoder": {**preset("tiny").to_dict(), "specials": {}}, "specials": {"pad": 3}}
    del old["encoder"]["gate"]  # written before the field existed
    assert EncoderConfig.from_export(old).gate == "wavlm"
    assert preset("tiny").gate == "xlm-e"
    with pytest.raises(ValueError, match="gate 't5'"):
        preset("tiny", gate="t5")


def test_size_presets_follow_the_papers():
    assert (PRESETS["base"].layers, PRESETS["base"].hidden, PRESETS["base"].ffn, PRESETS["base"].heads) == (12, 768, 3072, 12)
    assert (PRESETS["large"].layers, PRESETS["large"].hidden, PRESETS["large"].ffn, PRESETS["large"].heads) == (24, 1024, 4096, 16)
    assert (PRESETS["xl"].layers, PRESETS["xl"].hidden, PRESETS["xl"].ffn, PRESETS["xl"].heads) == (48, 1536, 6144, 24)
    assert [PRESETS[s].generator_layers for s in ("base", "large", "xl")] == [4, 6, 8]
    assert preset("base", layers=6).layers == 6 and preset("base", layers=6).hidden == 768
    with pytest.raises(ValueError):
        preset("huge")
    with pytest.raises(ValueError):
        preset("tiny", heads=3)
    assert np.isclose(PRESETS["tiny"].head_dim * PRESETS["tiny"].heads, PRESETS["tiny"].hidden)
