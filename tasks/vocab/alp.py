"""Average log probability (ALP) and the concave smoothing of ALP curves (VoCAP).

ALP(D, V) = mean over sentences s of D of Σ_{t in seg_V(s)} log p(t), where
seg_V is the model's own Viterbi segmentation and p is the unigram frequency
of each piece in the segmentation of the same held sample (no BOS/EOS; <unk>
is a piece like any other).  Not normalised per token, as in the reference.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from itertools import chain

import numpy as np
import sentencepiece as spm
from scipy.optimize import isotonic_regression


def alp_from_ids(ids: list[list[int]]) -> float:
    """ALP of a segmented sample (lists of piece ids)."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    if len(ids) == 0 or lengths.sum() == 0:
        return float("nan")
    flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
    counts = np.bincount(flat)
    logp = np.log(counts[flat] / len(flat))
    per_sentence = np.zeros(len(ids))
    nonempty = lengths > 0
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])[nonempty]
    per_sentence[nonempty] = np.add.reduceat(logp, starts)
    return float(per_sentence.mean())


def average_log_probability(model_file: str, sentences: list[str], *, num_threads: int = 2) -> float:
    """ALP of ``sentences`` under the SentencePiece model in ``model_file``
    (batch encoding in C++ on ``num_threads`` threads, counting and sums in numpy)."""
    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    sentences = list(sentences)
    if num_threads <= 1 or len(sentences) < 2000:
        return alp_from_ids(sp.encode(sentences, num_threads=1))
    # SentencePiece releases the GIL while it segments but not while it builds the
    # Python lists: separate calls on threads overlap the two (1.5x over one call,
    # where its own num_threads gains nothing)
    step = -(-len(sentences) // num_threads)
    chunks = [sentences[i : i + step] for i in range(0, len(sentences), step)]
    with ThreadPoolExecutor(len(chunks)) as pool:
        parts = list(pool.map(lambda c: sp.encode(c, num_threads=1), chunks))
    return alp_from_ids([ids for part in parts for ids in part])


def concave_curve(sizes: list[int], alps: list[float]) -> list[float]:
    """Smallest change that makes an ALP-vs-size curve concave: the slopes
    (gain per added piece) are made non-increasing by pool-adjacent-violators,
    weighted by the size steps, and the curve is rebuilt from its first point.
    A concave curve comes back unchanged."""
    if len(sizes) < 3:
        return list(alps)
    x = np.asarray(sizes, dtype=float)
    y = np.asarray(alps, dtype=float)
    steps = np.diff(x)
    slopes = np.diff(y) / steps
    fitted = isotonic_regression(slopes, weights=steps, increasing=False).x
    return list(np.concatenate([[y[0]], y[0] + np.cumsum(fitted * steps)]))


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
