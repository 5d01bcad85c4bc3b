"""χ² DRO best response over groups (XY-LENT §6.6; Zhou et al. 2021,
reference code violet-zct/fairseq-dro-mnmt).

Given per-group losses L and a prior Q (the training distribution), the
adversary picks

    q = argmax Σ q_i L_i  s.t.  ½ Σ Q_i (q_i/Q_i − 1)² ≤ ρ,  Σ q_i = 1,  q_i ≥ m·Q_i.

In ratios r = q/Q the KKT conditions give r_i = max(m, (L_i − η)/λ): the groups
clamped at the floor are those with the smallest losses, and on the others r is
affine in L with its mean fixed by Σ Q r = 1 and its slope fixed by the
divergence being exactly ρ.  So instead of the reference's nested bisection we
sort by loss once and scan every cut point between "clamped" and "free" with
cumulative sums (O(n log n) in all), then recompute the winning cut directly
from the free groups and check its KKT conditions.  Losses are standardised
(Q-weighted mean 0, sd 1) first, which makes the result invariant to L → a·L + b
and keeps the cumulative sums well scaled.
"""

from __future__ import annotations

import numpy as np

__all__ = ["chi2_best_response", "chi2_divergence"]

# Losses whose spread on the support is below this fraction of their magnitude
# carry no signal (EMA round-off), so the adversary has nothing to prefer.
_EQUAL_RTOL = 1e-12
# Slack, in ratio units, when checking a cut's KKT conditions: rounding in the
# standardised losses is ~1e-15, so anything past this is the wrong cut.
_KKT_TOL = 1e-10
# Candidate cuts checked exactly (best scan candidates first) before settling for
# the least-violating one; one is nearly always enough.
_MAX_REFINE = 16


def _as_vector(name: str, value, what_to_do: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numeric ({exc}); {what_to_do}") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one entry per group), got shape {arr.shape}; {what_to_do}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: there are no groups to weight; {what_to_do}")
    return arr


def _normalised_prior(prior) -> np.ndarray:
    fix = "pass the groups' training distribution (non-negative weights with a positive sum, e.g. the sampling table)"
    p = _as_vector("prior", prior, fix)
    bad = ~np.isfinite(p)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"prior has {int(bad.sum())} NaN/inf entries (first at index {i}: {p[i]!r}); {fix}")
    if (p < 0).any():
        i = int(np.flatnonzero(p < 0)[0])
        raise ValueError(f"prior has {int((p < 0).sum())} negative entries (first at index {i}: {p[i]!r}); {fix}")
    total = p.sum()
    if not total > 0:
        raise ValueError(f"prior sums to 0: no group has any probability; {fix}")
    return p / total


def _check_inputs(losses, prior, rho, min_ratio) -> tuple[np.ndarray, np.ndarray, float, float]:
    loss_fix = "pass one finite loss per group (e.g. the EMA of each pair's training loss)"
    L = _as_vector("losses", losses, loss_fix)
    Q = _normalised_prior(prior)
    if L.shape != Q.shape:
        raise ValueError(f"losses has {L.size} groups but prior has {Q.size}; pass both in the same group order")
    bad = ~np.isfinite(L)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"losses has {int(bad.sum())} NaN/inf entries (first at index {i}: {L[i]!r}); "
                         f"{loss_fix}, dropping or re-initialising groups whose loss diverged")
    try:
        rho_f = float(rho)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"rho must be a number, got {rho!r}; set the χ² radius to a positive value "
                         "(reference 0.05-0.1)") from exc
    if not (np.isfinite(rho_f) and rho_f > 0):
        raise ValueError(f"rho must be a positive finite number, got {rho!r}; set the χ² radius to a positive "
                         "value (reference 0.05-0.1)")
    try:
        m = float(min_ratio)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"min_ratio must be a number in [0, 1), got {min_ratio!r}") from exc
    if not 0.0 <= m < 1.0:
        raise ValueError(f"min_ratio must be in [0, 1), got {min_ratio!r}; it is the floor on q/Q "
                         "(0 = no floor, reference 0.2), and 1 or more would leave no feasible q but Q itself")
    return L, Q, rho_f, m


