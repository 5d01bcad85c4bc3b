"""sampling: the three pair tables on hand-checkable matrices and on the real
CCMatrix v1 pair counts."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tasks.sampling import (
    build_tables,
    language_distribution,
    m2m_pair_distribution,
    read_pair_counts,
    sinkhorn_pair_distribution,
    temperature_pair_distribution,
)
from tasks.sampling.tables import marginal_error, target_marginal
from xylent.errors import XylentError
from xylent.spec import SamplingConfig

CCMATRIX = Path(__file__).resolve().parents[2] / "shared" / "data" / "ccmatrix_v1_pairs.tsv"


def ccmatrix() -> tuple[list[str], np.ndarray]:
    if not CCMATRIX.exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the real-data tests but {CCMATRIX} is missing")
        pytest.skip(f"real CCMatrix counts not found at {CCMATRIX} (they ship beside the repository in CI)")
    return read_pair_counts(CCMATRIX)


def target(counts, t):
    s = counts + counts.T
    q = s / s.sum()
    return target_marginal(q, t)


# -- monolingual ---------------------------------------------------------------

def test_language_distribution():
    m = np.array([1000.0, 100.0, 10.0, 0.0])
    assert np.allclose(language_distribution(m, 1.0), [1000 / 1110, 100 / 1110, 10 / 1110, 0])
    p = language_distribution(m, 0.7)
    expected = m[:3] ** 0.7 / (m[:3] ** 0.7).sum()
    assert np.allclose(p[:3], expected) and p[3] == 0 and abs(p.sum() - 1) < 1e-15
    assert p[2] > 10 / 1110, "smoothing raises small languages"
    with pytest.raises(XylentError):
        language_distribution(np.array([1.0, np.nan]), 0.7)


# -- hand-checkable ------------------------------------------------------------

TRIANGLE = np.array([[0, 60, 30], [0, 0, 10], [0, 0, 0]], dtype=float)


def test_temperature_one_returns_q_itself():
    s = TRIANGLE + TRIANGLE.T
    p = sinkhorn_pair_distribution(TRIANGLE, 1.0)
    assert np.allclose(p, s / s.sum(), atol=1e-12)


def test_triangle_at_t5_marginals_and_support():
    a = target(TRIANGLE, 5.0)
    p = sinkhorn_pair_distribution(TRIANGLE, 5.0)
    assert marginal_error(p, a) < 1e-9 and abs(p.sum() - 1) < 1e-12
    assert np.array_equal(p > 0, (TRIANGLE + TRIANGLE.T) > 0)
    assert np.allclose(p, p.T)
    # 3 languages, all pairs: P is determined by the marginals alone
    x = {(0, 1): (a[0] + a[1] - a[2]) / 2, (0, 2): (a[0] + a[2] - a[1]) / 2, (1, 2): (a[1] + a[2] - a[0]) / 2}
    for (i, j), v in x.items():
        assert abs(p[i, j] - v) < 1e-12


def test_structural_zeros_stay_exactly_zero_and_eps_leaks():
    counts = np.zeros((4, 4))
    counts[0, 1], counts[0, 2], counts[1, 2], counts[2, 3], counts[0, 3] = 100, 50, 20, 5, 7
    p = sinkhorn_pair_distribution(counts, 3.0)
    assert p[1, 3] == 0.0 and p[3, 1] == 0.0
    smoothed = sinkhorn_pair_distribution(counts, 3.0, eps=1e-3)
    assert smoothed[1, 3] > 0, "the paper's -log(Q + eps) puts mass on pairs without data"
    assert np.all(np.diag(smoothed) == 0)


def test_zero_rows_and_columns_are_dropped_and_reembedded():
    big = np.zeros((5, 5))
    big[np.ix_([0, 2, 4], [0, 2, 4])] = TRIANGLE
    p = sinkhorn_pair_distribution(big, 5.0)
    assert np.all(p[[1, 3]] == 0) and np.all(p[:, [1, 3]] == 0)
    assert np.allclose(p[np.ix_([0, 2, 4], [0, 2, 4])], sinkhorn_pair_distribution(TRIANGLE, 5.0), atol=1e-15)
    m = m2m_pair_distribution(big, 5.0)
    assert np.all(m[[1, 3]] == 0) and abs(m.sum() - 1) < 1e-12


def test_english_centric_bitexts_are_infeasible_and_say_why():
    star = np.zeros((4, 4))
    star[0, 1:] = [1000, 100, 10]  # every pair contains language 0
    with pytest.raises(XylentError) as err:
        sinkhorn_pair_distribution(star, 5.0, names=["en", "de", "sw", "xh"])
    msg = str(err.value)
    assert "every pair contains 'en'" in msg and "half" in msg and "pair_method: temperature" in msg
    assert np.allclose(sinkhorn_pair_distribution(star, 1.0).sum(axis=1)[0], 0.5), "T = 1 is feasible"
    p = temperature_pair_distribution(star, 0.7)
    assert abs(p.sum() - 1) < 1e-12 and np.all(p[1:, 1:] == 0)


def test_a_support_that_cannot_carry_the_marginals_is_named():
    # only {en, fr} x {x, y, z}: the two sides must each hold exactly half the mass
    c = np.zeros((5, 5))
    c[0, 2:] = [500, 50, 5]
    c[1, 2:] = [300, 30, 3]
    with pytest.raises(XylentError, match="cannot carry the target marginals"):
        sinkhorn_pair_distribution(c, 5.0, names=["en", "fr", "x", "y", "z"])


@pytest.mark.parametrize("bad", [np.array([[0, np.nan], [0, 0]]), np.array([[0, -1.0], [0, 0]]),
                                 np.array([[3.0, 1.0], [0, 0]]), np.zeros((2, 3))])
def test_bad_counts_are_user_errors(bad):
    with pytest.raises(XylentError):
        sinkhorn_pair_distribution(bad, 5.0)


@pytest.mark.parametrize("t", [0.0, -1.0, float("nan")])
def test_bad_temperature_is_a_user_error(t):
    with pytest.raises(XylentError, match="temperature"):
        sinkhorn_pair_distribution(TRIANGLE, t)


# -- the real CCMatrix v1 counts ----------------------------------------------

@pytest.mark.parametrize("t", [2.0, 5.0])
def test_ccmatrix_tables(t):
    langs, c = ccmatrix()
    L = len(langs)
    assert L == 90 and (c > 0).sum() > 1100
    a = target(c, t)
    star = sinkhorn_pair_distribution(c, t)
    assert marginal_error(star, a) < 1e-9 and abs(star.sum() - 1) < 1e-12
    assert np.array_equal(star > 0, (c + c.T) > 0), "P* > 0 exactly where Q > 0"
    m2m = m2m_pair_distribution(c, t)
    assert marginal_error(m2m, a) < 1e-9
    assert (m2m > 0).sum() <= 2 * L - 1, "an LP vertex"
    assert (m2m > 0).sum() < 0.2 * ((c + c.T) > 0).sum(), "the M2M table is sparse"

    perm = np.random.default_rng(7).permutation(L)
    cp = c[np.ix_(perm, perm)]
    assert np.array_equal(sinkhorn_pair_distribution(cp, t), star[np.ix_(perm, perm)])
    assert np.array_equal(m2m_pair_distribution(cp, t), m2m[np.ix_(perm, perm)])

    leaky = sinkhorn_pair_distribution(c, t, eps=1e-12)
    empty = ((c + c.T) == 0) & ~np.eye(L, dtype=bool)
    assert leaky[empty].max() > 1e-9, "eps = 1e-12 leaks onto empty pairs (the paper's smoothing)"


def test_build_tables_on_ccmatrix_reports_wastage():
    langs, c = ccmatrix()
    pairs = {(langs[i], langs[j]): int(c[i, j]) for i, j in zip(*np.nonzero(c))}
    mono = {lang: 1000 for lang in langs}
    t = build_tables(mono, pairs, SamplingConfig(temperature=5.0, bitext_budget=2_000_000_000))
    m = t.metrics
    assert m["support_kept.star"] == 1.0 and m["support_kept.m2m"] < 0.2
    assert m["max_marginal_error.star"] < 1e-9 and m["max_marginal_error.m2m"] < 1e-9
    assert m["wastage.m2m"] > m["wastage.star"]
    assert m["entropy.star"] > m["entropy.m2m"]
    b = t.bitext
    assert len(b) == len(pairs) and abs(b["p_star"].sum() - 1) < 1e-9 and abs(b["q"].sum() - 1) < 1e-9
    assert (b["p_star"] > 0).all() and b["p"].equals(b["p_star"])
    en_de = b.filter((b["lang_a"] == "de") & (b["lang_b"] == "en"))
    assert en_de["pairs"][0] == pairs[("de", "en")], "pair sizes are the input counts"
    assert en_de["expected_epochs_star"][0] == pytest.approx(en_de["p_star"][0] * 2e9 / en_de["pairs"][0])
