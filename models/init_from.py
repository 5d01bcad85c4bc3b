"""Start a pretraining model from an existing encoder (``pretrain.init``; MetaXLM's
second phase starts from the first phase's model).

The source is one of

- an xylent export (a pretrain output's ``model/``: ``model.safetensors`` with the
  encoder, ``pretraining.safetensors`` with every weight, ``spm.model``);
- a Hugging Face dir written by ``xylent export-hf`` (``model_type: xylent``);
- a local Hugging Face BERT / RoBERTa / XLM-R dir (``model_type`` bert, roberta,
  xlm-roberta, camembert): the BertModel layout is xylent's encoder without the
  relative position bias (post-LayerNorm blocks, GELU, absolute positions), so it
  maps weight for weight: q, k, v are concatenated into ``qkv``, the type-0 token
  type embedding is folded into the position embeddings, RoBERTa's position rows
  start after its padding index.  The bias table and gates the source lacks keep
  their random init; pooler and MLM heads are not used.

What is copied into the new model (built with the run's seed, i.e. its own random
init, so everything not copied is exactly what training from scratch starts from):

- the **body** (the discriminator / MLM encoder: LayerNorms, relative position
  table, every layer), weight for weight; the body's shape (layers, hidden, heads,
  FFN, relative-bias buckets) must be the source's (:func:`check_body`);
- **position embeddings**: the rows both models have (a longer new table keeps its
  random rows beyond the source's);
- **token embeddings**: row i from the source's row ``match.old_ids[i]``
  (:mod:`xylent.models.vocab_transfer`); unmatched rows stay random;
- ELECTRA's **generator** (``generator``): ``random`` (default: as ELECTRA starts,
  with a generator that learns from scratch next to a trained discriminator),
  ``body`` (the first ``generator_layers`` layers of the source body, with its
  LayerNorm and bias table), or ``source`` (the source's own generator and its
  output head: an xylent ELECTRA export of the same generator shape);
- **heads** (``heads``): the pretraining heads of the source's full weights that the
  new model has under the same name and shape (the MLM head of an MLM/InfoXLM
  source for an MLM/InfoXLM run, the RTD head of an ELECTRA source ...); a head's
  vocabulary-sized output bias is remapped like the embedding rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from xylent.models.hf_export import renames
from xylent.models.vocab_transfer import Vocabulary, from_hf_tokenizer, from_sentencepiece
from xylent.errors import XylentError

XYLENT_FORMAT = "xylent-encoder/1"  # xylent.models.pretrained.FORMAT (not imported: that pulls in torch)
HF_PLAIN = ("bert", "roberta", "xlm-roberta", "camembert")
SUPPORTED = ("an xylent export (a pretrain output's model/ dir), a Hugging Face dir written by `xylent export-hf`, "
             f"or a local Hugging Face dir of a BertModel-layout encoder (model_type {', '.join(HF_PLAIN)})")
GENERATOR_MODES = ("random", "body", "source")
BODY_FIELDS = ("layers", "hidden", "heads", "ffn")


@dataclass(frozen=True)
class SourceInfo:
    """What a source dir is, read from its config.json alone (no weights)."""

    kind: str                 # "xylent", "xylent-hf" or the HF model_type
    path: Path
    body: dict                # layers, hidden, heads, ffn, max_position, vocab_size, relative_bias, rel_*
    files: tuple[Path, ...]   # the files that make it what it is (weights, tokenizer, config)
    meta: dict = field(default_factory=dict)

    def describe(self) -> str:
        b = self.body
        return (f"{b['layers']}×{b['hidden']} (ffn {b['ffn']}, {b['heads']} heads, relative bias "
                f"{'on' if b['relative_bias'] else 'off'}), vocab {b['vocab_size']}")


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise XylentError(f"{path.name} is not JSON ({exc})", where=str(path),
                          fix=f"point pretrain.init.from at {SUPPORTED}") from None
    if not isinstance(data, dict):
        raise XylentError(f"{path.name} is not a JSON object", where=str(path),
                          fix=f"point pretrain.init.from at {SUPPORTED}")
    return data


def _need(path: Path, names: list[str], what: str) -> list[Path]:
    missing = [n for n in names if not (path / n).is_file()]
    if missing:
        raise XylentError(f"the {what} at pretrain.init.from lacks {', '.join(missing)}", where=str(path),
                          fix="re-export it (xylent run pretrain --force / xylent export-hf), or point "
                              f"pretrain.init.from at {SUPPORTED}")
    return [path / n for n in names]


def _hf_weight_files(path: Path) -> list[Path]:
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(_json(index).get("weight_map", {}).values()))
        return _need(path, shards, "sharded Hugging Face checkpoint") + [index]
    if (path / "pytorch_model.bin").is_file():
        return [path / "pytorch_model.bin"]
    raise XylentError("the Hugging Face dir has no weights (model.safetensors, its index, or pytorch_model.bin)",
                      where=str(path), fix="save the model with save_pretrained into that dir")


def _tokenizer_files(path: Path) -> list[Path]:
    files = [path / n for n in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
             if (path / n).is_file()]
    if not any(f.name in ("tokenizer.json", "vocab.txt") for f in files):
        raise XylentError("the Hugging Face dir has no tokenizer.json or vocab.txt: its vocabulary is unknown",
                          where=str(path), fix="save the tokenizer next to the model (tokenizer.save_pretrained)")
    return files


def inspect_source(path: Path) -> SourceInfo:
    """What ``path`` is (kind, body shape, identifying files); a clear error when it is
    missing, not an encoder, or an architecture that does not map onto xylent's."""
    path = Path(path)
    if not path.exists():
        raise XylentError("the encoder to start from does not exist", where=str(path),
                          fix="point pretrain.init.from at an existing dir (relative paths are resolved from the "
                              "spec file's folder), or at a registered model: models:/<name>/<version|latest>")
    if not path.is_dir():
        raise XylentError("pretrain.init.from is a file, not a model dir", where=str(path),
                          fix=f"point it at the dir: {SUPPORTED}")
    if not (path / "config.json").is_file():
        raise XylentError("the dir is not an encoder: it has no config.json", where=str(path),
                          fix=f"point pretrain.init.from at {SUPPORTED}")
    meta = _json(path / "config.json")
    if meta.get("format") == XYLENT_FORMAT:
        enc = meta.get("encoder") or {}
        tok = meta.get("tokenizer", "spm.model")
        files = _need(path, ["config.json", "model.safetensors", tok], "xylent export")
        if (path / "pretraining.safetensors").is_file():
            files.append(path / "pretraining.safetensors")
        body = {k: enc.get(k) for k in ("layers", "hidden", "heads", "ffn", "max_position", "vocab_size",
                                        "relative_bias", "rel_buckets", "rel_max_distance")}
        body["gate"] = enc.get("gate", "wavlm")  # exports older than the field used WavLM's gate
        return SourceInfo("xylent", path, body, tuple(files), meta)
    kind = meta.get("model_type")
    if kind == "xylent" or kind in HF_PLAIN:
        files = [path / "config.json", *_hf_weight_files(path), *_tokenizer_files(path)]
        body = {"layers": meta.get("num_hidden_layers"), "hidden": meta.get("hidden_size"),
                "heads": meta.get("num_attention_heads"), "ffn": meta.get("intermediate_size"),
                "max_position": meta.get("max_position_embeddings"), "vocab_size": meta.get("vocab_size"),
                "relative_bias": bool(meta.get("relative_bias")) if kind == "xylent" else False,
                "rel_buckets": meta.get("rel_buckets"), "rel_max_distance": meta.get("rel_max_distance"),
                "gate": meta.get("gate", "wavlm")}
        if kind != "xylent":
            problems = []
            if meta.get("hidden_act", "gelu") != "gelu":
                problems.append(f"hidden_act {meta.get('hidden_act')!r} (xylent's FFN uses exact GELU)")
            if meta.get("position_embedding_type") not in (None, "absolute"):
                problems.append(f"position_embedding_type {meta.get('position_embedding_type')!r}")
            if meta.get("is_decoder") or meta.get("add_cross_attention"):
                problems.append("a decoder / cross-attention")
            if problems:
                raise XylentError(f"the {kind} model does not map onto xylent's encoder: {'; '.join(problems)}",
                                  where=str(path / "config.json"), fix=f"start from {SUPPORTED}")
        missing = [k for k in (*BODY_FIELDS, "max_position", "vocab_size") if not isinstance(body[k], int)]
        if missing:
            raise XylentError(f"config.json lacks the encoder's {', '.join(missing)}", where=str(path / "config.json"),
                              fix="save the model with save_pretrained (its config.json names every size)")
        if kind in HF_PLAIN and kind != "bert":  # RoBERTa's positions start after the padding index
            body["max_position"] -= meta.get("pad_token_id", 1) + 1
        return SourceInfo("xylent-hf" if kind == "xylent" else kind, path, body, tuple(files), meta)
    what = f"model_type {kind!r}" if kind else f"format {meta.get('format')!r}" if meta.get("format") else \
        "neither an xylent format nor a Hugging Face model_type"
    raise XylentError(f"the dir is not an encoder xylent can start from: its config.json has {what}",
                      where=str(path / "config.json"), fix=f"point pretrain.init.from at {SUPPORTED}")


