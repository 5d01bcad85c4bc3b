"""Small separable fine-tuning tasks and a tiny real encoder to learn them.

The encoder is xylent's own (PretrainedEncoder, random weights) over a
SentencePiece model trained here on the tasks' vocabulary; the tasks are
built so a model that learns anything beats the trivial baseline by far.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import sentencepiece as spm
import torch

from xylent.models.config import EncoderConfig
from xylent.models.pretrained import PretrainedEncoder
from xylent.tasks.evaluate.encoders import XylentEncoder
from xylent.tasks.evaluate.finetune.data import Example

WORDS = "the a cat dog house river green blue run walk over under near far old new".split()
CITIES = ["paris", "berlin", "rome", "tokyo", "lima", "oslo"]
SPECIALS = {"unk": 0, "bos": 1, "eos": 2, "pad": 3, "mask": 4}


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def tiny_tokenizer():
    rng = random.Random(0)
    corpus = [f"{sentence(rng, 10)} {rng.choice(CITIES)} {rng.randint(0, 999)} Straße 東京 ภาษา" for _ in range(1500)]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=buf, vocab_size=90, minloglevel=2,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=3, user_defined_symbols=["<mask>"],
                                   character_coverage=1.0)
    return spm.SentencePieceProcessor(model_proto=buf.getvalue())


def tiny_encoder(sp, seed: int = 0) -> XylentEncoder:
    cfg = EncoderConfig(vocab_size=sp.get_piece_size(), hidden=64, layers=2, heads=2, ffn=128, generator_layers=1,
                        max_position=256, specials=SPECIALS)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return XylentEncoder("tiny", PretrainedEncoder(cfg, sp))


def pair_examples(rng: random.Random, n: int) -> list[Example]:
    """The label says which city the hypothesis names: one token decides it."""
    out = []
    for _ in range(n):
        label = rng.choice(["entailment", "contradiction"])
        city = "paris" if label == "entailment" else "rome"
        out.append(Example(texts=(sentence(rng, 6), f"{sentence(rng, 3)} {city} {sentence(rng, 2)}"), label=label))
    return out


def tag_examples(rng: random.Random, n: int, length: int = 10) -> list[Example]:
    out = []
    for _ in range(n):
        toks = [rng.choice(CITIES) if rng.random() < 0.25 else rng.choice(WORDS) for _ in range(length)]
        out.append(Example(tokens=toks, tags=["B-LOC" if t in CITIES else "O" for t in toks]))
    return out


def qa_examples(rng: random.Random, n: int, prefix: str = "q") -> list[Example]:
    """The answer is the one number in the context."""
    out = []
    for i in range(n):
        a, b, num = sentence(rng, rng.randint(2, 12)), sentence(rng, rng.randint(2, 12)), str(rng.randint(0, 999))
        out.append(Example(qid=f"{prefix}{i}", question="which number", context=f"{a} {num} {b}",
                           answers=[(num, len(a) + 1)]))
    return out


def write_squad(path: Path, examples: list[Example]) -> Path:
    data = [{"title": e.qid, "paragraphs": [{"context": e.context, "qas": [
        {"id": e.qid, "question": e.question, "answers": [{"text": t, "answer_start": s} for t, s in e.answers]}]}]}
        for e in examples]
    path.write_text(json.dumps({"version": "1.1", "data": data}, ensure_ascii=False), encoding="utf-8")
    return path


def write_xnli(path: Path, examples: list[Example]) -> Path:
    path.write_text("".join(f"{e.texts[0]}\t{e.texts[1]}\t{e.label}\n" for e in examples), encoding="utf-8")
    return path


def write_conll(path: Path, examples: list[Example], lang: str) -> Path:
    path.write_text("".join("".join(f"{lang}:{t}\t{g}\n" for t, g in zip(e.tokens, e.tags)) + "\n"
                            for e in examples), encoding="utf-8")
    return path


def tiny_export(root: Path, sp, seed: int = 0) -> Path:
    """``tiny_encoder``'s weights as an exported xylent ``model/`` dir (what other processes load)."""
    from xylent.models.pretrained import export

    tok_dir = root / "vocab"
    tok_dir.mkdir(parents=True, exist_ok=True)
    (tok_dir / "spm.model").write_bytes(sp.serialized_model_proto())
    (tok_dir / "spm.vocab").write_text("".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i)}\n"
                                               for i in range(sp.get_piece_size())), encoding="utf-8")
    model = tiny_encoder(sp, seed).model
    state = model.state_dict()
    export(root / "model", state, state, model.config, tok_dir, {"objective": "electra"})
    return root / "model"
