"""VoCAP allocation: how many pieces each language gets under one budget.

Each language i has a smoothed (concave) ALP curve over its size grid and a
weight w_i = q_i^β.  Its gain *per piece* between grid sizes s_{k−1} and s_k is
w_i·(ALP_i(s_k) − ALP_i(s_{k−1}))/(s_k − s_{k−1}); the concave smoothing makes
these slopes non-increasing, also on a non-uniform grid.  At a threshold t a
language takes the largest grid size up to which every gain per piece exceeds
t; every language gets at least the smallest grid size.  On a uniform grid this
is the reference's rule (its per-step gains are the per-piece gains times the
constant step), so it makes the same choices; on a non-uniform grid (say a
doubling one) comparing per-step gains would favour the big, expensive steps.

The budget constrains the *union* of the chosen models' pieces.  The sizes only
change when t crosses one of the finitely many gains, so instead of bisecting
on t (the reference) every such threshold is a candidate.  Separately trained
SentencePiece models are not nested, so the union need not grow as t falls: all
candidates are scanned, largest threshold first, keeping the union's size up to
date with a reference count per piece: a language that moves to another size
releases the pieces only its old model has and takes those only its new one
has, and the union is the pieces with a count above zero.  Each grid model the
scan reaches is asked for once; nothing is rebuilt.  The answer is the candidate with the largest objective Σ w_i·ALP_i (smoothed
ALPs) whose union fits the budget, ties going to the lower threshold.  Every
step taken along the scan has a positive gain, so the objective grows strictly
along it and that candidate is simply the last one that fits: monotone in the
budget, and with nested pieces the same answer as the bisection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from xylent.tasks.vocab.alp import concave_curve


def _gains_per_piece(sizes: list[int], alps: list[float], weight: float) -> np.ndarray:
    """w·ΔALP/Δsize per grid step, as a running minimum: a language stops at its
    first step not above the threshold even where rounding breaks the smoothed
    slopes' order, so the steps taken at any threshold are a prefix."""
    if len(sizes) < 2:
        return np.zeros(0)
    gains = weight * np.diff(np.asarray(alps, dtype=float)) / np.diff(np.asarray(sizes, dtype=float))
    return np.minimum.accumulate(gains)


class _Union:
    """Size of the union of one piece set per language while languages change
    sets: a reference count per piece says how many languages' current sets
    hold it, and the union is the pieces with a count above zero.  A change
    touches only the pieces in which the old and the new set differ."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}
        self._held: dict[str, frozenset | set] = {}

    @property
    def size(self) -> int:
        return len(self._count)

    def hold(self, lang: str, pieces: Iterable[str]) -> None:
        """``lang``'s set is now ``pieces`` (in place of what it held before)."""
        if not isinstance(pieces, (set, frozenset)):
            pieces = set(pieces)
        count, old = self._count, self._held.get(lang, frozenset())
        for p in old - pieces:
            c = count[p]
            if c == 1:
                del count[p]
            else:
                count[p] = c - 1
        for p in pieces - old:
            count[p] = count.get(p, 0) + 1
        self._held[lang] = pieces


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
    the β exponent; ``pieces(lang, size)`` is that grid model's set of pieces
    (each size the scan passes through is asked for once, in increasing order
    per language: with positive gains, most of the grid; the caller caches).
    ``report`` (optional dict) receives ``threshold`` (the chosen threshold on
    the weighted gain *per piece*, w·ΔALP/Δsize; on a uniform grid the
    reference's per-step threshold divided by the step; inf when nothing
    fits), ``union_size``, ``capped`` (languages at their grid maximum while
    budget remained), ``over_budget_at_floor`` (no candidate fits, the floor
    included: every language gets the smallest size, over budget) and ``smoothed`` (the
    concave curves).
    """
    smooth = {}
    for lang, points in curves.items():
        pts = sorted(points)
        sizes = [s for s, _ in pts]
        smooth[lang] = (sizes, concave_curve(sizes, [a for _, a in pts]))
    w = {lang: float(weights[lang]) ** beta for lang in smooth}

    # events: at thresholds below gain g, lang takes at least its k-th grid size
    # (a language's steps with equal gains, as in a pooled stretch, are one move)
    events: dict[float, dict[str, int]] = {}
    for lang, (sizes, alps) in smooth.items():
        for k, g in enumerate(_gains_per_piece(sizes, alps, w[lang]), start=1):
            if g > 0:  # a running minimum: once not positive, never again
                events.setdefault(float(g), {})[lang] = k

    level = {lang: 0 for lang in smooth}
    union = _Union()
    for lang, (sizes, _) in smooth.items():
        union.hold(lang, pieces(lang, sizes[0]))
    floor_union = union.size
    best: tuple[float, dict[str, int], int] | None = None  # threshold, levels, union size

    def consider(t: float) -> None:
        nonlocal best
        if union.size <= budget:  # later candidates have a larger objective (see above)
            best = (t, dict(level), union.size)

    consider(float("inf"))
    for g in sorted(events, reverse=True):
        consider(g)  # steps with gain > g taken, those at g not yet
        for lang, k in events[g].items():
            union.hold(lang, pieces(lang, smooth[lang][0][k]))
            level[lang] = k
    consider(0.0)

    over = best is None
    threshold, levels, union_size = best if best is not None else (float("inf"), {lang: 0 for lang in smooth},
                                                                   floor_union)
    chosen = {lang: smooth[lang][0][k] for lang, k in levels.items()}
    if report is not None:
        report.update({
            "threshold": threshold,
            "union_size": union_size,
            "capped": sorted(lang for lang, size in chosen.items() if size == smooth[lang][0][-1]
                             and union_size < budget),
            "over_budget_at_floor": over,
            "smoothed": {lang: list(zip(s, a)) for lang, (s, a) in smooth.items()},
        })
    return chosen