def _extreme_ratios(z: np.ndarray, Q: np.ndarray, m: float) -> tuple[np.ndarray, float]:
    """The linear program's optimum ignoring the χ² ball: every group at the floor
    but the top-loss group(s), which share the rest in proportion to Q (the least
    divergent of the LP's optima), and its divergence."""
    top = z == z.max()
    q_top, q_rest = Q[top].sum(), Q[~top].sum()
    r_top = 1.0 + (1.0 - m) * q_rest / q_top  # Σ Q r = 1, written so that a tiny q_top keeps its precision
    return np.where(top, r_top, m), 0.5 * (1.0 - m) ** 2 * q_rest / q_top


def _cut_ratios(zs: np.ndarray, Qs: np.ndarray, k: int, rho: float, m: float):
    """Ratios (sorted order) with the k smallest-loss groups at the floor, computed
    directly from the free groups, and the cut's KKT violation; None when no
    ratio on this cut reaches divergence ρ."""
    qc, qf = Qs[:k].sum(), Qs[k:].sum()
    # Deviations from the free mean, measured from the heaviest free group: when
    # it dominates Q_F its own deviation is tiny, and z − mean would lose it all
    # (b can be huge then, so that loss would show up in ρ).
    ref = zs[k + int(np.argmax(Qs[k:]))]
    y = zs[k:] - ref
    mu = Qs[k:] @ y / qf
    d = y - mu
    s = Qs[k:] @ (d * d)
    # Σ Q r = 1 forces the free groups' mean ratio a = 1 + (1 − m)·qc/qf; the
    # spread b·d supplies the rest of the divergence (the cross term vanishes
    # because Σ_F Q d = 0): ½(1 − m)²·qc/qf + ½ b² s = ρ.
    shift = (1.0 - m) * qc / qf
    rest = 2.0 * rho - (1.0 - m) * shift
    if not (s > 0 and rest > 0):
        return None
    b = np.sqrt(rest / s)
    free = 1.0 + shift + b * d
    # Σ_F Q d is 0 only up to rounding, which one high-ratio group of tiny prior
    # magnifies; rescaling restores Σ q = 1 at a ~1e-12 relative cost in ρ.
    free *= (1.0 - m * qc) / (Qs[k:] @ free)
    violation = max(m - free[0], 0.0)  # the smallest free loss must not want to go below the floor
    if k > 0:  # the largest clamped loss must not want to rise above it
        violation = max(violation, 1.0 + shift + b * ((zs[k - 1] - ref) - mu) - m)
    ratios = np.empty_like(zs)
    ratios[:k] = m
    ratios[k:] = free
    return ratios, violation