def file_identity(files) -> dict[str, list[int]]:
    """name -> [size, mtime_ns] of each file: what identifies a local file (as the download stage does)."""
    out = {}
    for f in files:
        st = Path(f).stat()
        out[Path(f).name] = [st.st_size, st.st_mtime_ns]
    return out


def _suggest(body: dict) -> str:
    from xylent.models.config import PRESETS

    sizes = [name for name, p in PRESETS.items() if all(getattr(p, k) == body[k] for k in BODY_FIELDS)]
    if sizes:
        return f"model: {{size: {sizes[0]}}}"
    return "model: {" + ", ".join(f"{k}: {body[k]}" for k in BODY_FIELDS) + "}"


def check_body(info: SourceInfo, target: dict, where: str = "spec fields pretrain.init.from and model") -> list[str]:
    """Refuse (XylentError naming both shapes) a new model whose body is not the
    source's shape; returns notes on what stays random (a relative bias the source lacks)."""
    src = info.body
    if any(src[k] != target[k] for k in BODY_FIELDS):
        t = target
        raise XylentError(
            f"the encoder to start from is {info.describe()}; the new model is {t['layers']}×{t['hidden']} "
            f"(ffn {t['ffn']}, {t['heads']} heads): its body is copied weight for weight, so layers, hidden, "
            "heads and ffn must be equal", where=where,
            fix=f"give the new model the source's shape ({_suggest(src)}), or start from an encoder of the new "
                "model's shape")
    notes = []
    if src["relative_bias"] and not target["relative_bias"]:
        raise XylentError("the encoder to start from has XLM-E's gated relative position bias and the new model "
                          "has none: its trained bias would be dropped", where=where,
                          fix="set model.relative_bias: true (the default)")
    if src["relative_bias"]:
        for k in ("rel_buckets", "rel_max_distance", "gate"):
            if src[k] != target[k]:
                raise XylentError(f"the encoder to start from has {k} {src[k]}, the new model {target[k]}: its "
                                  "relative position bias would mean something else", where=where,
                                  fix=f"set model.{k}: {src[k]}")
    elif target["relative_bias"]:
        notes.append("the source has no relative position bias: the new model's bias table and gates start random "
                     "(set model.relative_bias: false to train without it)")
    return notes


