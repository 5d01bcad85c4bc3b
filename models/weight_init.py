"""Weight initialisation, in one place: N(0, 0.02) for every linear and embedding
weight (BERT/ELECTRA/XLM-R), zero biases, LayerNorm at identity; the gate's ``w``
keeps its ones (so the gated bias starts at ≈1.75·d, XLM-E §3.3).

Each top-level model applies it once, at the end of its constructor:
``self.apply(init_weights)``.
"""

from __future__ import annotations

from torch import nn

STD = 0.02


def init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=STD)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=STD)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
