"""Extractive QA (SQuAD v1.1 / XQuAD / MLQA / TyDiQA-GoldP): windows in, answer text out.

Contexts are longer than the encoder's input, so each example is cut into
overlapping windows the way BERT's ``run_squad.py`` (and XTREME, which reuses
it) does: the context is tokenised once, and windows of at most
``max_length - n_special - len(question)`` context tokens start ``doc_stride``
tokens apart.  ``doc_stride`` is the *step* between window starts, not the
overlap: with the usual 384 / 128 an answer near a window's edge also sits well
inside the next window, where the model sees context on both sides.

Predictions are mapped back through each token's character offsets into the
*original* context, never by detokenising: detokenised text loses the exact
whitespace, normalisation and characters of the source, which costs exact match
in scripts with multi-code-point graphemes and in languages written without
spaces (Thai, Chinese, Japanese), where no word boundary can be reconstructed.

Model-agnostic: the caller's tokenizer supplies

    encode(text) -> (ids, offsets)   offsets: [start, end) str indices into text, one per id
    build(a, b) -> (input_ids, segment)   special tokens added; segment -1 special, 0 of a, 1 of b;
                                          position 0 is the CLS-like no-answer target.

Not reproduced from the reference scripts: the "max context" filter (a start
token counts only in the window where it has most context on both sides).
Every window's candidates compete on score alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Encode = Callable[[str], tuple[list[int], list[tuple[int, int]]]]
Build = Callable[[list[int], list[int]], tuple[list[int], list[int]]]

__all__ = ["QAWindow", "best_span", "char_span_of_answer", "qa_windows"]


@dataclass
class QAWindow:
    example_id: str
    input_ids: list[int]
    token_chars: list[tuple[int, int] | None]  # per input position: char span in the context, None outside it
    start_position: int  # training target (index into input_ids); 0 when the answer is not fully in this window
    end_position: int


def _window_starts(n_tokens: int, size: int, stride: int) -> list[int]:
    # Step never exceeds the window, so a doc_stride larger than the room left by a
    # long question cannot skip context tokens (BERT's min(length, doc_stride)).
    step = min(size, stride)
    starts = [0]
    while starts[-1] + size < n_tokens:
        starts.append(starts[-1] + step)
    return starts


def _answer_tokens(offsets: Sequence[tuple[int, int]], answer: tuple[int, int] | None) -> tuple[int, int] | None:
    """First and last context token overlapping [char_start, char_end); None when no token does."""
    if answer is None or answer[1] <= answer[0]:
        return None
    lo, hi = answer
    hit = [k for k, (s, e) in enumerate(offsets) if e > lo and s < hi]
    return (hit[0], hit[-1]) if hit else None


def qa_windows(example_id: str, question: str, context: str, encode: Encode, build: Build, *,
               max_length: int = 384, doc_stride: int = 128, max_query_length: int = 64,
               answer: tuple[int, int] | None = None) -> list[QAWindow]:
    """Cut one example into model inputs; ``answer`` is (char_start, char_end) in ``context``, end exclusive."""
    if doc_stride < 1:
        raise ValueError(f"doc_stride must be at least 1, got {doc_stride}")
    q_ids = list(encode(question)[0])[:max_query_length]
    c_ids, c_offsets = encode(context)
    c_ids, c_offsets = list(c_ids), [tuple(o) for o in c_offsets]
    if len(c_ids) != len(c_offsets):
        raise ValueError(f"encode returned {len(c_ids)} ids but {len(c_offsets)} offsets")
    n_special = len(build([], [])[0])
    size = max_length - n_special - len(q_ids)
    if size < 1:
        raise ValueError(f"max_length={max_length} leaves no room for the context: {n_special} special tokens "
                         f"+ {len(q_ids)} question tokens (max_query_length={max_query_length})")
    target = _answer_tokens(c_offsets, answer)

    windows = []
    for start in _window_starts(len(c_ids), size, doc_stride):
        stop = min(start + size, len(c_ids))
        input_ids, segment = build(q_ids, c_ids[start:stop])
        ctx_positions = [i for i, seg in enumerate(segment) if seg == 1]
        if len(ctx_positions) != stop - start or len(segment) != len(input_ids):
            raise ValueError("build must return one segment label per input id, one 1 per context token")
        token_chars: list[tuple[int, int] | None] = [None] * len(input_ids)
        for k, pos in enumerate(ctx_positions):
            token_chars[pos] = c_offsets[start + k]
        s_pos = e_pos = 0
        # A partly visible answer is trained as "not here" (CLS), as in BERT: its
        # truncated span would teach the model wrong boundaries.
        if target is not None and start <= target[0] and target[1] < stop:
            s_pos, e_pos = ctx_positions[target[0] - start], ctx_positions[target[1] - start]
        windows.append(QAWindow(example_id, list(input_ids), token_chars, s_pos, e_pos))
    return windows


def best_span(windows: list[QAWindow], start_logits: list[np.ndarray], end_logits: list[np.ndarray],
              context: str, *, n_best: int = 20, max_answer_length: int = 30) -> str:
    """Highest start+end logit span over all windows of one example, as the original context text.

    Candidates pair each window's top-``n_best`` starts with its top-``n_best`` ends.
    Logits may be longer than the window (padding); positions past the window are
    dropped before ranking so they cannot take top-k slots.  Ties keep the earlier
    window / higher-ranked start.  Returns "" when no candidate is valid.
    """
    if not len(windows) == len(start_logits) == len(end_logits):
        raise ValueError(f"{len(windows)} windows but {len(start_logits)} start / {len(end_logits)} end logits")
    best_score, best = -np.inf, None
    for w, sl, el in zip(windows, start_logits, end_logits):
        n = len(w.token_chars)
        sl, el = np.asarray(sl, dtype=np.float64)[:n], np.asarray(el, dtype=np.float64)[:n]
        starts = np.argsort(-sl, kind="stable")[:n_best]
        ends = np.argsort(-el, kind="stable")[:n_best]
        for s in starts:
            if w.token_chars[s] is None:
                continue
            for e in ends:
                if w.token_chars[e] is None or e < s or e - s + 1 > max_answer_length:
                    continue
                score = sl[s] + el[e]
                if score > best_score:
                    best_score, best = score, (w.token_chars[s][0], w.token_chars[e][1])
    return "" if best is None else context[best[0]:best[1]].strip()


def char_span_of_answer(context: str, text: str, answer_start: int) -> tuple[int, int] | None:
    """(start, end) of the gold answer ``text`` in ``context``, trusting ``text`` over ``answer_start``.

    Some SQuAD-format files (translated or re-encoded sets, offsets counted in
    bytes or before a whitespace clean-up) give an ``answer_start`` a few
    characters off; the answer text is what is scored, so take the occurrence
    nearest the stated offset (the earlier one on a tie).  None when ``text`` is
    empty or absent: the caller counts and skips those examples.
    """
    if not text:
        return None
    if 0 <= answer_start and context[answer_start:answer_start + len(text)] == text:
        return answer_start, answer_start + len(text)
    best, i = None, context.find(text)
    while i != -1:
        if best is None or abs(i - answer_start) < abs(best - answer_start):
            best = i
        i = context.find(text, i + 1)
    return None if best is None else (best, best + len(text))
