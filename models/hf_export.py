"""An exported xylent encoder (``model/``, format ``xylent-encoder/1``) as a Hugging Face
model folder: ``AutoModel.from_pretrained(dir, trust_remote_code=True)`` and
``AutoTokenizer.from_pretrained(dir)`` work offline and give what
``xylent.models.load_pretrained`` gives.

    config.json          XylentConfig, with auto_map to modeling_xylent.py
    modeling_xylent.py   a copy of models/hf_modeling_xylent.py (self-contained)
    model.safetensors    the encoder's weights under the HF module names
    tokenizer.json, tokenizer_config.json, special_tokens_map.json
                         a fast tokenizer converted from spm.model
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import torch

from xylent.models.pretrained import FORMAT
from xylent.errors import XylentError

MODELING = Path(__file__).with_name("hf_modeling_xylent.py")
MODELING_NAME = "modeling_xylent.py"
AUTO_MAP = {
    "AutoConfig": "modeling_xylent.XylentConfig",
    "AutoModel": "modeling_xylent.XylentModel",
    "AutoModelForSequenceClassification": "modeling_xylent.XylentForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_xylent.XylentForTokenClassification",
    "AutoModelForQuestionAnswering": "modeling_xylent.XylentForQuestionAnswering",
}
# xylent's module names (xylent.models.encoder) and hf_modeling_xylent's, prefix by prefix ({i}: a layer index);
# every key must match exactly one.  One table for both directions (xylent.models.init_from reads HF dirs back).
NAME_PAIRS = (
    ("embeddings.tokens.", "embeddings.word_embeddings."),
    ("embeddings.positions.", "embeddings.position_embeddings."),
    ("discriminator.ln.", "embeddings.layer_norm."),
    ("discriminator.rel.", "encoder.relative_bias."),
    ("discriminator.layers.{i}.attn.", "encoder.layer.{i}.attention."),
    ("discriminator.layers.{i}.ln1.", "encoder.layer.{i}.attention_norm."),
    ("discriminator.layers.{i}.ffn.0.", "encoder.layer.{i}.intermediate."),
    ("discriminator.layers.{i}.ffn.2.", "encoder.layer.{i}.output."),
    ("discriminator.layers.{i}.ln2.", "encoder.layer.{i}.output_norm."),
)


def renames(to_hf: bool = True) -> list[tuple[re.Pattern, str]]:
    """(pattern, replacement) pairs for ``pattern.sub``: xylent → HF names, or back."""
    out = []
    for a, b in NAME_PAIRS:
        src, dst = (a, b) if to_hf else (b, a)
        out.append((re.compile("^" + re.escape(src).replace(r"\{i\}", r"(\d+)")), dst.replace("{i}", r"\1")))
    return out


RENAMES = renames(to_hf=True)
_FIX = "point export_hf at a pretrain output's model/ folder (workspace/pretrain/<fingerprint>/model)"


def export_hf(model_dir: Path, out_dir: Path) -> Path:
    """Write the HF folder for ``model_dir`` at ``out_dir`` (replacing it whole) and return it."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if out_dir.resolve() == model_dir.resolve() or out_dir.resolve() in model_dir.resolve().parents:
        raise XylentError("the Hugging Face dir would replace the model it is exported from", where=str(out_dir),
                          fix="write it to a new folder, e.g. <model dir>-hf")
    meta = read_xylent_config(model_dir)
    enc = meta["encoder"]
    specials = enc.get("specials") or meta["specials"]  # older exports keep them at the top level
    config = hf_config(enc, specials)
    config.xylent_objective = meta.get("objective")  # which retrieval layer evaluate reads (ELECTRA's or MLM's)
    state = hf_state_dict(model_dir / "model.safetensors", config)
    tokenizer = fast_tokenizer(model_dir / meta["tokenizer"], specials, config.max_position_embeddings)

    from safetensors.torch import save_file

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        config.save_pretrained(tmp)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        shutil.copy2(MODELING, tmp / MODELING_NAME)
        tokenizer.save_pretrained(tmp)
        _portable_tokenizer_class(tmp / "tokenizer_config.json")
        _swap_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def read_xylent_config(model_dir: Path) -> dict:
    """config.json of an xylent export, after checking its files are there."""
    try:
        meta = json.loads((model_dir / "config.json").read_text())
    except FileNotFoundError:
        raise XylentError(f"{model_dir} is not an xylent model export: it has no config.json",
                          where=str(model_dir), fix=_FIX) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise XylentError(f"{model_dir}/config.json is not JSON: {exc}", where=str(model_dir / "config.json"),
                          fix=_FIX) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise XylentError(f"{model_dir} is not an xylent model export: config.json's format is {got!r}, "
                          f"not {FORMAT!r}", where=str(model_dir / "config.json"), fix=_FIX)
    for name in ("model.safetensors", meta.get("tokenizer", "spm.model")):
        if not (model_dir / name).is_file():
            raise XylentError(f"the xylent export lacks {name}", where=str(model_dir / name),
                              fix=f"re-export the model (xylent run pretrain --force), or {_FIX}")
    return {"tokenizer": "spm.model", **meta}


