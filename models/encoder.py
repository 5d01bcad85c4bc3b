"""Transformer encoder (post-LayerNorm, as BERT/ELECTRA/XLM-R) over shared embeddings,
with XLM-E's gated relative position bias in every layer."""

from __future__ import annotations

import torch
from torch import nn

from models.attention import RelativePositionTable, SelfAttention
from models.config import EncoderConfig


class Embeddings(nn.Module):
    """Token + absolute position embeddings; shared by generator and discriminator."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.positions = nn.Embedding(cfg.max_position, cfg.hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.tokens(ids) + self.positions(pos)[None]


class Layer(nn.Module):
    def __init__(self, cfg: EncoderConfig, dropout: float):
        super().__init__()
        self.attn = SelfAttention(cfg.hidden, cfg.heads, dropout, cfg.relative_bias, cfg.gate)
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.ffn = nn.Sequential(nn.Linear(cfg.hidden, cfg.ffn), nn.GELU(), nn.Linear(cfg.ffn, cfg.hidden))
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, rel, pad):
        x = self.ln1(x + self.drop(self.attn(x, rel, pad)))
        return self.ln2(x + self.drop(self.ffn(x)))


class Encoder(nn.Module):
    """``layers`` blocks; the relative-position table lives here (the 'first layer owns it')
    and every layer gates the same table."""

    def __init__(self, cfg: EncoderConfig, layers: int, dropout: float):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.hidden)
        self.drop = nn.Dropout(dropout)
        self.rel = (RelativePositionTable(cfg.heads, cfg.rel_buckets, cfg.rel_max_distance)
                    if cfg.relative_bias else None)
        self.layers = nn.ModuleList(Layer(cfg, dropout) for _ in range(layers))

    def forward(self, emb: torch.Tensor, pad: torch.Tensor | None, return_layers: bool = False,
                upto: int | None = None):
        """``upto``: run only the first ``upto`` layers (a middle layer's states, e.g. InfoXLM's XLCo)."""
        x = self.drop(self.ln(emb))
        rel = self.rel(x.shape[1]) if self.rel is not None else None
        hidden = [x]
        for layer in self.layers[:upto]:
            x = layer(x, rel, pad)
            hidden.append(x)
        return (x, hidden) if return_layers else x