# -- loading the weights ---------------------------------------------------------------------------

# export-hf's names back to xylent's export names (the one table in xylent.models.hf_export)
_FROM_XYLENT_HF = renames(to_hf=False)
# BertModel's names (after the bert./roberta. prefix) -> xylent's, per layer; q, k, v are concatenated
_FROM_BERT_LAYER = {"attention.output.dense": "attn.out", "attention.output.LayerNorm": "ln1",
                    "intermediate.dense": "ffn.0", "output.dense": "ffn.2", "output.LayerNorm": "ln2"}


@dataclass
class Source:
    info: SourceInfo
    encoder: dict          # export names (embeddings.*, discriminator.*) -> fp32 tensors
    full: dict | None      # every weight of an xylent source's pretraining model (pretraining.safetensors)
    vocab: Vocabulary
    ignored: list[str] = field(default_factory=list)  # source weights with no place in the encoder


def _load_weights(files: list[Path]) -> dict:
    import torch
    from safetensors.torch import load_file

    out = {}
    for f in files:
        if f.suffix == ".safetensors":
            out.update(load_file(str(f)))
        elif f.suffix == ".bin":
            out.update(torch.load(f, map_location="cpu", weights_only=True))
    return {k: v.float() for k, v in out.items()}


def _strip(sd: dict, prefixes: tuple[str, ...]) -> dict:
    for p in prefixes:
        if any(k.startswith(p + "embeddings.") for k in sd):
            return {k[len(p):]: v for k, v in sd.items() if k.startswith(p)}
    return sd


def _from_xylent_hf(sd: dict) -> tuple[dict, list[str]]:
    out, ignored = {}, []
    for key, value in _strip(sd, ("xylent.",)).items():
        hits = [(pat, new) for pat, new in _FROM_XYLENT_HF if pat.match(key)]
        if len(hits) == 1:
            out[hits[0][0].sub(hits[0][1], key)] = value
        else:
            ignored.append(key)
    return out, ignored


