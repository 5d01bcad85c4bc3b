"""The exported model and how to load it.

``model/`` holds ``model.safetensors`` (shared embeddings + discriminator: the
encoder downstream tasks use), ``pretraining.safetensors`` (every weight, to
continue pretraining), ``config.json`` and the SentencePiece tokenizer.
:func:`load_pretrained` returns a :class:`PretrainedEncoder`.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import torch
from torch import nn

from xylent.models.config import EncoderConfig
from xylent.models.encoder import Embeddings, Encoder
from xylent.models.weight_init import init_weights
from xylent.errors import XylentError

FORMAT = "xylent-encoder/1"


def consolidate_zero(checkpoint_root: Path, tag: str) -> dict[str, torch.Tensor]:
    """fp32 weights from a DeepSpeed checkpoint: the optimizer's fp32 partitions
    for ZeRO 1–3 (and bf16), the module itself for ZeRO 0 in fp32."""
    tag_dir = Path(checkpoint_root) / tag
    if any(tag_dir.glob("*optim_states.pt")):
        import contextlib
        import sys

        if not torch.cuda.is_available():  # else DeepSpeed warns that it guessed the CPU
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        # DeepSpeed's logger binds to the stdout of its import; ours is for the CLI's --json output
        with contextlib.redirect_stdout(sys.stderr):
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        sd = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_root), tag=tag)
    else:
        path = tag_dir / "mp_rank_00_model_states.pt"
        try:  # tensors and plain data only: a tampered checkpoint cannot run code here
            sd = torch.load(path, map_location="cpu", weights_only=True)["module"]
        except pickle.UnpicklingError as exc:
            raise XylentError(f"the checkpoint holds more than tensors and plain data; refusing to unpickle it "
                              f"({str(exc).splitlines()[0]})", where=str(path),
                              fix="a checkpoint from somewhere else may run code when loaded: rerun the stage "
                              "with --force to train it again here") from None
    return {k: v.detach().float().contiguous() for k, v in sd.items()}


def export(model_dir: Path, full_state: dict[str, torch.Tensor] | None, encoder_state: dict[str, torch.Tensor],
           cfg: EncoderConfig, tokenizer_dir: Path, meta: dict) -> None:
    """``full_state`` None: the encoder alone (a snapshot: nothing starts from its pretraining weights)."""
    from safetensors.torch import save_file

    model_dir.mkdir(parents=True, exist_ok=True)
    save_file(encoder_state, str(model_dir / "model.safetensors"), metadata={"format": FORMAT})
    # every name its own copy: safetensors refuses tensors that share memory, and a model whose modules share a
    # weight under several names (transformers' ELECTRA: one word matrix, three names) must load back strictly
    stored, unaliased = set(), {}
    for k, v in (full_state or {}).items():
        ptr = v.untyped_storage().data_ptr()
        unaliased[k] = v.clone() if ptr in stored else v
        stored.add(ptr)
    if full_state is not None:
        save_file(unaliased, str(model_dir / "pretraining.safetensors"), metadata={"format": FORMAT})
    for name in ("spm.model", "spm.vocab"):
        shutil.copy2(tokenizer_dir / name, model_dir / name)
    (model_dir / "config.json").write_text(json.dumps({
        "format": FORMAT, "encoder": cfg.to_dict(), "tokenizer": "spm.model",
        "specials": cfg.specials, **meta}, indent=2))


class PretrainedEncoder(nn.Module):
    """Shared embeddings + the discriminator stack (ELECTRA) or the MLM encoder."""

    def __init__(self, cfg: EncoderConfig, tokenizer=None, meta: dict | None = None):
        super().__init__()
        self.config, self.tokenizer, self.meta = cfg, tokenizer, meta or {}
        self.embeddings = Embeddings(cfg)
        self.discriminator = Encoder(cfg, cfg.layers, dropout=cfg.dropout)
        self.pad_id, self.bos_id, self.eos_id = cfg.special("pad"), cfg.special("bos"), cfg.special("eos")
        self.apply(init_weights)  # what a random-init baseline is; loaded weights replace it

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                output_hidden_states: bool = False):
        """Last hidden state (B, L, H); with ``output_hidden_states`` also every layer
        (embeddings output first)."""
        pad = (input_ids == self.pad_id) if attention_mask is None else attention_mask == 0
        out, hidden = self.discriminator(self.embeddings(input_ids), pad, return_layers=True)
        return (out, hidden) if output_hidden_states else out

    def tokenize(self, texts: list[str], max_length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return tokenize(self.tokenizer, self.config, texts, max_length)

    @torch.no_grad()
    def embed(self, texts: list[str], layer: int = -1, batch_size: int = 32) -> torch.Tensor:
        """Mean-pooled hidden states of ``layer`` (-1: last; Tatoeba-style retrieval uses a middle layer)."""
        self.eval()
        device = next(self.parameters()).device
        out = []
        for i in range(0, len(texts), batch_size):
            ids, mask = self.tokenize(texts[i: i + batch_size])
            _, hidden = self(ids.to(device), mask.to(device), output_hidden_states=True)
            out.append(mean_pool(hidden[layer], mask.to(device)))
        return torch.cat(out)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``hidden`` (B, L, H) over the positions where ``mask`` (B, L) is 1."""
    m = mask.unsqueeze(-1).float()
    return (hidden * m).sum(1) / m.sum(1)


def tokenize(tokenizer, cfg: EncoderConfig, texts: list[str],
             max_length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``<s> pieces </s>`` rows, padded: (ids, attention mask)."""
    max_length = max_length or cfg.max_position
    bos, eos, pad = cfg.special("bos"), cfg.special("eos"), cfg.special("pad")
    rows = [[bos, *ids[: max_length - 2], eos] for ids in tokenizer.encode(list(texts))]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    for k, r in enumerate(rows):
        ids[k, : len(r)] = torch.tensor(r)
    return ids, (ids != pad).long()


def load_pretrained(path: str | Path, map_location: str = "cpu") -> PretrainedEncoder:
    """The discriminator encoder of an exported ``model/`` directory, with its tokenizer."""
    from safetensors.torch import load_file

    path = Path(path)
    meta, cfg, tok = read_model_dir(path)
    model = PretrainedEncoder(cfg, tok, meta)
    model.load_state_dict(load_file(str(path / "model.safetensors"), device=map_location), strict=True)
    return model.eval()


def read_model_dir(path: Path) -> tuple[dict, EncoderConfig, object]:
    """(config.json, the encoder's config, the SentencePiece tokenizer) of an exported ``model/``."""
    import sentencepiece as spm

    try:
        meta = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} has no config.json: point load_pretrained at a pretrain output's model/ "
                                f"folder (workspace/pretrain/<fingerprint>/model)") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}/config.json: format {meta.get('format')!r} is not {FORMAT!r}")
    cfg = EncoderConfig.from_export(meta)
    return meta, cfg, spm.SentencePieceProcessor(model_file=str(path / meta["tokenizer"]))
