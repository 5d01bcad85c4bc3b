"""Language and language-pair sampling distributions.

- Monolingual: p_j ∝ m_j^α (XLM-R / XLM-E / InfoXLM use α = 0.7).
- Pairs, M2M-100 (XY-LENT Eq. 1): max Tr(PQ) s.t. P1 = Pᵀ1 = a — an LP whose
  exact solution (``ot.emd``) is a sparse vertex.
- Pairs, XY-LENT (Eq. 2): entropic OT with cost −log Q and regularisation 1,
  so P* = diag(u)·Q·diag(v) (POT's Sinkhorn, float64).  Pairs with no data are
  *structural* zeros: the kernel is Q itself, so they get exactly zero mass.
  The paper's −log(Q + ε) smoothing is available with ``eps > 0``.
- Pairs, temperature (XLM-E style): p_pair ∝ n_pair^α — the fallback when the
  pairs' support cannot carry the Sinkhorn marginals (English-centric data).

Q is the symmetric, normalised L×L count matrix (X→Y and Y→X counts summed);
the target marginal is a = p^(1/T), renormalised, where p = Q's row sums.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from xylent.errors import XylentError

MARGINAL_TOL = 1e-9


def _check_positive(name: str, value: float) -> float:
    if not np.isfinite(value) or value <= 0:
        raise XylentError(f"{name} must be a positive number, got {value!r}",
                          where=f"spec field sampling.{name}", fix=f"set sampling.{name} > 0")
    return float(value)


def symmetric_counts(counts: np.ndarray) -> np.ndarray:
    """Validate an L×L count matrix and return C + Cᵀ (float64)."""
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] != c.shape[1]:
        raise XylentError(f"pair counts must be a square matrix, got shape {c.shape}", where="sampling input")
    if not np.all(np.isfinite(c)):
        raise XylentError("pair counts contain NaN or infinite values", where="sampling input",
                          fix="check the pair statistics the sampling stage reads")
    if np.any(c < 0):
        raise XylentError("pair counts must be non-negative", where="sampling input")
    if np.any(np.diag(c) != 0):
        i = int(np.flatnonzero(np.diag(c))[0])
        raise XylentError(f"language #{i} is paired with itself (counts[{i},{i}] = {c[i, i]:g})",
                          where="sampling input", fix="a bitext pair needs two different languages")
    s = c + c.T
    if s.sum() <= 0:
        raise XylentError("there is no bitext at all", where="sampling input",
                          fix="add bitext sources, or drop the bitext part of the pipeline")
    return s


def _active(s: np.ndarray) -> np.ndarray:
    """Indices of languages that have at least one pair (the others are dropped)."""
    return np.flatnonzero(s.sum(axis=1) > 0)


def target_marginal(q: np.ndarray, temperature: float) -> np.ndarray:
    p = q.sum(axis=1)
    p = p / p.sum()
    a = p ** (1.0 / _check_positive("temperature", temperature))
    return a / a.sum()


def _embed(sub: np.ndarray, idx: np.ndarray, n: int) -> np.ndarray:
    full = np.zeros((n, n))
    full[np.ix_(idx, idx)] = sub
    return full


def _canonical(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Active languages (with at least one pair) in a canonical order, and Q over them.

    The order depends only on the counts, not on how the languages were listed,
    and Q, a and the solvers then see bit-identical inputs for any listing: an
    LP with tied optima (Pᵀ is optimal whenever P is) returns the same vertex.
    """
    idx = _active(s)
    keys = {i: (-s[i].sum(), tuple(-np.sort(s[i]))) for i in idx}
    idx = np.array(sorted(idx, key=lambda i: keys[i]), dtype=int)
    sub = s[np.ix_(idx, idx)]
    return idx, sub / sub.sum()


def _hub(support: np.ndarray) -> int | None:
    """A language contained in every pair with data (English-centric bitexts), if any."""
    for h in range(len(support)):
        others = np.delete(np.arange(len(support)), h)
        if not support[np.ix_(others, others)].any():
            return h
    return None


