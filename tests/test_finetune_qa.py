"""Extractive-QA windows and span post-processing, with small real tokenizers
(whitespace + fixed-size subwords, and a 1-2 character splitter for scripts
written without spaces) that report character offsets like a fast tokenizer."""

from __future__ import annotations

import re

import numpy as np
import pytest

from xylent.tasks.evaluate.finetune.qa import QAWindow, best_span, char_span_of_answer, qa_windows

CLS, SEP = 1, 2


class Vocab:
    def __init__(self):
        self.ids: dict[str, int] = {}

    def __call__(self, piece: str) -> int:
        return self.ids.setdefault(piece, len(self.ids) + 10)


class SubwordTokenizer:
    """Whitespace words cut into pieces of at most ``piece`` characters.

    ``sp_style``: the first piece of every word but the first also covers the
    space before it, as SentencePiece's "▁" pieces do in fast-tokenizer offsets.
    """

    def __init__(self, piece: int = 3, sp_style: bool = False):
        self.piece, self.sp_style, self.vocab = piece, sp_style, Vocab()

    def encode(self, text):
        ids, offsets = [], []
        for m in re.finditer(r"\S+", text):
            for s in range(m.start(), m.end(), self.piece):
                e = min(s + self.piece, m.end())
                lead = 1 if self.sp_style and s == m.start() and s > 0 else 0
                ids.append(self.vocab(text[s:e]))
                offsets.append((s - lead, e))
        return ids, offsets


class ShortPieceTokenizer:
    """No word boundaries: pieces of 2, 1, 2, 1, ... characters (Thai, Chinese)."""

    def __init__(self):
        self.vocab = Vocab()

    def encode(self, text):
        ids, offsets, i, two = [], [], 0, True
        while i < len(text):
            e = min(i + (2 if two else 1), len(text))
            ids.append(self.vocab(text[i:e]))
            offsets.append((i, e))
            i, two = e, not two
        return ids, offsets


def build(a, b):
    return [CLS, *a, SEP, *b, SEP], [-1] + [0] * len(a) + [-1] + [1] * len(b) + [-1]


def words(n):
    return " ".join(f"w{i:03d}" for i in range(n))  # one token per word with piece=4


def ctx_indices(w: QAWindow):
    return [i for i, c in enumerate(w.token_chars) if c is not None]


def logits_at(w: QAWindow, s: int, e: int, hi: float = 10.0, pad: int = 0):
    rng = np.random.default_rng(s * 1000 + e)
    sl, el = rng.normal(0, 1, len(w.input_ids) + pad), rng.normal(0, 1, len(w.input_ids) + pad)
    sl[s], el[e] = hi, hi
    return sl, el


# -- windows -------------------------------------------------------------------

def test_window_count_overlap_and_coverage():
    tok = SubwordTokenizer(piece=4)
    context = words(100)  # 100 context tokens
    q_ids, _ = tok.encode("who w?")
    assert len(q_ids) == 2
    ws = qa_windows("ex", "who w?", context, tok.encode, build, max_length=3 + 2 + 20, doc_stride=8)

    # starts 0, 8, ..., 80; 80 + 20 reaches the end, so no 12th window
    assert len(ws) == 11
    _, offsets = tok.encode(context)
    firsts = [offsets.index(w.token_chars[ctx_indices(w)[0]]) for w in ws]
    assert firsts == list(range(0, 81, 8))
    for w in ws:
        assert len(w.input_ids) <= 25 and len(ctx_indices(w)) == 20
        assert w.input_ids[0] == CLS and ctx_indices(w)[0] == 1 + 2 + 1
        assert (w.start_position, w.end_position) == (0, 0)
    assert ws[-1].token_chars[ctx_indices(ws[-1])[-1]] == offsets[-1]
    # neighbours share window - stride = 12 tokens
    a = {ws[3].token_chars[i] for i in ctx_indices(ws[3])}
    b = {ws[4].token_chars[i] for i in ctx_indices(ws[4])}
    assert len(a & b) == 12
    seen = {w.token_chars[i] for w in ws for i in ctx_indices(w)}
    assert seen == set(offsets)


def test_stride_larger_than_window_skips_nothing_and_question_is_truncated():
    tok = SubwordTokenizer(piece=4)
    context = words(30)
    question = " ".join(["why"] * 50)
    ws = qa_windows("ex", question, context, tok.encode, build, max_length=3 + 5 + 7, doc_stride=128,
                    max_query_length=5)
    assert all(ctx_indices(w)[0] == 1 + 5 + 1 for w in ws)
    assert len(ws) == 5  # 7 context tokens fit, so the step is 7, not 128: starts 0, 7, 14, 21, 28
    seen = [w.token_chars[i] for w in ws for i in ctx_indices(w)]
    assert seen == tok.encode(context)[1]  # adjacent, no gap, no overlap


