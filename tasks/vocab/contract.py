"""The vocab stage's output contract.

    spm.model, spm.vocab     the VoCAP tokenizer (special pieces: :mod:`xylent.tasks.vocab.specials`)
    joint.model              the joint SentencePiece baseline of the same size (vocab.joint_baseline)
    allocation.parquet       lang, examples, q, weight, sizes, alp, alp_smoothed, chosen_size, capped, failed_sizes
    comparison.parquet       lang, examples, <metric>_vocap, <metric>_joint (tokens_per_sentence, alp,
                             unk_rate, chars_per_token on held-out sentences)
    alp_curves.png, allocation.png, tokens_per_sentence.png, report.md
"""

from __future__ import annotations

from pathlib import Path

MODEL_FILE = "spm.model"
VOCAB_FILE = "spm.vocab"
JOINT_MODEL_FILE = "joint.model"
ALLOCATION_FILE = "allocation.parquet"
COMPARISON_FILE = "comparison.parquet"


def tokenizer_path(vocab_dir: Path) -> Path:
    return Path(vocab_dir) / MODEL_FILE


def load_tokenizer(vocab_dir: Path):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(tokenizer_path(vocab_dir)))


def tokenizer_and_specials(vocab_dir: Path):
    """(the tokenizer, its special ids: unk, bos, eos, pad, mask), refused when a special piece is missing:
    what the shards' index records for the loader and what pretrain's model config takes."""
    from xylent.tasks.vocab.specials import special_ids

    sp = load_tokenizer(vocab_dir)
    return sp, special_ids(sp, str(tokenizer_path(vocab_dir)))
