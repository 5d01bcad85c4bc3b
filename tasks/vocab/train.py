"""Per-language SentencePiece models over the size grid, and the joint baseline."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as model_pb2

from xylent.spec import VocabConfig

from xylent.tasks.vocab.alp import alp_from_ids
from xylent.tasks.vocab.specials import CONTROL_SYMBOLS, TRAINER_IDS



def sample_language(parts: list[Path], cfg: VocabConfig, seed: int) -> tuple[list[str], list[str]]:
    """(training sentences, held-out sentences) of one language, reading one part
    at a time: at most ``input_sentence_size`` + ``held_sentences`` kept in memory."""
    total = sum(pq.ParquetFile(p).metadata.num_rows for p in parts)
    want = cfg.input_sentence_size + cfg.held_sentences
    frac = min(1.0, want / max(total, 1))
    rng = np.random.default_rng(seed)
    kept: list[str] = []
    for p in parts:
        texts = pl.read_parquet(p, columns=["text"])["text"]
        if frac < 1.0:
            texts = texts.filter(pl.Series(rng.random(len(texts)) < frac))
        kept.extend(texts.to_list())
    order = rng.permutation(len(kept))
    kept = [kept[i] for i in order]
    held_n = min(cfg.held_sentences, max(1, int(len(kept) * cfg.held_fraction)))
    return kept[held_n:], kept[:held_n]


def train_model(sentences_file: Path, prefix: Path, vocab_size: int, cfg: VocabConfig, seed: int) -> None:
    """One per-language unigram model.  No byte pieces here (as in the reference):
    they would take 256 slots of every grid size and distort its ALP; the merged
    model adds them once."""
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        input=str(sentences_file), model_prefix=str(prefix), vocab_size=vocab_size, model_type="unigram",
        character_coverage=cfg.character_coverage, input_sentence_size=cfg.input_sentence_size,
        shuffle_input_sentence=True, byte_fallback=False, num_threads=cfg.threads_per_model,
        control_symbols=CONTROL_SYMBOLS, minloglevel=2,
    )


_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


def train_grid(lang: str, train: list[str], held: list[str], out: Path, cfg: VocabConfig, seed: int) -> dict:
    """Train one model per grid size; ALP of each on the held sample.
    A size that cannot be trained is recorded with the trainer's reason."""
    out.mkdir(parents=True, exist_ok=True)
    if not train:
        reason = f"no training sentences: all {len(held)} were held out to measure ALP"
        return {"lang": lang, "points": [], "failures": [{"size": s, "reason": reason} for s in cfg.grid],
                "train_sentences": 0, "held_sentences": len(held)}
    text_file = out / f"{lang}.train.txt"
    text_file.write_text("\n".join(train) + "\n", encoding="utf-8")
    points, failures = [], []
    for size in cfg.grid:
        prefix = out / f"{lang}.{size}"
        try:
            train_model(text_file, prefix, size, cfg, seed)
        except RuntimeError as exc:
            high, low = _TOO_HIGH.search(str(exc)), _TOO_LOW.search(str(exc))
            if high:
                reason = f"corpus too small: at most {high.group(2)} pieces can be learned"
            elif low:
                reason = f"size below the {low.group(2)} pieces the script's characters need"
            else:
                reason = str(exc).splitlines()[-1][:300]
            failures.append({"size": size, "reason": reason})
            continue
        sp = spm.SentencePieceProcessor(model_file=f"{prefix}.model")
        points.append((size, alp_from_ids(sp.encode(held))))
    text_file.unlink()
    return {"lang": lang, "points": points, "failures": failures, "train_sentences": len(train),
            "held_sentences": len(held)}


def model_pieces(model_file: Path) -> dict[str, float]:
    """Normal pieces of a unigram model and their log-probabilities."""
    proto = model_pb2.ModelProto()
    proto.ParseFromString(Path(model_file).read_bytes())
    normal = model_pb2.ModelProto.SentencePiece.NORMAL
    return {p.piece: p.score for p in proto.pieces if p.type == normal}


def train_joint(samples: dict[str, list[str]], q: dict[str, float], size: int, out: Path, cfg: VocabConfig,
                seed: int) -> Path:
    """XLM-R-style baseline: one unigram model on α-sampled multilingual text."""
    rng = np.random.default_rng(seed)
    n_total = min(cfg.input_sentence_size, sum(len(s) for s in samples.values()))
    lines = []
    for lang, sents in sorted(samples.items()):
        if not sents:
            continue
        k = max(1, int(round(q[lang] * n_total)))
        lines.extend(sents[i] for i in rng.choice(len(sents), size=k, replace=k > len(sents)))
    text_file = out / "joint.train.txt"
    text_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prefix = out / "joint"
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        input=str(text_file), model_prefix=str(prefix), vocab_size=size, model_type="unigram",
        character_coverage=cfg.character_coverage, input_sentence_size=cfg.input_sentence_size,
        shuffle_input_sentence=True, byte_fallback=cfg.byte_fallback, num_threads=cfg.threads_per_model,
        control_symbols=CONTROL_SYMBOLS, minloglevel=2, hard_vocab_limit=False,
        **TRAINER_IDS,
    )
    text_file.unlink()
    return strip_paths(prefix.with_suffix(".model"))


def strip_paths(model_file: Path) -> Path:
    """Drop the trainer's file paths from a model (SentencePiece records its input and
    output paths, which live in a temporary folder): same text, same bytes."""
    proto = model_pb2.ModelProto()
    proto.ParseFromString(Path(model_file).read_bytes())
    ts = proto.trainer_spec
    names = [Path(i).name for i in ts.input]
    del ts.input[:]
    ts.input.extend(names)
    ts.model_prefix = Path(ts.model_prefix).name
    Path(model_file).write_bytes(proto.SerializeToString())
    return Path(model_file)