def hf_config(enc: dict, specials: dict[str, int]):
    from xylent.models.hf_modeling_xylent import XylentConfig

    config = XylentConfig(
        vocab_size=enc["vocab_size"], hidden_size=enc["hidden"], num_hidden_layers=enc["layers"],
        num_attention_heads=enc["heads"], intermediate_size=enc["ffn"], max_position_embeddings=enc["max_position"],
        rel_buckets=enc["rel_buckets"], rel_max_distance=enc["rel_max_distance"],
        relative_bias=enc["relative_bias"], gate=enc.get("gate", "wavlm"), hidden_dropout_prob=enc["dropout"],
        attention_probs_dropout_prob=enc["dropout"],  # xylent drops attention with the same rate
        pad_token_id=specials["pad"], bos_token_id=specials["bos"], eos_token_id=specials["eos"],
        mask_token_id=specials["mask"], unk_token_id=specials["unk"])
    config.auto_map = dict(AUTO_MAP)
    config.architectures = ["XylentModel"]
    return config


def hf_state_dict(weights: Path, config) -> dict[str, torch.Tensor]:
    """The export's weights under XylentModel's names, checked name by name and shape by shape."""
    from safetensors.torch import load_file

    from xylent.models.hf_modeling_xylent import XylentModel

    out = {}
    for key, value in load_file(str(weights)).items():
        hits = [(pat, new) for pat, new in RENAMES if pat.match(key)]
        if len(hits) != 1:
            raise XylentError(f"weight {key!r} has no Hugging Face counterpart", where=str(weights),
                              fix="export_hf knows xylent.models.encoder's layout; extend models/hf_export.py RENAMES "
                                  "and models/hf_modeling_xylent.py together")
        out[hits[0][0].sub(hits[0][1], key)] = value.contiguous()
    with torch.device("meta"):  # names and shapes only: no memory for the weights
        want = {k: v.shape for k, v in XylentModel(config).state_dict().items()}
    got = {k: v.shape for k, v in out.items()}
    if got != want:
        diff = sorted(set(got) ^ set(want)) or sorted(k for k in got if got[k] != want[k])
        raise XylentError(f"the export's weights do not fit its config.json (first differences: {diff[:5]})",
                          where=str(weights), fix="re-export the model (xylent run pretrain --force)")
    return out


