"""The encoders the evaluate stage compares, behind one small interface.

Every encoder turns texts into mean-pooled hidden states of one layer, in the
convention of ``xylent.models.load_pretrained(dir).embed(texts, layer=...)``: index 0
is the embedding output, index ``n_layers`` the last layer, negative indices
count from the end.  Texts are embedded in length-sorted chunks (less padding)
and yielded in their original order, one batch at a time, so a caller can
stream them into a faiss index without holding any hidden state.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from xylent.errors import XylentError

CHUNK_BATCHES = 16  # texts sorted by length within 16 batches: little padding, bounded memory


# XTREME's run_retrieval.py indexes ``hidden_states[-n_layers:]``, the embedding output dropped, so
# its default "layer 7" of a 12-layer XLM-R is hidden-state index 8; XLM-E §4 reads "layer-7 for
# XLM-R and layer-9 for XLM-E" in that same numbering.
XTREME_LAYER_OF_12 = {"mlm": 7, "electra": 9}


def family(objective: str | None) -> str:
    """Which paper's retrieval layer an objective follows: ELECTRA-style (XLM-E, XY-LENT) or
    MLM-style (XLM-R, InfoXLM, VECO)."""
    from xylent.objectives import OBJECTIVES

    declared = OBJECTIVES.get(objective or "")
    return declared.family if declared is not None else "mlm"


def default_layer(n_layers: int, kind: str = "mlm") -> int:
    """The hidden-state index (embeddings = 0) retrieval reads by default: XTREME's layer 7 of 12
    for MLM encoders, XLM-E's layer 9 of 12 for ELECTRA ones (index 8 and 10), scaled to
    other depths, never past the last layer."""
    xtreme = round(n_layers * XTREME_LAYER_OF_12[kind] / 12)
    return max(1, min(n_layers, xtreme + 1))


class SentenceEncoder(ABC):
    """Subclasses set ``name``, ``n_layers`` and implement :meth:`_hidden`."""

    name: str
    kind: str
    n_layers: int
    family: str = "mlm"  # which default layer (default_layer)

    def layer_index(self, layer: int | None) -> int:
        """The non-negative hidden-state index of ``layer`` (None: XTREME's default for this family)."""
        if layer is None:
            return default_layer(self.n_layers, self.family)
        idx = layer + self.n_layers + 1 if layer < 0 else layer
        if not 0 <= idx <= self.n_layers:
            raise XylentError(f"layer {layer} does not exist in model {self.name!r}: it has hidden states "
                              f"0..{self.n_layers} (0 = embeddings)", where="spec field evaluate.tasks[].layer",
                              fix=f"pick a layer in 0..{self.n_layers}, or leave it out for XTREME's default")
        return idx

    def plug_in(self):
        """The plug-in model (reads each text beside its translation), or None: not applicable."""
        return None

    @abstractmethod
    def _hidden(self, texts: list[str], max_length: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """-> (hidden states per layer, each (B, L, H); attention mask (B, L))."""

    @torch.no_grad()
    def pooled(self, texts: list[str], layers: Sequence[int], max_length: int) -> dict[int, np.ndarray]:
        hidden, mask = self._hidden(texts, max_length)
        m = mask.unsqueeze(-1).float()
        return {i: ((hidden[i].float() * m).sum(1) / m.sum(1).clamp(min=1)).cpu().numpy() for i in layers}

    def embed_batches(self, texts: Sequence[str], layers: Sequence[int], *, batch_size: int, max_length: int,
                      on_batch: Callable[[int], None] = lambda n: None) -> Iterator[dict[int, np.ndarray]]:
        """Mean-pooled float32 states of ``layers`` (non-negative indices), batch by
        batch in the order of ``texts``."""
        chunk = batch_size * CHUNK_BATCHES
        for start in range(0, len(texts), chunk):
            part = list(texts[start: start + chunk])
            order = sorted(range(len(part)), key=lambda i: len(part[i]))
            out = {i: np.empty((len(part), 0), np.float32) for i in layers}
            for b in range(0, len(part), batch_size):
                idx = order[b: b + batch_size]
                got = self.pooled([part[i] for i in idx], layers, max_length)
                for i in layers:
                    if out[i].shape[1] == 0:
                        out[i] = np.empty((len(part), got[i].shape[1]), np.float32)
                    out[i][idx] = got[i]
                on_batch(len(idx))
            for b in range(0, len(part), batch_size):
                yield {i: out[i][b: b + batch_size] for i in layers}


def device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class XylentEncoder(SentenceEncoder):
    kind = "xylent"

    def __init__(self, name: str, model, source: Path | None = None, seed: int | None = None):
        self.name, self.model = name, model.float().to(device()).eval()
        self.n_layers = model.config.layers
        self.family = family(model.meta.get("objective"))
        self.source, self.seed = source, seed  # the export dir (and random-init's seed): plug-in mode rebuilds

    def plug_in(self):
        """VECO's plug-in model of this encoder (xylent.models.load_plug_in), None when the export
        has no cross-attention; for random-init, VECO's architecture with fresh weights."""
        from xylent.models.veco_plug_in import load_plug_in, random_plug_in

        if self.source is None:
            return None
        if json.loads((self.source / "config.json").read_text()).get("objective") != "veco":
            return None
        model = load_plug_in(self.source) if self.seed is None else random_plug_in(self.source, self.seed)
        return model.float().to(device()).eval()

    def _hidden(self, texts, max_length):
        ids, mask = self.model.tokenize(texts, max_length=min(max_length, self.model.config.max_position))
        at = next(self.model.parameters()).device
        _, hidden = self.model(ids.to(at), mask.to(at), output_hidden_states=True)
        return hidden, mask.to(at)


class HuggingFaceEncoder(SentenceEncoder):
    kind = "hf"

    def __init__(self, name: str, path: Path, trust_remote_code: bool = False):
        from transformers import AutoModel, AutoTokenizer

        self.name = name
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                                           trust_remote_code=trust_remote_code)
            # fp32 whatever the checkpoint's dtype: half precision on a CPU is slow and changes the scores
            self.model = AutoModel.from_pretrained(str(path), local_files_only=True, dtype=torch.float32,
                                                   trust_remote_code=trust_remote_code).to(device()).eval()
        except Exception as exc:  # transformers raises many kinds for a dir that is not a model
            raise XylentError(f"cannot load Hugging Face encoder {name!r}: {exc}", where=str(path),
                              fix="point evaluate.models[].path at a local dir with config.json, the weights and "
                              "the tokenizer files (save_pretrained of both); the hub is never contacted") from None
        self.n_layers = int(self.model.config.num_hidden_layers)
        cfg = self.model.config  # an xylent export names its objective; an HF ELECTRA is one by its type
        self.family = family("electra" if cfg.model_type == "electra" else getattr(cfg, "xylent_objective", None))

    def _hidden(self, texts, max_length):
        # XLM-R declares 514 positions of which 512 are usable; the tokenizer knows the real limit
        limits = [max_length, getattr(self.model.config, "max_position_embeddings", None),
                  getattr(self.tokenizer, "model_max_length", None)]
        limit = min(v for v in limits if isinstance(v, int) and v > 0)
        enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=limit, return_tensors="pt")
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        out = self.model(**enc, output_hidden_states=True)
        return out.hidden_states, enc["attention_mask"]


