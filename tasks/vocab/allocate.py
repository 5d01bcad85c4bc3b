"""VoCAP allocation: how many pieces each language gets under one budget.

Each language i, with smoothed (concave) ALP curve over the size grid and
weight w_i = q_i^β, takes the largest grid size whose weighted marginal gain
w_i·(ALP_i(s_k) − ALP_i(s_{k−1})) exceeds a threshold t; every language gets
at least the smallest grid size.  The budget constrains the *union* of the
chosen models' pieces.  The reference bisects on t; since the sizes only change
when t crosses one of the finitely many weighted gains, we binary-search that
sorted list instead: the same optimum, exactly, and monotone in the budget.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tasks.vocab.alp import concave_curve


def _sizes_at(t: float, curves: dict, weights: dict) -> dict[str, int]:
    chosen = {}
    for lang, (sizes, alps) in curves.items():
        k = 0
        gains = np.diff(alps) * weights[lang]
        # concave curves: gains are non-increasing, so the first gain <= t stops it
        while k < len(gains) and gains[k] > t:
            k += 1
        chosen[lang] = sizes[k]
    return chosen


def allocate_vocabulary(
    curves: dict[str, list[tuple[int, float]]],
    weights: dict[str, float],
    budget: int,
    pieces: Callable[[str, int], set[str]],
    *,
    beta: float = 0.7,
    report: dict | None = None,
) -> dict[str, int]:
    """language -> chosen size (see the module docstring).

    ``curves`` are unsmoothed (size, ALP) points; ``weights`` are the q_i before
    the β exponent.  ``report`` (optional dict) receives ``threshold``,
    ``union_size``, ``capped`` (languages at their grid maximum while budget
    remained) and ``over_budget_at_floor``.
    """
    smooth = {}
    for lang, points in curves.items():
        pts = sorted(points)
        sizes = [s for s, _ in pts]
        smooth[lang] = (sizes, concave_curve(sizes, [a for _, a in pts]))
    w = {lang: float(weights[lang]) ** beta for lang in smooth}

    cache: dict[tuple, int] = {}

    def union_size(chosen: dict[str, int]) -> int:
        key = tuple(sorted(chosen.items()))
        if key not in cache:
            u: set[str] = set()
            for lang, size in chosen.items():
                u |= pieces(lang, size)
            cache[key] = len(u)
        return cache[key]

    # thresholds where some language's size changes, largest first (t = inf: all at the floor)
    ts = sorted({float(g) for lang, (s, a) in smooth.items() for g in np.diff(a) * w[lang]}, reverse=True)
    candidates = [float("inf")] + [t for t in ts if t > 0] + [0.0]
    # sizes grow as t falls: find the last candidate whose union fits
    lo, hi = 0, len(candidates) - 1
    if union_size(_sizes_at(candidates[0], smooth, w)) > budget:
        best = 0
        over = True
    else:
        over = False
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if union_size(_sizes_at(candidates[mid], smooth, w)) <= budget:
                lo = mid
            else:
                hi = mid - 1
        best = lo
    chosen = _sizes_at(candidates[best], smooth, w)
    if report is not None:
        report.update({
            "threshold": candidates[best],
            "union_size": union_size(chosen),
            "capped": sorted(lang for lang, size in chosen.items() if size == smooth[lang][0][-1]
                             and union_size(chosen) < budget),
            "over_budget_at_floor": over,
            "smoothed": {lang: list(zip(s, a)) for lang, (s, a) in smooth.items()},
        })
    return chosen
