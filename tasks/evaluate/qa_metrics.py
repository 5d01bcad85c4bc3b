"""Exact match and token F1 for extractive QA, as XTREME scores XQuAD, TyDiQA-GoldP and MLQA.

XQuAD and TyDiQA use the SQuAD v1.1 normalisation (English articles, ASCII
punctuation) whatever the language; MLQA normalises per answer language.  The
arithmetic follows google-research/xtreme ``third_party/evaluate_squad.py`` and
``third_party/evaluate_mlqa.py`` step by step, so sums agree to the last bit.
"""

from __future__ import annotations

import functools
import logging
import re
import string
import sys
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

log = logging.getLogger(__name__)

_SQUAD_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_SQUAD_PUNCT = str.maketrans("", "", string.punctuation)

# Word-bounded articles per MLQA answer language; hi and zh have none.  vi lists
# "của" and "là", which are not articles: the reference strips them, so do we.
_MLQA_ARTICLES = {
    "en": re.compile(r"\b(?:a|an|the)\b"),
    "es": re.compile(r"\b(?:un|una|unos|unas|el|la|los|las)\b"),
    "vi": re.compile(r"\b(?:của|là|cái|chiếc|những)\b"),
    "de": re.compile(r"\b(?:ein|eine|einen|einem|eines|einer|der|die|das|den|dem|des)\b"),
}
# The reference's Arabic pattern is "\sال^|ال"; its first branch can never match
# (``^`` after two characters), so every "ال" is replaced by a space, also in the
# middle of a word.
_ARABIC_ARTICLE = "ال"
MLQA_LANGUAGES = ("en", "es", "hi", "vi", "de", "ar", "zh")


@functools.cache
def _mlqa_punct() -> frozenset[str]:
    # Every Unicode "P*" code point plus ASCII punctuation (which adds symbols
    # such as $ + < = > ^ ` | ~).  Built from this interpreter's Unicode tables,
    # as the reference does, so both agree when run on the same Python.
    cats = (chr(i) for i in range(sys.maxunicode))
    return frozenset(c for c in cats if unicodedata.category(c).startswith("P")) | frozenset(string.punctuation)


@functools.cache
def _mlqa_punct_table() -> dict[int, None]:
    return dict.fromkeys(map(ord, _mlqa_punct()))


def _is_cjk(ch: str) -> bool:
    # The reference's range stops at U+9FA5, not U+9FFF: later ideographs group
    # with their neighbours like Latin letters do.
    return "\u4e00" <= ch <= "\u9fa5"


def _mixed_segmentation(text: str) -> list[str]:
    """Chinese: each CJK ideograph (or punctuation mark) is a token; other runs split on whitespace."""
    punct = _mlqa_punct()
    tokens: list[str] = []
    run: list[str] = []
    for ch in text:
        if _is_cjk(ch) or ch in punct:
            tokens.extend("".join(run).split())
            run = []
            tokens.append(ch)
        else:
            run.append(ch)
    tokens.extend("".join(run).split())
    return tokens


def squad_normalize(text: str) -> str:
    """Lower case, drop ASCII punctuation and English articles, collapse whitespace."""
    text = text.lower().translate(_SQUAD_PUNCT)
    return " ".join(_SQUAD_ARTICLES.sub(" ", text).split())


def mlqa_normalize(text: str, lang: str) -> str:
    """MLQA's normalisation for an answer in ``lang`` (one of :data:`MLQA_LANGUAGES`)."""
    if lang not in MLQA_LANGUAGES:
        raise ValueError(f"MLQA has no normalisation for language {lang!r}; known: {', '.join(MLQA_LANGUAGES)}")
    text = text.lower().translate(_mlqa_punct_table())
    if lang == "ar":
        text = text.replace(_ARABIC_ARTICLE, " ")
    elif lang in _MLQA_ARTICLES:
        text = _MLQA_ARTICLES[lang].sub(" ", text)
    tokens = _mixed_segmentation(text) if lang == "zh" else text.split()
    return " ".join(t for t in tokens if t.strip())


def _token_f1(prediction: str, gold: str) -> float:
    pred_tokens = prediction.split()
    gold_tokens = gold.split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0
    precision = 1.0 * same / len(pred_tokens)
    recall = 1.0 * same / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


def squad_exact_match(prediction: str, gold: str) -> bool:
    return squad_normalize(prediction) == squad_normalize(gold)


def squad_f1(prediction: str, gold: str) -> float:
    return _token_f1(squad_normalize(prediction), squad_normalize(gold))


def mlqa_exact_match(prediction: str, gold: str, lang: str) -> bool:
    return mlqa_normalize(prediction, lang) == mlqa_normalize(gold, lang)


def mlqa_f1(prediction: str, gold: str, lang: str) -> float:
    return _token_f1(mlqa_normalize(prediction, lang), mlqa_normalize(gold, lang))


def _questions(dataset: Iterable[Mapping]) -> Iterable[Mapping]:
    for article in dataset:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def _qa_scores(dataset: Iterable[Mapping], predictions: Mapping[str, str], normalize: Callable[[str], str],
               source: str) -> dict:
    # An empty gold and an empty prediction give EM 1 but F1 0 (no shared
    # token): the reference's behaviour, kept.  Unanswered questions count 0.
    em = f1 = total = 0
    unanswered: list[str] = []
    for qa in _questions(dataset):
        total += 1
        if qa["id"] not in predictions:
            unanswered.append(qa["id"])
            continue
        golds = [normalize(answer["text"]) for answer in qa["answers"]]
        if not golds:
            raise ValueError(f"question {qa['id']!r} has no gold answer")
        pred = normalize(predictions[qa["id"]])
        em += max(pred == gold for gold in golds)
        f1 += max(_token_f1(pred, gold) for gold in golds)
    if total == 0:
        raise ValueError("the gold data holds no question")
    if unanswered:
        log.warning("%s: %d of %d questions have no prediction and score 0 (first: %s)",
                    source, len(unanswered), total, ", ".join(unanswered[:3]))
    return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total}


def squad_scores(dataset: Iterable[Mapping], predictions: Mapping[str, str], *, source: str = "predictions") -> dict:
    """``{"exact_match", "f1"}`` (0-100) of ``{question id: answer}`` against SQuAD-format articles.

    ``source`` names the predictions in the warning about unanswered questions.
    """
    return _qa_scores(dataset, predictions, squad_normalize, source)


def mlqa_scores(dataset: Iterable[Mapping], predictions: Mapping[str, str], lang: str, *,
                source: str = "predictions") -> dict:
    """As :func:`squad_scores`, with MLQA's normalisation for answer language ``lang``."""
    if lang not in MLQA_LANGUAGES:
        raise ValueError(f"MLQA has no normalisation for language {lang!r}; known: {', '.join(MLQA_LANGUAGES)}")
    return _qa_scores(dataset, predictions, lambda text: mlqa_normalize(text, lang), source)