class SubwordBagEncoder(SentenceEncoder):
    """The trivial peer of retrieval and probing: a sentence is the L2-normalised
    count vector of its subword pieces (the pipeline's tokenizer), no weights at
    all.  Vocabularies above ``MAX_DIMS`` are folded by id modulo (rare collisions).
    One "layer" (index 0)."""

    kind = "subwords"
    n_layers = 0
    MAX_DIMS = 1 << 15

    def __init__(self, name: str, tokenizer):
        self.name, self.tokenizer = name, tokenizer
        self.dims = min(tokenizer.get_piece_size(), self.MAX_DIMS)

    def layer_index(self, layer: int | None) -> int:
        return 0  # no layers: every task's layer means "the bag"

    def _hidden(self, texts, max_length):  # never called: pooled() counts pieces itself
        raise TypeError("a bag of subwords has no hidden states")

    def pooled(self, texts: list[str], layers: Sequence[int], max_length: int) -> dict[int, np.ndarray]:
        out = np.zeros((len(texts), self.dims), np.float32)
        for row, ids in enumerate(self.tokenizer.encode(list(texts))):
            np.add.at(out[row], np.asarray(ids[:max_length], dtype=np.int64) % self.dims, 1.0)
        return {i: out for i in layers}


def subword_bag(name: str, like: Path) -> SubwordBagEncoder:
    import sentencepiece as spm

    meta = json.loads((Path(like) / "config.json").read_text())
    return SubwordBagEncoder(name, spm.SentencePieceProcessor(model_file=str(Path(like) / meta["tokenizer"])))


