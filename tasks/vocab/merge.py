"""The VoCAP tokenizer: one unigram ModelProto over the union of the chosen
per-language vocabularies.

Stock SentencePiece cannot be told to keep given pieces (the reference patches
it), so the model is assembled directly: pieces = the union, score of a piece
= log Σ_i q_i·p_i(piece), the q-weighted mixture of the per-language unigram
probabilities (p_i = 0 where language i's model lacks it); the special pieces
first (:mod:`xylent.tasks.vocab.specials`), then the 256 byte pieces when byte fallback is on.
"""

from __future__ import annotations

import math
from pathlib import Path

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as model_pb2

from xylent.errors import XylentError

from xylent.tasks.vocab.specials import BOS, CONTROL_SYMBOLS, EOS, PAD, SPECIAL_PIECES, UNK

SP = model_pb2.ModelProto.SentencePiece


def merge_vocab_model(template: Path, chosen: dict[str, dict[str, float]], q: dict[str, float],
                byte_fallback: bool, out: Path) -> Path:
    """chosen: language -> {piece: log p} of its chosen model; q: language -> weight."""
    proto = model_pb2.ModelProto()
    proto.ParseFromString(Path(template).read_bytes())
    total_q = sum(q[lang] for lang in chosen)
    mix: dict[str, float] = {}
    for lang, pieces in chosen.items():
        w = q[lang] / total_q
        for piece, logp in pieces.items():
            mix[piece] = mix.get(piece, 0.0) + w * math.exp(logp)
    del proto.pieces[:]
    for i, piece in enumerate(SPECIAL_PIECES):
        proto.pieces.add(piece=piece, score=0.0, type=SP.UNKNOWN if i == UNK else SP.CONTROL)
    if byte_fallback:
        for b in range(256):
            proto.pieces.add(piece=f"<0x{b:02X}>", score=0.0, type=SP.BYTE)
    for piece, p in sorted(mix.items(), key=lambda kv: (-kv[1], kv[0])):
        proto.pieces.add(piece=piece, score=math.log(p), type=SP.NORMAL)
    ts = proto.trainer_spec
    ts.vocab_size = len(proto.pieces)
    ts.byte_fallback = byte_fallback
    ts.unk_id, ts.bos_id, ts.eos_id, ts.pad_id = UNK, BOS, EOS, PAD
    ts.model_prefix = "spm"
    del ts.input[:]  # the template's training file lived in a temporary folder: not part of the model
    del ts.control_symbols[:]
    ts.control_symbols.extend(CONTROL_SYMBOLS)
    data = proto.SerializeToString()
    try:
        spm.SentencePieceProcessor(model_proto=data)
    except RuntimeError as exc:  # a bug here would hand every later stage a broken tokenizer
        raise XylentError(f"the assembled VoCAP model does not load: {exc}", where=str(out)) from None
    out.write_bytes(data)
    out.with_suffix(".vocab").write_text(
        "".join(f"{p.piece}\t{p.score:.6f}\n" for p in proto.pieces), encoding="utf-8")
    return out
