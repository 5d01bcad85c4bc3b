"""vocab stage: VoCAP (Zheng et al. 2021) — per-language capacity measured by
ALP, allocated under one budget, merged into one SentencePiece unigram model.

Public API: :func:`average_log_probability`, :func:`allocate_vocabulary`,
:func:`concave_curve`, :func:`evaluate_tokenizer`.
"""

from __future__ import annotations

import numpy as np
import sentencepiece as spm

from tasks.vocab.allocate import allocate_vocabulary
from tasks.vocab.alp import alp_from_ids, average_log_probability, concave_curve

__all__ = ["allocate_vocabulary", "average_log_probability", "concave_curve", "evaluate_tokenizer"]


def evaluate_tokenizer(model_file: str, held: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """Per language: tokens per sentence, ALP (own segmentation), unknown rate, characters per token."""
    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    unk = sp.unk_id()
    out = {}
    for lang, sents in held.items():
        ids = sp.encode(sents)
        n_tok = sum(len(x) for x in ids)
        n_unk = sum(int(np.count_nonzero(np.asarray(x) == unk)) for x in ids if x)
        chars = sum(len(s) for s in sents)
        out[lang] = {"tokens_per_sentence": n_tok / max(len(sents), 1), "alp": alp_from_ids(ids),
                     "unk_rate": n_unk / max(n_tok, 1), "chars_per_token": chars / max(n_tok, 1)}
    return out