def _explain_infeasible(support: np.ndarray, a: np.ndarray, names: list[str] | None) -> XylentError:
    label = (lambda i: names[i]) if names else (lambda i: f"#{i}")
    fix = ("use sampling.pair_method: smoothed (p_pair ∝ n_pair^pair_alpha, XLM-E style), set sampling.temperature: 1, "
           "or add bitexts between the other languages (X–Y, not only English-centric)")
    h = _hub(support)
    if h is not None:
        return XylentError(
            f"the Sinkhorn pair table is infeasible: every pair contains {label(h)!r} (hub-centric bitexts), so "
            f"{label(h)!r} must hold exactly half of the pair mass, but the temperature-smoothed target gives it "
            f"{a[h]:.4f}",
            where="sampling: bitext pair counts", fix=fix)
    # Which rows cannot be served inside the support: the LP that moves as little
    # mass as possible outside it says.
    ot = _pot()

    penalty = np.where(support, 0.0, 1.0)
    plan = ot.emd(a, a, penalty)
    outside = (plan * (~support)).sum(axis=1)
    worst = [label(i) for i in np.argsort(-outside)[:5] if outside[i] > 1e-12]
    return XylentError(
        "the Sinkhorn pair table is infeasible: the language pairs with data cannot carry the target marginals "
        f"({(plan * ~support).sum():.3g} of the mass has nowhere to go; most affected: {', '.join(worst)})",
        where="sampling: bitext pair counts", fix=fix)


def _pot():
    """POT, imported where used (not by readers of the tables) and without its array backends: its
    inputs here are NumPy arrays, and loading torch for a backend it never uses costs 1.4 s a stage."""
    for backend in ("PYTORCH", "JAX", "CUPY", "TENSORFLOW"):
        os.environ.setdefault(f"POT_BACKEND_DISABLE_{backend}", "1")
    import ot

    return ot


def sinkhorn_pair_distribution(counts: np.ndarray, temperature: float, *, eps: float = 0.0,
                               max_iter: int = 100_000, names: list[str] | None = None) -> np.ndarray:
    """XY-LENT's P* (L×L, symmetric, sums to 1); exactly zero where counts are zero when ``eps == 0``."""
    ot = _pot()

    s = symmetric_counts(counts)
    idx, q = _canonical(s)
    a = target_marginal(q, temperature)
    if eps < 0 or not np.isfinite(eps):
        raise XylentError(f"eps must be >= 0, got {eps!r}", where="spec field sampling.eps")
    sub_names = [names[i] for i in idx] if names else None
    with np.errstate(divide="ignore"):
        if eps > 0:  # the paper's smoothing: every off-diagonal pair becomes possible
            cost = -np.log(q + eps * (1 - np.eye(len(q))))
        else:
            cost = -np.log(q)  # +inf where Q = 0: kernel exp(-cost) = Q, zeros stay zeros
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence is checked below, on both marginals
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            plan = ot.sinkhorn(a, a, cost, reg=1.0, method="sinkhorn", numItermax=max_iter, stopThr=1e-15)
    err = marginal_error(plan, a)
    if not np.isfinite(err) or err > MARGINAL_TOL:
        support = np.isfinite(cost)
        least_outside = ot.emd(a, a, np.where(support, 0.0, 1.0))
        if (least_outside * ~support).sum() > 1e-12:
            raise _explain_infeasible(support, a, sub_names)
        raise XylentError(
            f"the Sinkhorn pair table did not converge in {max_iter} iterations (max marginal error {err:.3g}): "
            "the target marginals can be met only by giving some pairs zero probability",
            where="sampling: bitext pair counts",
            fix="lower sampling.temperature, or use sampling.pair_method: smoothed")
    plan = (plan + plan.T) / 2  # symmetric by construction; remove round-off asymmetry
    plan /= plan.sum()
    return _embed(plan, idx, len(s))


def m2m_pair_distribution(counts: np.ndarray, temperature: float) -> np.ndarray:
    """The M2M-100 table: an optimal vertex of max Tr(PQ) s.t. P1 = Pᵀ1 = a."""
    ot = _pot()

    s = symmetric_counts(counts)
    idx, q = _canonical(s)
    a = target_marginal(q, temperature)
    plan = ot.emd(a, a, -q, numItermax=10_000_000)
    # the network simplex leaves ~1e-17 round-off on some non-basic cells: not real mass
    plan = np.where(plan > 1e-14, plan, 0.0)
    plan /= plan.sum()
    return _embed(plan, idx, len(s))


def smoothed_pair_distribution(counts: np.ndarray, alpha: float) -> np.ndarray:
    """p_pair ∝ n_pair^α over unordered pairs, split evenly over (i, j) and (j, i)."""
    s = symmetric_counts(counts)
    _check_positive("pair_alpha", alpha)
    w = np.where(s > 0, s, 0.0) ** alpha
    w[s == 0] = 0.0
    return w / w.sum()


def marginal_error(plan: np.ndarray, a: np.ndarray) -> float:
    return float(max(np.abs(plan.sum(axis=1) - a).max(), np.abs(plan.sum(axis=0) - a).max()))
