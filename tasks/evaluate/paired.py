"""Is a difference between two encoders shown, or could another pretraining seed undo it?

The unit is one (seed, language) pair scored by both encoders on one task: the
difference of their scores.  Languages of one seed share that seed's model, so
they are not independent draws; the interval is a two-stage bootstrap that
resamples the seeds first and then the languages within each drawn seed, which
keeps the seed-to-seed spread in the interval (resampling the pooled units
alone would count 3 seeds x 19 languages as 57 independent runs).  Beside it,
the sign test over the units (ties dropped) says how often the sign holds.

A claim is "shown" only where the 95 % interval over at least three seeds
excludes zero; otherwise it is "not shown at this scale", whichever way the
mean points.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import binomtest

RESAMPLES = 10_000
LEVEL = 0.95
MIN_SEEDS = 3  # fewer, and the seed-to-seed spread is not measured: nothing is "shown"


def difference(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]], *, seed: int = 0) -> dict | None:
    """``a`` minus ``b``, each ``{seed: {language: score}}``, paired on the seeds and languages both scored.
    None when they share no unit."""
    by_seed = {s: np.array([a[s][lang] - b[s][lang] for lang in sorted(set(a[s]) & set(b[s]))])
               for s in sorted(set(a) & set(b))}
    by_seed = {s: d for s, d in by_seed.items() if len(d)}
    if not by_seed:
        return None
    units = np.concatenate(list(by_seed.values()))
    groups = list(by_seed.values())
    rng = np.random.default_rng(seed)
    k = len(groups)
    drawn = rng.integers(k, size=(RESAMPLES, k))  # stage 1: which seeds each resample holds
    sums, sizes = np.zeros((RESAMPLES, k)), np.zeros((RESAMPLES, k))
    for j, g in enumerate(groups):  # stage 2: each drawn seed's languages, resampled afresh at every draw
        inner = g[rng.integers(len(g), size=(RESAMPLES, k, len(g)))].sum(axis=2)
        here = drawn == j
        sums[here], sizes[here] = inner[here], len(g)
    means = sums.sum(axis=1) / sizes.sum(axis=1)
    lo, hi = np.quantile(means, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    up, down = int((units > 0).sum()), int((units < 0).sum())
    p = float(binomtest(up, up + down).pvalue) if up + down else 1.0
    return {"mean": float(units.mean()), "low": float(lo), "high": float(hi), "seeds": len(groups),
            "units": len(units), "above": up, "below": down, "sign_p": p,
            "verdict": verdict(float(lo), float(hi), len(groups))}


def verdict(low: float, high: float, seeds: int) -> str:
    if seeds < MIN_SEEDS:
        return f"not shown: {seeds} seed{'s' if seeds != 1 else ''} (at least {MIN_SEEDS} measure the spread)"
    if low > 0:
        return "shown: above"
    if high < 0:
        return "shown: below"
    return "not shown at this scale"


def describe(d: dict) -> str:
    """One cell: the mean difference, its interval, the sign count and the verdict."""
    return (f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}], {d['above']}↑ {d['below']}↓ of {d['units']} "
            f"(sign test p {d['sign_p']:.2g}, {d['seeds']} seed{'s' if d['seeds'] != 1 else ''}): {d['verdict']}")
