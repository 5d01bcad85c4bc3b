"""χ² DRO best response of the audit stage (xylent.models.training.audit.dro): closed form, KKT,
optimality against a general-purpose solver, invariances, degenerate inputs."""

from __future__ import annotations

import numpy as np
import pytest

from xylent.models.training.audit.dro import chi2_best_response, chi2_divergence


def _standardised(L, Q):
    mean = Q @ L
    return (L - mean) / np.sqrt(Q @ (L - mean) ** 2)


def _problem(rng, n, alpha=1.0):
    return rng.normal(size=n), rng.dirichlet(np.full(n, alpha))


def _rho_without_floor(L, Q, m):
    """The largest ρ for which the unclamped closed form keeps every ratio ≥ m."""
    return 0.5 * ((1.0 - m) / -_standardised(L, Q).min()) ** 2


def _extreme_divergence(L, Q, m):
    L, Q = L[Q > 0], Q[Q > 0] / Q.sum()
    top = Q[L == L.max()].sum()
    return 0.5 * (1.0 - m) ** 2 * (1.0 - top) / top


def _assert_feasible(q, Q, rho, m):
    assert q.dtype == np.float64
    assert abs(q.sum() - 1.0) < 1e-12
    assert np.all(q >= m * Q - 1e-12)
    assert chi2_divergence(q, Q) <= rho * (1 + 1e-9)


def _assert_kkt(L, Q, q, rho, m):
    """Ratios are max(m, (L − η)/λ) with one η and λ > 0, the divergence is ρ."""
    _assert_feasible(q, Q, rho, m)
    assert chi2_divergence(q, Q) == pytest.approx(rho, rel=1e-9)
    r = q / Q
    free = r > m + 1e-9
    assert len(np.unique(L[free])) >= 2
    slope, intercept = np.polyfit(L[free], r[free], 1)
    assert slope > 0
    np.testing.assert_allclose(r[free], slope * L[free] + intercept, rtol=1e-8, atol=1e-9)
    lam, eta = 1.0 / slope, -intercept / slope
    clamped = ~free
    np.testing.assert_allclose(r[clamped], m, atol=1e-9)
    assert np.all((L[clamped] - eta) / lam <= m + 1e-8)  # clamped only because the floor holds them up
    if clamped.any():
        assert L[clamped].max() <= L[free].min()
    return clamped


@pytest.mark.parametrize("m", [0.0, 0.2])
def test_closed_form_when_no_floor_binds(m):
    rng = np.random.default_rng(11)
    for _ in range(60):
        n = int(rng.integers(2, 60))
        L = 2.3 + 0.02 * rng.normal(size=n)  # a small spread, as loss EMAs of similar pairs have
        Q = rng.dirichlet(np.full(n, rng.choice([0.3, 1.0, 5.0])))
        rho = float(rng.uniform(0.05, 0.95)) * _rho_without_floor(L, Q, m)
        q = chi2_best_response(L, Q, rho, min_ratio=m)
        expected = 1.0 + np.sqrt(2 * rho) * _standardised(L, Q)
        np.testing.assert_allclose(q / Q, expected, rtol=1e-9)
        _assert_feasible(q, Q, rho, m)
        assert chi2_divergence(q, Q) == pytest.approx(rho, rel=1e-9)


@pytest.mark.parametrize("m", [0.0, 0.2, 0.5])
def test_kkt_when_floors_bind(m):
    rng = np.random.default_rng(23)
    for _ in range(40):
        n = int(rng.integers(5, 200))
        L, Q = _problem(rng, n, alpha=float(rng.choice([0.5, 1.0, 10.0])))
        lo, hi = _rho_without_floor(L, Q, m), _extreme_divergence(L, Q, m)
        rho = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        if rho <= lo * 1.01:
            continue
        q = chi2_best_response(L, Q, rho, min_ratio=m)
        clamped = _assert_kkt(L, Q, q, rho, m)
        assert clamped.any()  # ρ beyond the closed form's reach: some floor must hold


def test_matches_scipy_slsqp_on_small_problems():
    optimize = pytest.importorskip("scipy.optimize")
    rng = np.random.default_rng(5)
    for trial in range(8):
        n = int(rng.integers(3, 8))
        L, Q = _problem(rng, n)
        m = (0.0, 0.2)[trial % 2]
        rho = float(rng.choice([0.05, 0.3, 1.0]))
        res = optimize.minimize(
            lambda x: -(x @ L), Q.copy(), jac=lambda x: -L, method="SLSQP",
            bounds=[(m * Qi, None) for Qi in Q],
            constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1.0, "jac": lambda x: np.ones_like(x)},
                         {"type": "ineq", "fun": lambda x: rho - chi2_divergence(x, Q), "jac": lambda x: 1.0 - x / Q}],
            options={"ftol": 1e-12, "maxiter": 1000},
        )
        # the peer's point must be feasible for its objective to bound ours
        assert abs(res.x.sum() - 1.0) < 1e-8 and np.all(res.x >= m * Q - 1e-8), res.message
        assert chi2_divergence(res.x, Q) <= rho + 1e-8, res.message
        q = chi2_best_response(L, Q, rho, min_ratio=m)
        _assert_feasible(q, Q, rho, m)
        assert q @ L >= res.x @ L - 1e-7


