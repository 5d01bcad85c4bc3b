"""Examples -> model inputs for the classification and tagging heads, and the
predictions back to the examples' own units (labels, one tag per word).

Tagging follows XTREME: a word's label sits on its first sub-token, later
sub-tokens are ignored in the loss, and a word's prediction is read from its
first sub-token.  A sentence longer than ``max_length`` is cut into chunks of
whole words, so every word gets a prediction (XTREME pre-splits its files for
the same reason).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xylent.models.heads import IGNORE
from xylent.tasks.evaluate.finetune.data import Example
from xylent.tasks.evaluate.finetune.tokens import TextTokenizer


@dataclass
class Feature:
    ids: list[int]
    target: dict          # what the loss reads: label / labels / start, end
    example: int          # index of its example
    first_tokens: list[int] | None = None  # tagging: input position of each word's first piece
    first_word: int = 0   # tagging: index of the chunk's first word in its sentence
    window: object = None  # qa: the xylent.tasks.evaluate.finetune.qa.QAWindow it came from


def classification_features(examples: list[Example], tok: TextTokenizer, labels: dict[str, int],
                            max_length: int) -> list[Feature]:
    out = []
    n_special_pair = len(tok.build([], [])[0])
    for i, e in enumerate(examples):
        if len(e.texts) == 1:
            ids, _ = tok.build(tok.ids(e.texts[0])[: max_length - len(tok.build([])[0])])
        else:
            a, b = tok.ids(e.texts[0]), tok.ids(e.texts[1])
            room = max_length - n_special_pair
            while len(a) + len(b) > room:  # longest-first truncation, as Hugging Face's default
                if len(a) >= len(b):
                    a = a[:-1]
                else:
                    b = b[:-1]
            ids, _ = tok.build(a, b)
        out.append(Feature(ids=ids, target={"label": labels.get(e.label, IGNORE)}, example=i))
    return out


def tagging_features(examples: list[Example], tok: TextTokenizer, labels: dict[str, int],
                     max_length: int) -> list[Feature]:
    room = max_length - len(tok.build([])[0])
    out = []
    for i, e in enumerate(examples):
        pieces = tok.word_ids(e.tokens)
        start = 0
        while start < len(pieces):
            end, used = start, 0
            while end < len(pieces) and (end == start or used + len(pieces[end]) <= room):
                used += min(len(pieces[end]), room)
                end += 1
            ids_a, firsts = [], []
            for w in range(start, end):
                firsts.append(len(ids_a))
                ids_a += pieces[w][: room - len(ids_a)] if w == start else pieces[w]
            ids, seg = tok.build(ids_a)
            pos_a = [p for p, s in enumerate(seg) if s == 0]
            first_pos = [pos_a[f] for f in firsts]
            target = [IGNORE] * len(ids)
            for w, p in zip(range(start, end), first_pos):
                target[p] = labels.get(e.tags[w], IGNORE) if e.tags else IGNORE
            out.append(Feature(ids=ids, target={"labels": target}, example=i, first_tokens=first_pos,
                               first_word=start))
            start = end
    return out


def classification_predictions(features: list[Feature], logits: list[np.ndarray], names: list[str]) -> list[str]:
    return [names[int(np.argmax(row))] for row in logits]


def tagging_predictions(examples: list[Example], features: list[Feature], logits: list[np.ndarray],
                        names: list[str]) -> list[list[str]]:
    out = [["O"] * len(e.tokens) for e in examples]
    for f, row in zip(features, logits):
        for k, p in enumerate(f.first_tokens):
            out[f.example][f.first_word + k] = names[int(np.argmax(row[p]))]
    return out
