"""sampling: the three pair tables on hand-checkable matrices and on the real
CCMatrix v1 pair counts (tests/data/, shipped with the repository, so these
tests always run), with XY-LENT's P* pinned against an independent solver."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from xylent.tasks.sampling import (
    build_tables,
    language_distribution,
    m2m_pair_distribution,
    read_pair_counts,
    sinkhorn_pair_distribution,
    smoothed_pair_distribution,
)
from xylent.tasks.sampling.tables import marginal_error, target_marginal
from xylent.errors import XylentError
from xylent.spec import SamplingConfig

DATA = Path(__file__).resolve().parent / "data"  # shipped with the repository: see tests/data/README.md
CCMATRIX = DATA / "ccmatrix_v1_pairs.tsv"
CCMATRIX_MONO = DATA / "ccmatrix_v1_mono.tsv"


def ccmatrix() -> tuple[list[str], np.ndarray]:
    return read_pair_counts(CCMATRIX)


def ccmatrix_mono() -> dict[str, float]:
    """Sentences per language from the CCMatrix v1 monolingual table ("5.1M", "1.5G", ...)."""
    scale = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}
    out = {}
    for line in CCMATRIX_MONO.read_text(encoding="utf-8").splitlines()[1:]:
        if line.strip():
            lang, _tokens, sentences = line.split("\t")
            out[lang] = float(sentences[:-1]) * scale[sentences[-1]]
    return out


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
    a = target(counts, 3.0)
    p = sinkhorn_pair_distribution(counts, 3.0)
    assert p[1, 3] == 0.0 and p[3, 1] == 0.0
    assert np.array_equal(p > 0, (counts + counts.T) > 0), "every pair with data keeps some mass"
    assert marginal_error(p, a) < 1e-9, "the zeros are structural: the marginals are still met"
    smoothed = sinkhorn_pair_distribution(counts, 3.0, eps=1e-3)
    assert marginal_error(smoothed, a) < 1e-9
    # the paper's -log(Q + eps) puts mass on pairs without data: the kernel there is
    # eps = 1e-3 against Q's smallest non-zero entry 5/364 = 0.014, so the leak is visible
    assert smoothed[1, 3] > 1e-4 and smoothed[1, 3] == smoothed[3, 1]
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
    assert "every pair contains 'en'" in msg and "half" in msg and "pair_method: smoothed" in msg
    assert np.allclose(sinkhorn_pair_distribution(star, 1.0).sum(axis=1)[0], 0.5), "T = 1 is feasible"
    p = smoothed_pair_distribution(star, 0.7)
    assert abs(p.sum() - 1) < 1e-12 and np.all(p[1:, 1:] == 0)


def test_the_en_x_only_ablation_keeps_the_pivots_pairs_alone():
    pairs = {("de", "en"): 500, ("en", "fr"): 300, ("de", "fr"): 200, ("es", "fr"): 100}
    mono = {lang: 100 for lang in ("de", "en", "es", "fr")}
    t = build_tables(mono, pairs, SamplingConfig(pivot="en", pair_method="smoothed"))
    b = t.bitext
    kept = b.filter(b["p"] > 0)
    assert sorted(zip(kept["lang_a"], kept["lang_b"])) == [("de", "en"), ("en", "fr")]
    assert abs(b["p"].sum() - 1) < 1e-12 and any("pivot=en" in n for n in t.notes)
    with pytest.raises(XylentError, match="sampling.pivot"):
        build_tables(mono, pairs, SamplingConfig(pivot="sw", pair_method="smoothed"))


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


# -- P* pinned against an independent Sinkhorn-Knopp solver ------------------

def sinkhorn_knopp(q: np.ndarray, a: np.ndarray, tol: float = 1e-15, max_iter: int = 100_000):
    """Plain Sinkhorn-Knopp on the kernel Q (float64): alternately rescale rows and
    columns of diag(u) Q diag(v) to the marginal a.  Zeros of Q stay exact zeros.
    Written here, independently of POT, on purpose."""
    q = np.asarray(q, dtype=np.float64)
    u, v = np.ones(len(a)), np.ones(len(a))
    for _ in range(max_iter):
        u = a / (q @ v)
        v = a / (q.T @ u)
        plan = u[:, None] * q * v[None, :]
        if max(np.abs(plan.sum(axis=1) - a).max(), np.abs(plan.sum(axis=0) - a).max()) < tol:
            return plan
    raise AssertionError(f"the reference Sinkhorn-Knopp did not reach {tol} in {max_iter} iterations")


def additivity_residual(plan: np.ndarray, q: np.ndarray) -> float:
    """Least-squares fit of log P_ij - log Q_ij = f_i + g_j over Q's support: the max
    abs residual is ~1e-14 when P = diag(u) Q diag(v) and O(1) otherwise."""
    i, j = np.nonzero(q > 0)
    y = np.log(plan[i, j]) - np.log(q[i, j])
    n = len(q)
    design = np.zeros((len(i), 2 * n))
    design[np.arange(len(i)), i] = 1.0
    design[np.arange(len(i)), n + j] = 1.0
    fg, *_ = np.linalg.lstsq(design, y, rcond=None)
    return float(np.abs(design @ fg - y).max())


def test_additivity_residual_detects_a_plan_that_is_not_a_scaling():
    """The check below has teeth: the temperature table n^0.7 is not diag(u) Q diag(v)."""
    _, c = ccmatrix()
    s = c + c.T
    q = s / s.sum()
    assert additivity_residual(sinkhorn_knopp(q, target_marginal(q, 5.0)), q) < 1e-10
    assert additivity_residual(smoothed_pair_distribution(c, 0.7), q) > 0.1


@pytest.mark.parametrize("t", [2.0, 5.0])
def test_ccmatrix_p_star_equals_independent_sinkhorn_knopp(t):
    langs, c = ccmatrix()
    s = c + c.T
    q = s / s.sum()
    support = q > 0
    p = q.sum(axis=1)
    a = p ** (1.0 / t)
    a /= a.sum()
    reference = sinkhorn_knopp(q, a)

    star = sinkhorn_pair_distribution(c, t)
    # Magnitudes: on CCMatrix v1 (90 languages, 2394 ordered pairs with data) the
    # non-zero entries of P* run from ~6e-6 (T=2) / ~1e-5 (T=5) up to ~4e-3 / ~6e-3, and
    # the two solvers agree to ~3e-16 absolute, ~7e-13 relative.  1e-9 absolute is
    # therefore ~1e-4 of the smallest entry, so we also bound the relative error.
    assert np.abs(star - reference).max() < 1e-9
    assert (np.abs(star - reference)[support] / reference[support]).max() < 1e-9
    assert np.all(star[~support] == 0.0) and np.all(reference[~support] == 0.0)

    # marginals: both are a = p^(1/T) renormalised (a runs ~7e-5..0.056 at T=2, ~2e-3..0.025 at T=5)
    assert np.abs(star.sum(axis=1) - a).max() < 1e-9 and np.abs(star.sum(axis=0) - a).max() < 1e-9
    assert np.allclose(a, target(c, t), rtol=0, atol=1e-15)
    # T > 1 flattens: the target is not Q's own marginal (else the test would be vacuous)
    assert np.abs(a - p).max() > 0.01

    # P* = diag(u) Q diag(v): log P*_ij - log Q_ij = f_i + g_j on Q's support
    # (log-ratios span ~-2..6 at T=2 and ~-4..9 at T=5; the fit residual is ~4e-14)
    assert additivity_residual(star, q) < 1e-8
    # the same, without a fit: every 2x2 rectangle of the support has zero cross difference
    rng = np.random.default_rng(0)
    rows, cols = rng.integers(0, len(q), size=(2, 200_000)), rng.integers(0, len(q), size=(2, 200_000))
    i, k = rows
    j, m = cols
    ok = support[i, j] & support[i, m] & support[k, j] & support[k, m]
    assert ok.sum() > 1000, "enough rectangles of the support sampled"
    with np.errstate(divide="ignore", invalid="ignore"):  # -inf - -inf off the support: never used
        r = np.log(star) - np.log(q)
    cross = r[i, j] - r[i, m] - r[k, j] + r[k, m]
    assert np.abs(cross[ok]).max() < 1e-8

    # build_tables (the stage) carries the same P*, reordered by language size
    pairs = {(langs[x], langs[y]): int(c[x, y]) for x, y in zip(*np.nonzero(c))}
    tables = build_tables({lang: 1 for lang in langs}, pairs, SamplingConfig(temperature=t))
    order = [langs.index(lang) for lang in tables.languages]
    assert np.abs(tables.matrices["p_star"] - reference[np.ix_(order, order)]).max() < 1e-9
    b = tables.bitext
    ix = {lang: x for x, lang in enumerate(langs)}
    unordered = np.array([reference[ix[x], ix[y]] + reference[ix[y], ix[x]]
                          for x, y in zip(b["lang_a"], b["lang_b"])])
    assert np.abs(b["p_star"].to_numpy() - unordered).max() < 1e-9
    assert tables.metrics["max_marginal_error.star"] < 1e-9


def test_ccmatrix_monolingual_smoothing():
    """p_j ∝ m_j^0.7 on the real CCMatrix v1 monolingual sentence counts."""
    mono = ccmatrix_mono()
    assert len(mono) == 90 and max(mono.values()) > 1e9 and min(mono.values()) < 1e5
    langs = sorted(mono)
    m = np.array([mono[lang] for lang in langs])
    p = language_distribution(m, 0.7)
    assert abs(p.sum() - 1) < 1e-12
    # exact power law: log p_i - log p_j = 0.7 (log m_i - log m_j) for every pair
    lp, lm = np.log(p), np.log(m)
    assert np.abs((lp[:, None] - lp[None, :]) - 0.7 * (lm[:, None] - lm[None, :])).max() < 1e-10
    raw = m / m.sum()
    big, small = int(np.argmax(m)), int(np.argmin(m))
    assert p[big] < raw[big] and p[small] > 3 * raw[small], "smoothing moves mass to small languages"
    t = build_tables({lang: int(n) for lang, n in mono.items()}, {("de", "en"): 10},
                     SamplingConfig(alpha=0.7))
    ix = {lang: x for x, lang in enumerate(langs)}
    got = t.mono["p"].to_numpy()
    assert np.abs(got - p[[ix[lang] for lang in t.mono["lang"]]]).max() < 1e-12


def test_a_monolingual_corpus_gets_an_empty_pair_table_and_a_report(tmp_path):
    """MetaXLM's phase 1 (English MLM, no pairs): the language table as usual, an empty pair table the
    loader reads as no TRTD data, a note saying so; the pretrain stage refuses TRTD on it."""
    from xylent.data.sampling import PAIR_TABLE, pair_table
    from xylent.tasks.sampling.run import write_output

    cfg = SamplingConfig(temperature=5.0)
    t = build_tables({"en": 500}, {}, cfg)
    assert t.mono["p"].to_list() == [1.0] and t.bitext.is_empty() and t.matrices == {}
    assert any("no bitext" in n for n in t.notes)
    outcome = write_output(t, cfg, tmp_path)
    assert (tmp_path / PAIR_TABLE).is_file() and pair_table(tmp_path) == {}
    assert not (tmp_path / "pair_heatmaps.png").exists() and "No bitext" in outcome.summary
    with pytest.raises(XylentError, match="no language pair of the data has it"):
        build_tables({"en": 500}, {}, SamplingConfig(temperature=5.0, pivot="en"))


def test_the_tables_load_pot_without_torch_and_give_the_same_bits():
    """POT registers every array backend it finds at import; the tables pass it NumPy arrays only, so
    loading torch for it cost 1.4 s a stage. Without the backend the tables are the same to the bit."""
    import os
    import subprocess
    import sys

    code = ("import sys, hashlib, numpy as np\n"
            "if sys.argv[1] == 'torch':\n    import ot\n"
            "from xylent.tasks.sampling.tables import sinkhorn_pair_distribution, m2m_pair_distribution\n"
            "c = np.random.default_rng(0).integers(0, 1000, size=(12, 12)).astype(float)\n"
            "c = c + c.T\nnp.fill_diagonal(c, 0)\n"
            "out = b''.join(f(c, 0.3).tobytes() for f in (sinkhorn_pair_distribution, m2m_pair_distribution))\n"
            "print(hashlib.sha256(out).hexdigest(), 'torch' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("POT_BACKEND_")}  # a stage run here set them
    runs = {how: subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True, timeout=120,
                                env=env) for how in ("torch", "bare")}
    assert all(r.returncode == 0 for r in runs.values()), {k: r.stderr[-2000:] for k, r in runs.items()}
    (with_torch, loaded), (bare, loaded_bare) = (runs[h].stdout.split() for h in ("torch", "bare"))
    assert (loaded, loaded_bare) == ("True", "False") and with_torch == bare