def fast_tokenizer(spm_file: Path, specials: dict[str, int], max_length: int):
    """A PreTrainedTokenizerFast giving SentencePiece's ids, with ``<s> A </s>`` and
    ``<s> A </s> B </s>`` (xylent's pair convention, xylent/data/loader.py) around them."""
    from sentencepiece import sentencepiece_model_pb2 as model_pb2
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    proto = model_pb2.ModelProto()
    proto.ParseFromString(Path(spm_file).read_bytes())
    ns, ts = proto.normalizer_spec, proto.trainer_spec
    if ts.treat_whitespace_as_suffix or not ns.escape_whitespaces:
        raise XylentError("the SentencePiece model treats whitespace in a way the converter does not replicate "
                          "(treat_whitespace_as_suffix or escape_whitespaces=false)", where=str(spm_file),
                          fix="train the vocabulary with xylent's vocab stage (its defaults convert exactly)")
    tok = Tokenizer(_model(proto, spm_file))
    tok.normalizer = _normalizer(ns)
    # pieces never span "▁" when trained split_by_whitespace, so splitting there changes no id
    # and gives word_ids() for token classification
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never",
                                                 split=ts.split_by_whitespace)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if ns.add_dummy_prefix else []))

    piece = {name: proto.pieces[i].piece for name, i in specials.items()}
    tok.post_processor = processors.TemplateProcessing(
        single=f"{piece['bos']} $A {piece['eos']}", pair=f"{piece['bos']} $A {piece['eos']} $B {piece['eos']}",
        special_tokens=[(piece["bos"], specials["bos"]), (piece["eos"], specials["eos"])])
    control = model_pb2.ModelProto.SentencePiece.CONTROL, model_pb2.ModelProto.SentencePiece.UNKNOWN
    user = model_pb2.ModelProto.SentencePiece.USER_DEFINED
    tok.add_special_tokens([AddedToken(p.piece, special=True, normalized=False)
                            for p in proto.pieces if p.type in control])
    tok.add_tokens([AddedToken(p.piece, special=False, normalized=False) for p in proto.pieces if p.type == user])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=piece["bos"], eos_token=piece["eos"], unk_token=piece["unk"],
        pad_token=piece["pad"], mask_token=piece["mask"], cls_token=piece["bos"], sep_token=piece["eos"],
        model_max_length=max_length, padding_side="right", truncation_side="right",
        model_input_names=["input_ids", "attention_mask"])  # no segment embeddings: no token_type_ids


def _model(proto, spm_file: Path):
    from tokenizers.models import BPE, Unigram

    ts = proto.trainer_spec
    scores = [(p.piece, p.score) for p in proto.pieces]
    if ts.model_type == ts.UNIGRAM:
        return Unigram(scores, unk_id=ts.unk_id, byte_fallback=ts.byte_fallback)
    if ts.model_type == ts.BPE:
        from transformers.convert_slow_tokenizer import generate_merges

        # SentencePiece merges the adjacent pair whose result scores highest: rank merges by that score
        vocab = {p: i for i, (p, _) in enumerate(scores)}
        return BPE(vocab, generate_merges(vocab, scores), unk_token=proto.pieces[ts.unk_id].piece, fuse_unk=True,
                   byte_fallback=ts.byte_fallback, dropout=None)
    raise XylentError(f"SentencePiece model type {ts.model_type} is neither unigram nor BPE", where=str(spm_file),
                      fix="train the vocabulary with xylent's vocab stage (unigram)")


def _normalizer(ns):
    """SentencePiece's normaliser: its compiled NFKC-style rules (the model's own
    precompiled_charsmap, so nmt_nfkc, nfkc, custom TSV rules … all come along), then
    what it does to spaces in the normalised text (strip the ends, collapse runs), then
    the dummy "▁" prefix; Metaspace turns the spaces into "▁".

    One known gap, shared by every fast tokenizer converted from SentencePiece (XLM-R's
    too): tokenizers' Precompiled applies a multi-code-point rule only inside a grapheme
    cluster shorter than 6 bytes, so a decomposed sequence SentencePiece composes within a
    longer cluster (Bengali স + ে + া typed for সো) stays decomposed.  Adding NFC first
    would fix those but reorder Arabic harakat SentencePiece keeps: worse."""
    from tokenizers import Regex, normalizers

    steps = [normalizers.Precompiled(ns.precompiled_charsmap)] if ns.precompiled_charsmap else []
    if ns.remove_extra_whitespaces:
        # only U+0020 counts, as in SentencePiece (after the rules mapped other spaces to it)
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if ns.add_dummy_prefix:
        steps.append(normalizers.Prepend(" "))
    return normalizers.Sequence(steps)


def _portable_tokenizer_class(path: Path) -> None:
    """transformers 5 writes its class name, TokenizersBackend, which 4.x lacks; both versions
    load PreTrainedTokenizerFast from tokenizer.json."""
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def _swap_in(tmp: Path, out_dir: Path) -> None:
    """Rename the finished folder into place; an older export there goes only once the new one is in."""
    if not out_dir.exists():
        tmp.rename(out_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old.", dir=out_dir.parent))
    out_dir.rename(old / out_dir.name)
    try:
        tmp.rename(out_dir)
    except BaseException:
        (old / out_dir.name).rename(out_dir)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)