@pytest.mark.parametrize("m,rho", [(0.0, 0.05), (0.2, 0.1), (0.2, 2.0), (0.5, 0.3)])
def test_invariant_to_shift_and_positive_scale_of_losses(m, rho):
    rng = np.random.default_rng(7)
    L, Q = _problem(rng, 300)
    q = chi2_best_response(L, Q, rho, min_ratio=m)
    for a, b in [(1e-3, 0.0), (7.5, -3.0), (1e4, 1e3), (0.01, 50.0)]:
        np.testing.assert_allclose(chi2_best_response(a * L + b, Q, rho, min_ratio=m), q, rtol=1e-9, atol=1e-12)


def test_permutation_equivariance():
    rng = np.random.default_rng(3)
    L, Q = _problem(rng, 500)
    L[::7] = L[0]  # ties must not depend on position either
    for m, rho in [(0.0, 0.05), (0.2, 0.5), (0.2, 1e6)]:
        q = chi2_best_response(L, Q, rho, min_ratio=m)
        perm = rng.permutation(len(L))
        np.testing.assert_allclose(chi2_best_response(L[perm], Q[perm], rho, min_ratio=m), q[perm],
                                   rtol=1e-12, atol=1e-15)


def test_prior_need_not_be_normalised():
    rng = np.random.default_rng(9)
    L, Q = _problem(rng, 50)
    np.testing.assert_allclose(chi2_best_response(L, 1234.5 * Q, 0.1, min_ratio=0.2),
                               chi2_best_response(L, Q, 0.1, min_ratio=0.2), rtol=1e-12)


def test_equal_losses_give_the_prior_exactly():
    prior = np.array([1.0, 2.0, 3.0, 4.0])
    Q = prior / prior.sum()
    for L in (np.full(4, 2.7), np.zeros(4), 1e6 * (1 + 1e-14 * np.array([0.0, 1.0, -1.0, 0.5]))):
        q = chi2_best_response(L, prior, 0.1, min_ratio=0.2)
        assert np.array_equal(q, Q)


def test_losses_equal_on_the_support_give_the_prior():
    prior = np.array([0.5, 0.0, 0.25, 0.0, 0.25])
    L = np.array([1.0, 50.0, 1.0, -3.0, 1.0])  # only the groups nobody samples differ
    q = chi2_best_response(L, prior, 0.1)
    assert np.array_equal(q, prior)


def test_rho_beyond_the_floors_gives_the_extreme_distribution():
    L = np.array([1.0, 3.0, 2.0, 3.0, 0.0])
    Q = np.array([0.1, 0.2, 0.3, 0.1, 0.3])
    m = 0.2
    q = chi2_best_response(L, Q, 100.0, min_ratio=m)
    rest = 1.0 - m * (0.1 + 0.3 + 0.3)  # the two top-loss groups share it 2:1, like their prior
    np.testing.assert_allclose(q, [0.02, rest * 2 / 3, 0.06, rest / 3, 0.06], rtol=1e-12)
    d_max = _extreme_divergence(L, Q, m)
    assert chi2_divergence(q, Q) == pytest.approx(d_max, rel=1e-12)
    # just inside, the constraint binds again and the optimum moves continuously away from the extreme
    inside = chi2_best_response(L, Q, d_max * (1 - 1e-3), min_ratio=m)
    _assert_kkt(L, Q, inside, d_max * (1 - 1e-3), m)
    np.testing.assert_allclose(inside, q, atol=1e-3)
    np.testing.assert_allclose(chi2_best_response(L, Q, d_max * (1 - 1e-9), min_ratio=m), q, atol=1e-8)


def test_rho_beyond_reach_without_floor_puts_everything_on_the_worst_group():
    L = np.array([0.3, 2.0, 1.0])
    Q = np.array([0.5, 0.25, 0.25])
    q = chi2_best_response(L, Q, 10.0)
    np.testing.assert_array_equal(q, [0.0, 1.0, 0.0])