def _binding_ratios(z: np.ndarray, Q: np.ndarray, rho: float, m: float) -> np.ndarray:
    order = np.argsort(z, kind="stable")
    zs, Qs = z[order], Q[order]
    n = zs.size
    # Free set of cut k = order[k:].  Suffix sums run from the top so that small
    # free sets keep their precision; the free sets' Q-weighted sums of squares
    # are accumulated from non-negative pairwise-merge terms (Chan et al.)
    # because Σ Q z² − (Σ Q z)²/Σ Q cancels catastrophically for a tight free set.
    qf = np.cumsum(Qs[::-1])[::-1]
    mu = np.cumsum((Qs * zs)[::-1])[::-1] / qf
    qc = np.concatenate(([0.0], np.cumsum(Qs)[:-1]))
    # How far the first free group sits below its free set's mean, mu[k] − zs[k],
    # taken from the next set's mean so that it keeps its precision when the
    # group dominates the set (then it is tiny and the slope b is huge).
    gap = np.zeros(n)
    gap[:-1] = mu[1:] - zs[:-1]
    below = np.zeros(n)
    below[:-1] = (qf[1:] / qf[:-1]) * gap[:-1]
    s = np.cumsum((Qs * below * gap)[::-1])[::-1]  # Σ_{j≥k} Q_j·Q_F(j+1)/Q_F(j)·(mu[j+1] − zs[j])²
    # A cut inside a run of equal losses is the same solution as one at its edge;
    # a free set that is one run of equal losses has no spread to tune.
    cut = np.ones(n, dtype=bool)
    cut[1:] = zs[1:] > zs[:-1]
    cut &= zs < zs[-1]
    shift = (1.0 - m) * qc / qf
    rest = 2.0 * rho - (1.0 - m) * shift
    # The optimum's cut is the one whose first free group stays at or above the
    # floor while its last clamped group would fall to or below it.  Rank cuts by
    # how far they miss that, then recompute the best ones exactly.
    candidates = np.flatnonzero(cut & (s > 0) & (rest > 0))
    b = np.sqrt(rest[candidates] / s[candidates])
    a = 1.0 + shift[candidates]
    first_free = a - b * below[candidates]
    step = np.where(candidates > 0, zs[candidates] - zs[np.maximum(candidates - 1, 0)], np.inf)
    last_clamped = a - b * (below[candidates] + step)
    violation = np.maximum(np.maximum(m - first_free, last_clamped - m), 0.0)
    candidates = candidates[np.argsort(violation, kind="stable")][:_MAX_REFINE]
    best = None
    for k in candidates:
        found = _cut_ratios(zs, Qs, int(k), rho, m)
        if found is None:
            continue
        if best is None or found[1] < best[1]:
            best = found
        if found[1] <= _KKT_TOL:
            break
    if best is None:  # cannot happen for ρ below the extreme's divergence (Slater: q = Q is strictly feasible)
        raise RuntimeError("chi2_best_response found no KKT point; this is a bug, please report the inputs")
    ratios = np.empty_like(z)
    # The clip absorbs rounding (≤ _KKT_TOL unless no candidate met it, which the
    # stress runs never saw); either way the floor then holds exactly.
    ratios[order] = np.maximum(best[0], m)
    return ratios


def chi2_best_response(losses: np.ndarray, prior: np.ndarray, rho: float, *, min_ratio: float = 0.0) -> np.ndarray:
    """The adversary's distribution q over groups (float64, sums to 1, input order).

    Maximises Σ q_i L_i over ½ Σ Q_i (q_i/Q_i − 1)² ≤ ``rho``, Σ q = 1 and
    q_i ≥ ``min_ratio``·Q_i, where Q is ``prior`` normalised.  Groups with
    Q_i = 0 get q_i = 0.  Losses all equal on Q's support (to a relative 1e-12)
    give q = Q; a ``rho`` beyond what the floors allow gives the most extreme
    feasible q (all groups at the floor but the top-loss one(s), which share the
    rest in proportion to Q).  Raises ValueError for malformed inputs.
    """
    L, Q, rho, m = _check_inputs(losses, prior, rho, min_ratio)
    support = np.flatnonzero(Q > 0)
    Ls, Qs = L[support], Q[support]
    spread = Ls.max() - Ls.min()
    if spread <= _EQUAL_RTOL * np.abs(Ls).max():
        return Q
    u = (Ls - Ls.min()) / spread  # in [0, 1]: no overflow in the squares below, whatever the losses' scale
    mean = Qs @ u
    sd = np.sqrt(Qs @ (u - mean) ** 2)
    if not sd > 0:  # a spread carried only by groups of vanishing (underflowing) weight
        return Q
    z = (u - mean) / sd
    ratios, d_max = _extreme_ratios(z, Qs, m)
    if rho < d_max:
        ratios = _binding_ratios(z, Qs, rho, m)
    q = np.zeros_like(Q)
    q[support] = Qs * ratios
    return q


def chi2_divergence(q: np.ndarray, prior: np.ndarray) -> float:
    """½ Σ Q_i (q_i/Q_i − 1)² over the groups with Q_i > 0 (Q = ``prior``
    normalised); mass q puts outside Q's support is not counted."""
    Q = _normalised_prior(prior)
    qv = _as_vector("q", q, "pass one probability per group")
    if qv.shape != Q.shape:
        raise ValueError(f"q has {qv.size} groups but prior has {Q.size}; pass both in the same group order")
    if not np.isfinite(qv).all():
        raise ValueError("q has NaN/inf entries; pass a probability vector")
    support = Q > 0
    r = qv[support] / Q[support]
    return float(0.5 * (Q[support] @ (r - 1.0) ** 2))
