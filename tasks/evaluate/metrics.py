"""XTREME's non-QA metrics as pure functions, on the benchmark's 0-100 scale.

Each returns ``{metric name: value}`` with the names and float arithmetic of
google-research/xtreme ``evaluate.py``, so scores agree with the leaderboard
script to the last bit.  QA metrics live in :mod:`xylent.tasks.evaluate.qa_metrics`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

from seqeval.metrics.sequence_labeling import precision_recall_fscore_support

MEWSLIX_TOP_K = 20


def accuracy(labels: Sequence, predictions: Sequence) -> dict:
    """Share of predictions equal to their label (PAWS-X, XNLI, Tatoeba, XCOPA)."""
    if len(labels) != len(predictions):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
    if not labels:
        raise ValueError("no labels to score")
    correct = sum(int(p == gold) for p, gold in zip(predictions, labels))
    return {"accuracy": float(correct) / len(predictions) * 100}


def tag_f1(labels: Sequence[Sequence[str]], predictions: Sequence[Sequence[str]]) -> dict:
    """Micro span F1 / precision / recall over sentences of tags (PAN-X, UD-POS), via seqeval.

    seqeval's default (conlleval-compatible) chunking is applied to UD-POS too,
    where a run of equal POS tags counts as one span: that is how XTREME scores
    it, so it is kept.
    """
    if len(labels) != len(predictions):
        raise ValueError(f"{len(predictions)} predicted sentences for {len(labels)} gold sentences")
    with warnings.catch_warnings():
        # POS tags are not B-/I- tags and seqeval says so for every one of them.
        warnings.filterwarnings("ignore", message=".*seems not to be NE tag", category=UserWarning)
        # a model that predicts no entity yet (an early fine-tuning epoch) scores 0, which is right; no warning
        warnings.filterwarnings("ignore", message=".*ill-defined.*")
        precision, recall, f1, _ = precision_recall_fscore_support(
            [list(s) for s in labels], [list(s) for s in predictions], average="micro")
    return {"f1": float(f1) * 100, "precision": float(precision) * 100, "recall": float(recall) * 100}


def bucc_f1(labels: Sequence[str], predictions: Sequence[str]) -> dict:
    """F1 of the set of mined ``"src_id\\ttgt_id"`` pairs against the gold pairs (BUCC 2018).

    Both sides are deduplicated before counting, so a pair predicted twice
    counts once in the precision's denominator.
    """
    gold = {tuple(line.split("\t")) for line in labels}
    mined = {tuple(line.split("\t")) for line in predictions}
    correct = len(gold & mined)
    if correct > 0:
        precision = correct / len(mined)
        recall = correct / len(gold)
        f1 = 2 * precision * recall / (precision + recall)
    else:
        precision = recall = f1 = 0
    return {"f1": f1 * 100, "precision": precision * 100, "recall": recall * 100}


def map_at_k(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, Sequence[str]],
             k: int = MEWSLIX_TOP_K) -> dict:
    """Mewsli-X ``map@k``: mean reciprocal rank of the single gold entity in the top ``k`` predictions.

    ``gold`` maps example id to a one-item list with the gold entity id;
    ``predictions`` maps example id to a ranked list of entity ids.  Examples
    without a prediction score 0; predictions for unknown ids are ignored.
    """
    ranks = []
    for example_id, entities in gold.items():
        if not entities:
            raise ValueError(f"example {example_id!r} has no gold entity")
        target = entities[0].strip()
        ranked = list(predictions.get(example_id, []))[:k]
        ranks.append(1.0 / (ranked.index(target) + 1) if target in ranked else 0.0)
    mrr = sum(ranks) / len(ranks) if ranks else 0.0
    return {f"map@{k}": mrr * 100}