def test_groups_without_prior_get_nothing():
    rng = np.random.default_rng(13)
    L, Q = _problem(rng, 40)
    Q[[3, 17]] = 0.0
    L[3] = L.max() + 10  # the worst loss, but never sampled
    for m, rho in [(0.0, 0.05), (0.2, 0.5), (0.2, 1e9)]:
        q = chi2_best_response(L, Q, rho, min_ratio=m)
        assert q[3] == 0.0 and q[17] == 0.0
        keep = Q > 0
        np.testing.assert_allclose(q[keep], chi2_best_response(L[keep], Q[keep], rho, min_ratio=m), rtol=1e-12)


@pytest.mark.parametrize("losses,prior,rho,min_ratio,match", [
    ([1.0, 2.0], [0.5, np.nan], 0.1, 0.0, "prior has 1 NaN/inf"),
    ([1.0, 2.0], [0.5, np.inf], 0.1, 0.0, "prior has 1 NaN/inf"),
    ([1.0, 2.0], [0.5, -0.1], 0.1, 0.0, "prior has 1 negative"),
    ([1.0, 2.0], [0.0, 0.0], 0.1, 0.0, "prior sums to 0"),
    ([1.0, np.nan], [0.5, 0.5], 0.1, 0.0, "losses has 1 NaN/inf"),
    ([-np.inf, 1.0], [0.5, 0.5], 0.1, 0.0, "losses has 1 NaN/inf"),
    ([1.0, 2.0], [0.5, 0.5], 0.0, 0.0, "rho must be a positive finite number"),
    ([1.0, 2.0], [0.5, 0.5], -0.1, 0.0, "rho must be a positive finite number"),
    ([1.0, 2.0], [0.5, 0.5], np.nan, 0.0, "rho must be a positive finite number"),
    ([1.0, 2.0], [0.5, 0.5], np.inf, 0.0, "rho must be a positive finite number"),
    ([1.0, 2.0], [0.5, 0.5], "big", 0.0, "rho must be a number"),
    ([1.0, 2.0], [0.5, 0.5], 0.1, -0.1, r"min_ratio must be in \[0, 1\)"),
    ([1.0, 2.0], [0.5, 0.5], 0.1, 1.0, r"min_ratio must be in \[0, 1\)"),
    ([1.0, 2.0], [0.5, 0.5], 0.1, np.nan, r"min_ratio must be in \[0, 1\)"),
    ([1.0, 2.0, 3.0], [0.5, 0.5], 0.1, 0.0, "losses has 3 groups but prior has 2"),
    ([], [], 0.1, 0.0, "is empty"),
    ([[1.0, 2.0]], [[0.5, 0.5]], 0.1, 0.0, "must be 1-D"),
])
def test_malformed_inputs_raise_value_error(losses, prior, rho, min_ratio, match):
    with pytest.raises(ValueError, match=match) as info:
        chi2_best_response(np.array(losses), np.array(prior), rho, min_ratio=min_ratio)
    assert ";" in str(info.value)  # every message goes on to say what to do


def test_extreme_priors_and_heavy_tailed_losses():
    # priors spanning 1e-40..1: a tiny-prior group with a huge loss makes the slope
    # enormous, where cancellation would show up in Σ q or in the divergence
    rng = np.random.default_rng(526)
    binding = 0
    for _ in range(300):
        n = int(rng.integers(2, 60))
        L = rng.lognormal(0.0, 3.0, size=n)
        Q = rng.dirichlet(np.full(n, 0.05))
        m = float(rng.choice([0.0, 0.2, 0.5, 0.9]))
        rho = float(np.exp(rng.uniform(-8, 4)))
        q = chi2_best_response(L, Q, rho, min_ratio=m)
        _assert_feasible(q, Q, rho, m)
        if rho < _extreme_divergence(L, Q, m) and np.ptp(L[Q > 0]) > 0:
            binding += 1
            assert chi2_divergence(q, Q) == pytest.approx(rho, rel=1e-9)
    assert binding > 100


def test_ten_thousand_groups():
    rng = np.random.default_rng(2021)
    n = 10_000
    L = rng.lognormal(0.0, 0.5, size=n)
    Q = rng.dirichlet(np.full(n, 0.5))
    q = chi2_best_response(L, Q, 0.5, min_ratio=0.2)
    clamped = _assert_kkt(L, Q, q, 0.5, 0.2)
    assert 0 < clamped.sum() < n


def test_chi2_divergence():
    assert chi2_divergence(np.array([0.5, 0.5]), np.array([1.0, 3.0])) == pytest.approx(1 / 6, rel=1e-15)
    assert chi2_divergence(np.array([0.2, 0.3, 0.5]), np.array([2.0, 3.0, 5.0])) == 0.0
    # mass off Q's support is not counted: only the ratios where Q > 0 are
    assert chi2_divergence(np.array([0.5, 0.5, 0.0]), np.array([1.0, 0.0, 1.0])) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="q has 2 groups but prior has 3"):
        chi2_divergence(np.array([0.5, 0.5]), np.array([1.0, 1.0, 1.0]))
