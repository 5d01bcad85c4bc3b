"""Self-attention with XLM-E's gated relative position bias.

The bias table d[bucket(j − i), head] uses T5's bidirectional log buckets; one
table is owned by the first layer and shared by every layer.  Each layer gates
it per head and query position (XLM-E §3.3, Eq. 9):

    g_u, g_r = σ(q_i·u), σ(q_i·v)
    r = d + g_u·d + (1 − g_u)·w·g_r·d

``gate: xlm-e`` (the default) is the paper's form: the gates read the projected
query q_i of each head, and w is one learnable scalar.  ``gate: wavlm`` is the
form WavLM's code uses and xylent trained before: the gates read the layer
input split into heads, with a w per head; exports without a ``gate`` field
were trained with it.  w starts at 1, so at initialisation (g ≈ ½) the gate
multiplies d by ≈ 1.75.  The bias is added before the softmax through PyTorch's
scaled-dot-product attention.  Weights are initialised N(0, 0.02).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def relative_buckets(query_len: int, key_len: int, num_buckets: int = 32, max_distance: int = 128,
                     device=None) -> torch.Tensor:
    """T5 bidirectional buckets of j − i, shape (query_len, key_len)."""
    ctx = torch.arange(query_len, device=device)[:, None]
    mem = torch.arange(key_len, device=device)[None, :]
    rel = mem - ctx
    half = num_buckets // 2
    buckets = (rel > 0).long() * half
    rel = rel.abs()
    exact = half // 2
    small = rel < exact
    large = exact + (torch.log(rel.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                     * (half - exact)).long()
    large = torch.minimum(large, torch.full_like(large, half - 1))
    return buckets + torch.where(small, rel, large)


class RelativePositionTable(nn.Module):
    """d[bucket, head]: owned by the first layer, shared by all."""

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128):
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.table = nn.Embedding(num_buckets, num_heads)

    def forward(self, length: int) -> torch.Tensor:
        """(heads, length, length) bias."""
        b = relative_buckets(length, length, self.num_buckets, self.max_distance, device=self.table.weight.device)
        return self.table(b).permute(2, 0, 1)


GATE_FORMS = ("xlm-e", "wavlm")


class GatedRelativeBias(nn.Module):
    """Per-layer gate of the shared table, in one of ``GATE_FORMS``."""

    def __init__(self, num_heads: int, head_dim: int, form: str = "xlm-e"):
        super().__init__()
        if form not in GATE_FORMS:
            raise ValueError(f"gate form {form!r} is not one of {GATE_FORMS}")
        self.num_heads, self.head_dim, self.form = num_heads, head_dim, form
        self.uv = nn.Linear(head_dim, 2, bias=False)  # u and v
        self.w = nn.Parameter(torch.ones(num_heads if form == "wavlm" else 1))

    def forward(self, x: torch.Tensor, q: torch.Tensor, d: torch.Tensor,
                pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, L, H·Dh) attention input; q: (B, H, L, Dh) projected queries; d: (H, L, L)
        -> gated bias (B, H, L, L), with -inf at padded keys when ``pad_mask`` (B, L) is given."""
        b, n, _ = x.shape
        src = q if self.form == "xlm-e" else x.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        g = torch.sigmoid(self.uv(src))  # (B, H, L, 2)
        g_u, g_r = g[..., 0:1], g[..., 1:2]  # gate per query position: broadcast over keys
        w = self.w.view(1, -1, 1, 1)  # one per head (wavlm) or one for all (xlm-e)
        scale = 1 + g_u + (1 - g_u) * w * g_r
        if pad_mask is None:
            return scale * d.unsqueeze(0)
        # one pass over the (B, H, L, L) tensor: padding's -inf added in the same kernel
        pad = torch.zeros(pad_mask.shape, dtype=d.dtype, device=d.device).masked_fill(pad_mask, float("-inf"))
        return torch.addcmul(pad[:, None, None, :], scale, d.unsqueeze(0))


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float = 0.0, relative_bias: bool = True,
                 gate: str = "xlm-e"):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.gate = GatedRelativeBias(heads, self.head_dim, gate) if relative_bias else None
        self.dropout = dropout

    def forward(self, x: torch.Tensor, rel: torch.Tensor | None, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, L, D); rel: (H, L, L) shared table output (None without relative bias);
        pad_mask: (B, L) True where padding."""
        b, n, dim = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.gate is not None:
            bias = self.gate(x, q, rel, pad_mask)
        else:  # a boolean mask: True where attention is allowed
            bias = None if pad_mask is None else ~pad_mask[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(b, n, dim))
