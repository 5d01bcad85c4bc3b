"""Transformer encoder (post-LayerNorm, as BERT/ELECTRA/XLM-R) over shared embeddings,
with XLM-E's gated relative position bias in every layer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xylent.models.attention import FLEX_BLOCK, FlexBias, RelativePositionTable, SelfAttention, padding_block_mask
from xylent.models.config import EncoderConfig


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
        self.rel = (RelativePositionTable(cfg.heads, cfg.rel_buckets, cfg.rel_max_distance, cfg.max_position)
                    if cfg.relative_bias else None)
        self.layers = nn.ModuleList(Layer(cfg, dropout) for _ in range(layers))
        self.kernel = cfg.attention

    def uses_flex(self, x: torch.Tensor) -> bool:
        if self.rel is None or self.kernel == "materialised" or (self.kernel == "auto" and not x.is_cuda):
            return False
        if not x.is_cuda and torch.is_grad_enabled():
            raise RuntimeError("model.attention: flex trains on CUDA only (PyTorch has no FlexAttention backward "
                               "on CPU); set model.attention to auto or materialised on this machine")
        return True

    def attention_inputs(self, x: torch.Tensor, pad: torch.Tensor | None):
        """(x, pad, rel) for the layers: flex rows padded to a multiple of its block (so a width
        compiles once), with the padding as keys no query sees; the materialised (H, L, L) bias else."""
        if self.rel is None:
            return x, pad, None
        if not self.uses_flex(x):
            return x, pad, self.rel(x.shape[1])
        b, n = x.shape[:2]
        width = -(-n // FLEX_BLOCK) * FLEX_BLOCK
        if pad is None:
            pad = torch.zeros(b, n, dtype=torch.bool, device=x.device)
        x, pad = F.pad(x, (0, 0, 0, width - n)), F.pad(pad, (0, width - n), value=True)
        return x, pad, FlexBias(self.rel.distances(), self.rel.max_position - 1, padding_block_mask(pad))

    def forward(self, emb: torch.Tensor, pad: torch.Tensor | None, return_layers: bool = False,
                upto: int | None = None):
        """``upto``: run only the first ``upto`` layers (a middle layer's states, e.g. InfoXLM's XLCo)."""
        n = emb.shape[1]
        x, pad, rel = self.attention_inputs(self.drop(self.ln(emb)), pad)
        hidden = [x]
        for layer in self.layers[:upto]:
            x = layer(x, rel, pad)
            hidden.append(x)
        if x.shape[1] != n:  # flex's block padding off again
            x, hidden = x[:, :n], [h[:, :n] for h in hidden]
        return (x, hidden) if return_layers else x


def compile_encoders(model: nn.Module) -> int:
    """Put every Encoder of ``model`` under torch.compile, in place (each traces as one graph,
    tests/test_models_flex.py); returns how many.  On CUDA only: there it fuses the layers' small
    kernels and compiles flex attention with its backward; on CPU Inductor's first compile costs
    more than a short run gains, and PyTorch has no flex backward to compile."""
    encoders = [m for m in model.modules() if isinstance(m, Encoder)]
    for enc in encoders:
        enc.compile()
    return len(encoders)