def test_short_context_is_one_window_and_empty_context_gives_nothing():
    tok = SubwordTokenizer()
    ws = qa_windows("ex", "q", "tiny context", tok.encode, build)
    assert len(ws) == 1 and ws[0].example_id == "ex"
    empty = qa_windows("ex", "q", "", tok.encode, build, answer=None)
    assert len(empty) == 1 and not ctx_indices(empty[0])
    assert best_span(empty, [np.zeros(3)], [np.zeros(3)], "") == ""


def test_no_room_for_context_raises():
    tok = SubwordTokenizer()
    with pytest.raises(ValueError, match="no room for the context"):
        qa_windows("ex", "one two three four", "ctx", tok.encode, build, max_length=7)
    with pytest.raises(ValueError, match="doc_stride"):
        qa_windows("ex", "q", "ctx", tok.encode, build, doc_stride=0)


def test_answer_across_a_window_boundary():
    tok = SubwordTokenizer(piece=4)
    context = words(60)
    text = "w018 w019 w020 w021"  # tokens 18..21; window 0 holds 0..19, window 1 holds 8..27, window 2 16..35
    span = char_span_of_answer(context, text, context.index(text))
    ws = qa_windows("ex", "q", context, tok.encode, build, max_length=3 + 1 + 20, doc_stride=8, answer=span)
    _, offsets = tok.encode(context)
    for w in ws:
        held = {w.token_chars[i] for i in ctx_indices(w)}
        inside = {offsets[k] for k in range(18, 22)} <= held
        if inside:
            assert w.token_chars[w.start_position] == offsets[18]
            assert w.token_chars[w.end_position] == offsets[21]
        else:
            assert (w.start_position, w.end_position) == (0, 0)
    targeted = [i for i, w in enumerate(ws) if w.start_position]
    assert targeted == [1, 2]

    # the model points at the answer in window 1 only; window 0 holds its best guess at the cut answer
    logits = [logits_at(w, 1, 1, hi=-5.0) for w in ws]
    logits[0] = logits_at(ws[0], ctx_indices(ws[0])[18], ctx_indices(ws[0])[19], hi=4.0)
    logits[1] = logits_at(ws[1], ws[1].start_position, ws[1].end_position)
    assert best_span(ws, [s for s, _ in logits], [e for _, e in logits], context) == text


def test_answer_targets_tokens_overlapping_its_edges():
    tok = SubwordTokenizer(piece=3)
    context = "alpha betagamma delta"
    # pieces "bet", "aga", "mma": "tagam" starts inside the first and ends inside the last
    lo = context.index("tagam")
    (w,) = qa_windows("ex", "q", context, tok.encode, build, answer=(lo, lo + 5))
    assert context[w.token_chars[w.start_position][0]:w.token_chars[w.end_position][1]] == "betagamma"
    (w,) = qa_windows("ex", "q", context, tok.encode, build, answer=None)
    assert (w.start_position, w.end_position) == (0, 0)


# -- back to the original text ----------------------------------------------------

@pytest.mark.parametrize("context, text", [
    ("Η πρωτεύουσα της Ελλάδας είναι η Αθήνα 🇬🇷 από την αρχαιότητα.", "Αθήνα 🇬🇷"),
    ("عاصمة مصر هي القاهرة، وهي أكبر مدينة عربية 👍🏽 حسب التقديرات.", "أكبر مدينة عربية 👍🏽"),
])
def test_multibyte_context_gives_exact_substring(context, text):
    tok = SubwordTokenizer(piece=3, sp_style=True)
    span = char_span_of_answer(context, text, context.index(text))
    ws = qa_windows("ex", "ποιο;", context, tok.encode, build, max_length=3 + 2 + 10, doc_stride=3, answer=span)
    assert len(ws) > 3 and any(w.start_position for w in ws)
    scored = [logits_at(w, w.start_position, w.end_position) if w.start_position else logits_at(w, 0, 0)
              for w in ws]
    got = best_span(ws, [s for s, _ in scored], [e for _, e in scored], context)
    assert got == text  # the leading "▁" space of the first piece is stripped


