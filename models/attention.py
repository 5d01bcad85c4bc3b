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
multiplies d by ≈ 1.75.  Weights are initialised N(0, 0.02).

Two kernels add the bias before the softmax (``EncoderConfig.attention``):

- ``materialised``: the gated bias is built as a (B, H, L, L) tensor in the compute
  dtype, padded keys at −inf, and passed to PyTorch's scaled-dot-product attention as a
  float mask.  The reference, the CPU path, and the only one with attention dropout.
- ``flex``: FlexAttention (compiled) adds gate[b, h, q] · dist[h, kv − q] inside the
  kernel from a (B, H, L) gate and an (H, 2P − 1) table of the bias per distance, with
  padding as a block mask; nothing L × L is stored.  No attention dropout, and its
  bias gradients are atomic adds, so GPU runs agree run to run within a tolerance,
  not bitwise.  CUDA only for training (PyTorch has no FlexAttention backward on CPU).
- ``auto`` (the default): flex on CUDA, materialised elsewhere.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

ATTENTION_KERNELS = ("auto", "flex", "materialised")
FLEX_BLOCK = 128  # FlexAttention's block: flex rows are padded to a multiple, so widths compile once each


def bucket_of(rel: torch.Tensor, num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's bidirectional bucket of each relative position j − i in ``rel``."""
    half = num_buckets // 2
    buckets = (rel > 0).long() * half
    rel = rel.abs()
    exact = half // 2
    small = rel < exact
    large = exact + (torch.log(rel.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                     * (half - exact)).long()
    large = torch.minimum(large, torch.full_like(large, half - 1))
    return buckets + torch.where(small, rel, large)


def relative_buckets(query_len: int, key_len: int, num_buckets: int = 32, max_distance: int = 128,
                     device=None) -> torch.Tensor:
    """T5 bidirectional buckets of j − i, shape (query_len, key_len)."""
    rel = torch.arange(key_len, device=device)[None, :] - torch.arange(query_len, device=device)[:, None]
    return bucket_of(rel, num_buckets, max_distance)


class RelativePositionTable(nn.Module):
    """d[bucket, head]: owned by the first layer, shared by all.  The buckets depend on j − i
    alone, so they are computed once for ``max_position`` (buffers, not saved) and sliced."""

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128, max_position: int = 512):
        super().__init__()
        self.num_buckets, self.max_distance, self.max_position = num_buckets, max_distance, max_position
        self.table = nn.Embedding(num_buckets, num_heads)
        self.register_buffer("square", relative_buckets(max_position, max_position, num_buckets, max_distance),
                             persistent=False)
        self.register_buffer("by_distance", bucket_of(torch.arange(1 - max_position, max_position),
                                                      num_buckets, max_distance), persistent=False)

    def forward(self, length: int) -> torch.Tensor:
        """(heads, length, length) bias."""
        b = (self.square[:length, :length] if length <= self.max_position else
             relative_buckets(length, length, self.num_buckets, self.max_distance, device=self.table.weight.device))
        return self.table(b).permute(2, 0, 1)

    def distances(self) -> torch.Tensor:
        """(heads, 2·max_position − 1): the bias at distance j − i, read at [h, j − i + max_position − 1]."""
        return self.table(self.by_distance).t()


class FlexBias(NamedTuple):
    """What every layer of one flex forward shares: the bias per distance and the padding's block mask."""

    distances: torch.Tensor  # (H, 2P − 1), RelativePositionTable.distances
    offset: int              # P − 1: index of distance 0
    block_mask: object       # torch.nn.attention.flex_attention.BlockMask over the padded keys


def padding_block_mask(pad: torch.Tensor):
    """A BlockMask that hides the keys where ``pad`` (B, L) is True; L a multiple of FLEX_BLOCK."""
    from torch.nn.attention.flex_attention import create_block_mask

    def keep(b, h, q_idx, kv_idx):
        return ~pad[b, kv_idx]
    return create_block_mask(keep, pad.shape[0], None, pad.shape[1], pad.shape[1], device=pad.device,
                             BLOCK_SIZE=FLEX_BLOCK)


_compiled_flex = None


def flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, bias: FlexBias):
    """softmax(q·kᵀ/√d + gate[b, h, i] · dist[h, j − i]) · v with ``bias``'s padding hidden.
    gate: (B, H, L) per query position; the sum happens inside the kernel."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if _compiled_flex is None:  # eager flex is a slow reference: compiled, it is one fused kernel
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    dist, off = bias.distances, bias.offset

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + gate[b, h, q_idx] * dist[h, kv_idx - q_idx + off]
    return _compiled_flex(q, k, v, score_mod=score_mod, block_mask=bias.block_mask)


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

    def scale(self, x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """(B, H, L, 1): the factor 1 + g_u + (1 − g_u)·w·g_r that multiplies d at each query position."""
        b, n, _ = x.shape
        src = q if self.form == "xlm-e" else x.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        g = torch.sigmoid(self.uv(src))  # (B, H, L, 2)
        g_u, g_r = g[..., 0:1], g[..., 1:2]  # gate per query position: broadcast over keys
        w = self.w.view(1, -1, 1, 1)  # one per head (wavlm) or one for all (xlm-e)
        return 1 + g_u + (1 - g_u) * w * g_r

    def forward(self, x: torch.Tensor, q: torch.Tensor, d: torch.Tensor,
                pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, L, H·Dh) attention input; q: (B, H, L, Dh) projected queries; d: (H, L, L)
        -> gated bias (B, H, L, L) in q's dtype (bf16 under autocast: the fp32 w and table would
        otherwise make the largest tensor of the layer fp32), −inf at padded keys when
        ``pad_mask`` (B, L) is given."""
        scale, d = self.scale(x, q).to(q.dtype), d.to(q.dtype)
        if pad_mask is None:
            return scale * d.unsqueeze(0)
        # one pass over the (B, H, L, L) tensor: padding's -inf added in the same kernel
        pad = torch.zeros(pad_mask.shape, dtype=q.dtype, device=d.device).masked_fill(pad_mask, float("-inf"))
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

    def forward(self, x: torch.Tensor, rel: torch.Tensor | FlexBias | None,
                pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, L, D); rel: the shared table's (H, L, L) output, a FlexBias (the flex kernel:
        no attention dropout), or None without relative bias; pad_mask: (B, L) True where padding."""
        b, n, dim = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if isinstance(rel, FlexBias):
            y = flex_attend(q, k, v, self.gate.scale(x, q).squeeze(-1).float(), rel)
        else:
            if self.gate is not None:
                bias = self.gate(x, q, rel, pad_mask)
            else:  # a boolean mask: True where attention is allowed
                bias = None if pad_mask is None else ~pad_mask[:, None, None, :]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                               dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(b, n, dim))
