"""VECO's plug-in mode: the encoder with its cross-attention sublayers back in, for
tasks that come with a translation of every input (translate-train, translate-test).

The exported ``model.safetensors`` is the plug-out encoder (what every other task
reads); ``pretraining.safetensors`` keeps the ``cross.<i>`` sublayers.  Here the
input's layers attend to H^L of its translation — the translation's final states
through the plug-out encoder — exactly as VECO's plug-in pass did in pretraining
(xylent.models.veco.VecoModel.plug_in).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from xylent.models.pretrained import mean_pool, read_model_dir, tokenize
from xylent.models.veco import VecoModel
from xylent.errors import XylentError


class PlugInEncoder(nn.Module):
    """A pretrained VECO model in plug-in mode, with its tokenizer."""

    def __init__(self, model: VecoModel, tokenizer=None, meta: dict | None = None):
        super().__init__()
        self.model, self.config, self.tokenizer, self.meta = model, model.cfg, tokenizer, meta or {}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, translation_ids: torch.Tensor,
                translation_mask: torch.Tensor) -> torch.Tensor:
        """Final states (B, L, H) of ``input_ids``, every layer cross-attending to the
        plug-out final states of ``translation_ids`` (row k's translation is row k)."""
        pad, memory_pad = attention_mask == 0, translation_mask == 0
        memory = self.model.plug_out(translation_ids, memory_pad)
        return self.model.plug_in(input_ids, pad, memory, memory_pad)

    @torch.no_grad()
    def embed(self, texts: list[str], translations: list[str], batch_size: int = 32,
              max_length: int | None = None) -> torch.Tensor:
        """Mean-pooled plug-in final states of ``texts``, each read beside its translation."""
        if len(texts) != len(translations):
            raise ValueError(f"{len(texts)} texts and {len(translations)} translations: plug-in mode reads "
                             "each text beside its own translation")
        self.eval()
        device = next(self.parameters()).device
        max_length = min(max_length or self.config.max_position, self.config.max_position)
        out = []
        for i in range(0, len(texts), batch_size):
            ids, mask = (t.to(device) for t in tokenize(self.tokenizer, self.config, texts[i: i + batch_size],
                                                        max_length))
            tr_ids, tr_mask = (t.to(device) for t in tokenize(self.tokenizer, self.config,
                                                              translations[i: i + batch_size], max_length))
            out.append(mean_pool(self(ids, mask, tr_ids, tr_mask), mask).float().cpu())  # numpy-ready, host memory
        return torch.cat(out)


def load_plug_in(path: str | Path, map_location: str = "cpu") -> PlugInEncoder:
    """The plug-in model of a VECO pretrain output's ``model/`` folder."""
    from safetensors.torch import load_file

    path = Path(path)
    meta, cfg, tok = read_model_dir(path)
    if meta.get("objective") != "veco":
        raise XylentError(f"this model was pretrained with objective {meta.get('objective')!r}; only VECO's "
                          "(objective: veco) has cross-attention sublayers to plug in", where=str(path),
                          fix="load it with xylent.models.load_pretrained, or pretrain with --set pretrain.objective=veco")
    full = load_file(str(path / "pretraining.safetensors"), device=map_location)
    model = VecoModel(cfg)
    missing, unexpected = model.load_state_dict(full, strict=False)
    if missing or unexpected:
        raise XylentError(f"pretraining.safetensors does not hold VECO's weights (missing {sorted(missing)[:3]}, "
                          f"unexpected {sorted(unexpected)[:3]})", where=str(path / "pretraining.safetensors"),
                          fix="point at the model/ folder of a pretrain run with objective veco")
    return PlugInEncoder(model.eval(), tok, meta).eval()


def random_plug_in(path: str | Path, seed: int) -> PlugInEncoder:
    """VECO's plug-in model with fresh weights, the tokenizer and config of the export
    at ``path``: the random-init peer of a plug-in task."""
    path = Path(path)
    meta, cfg, tok = read_model_dir(path)
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was
        torch.manual_seed(seed)
        return PlugInEncoder(VecoModel(cfg).eval(), tok, meta).eval()
