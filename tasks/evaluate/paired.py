"""Is a difference between two encoders shown, or could another pretraining seed undo it?

Both encoders are scored per seed and language on one task, and paired there.
The languages of one seed share that seed's model, so they are not independent
draws: the seed is the unit of replication.  Each seed gives one number, the
mean difference over its languages, and the interval is Student's t over those
per-seed means (k - 1 degrees of freedom).  With k seeds that is the exact
interval for "seed effect + language noise" when every seed scores the same
languages, and it widens as it should when there are few seeds.

Not a bootstrap: at three seeds the percentile bootstrap's lower bound is the
worst seed's mean (a resample of that seed three times has probability 1/27 >
2.5 %), so it would call a difference "shown" whenever the three seeds agree in
sign, which happens one time in four with no difference at all.  Not a sign
test over (seed, language) units either: it would count 3 seeds x 19 languages
as 57 independent runs.  The counts of seeds and of languages (by their mean
over the seeds) that go up and down are printed beside, as counts.

A claim is "shown" only where the 95 % interval over at least three seeds
excludes zero; otherwise it is "not shown at this scale", whichever way the
mean points.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import t as student_t

LEVEL = 0.95
MIN_SEEDS = 3  # fewer, and the seed-to-seed spread is barely measured: nothing is "shown"


def difference(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]]) -> dict | None:
    """``a`` minus ``b``, each ``{seed: {language: score}}``, paired on the seeds and languages both
    scored (a score that is not a finite number is left out).  None when they share nothing."""
    by_seed = {}
    for s in sorted(set(a) & set(b)):
        diffs = {lang: a[s][lang] - b[s][lang] for lang in sorted(set(a[s]) & set(b[s]))}
        diffs = {lang: d for lang, d in diffs.items() if math.isfinite(d)}
        if diffs:
            by_seed[s] = diffs
    if not by_seed:
        return None
    seed_means = np.array([np.mean(list(d.values())) for d in by_seed.values()])
    k, mean = len(seed_means), float(seed_means.mean())
    if k > 1:
        half = float(student_t.ppf((1 + LEVEL) / 2, k - 1) * seed_means.std(ddof=1) / math.sqrt(k))
    else:
        half = math.inf  # one seed: its spread is unknown
    langs = {lang for d in by_seed.values() for lang in d}
    lang_means = [np.mean([d[lang] for d in by_seed.values() if lang in d]) for lang in langs]
    return {"mean": mean, "low": mean - half, "high": mean + half, "seeds": k,
            "seeds_up": int((seed_means > 0).sum()), "seeds_down": int((seed_means < 0).sum()),
            "languages": len(langs), "languages_up": int(sum(m > 0 for m in lang_means)),
            "languages_down": int(sum(m < 0 for m in lang_means)),
            "verdict": verdict(mean - half, mean + half, k)}


def verdict(low: float, high: float, seeds: int) -> str:
    if seeds < MIN_SEEDS:
        return f"not shown: {seeds} seed{'s' if seeds != 1 else ''} (at least {MIN_SEEDS} measure the spread)"
    if low > 0:
        return "shown: above"
    if high < 0:
        return "shown: below"
    return "not shown at this scale"


def describe(d: dict) -> str:
    """One cell: the mean difference, its interval, the counts and the verdict."""
    interval = f"[{d['low']:+.1f}, {d['high']:+.1f}]" if math.isfinite(d["high"]) else "[no interval]"
    return (f"{d['mean']:+.1f} {interval}; seeds {d['seeds_up']}↑ {d['seeds_down']}↓ of {d['seeds']}, "
            f"languages {d['languages_up']}↑ {d['languages_down']}↓ of {d['languages']}: {d['verdict']}")