def _from_bert(sd: dict, info: SourceInfo) -> tuple[dict, list[str]]:
    def missing(key):
        raise XylentError(f"the {info.kind} checkpoint lacks {key}", where=str(info.path),
                          fix="save the whole encoder (save_pretrained of the model)")

    sd = _strip(sd, ("bert.", "roberta.", "model."))
    offset = 0 if info.kind == "bert" else info.meta.get("pad_token_id", 1) + 1
    return from_bert_names(sd, info.body["layers"], offset, missing)


def from_bert_names(sd: dict, layers: int, position_offset: int = 0, missing=None) -> tuple[dict, list[str]]:
    """A BERT-shaped encoder's state dict (BERT, RoBERTa/XLM-R, ELECTRA's ``ElectraModel``) under
    xylent's export names, and the keys it left unused.  Query, key and value are stacked into
    ``qkv``; the token-type row 0 is added to every position (every xylent row is segment 0);
    ``position_offset``: the rows before position 0 (RoBERTa's pad + 1).  ``missing(key)`` raises
    for an absent key (a KeyError without it)."""
    import torch

    used, out = set(), {}

    def take(key):
        if key not in sd:
            if missing is not None:
                missing(key)
            raise KeyError(key)
        used.add(key)
        return sd[key]

    out["embeddings.tokens.weight"] = take("embeddings.word_embeddings.weight")
    pos = take("embeddings.position_embeddings.weight")[position_offset:]
    if "embeddings.token_type_embeddings.weight" in sd:
        pos = pos + take("embeddings.token_type_embeddings.weight")[0]
    out["embeddings.positions.weight"] = pos
    for p in ("weight", "bias"):
        out[f"discriminator.ln.{p}"] = take(f"embeddings.LayerNorm.{p}")
    for i in range(layers):
        a, b = f"encoder.layer.{i}.", f"discriminator.layers.{i}."
        for p in ("weight", "bias"):
            out[f"{b}attn.qkv.{p}"] = torch.cat([take(f"{a}attention.self.{n}.{p}") for n in ("query", "key", "value")])
            for src, dst in _FROM_BERT_LAYER.items():
                out[f"{b}{dst}.{p}"] = take(f"{a}{src}.{p}")
    return out, sorted(set(sd) - used)


def load_source(info: SourceInfo) -> Source:
    """The source's encoder weights under xylent's export names, its full weights
    (xylent exports) and its vocabulary."""
    weights = [f for f in info.files if f.suffix in (".safetensors", ".bin") and f.name != "pretraining.safetensors"]
    sd = _load_weights(weights)
    full, ignored = None, []
    if info.kind == "xylent":
        enc, meta = sd, info.meta
        specials = (meta.get("encoder") or {}).get("specials") or meta.get("specials")
        vocab = from_sentencepiece(info.path / meta.get("tokenizer", "spm.model"), specials)
        if (info.path / "pretraining.safetensors").is_file():
            full = _load_weights([info.path / "pretraining.safetensors"])
    else:
        enc, ignored = _from_xylent_hf(sd) if info.kind == "xylent-hf" else _from_bert(sd, info)
        vocab = from_hf_tokenizer(info.path, info.meta)
    if "embeddings.tokens.weight" not in enc:
        raise XylentError("the encoder to start from has no token embeddings", where=str(info.path),
                          fix=f"point pretrain.init.from at {SUPPORTED}")
    rows = enc["embeddings.tokens.weight"].shape[0]
    if len(vocab) > rows:
        raise XylentError(f"the source's tokenizer has {len(vocab)} pieces but its embedding matrix {rows} rows",
                          where=str(info.path), fix="save the model and its own tokenizer together")
    return Source(info, enc, full, vocab, ignored)


# -- the init weights -------------------------------------------------------------------------------


def _encoder_keys(model) -> dict[str, list[str]]:
    """The model's encoder weights under the export names (``model.encoder_state_dict()``)
    -> the model's own state-dict keys holding them (found by storage: an objective may
    call its body ``discriminator`` or ``encoder``)."""
    by_storage: dict[tuple, list[str]] = {}
    for k, v in model.state_dict().items():
        by_storage.setdefault((v.data_ptr(), tuple(v.shape)), []).append(k)
    return {ek: by_storage[(v.data_ptr(), tuple(v.shape))] for ek, v in model.encoder_state_dict().items()}


def _mapped_rows(dst, src, old_ids: np.ndarray, what: str):
    import torch

    idx = torch.as_tensor(old_ids, dtype=torch.long)
    keep = idx >= 0
    if keep.any() and int(idx[keep].max()) >= src.shape[0]:
        raise XylentError(f"{what}: the source has {src.shape[0]} rows but the vocabulary match points at row "
                          f"{int(idx[keep].max())}", fix="save the source model with its own tokenizer")
    out = dst.clone()
    out[keep] = src[idx[keep]].to(dst.dtype)
    return out