def load_xylent(name: str, path: Path) -> XylentEncoder:
    from xylent.models.pretrained import load_pretrained

    if not (Path(path) / "config.json").is_file():
        raise XylentError(f"model {name!r}: no config.json in {path}", where="spec field evaluate.models[].path",
                          fix="point it at an exported xylent model dir (workspace/pretrain/<fingerprint>/model)")
    try:
        return XylentEncoder(name, load_pretrained(path), source=Path(path))
    except (OSError, ValueError, KeyError, RuntimeError) as exc:  # not ours, or damaged
        raise XylentError(f"cannot load xylent model {name!r}: {type(exc).__name__}: {exc}", where=str(path),
                          fix="point it at an exported xylent model dir; for a Hugging Face dir use kind: hf") from None


def random_init(name: str, like: Path, seed: int) -> XylentEncoder:
    """The pipeline's architecture and tokenizer with freshly initialised weights:
    what pretraining must beat."""
    import sentencepiece as spm

    from xylent.models.config import EncoderConfig
    from xylent.models.pretrained import PretrainedEncoder

    meta = json.loads((Path(like) / "config.json").read_text())
    cfg = EncoderConfig.from_export(meta)
    tok = spm.SentencePieceProcessor(model_file=str(Path(like) / meta["tokenizer"]))
    with torch.random.fork_rng(devices=[]):  # the caller's CPU generator is left as it was
        torch.manual_seed(seed)
        model = PretrainedEncoder(cfg, tok, {"random_init_seed": seed, "objective": meta.get("objective")})
    return XylentEncoder(name, model, source=Path(like), seed=seed)


def declared_layers(kind: str, path: Path) -> int:
    """The layer count a model dir declares, read from its config.json before any
    weight is loaded: lets the stage refuse a bad path or layer before it runs."""
    cfg = Path(path) / "config.json"
    try:
        meta = json.loads(cfg.read_text())
        return int(meta["encoder"]["layers"] if kind == "xylent" else meta["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise XylentError(f"{cfg} does not describe a {kind} encoder ({type(exc).__name__}: {exc})",
                          where="spec field evaluate.models[].path",
                          fix="xylent: an exported model/ dir; hf: a dir saved with save_pretrained") from None


def check_layers(models: dict[str, tuple[str, Path]], tasks: list) -> None:
    """Every task's explicit ``layer`` exists in every model (name -> (kind, dir))."""
    for name, (kind, path) in models.items():
        if kind == "subwords":
            continue  # no layers to choose from
        n = declared_layers(kind, path)
        for t in tasks:
            if t.layer is not None and not -(n + 1) <= t.layer <= n:
                raise XylentError(f"evaluate task {t.name!r} asks for layer {t.layer}, but model {name!r} has "
                                  f"hidden states 0..{n} (0 = embeddings)", where="spec field evaluate.tasks[].layer",
                                  fix=f"pick a layer in 0..{n}, or leave it out for the middle layer")


def load_ref(ref: dict) -> SentenceEncoder:
    """An encoder from its plain-data description (``kind``: xylent, hf, random-init,
    bag-of-subwords; ``name``, ``path``, ...): the stage and fine-tuning ranks in
    other processes load models the same way."""
    kind, name, path = ref["kind"], ref["name"], Path(ref["path"])
    if kind == "random-init":
        return random_init(name, path, ref["seed"])
    if kind == "bag-of-subwords":
        return subword_bag(name, path)
    if kind == "hf":
        return HuggingFaceEncoder(name, path, trust_remote_code=ref.get("trust_remote_code", False))
    return load_xylent(name, path)
