"""models: gated relative position bias and the size presets (CPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.attention import GatedRelativeBias, RelativePositionTable, SelfAttention, relative_buckets
from models.config import PRESETS, preset
from models.init import init_weights


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


def test_gate_is_about_1_75_at_initialisation():
    torch.manual_seed(0)
    gate = GatedRelativeBias(num_heads=12, head_dim=64).apply(init_weights)  # as every model initialises it
    x = torch.randn(4, 50, 12 * 64)
    d = torch.ones(12, 50, 50)
    scale = gate(x, d)
    assert scale.mean().item() == pytest.approx(1.75, abs=0.01)
    assert (scale - 1.75).abs().max().item() < 0.1


def test_gated_bias_equals_the_formula_on_random_input():
    torch.manual_seed(1)
    heads, dh, n = 3, 8, 6
    gate = GatedRelativeBias(heads, dh)
    with torch.no_grad():
        gate.uv.weight.normal_()
        gate.w.copy_(torch.tensor([0.5, 1.0, 2.0]))
    x = torch.randn(2, n, heads * dh)
    d = torch.randn(heads, n, n)
    got = gate(x, d).detach().numpy()
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


def test_attention_adds_the_bias_before_the_softmax_and_masks_padding():
    torch.manual_seed(2)
    att = SelfAttention(hidden=16, heads=2).eval()
    table = RelativePositionTable(num_heads=2)
    x = torch.randn(1, 5, 16)
    pad = torch.tensor([[False, False, False, True, True]])
    rel = table(5)
    got = att(x, rel, pad)
    q, k, v = att.qkv(x).view(1, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
    scores = q @ k.transpose(-1, -2) / math.sqrt(8) + att.gate(x, rel)
    scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
    want = att.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(1, 5, 16))
    assert torch.allclose(got, want, atol=1e-5)
    x2 = x.clone()
    x2[0, 3:] = torch.randn(2, 16)  # padding content must not matter to real positions
    assert torch.allclose(att(x2, rel, pad)[0, :3], got[0, :3], atol=1e-5)


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