def build_init_state(model, source: Source, old_ids: np.ndarray, generator: str = "random",
                     heads: bool = True) -> tuple[dict, dict]:
    """Every weight of ``model`` (freshly built, i.e. at its random init): the source's body,
    positions, matched token rows, generator and heads as the module docstring says; the
    rest as it was.  Returns (state dict, what was copied)."""

    if generator not in GENERATOR_MODES:
        raise ValueError(f"generator must be one of {GENERATOR_MODES}, not {generator!r}")
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    vocab_size = state["embeddings.tokens.weight"].shape[0] if "embeddings.tokens.weight" in state else None
    if len(old_ids) != vocab_size:
        raise ValueError(f"the match covers {len(old_ids)} pieces; the model has {vocab_size} token embeddings")
    where = str(source.info.path)
    done = {"body": 0, "random_body": [], "positions": 0, "token_rows": int((old_ids >= 0).sum()),
            "generator": generator, "heads": [], "ignored_source_weights": len(source.ignored)}
    enc_keys = _encoder_keys(model)
    covered = {k for keys in enc_keys.values() for k in keys}
    for ek, keys in enc_keys.items():
        dst = state[keys[0]]
        if ek == "embeddings.tokens.weight":
            value = _mapped_rows(dst, source.encoder[ek], old_ids, "token embeddings")
        elif ek == "embeddings.positions.weight":
            src = source.encoder[ek]
            n = min(src.shape[0], dst.shape[0])
            value = dst.clone()
            value[:n] = src[:n]
            done["positions"] = int(n)
        elif ek not in source.encoder:
            if (".rel." in ek or ".gate." in ek) and not source.info.body["relative_bias"]:
                done["random_body"].append(ek)
                continue
            raise XylentError(f"the encoder to start from has no weight {ek!r} that the new model has", where=where,
                              fix="give the new model the source's shape (see docs/stages/pretrain.md, pretrain.init)")
        else:
            value = source.encoder[ek]
            if tuple(value.shape) != tuple(dst.shape):
                raise XylentError(f"weight {ek!r} is {tuple(value.shape)} in the encoder to start from and "
                                  f"{tuple(dst.shape)} in the new model", where=where,
                                  fix="give the new model the source's shape (model.* fields)")
            done["body"] += 1
        for k in keys:
            state[k] = value.to(dst.dtype).clone()

    gen = [k for k in state if k.startswith("generator.")]
    gen_head = [k for k in state if k.startswith("generator_head.")]
    full = source.full or {}
    if gen and generator == "body":
        for k in gen:
            src = source.encoder.get("discriminator." + k[len("generator."):])
            if src is None or tuple(src.shape) != tuple(state[k].shape):
                raise XylentError(f"pretrain.init.generator: body needs the source body's weight for {k!r} "
                                  f"({'missing' if src is None else tuple(src.shape)})", where=where,
                                  fix="use generator: random, or a source with at least model.generator_layers "
                                      "layers")
            state[k] = src.to(state[k].dtype).clone()
    elif gen and generator == "source":
        missing = [k for k in gen + gen_head if k not in full
                   or (tuple(full[k].shape) != tuple(state[k].shape) and not k.endswith("head.bias"))]
        if missing:
            raise XylentError(f"pretrain.init.generator: source needs the source's own generator of the new shape; "
                              f"{len(missing)} weight(s) missing or of another shape (first: {missing[0]})",
                              where=where, fix="start from an xylent ELECTRA export with the same "
                              "generator_layers, or use generator: random or body")
        for k in gen:
            state[k] = full[k].to(state[k].dtype).clone()

    for k in state:  # heads: under the same name in the source's full weights
        if k in covered or k.startswith("generator."):
            continue
        if (not heads and k not in gen_head) or (k in gen_head and not (gen and generator == "source")):
            continue
        src, dst = full.get(k), state[k]
        if src is None:
            continue
        if dst.dim() == 1 and k.endswith("head.bias") and dst.shape[0] == vocab_size:
            state[k] = _mapped_rows(dst, src, old_ids, k)  # an output layer's bias: one entry per piece
        elif tuple(src.shape) == tuple(dst.shape):
            state[k] = src.to(dst.dtype).clone()
        else:
            continue
        done["heads"].append(k)
    return {k: v.contiguous() for k, v in state.items()}, done


__all__ = ["GENERATOR_MODES", "SUPPORTED", "Source", "SourceInfo", "build_init_state", "check_body", "file_identity",
           "inspect_source", "load_source"]