@pytest.mark.parametrize("context", [
    "กรุงเทพมหานครเป็นเมืองหลวงและนครที่มีประชากรมากที่สุดของประเทศไทย",
    "北京是中华人民共和国的首都，也是全国的政治和文化中心。",
])
def test_whitespace_free_script_gives_exact_substring(context):
    tok = ShortPieceTokenizer()
    _, offsets = tok.encode(context)
    text = context[offsets[7][0]:offsets[12][1]]
    span = char_span_of_answer(context, text, offsets[7][0])
    ws = qa_windows("ex", "ที่ไหน", context, tok.encode, build, max_length=3 + 4 + 10, doc_stride=4, answer=span)
    hits = [w for w in ws if w.start_position]
    assert hits
    scored = [logits_at(w, w.start_position, w.end_position) if w.start_position else logits_at(w, 0, 0)
              for w in ws]
    assert best_span(ws, [s for s, _ in scored], [e for _, e in scored], context) == text

    # an answer starting inside a 2-character piece comes back as the whole pieces it touches
    lo = offsets[6][0] + 1
    assert offsets[6][1] - offsets[6][0] == 2
    (w,) = qa_windows("ex", "q", context, tok.encode, build, answer=(lo, offsets[9][1]))
    sl, el = logits_at(w, w.start_position, w.end_position)
    assert best_span([w], [sl], [el], context) == context[offsets[6][0]:offsets[9][1]]


# -- span choice ---------------------------------------------------------------------

def _one_window(n_ctx=40):
    tok = SubwordTokenizer(piece=4)
    context = words(n_ctx)
    (w,) = qa_windows("ex", "q", context, tok.encode, build, max_length=3 + 1 + n_ctx)
    return w, context, tok.encode(context)[1]


def test_max_answer_length_and_order_are_respected():
    w, context, offsets = _one_window()
    c = ctx_indices(w)
    n = len(w.input_ids)
    sl, el = np.full(n, -20.0), np.full(n, -20.0)
    sl[c[2]], el[c[10]] = 9.0, 9.0    # 9 tokens: too long for max_answer_length=5
    sl[c[20]], el[c[15]] = 8.5, 8.5   # end before start
    sl[c[30]], el[c[33]] = 3.0, 3.0   # valid, lower score
    assert best_span([w], [sl], [el], context, max_answer_length=5) == "w030 w031 w032 w033"
    assert best_span([w], [sl], [el], context, max_answer_length=9) == " ".join(f"w{i:03d}" for i in range(2, 11))
    # top-1 start is 2, top-1 end is 10: no pair survives length 5
    assert best_span([w], [sl], [el], context, n_best=1, max_answer_length=5) == ""


def test_special_and_question_positions_are_never_answers():
    w, context, offsets = _one_window()
    n = len(w.input_ids)
    sl, el = np.full(n, -1.0), np.full(n, -1.0)
    sl[0] = el[0] = 50.0   # CLS
    sl[1] = el[1] = 40.0   # question token
    sl[-1] = el[-1] = 30.0  # final SEP
    c = ctx_indices(w)
    sl[c[4]], el[c[4]] = 1.0, 1.0
    assert best_span([w], [sl], [el], context, n_best=4) == "w004"


def test_later_window_with_higher_score_wins_and_padding_is_ignored():
    tok = SubwordTokenizer(piece=4)
    context = words(50)
    ws = qa_windows("ex", "q", context, tok.encode, build, max_length=3 + 1 + 20, doc_stride=10)
    assert len(ws) == 4
    c0, c3 = ctx_indices(ws[0]), ctx_indices(ws[3])
    first = logits_at(ws[0], c0[1], c0[2], hi=6.0, pad=40)
    last = logits_at(ws[3], c3[5], c3[6], hi=6.5, pad=40)
    mid = [logits_at(w, 0, 0, pad=40) for w in ws[1:3]]
    starts = [first[0], *(s for s, _ in mid), last[0]]
    ends = [first[1], *(e for _, e in mid), last[1]]
    for s, e in zip(starts, ends):
        s[len(ws[0].input_ids):] = e[len(ws[0].input_ids):] = 100.0  # padding must not be read
    assert best_span(ws, starts, ends, context) == "w035 w036"
    last[0][c3[5]] = 5.0
    assert best_span(ws, starts, ends, context) == "w001 w002"
    with pytest.raises(ValueError, match="windows"):
        best_span(ws, starts[:2], ends, context)


# -- gold answers ---------------------------------------------------------------------

def test_char_span_of_answer():
    context = "The Normans gave their name to Normandy, a region in France. Normandy is green."
    at = context.index("Normandy")
    assert char_span_of_answer(context, "Normandy", at) == (at, at + 8)
    assert char_span_of_answer(context, "Normandy", at + 2) == (at, at + 8)   # off by 2
    assert char_span_of_answer(context, "Normandy", at - 2) == (at, at + 8)
    second = context.index("Normandy", at + 1)
    assert char_span_of_answer(context, "Normandy", second - 3) == (second, second + 8)  # nearest occurrence
    assert char_span_of_answer(context, "Brittany", at) is None
    assert char_span_of_answer(context, "", at) is None
    assert char_span_of_answer(context, "France", 10_000) == (context.index("France"), context.index("France") + 6)

