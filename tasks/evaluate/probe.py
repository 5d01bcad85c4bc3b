"""Zero-shot cross-lingual transfer with a linear probe.

A logistic-regression classifier is trained on frozen, mean-pooled sentence
embeddings of one language (English) and tested on every language.  The
encoder is not updated, so the score says how much of the label's information
the representation carries *in the same place* across languages; the transfer
gap (train-language score minus the mean of the others, XY-LENT Table 4) says
how much is lost crossing languages.  Next to it: the majority-class rate, the
score of a probe that learned nothing.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Callable

import numpy as np

from xylent.errors import XylentError

MIN_TRAIN_PER_LABEL = 5  # labels rarer than this in training cannot be learned (or cross-validated); left out
C_GRID = np.logspace(-3, 2, 11)  # inverse L2 strength, chosen by 5-fold CV on the train language only


def fit_probe(x: np.ndarray, y: list[str], seed: int = 0):
    """Standardised features, multinomial logistic regression; the regularisation
    is chosen by cross-validation on the training language alone (the zero-shot
    protocol: nothing is selected on the languages it is tested on)."""
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    cv = StratifiedKFold(n_splits=5, shuffle=True, random_state=seed)
    clf = make_pipeline(StandardScaler(), LogisticRegressionCV(Cs=C_GRID, cv=cv, scoring="neg_log_loss",
                                                               max_iter=5000, random_state=seed))
    with warnings.catch_warnings():  # scikit-learn announces default changes we do not rely on (all set here)
        warnings.simplefilter("ignore", FutureWarning)
        return clf.fit(x, y)


def evaluate_probe(embed: Callable[[list[str]], np.ndarray], train: tuple[list[str], list[str]],
                   tests: dict[str, tuple[list[str], list[str]]], train_language: str) -> dict:
    """``train`` = (labels, texts) in ``train_language``; ``tests`` = lang -> (labels, texts).
    Returns per-language accuracy (0–100), the majority baseline and the transfer gap."""
    counts = Counter(train[0])
    kept = {lab for lab, n in counts.items() if n >= MIN_TRAIN_PER_LABEL}
    if len(kept) < 2:
        raise XylentError(f"the probe's {train_language} training data has {len(kept)} label(s) with at least "
                          f"{MIN_TRAIN_PER_LABEL} examples ({dict(counts)}); a classifier needs two",
                          where=f"train-{train_language}.tsv",
                          fix="add training examples, or reserve a larger holdout fraction")
    tr = [(lab, t) for lab, t in zip(*train) if lab in kept]
    clf = fit_probe(embed([t for _, t in tr]), [lab for lab, _ in tr])
    majority = max(kept, key=lambda lab: (counts[lab], lab))
    langs, dropped = {}, 0
    for lang, (labels, texts) in tests.items():
        rows = [(lab, t) for lab, t in zip(labels, texts) if lab in kept]
        dropped += len(labels) - len(rows)
        if not rows:
            continue
        gold = np.array([lab for lab, _ in rows])
        pred = clf.predict(embed([t for _, t in rows]))
        langs[lang] = {"accuracy": 100.0 * float((pred == gold).mean()),
                       "majority_baseline": 100.0 * float((gold == majority).mean()), "n": len(rows)}
    others = [v["accuracy"] for lang, v in langs.items() if lang != train_language]
    if not langs:
        raise XylentError("no probe test item has a label the probe was trained on",
                          where="test-<lang>.tsv", fix="test on the labels of the training file")
    out = {"languages": langs, "labels": sorted(kept), "train_examples": len(tr), "test_items_dropped": dropped,
           "avg": float(np.mean([v["accuracy"] for v in langs.values()])),
           "majority_baseline": float(np.mean([v["majority_baseline"] for v in langs.values()]))}
    if train_language in langs and others:
        out["transfer_gap"] = langs[train_language]["accuracy"] - float(np.mean(others))
    return out
