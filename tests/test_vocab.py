"""vocab: ALP, concave smoothing, allocation properties, the merged model."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections import Counter
from pathlib import Path

import matplotlib
import matplotlib.image
import numpy as np
import polars as pl
import pytest
import sentencepiece as spm

from conftest import write_spec
from xylent.tasks.vocab import allocate_vocabulary, average_log_probability, concave_curve
from xylent.tasks.vocab.merge import merge_vocab_model
from xylent.tasks.vocab.train import model_pieces, train_model
from xylent.spec import VocabConfig

ROOT = Path(__file__).resolve().parents[1]
TEXTS = {
    "en": "The quick brown fox jumps over the lazy dog while the children watch from the garden window.",
    "de": "Der schnelle braune Fuchs springt über den faulen Hund, während die Kinder aus dem Fenster schauen.",
    "zh": "敏捷的棕色狐狸跳过了懒狗，孩子们在花园的窗户里看着。今天天气很好，我们去公园散步吧。",
    "th": "สุนัขจิ้งจอกสีน้ำตาลกระโดดข้ามสุนัขขี้เกียจ เด็กๆ มองจากหน้าต่างสวน",
    "ar": "الثعلب البني السريع يقفز فوق الكلب الكسول بينما يشاهد الأطفال من نافذة الحديقة.",
}


PALETTE = [tuple(round(v * 255) for v in matplotlib.colors.to_rgb(c["color"]))
           for c in matplotlib.rcParams["axes.prop_cycle"]]  # the colours matplotlib draws series in


def _png(path: Path, min_size: tuple[int, int]) -> np.ndarray:
    """A real picture, as 0..255 RGB: at least min_size (width, height) pixels and not blank."""
    img = matplotlib.image.imread(path)
    h, w = img.shape[:2]
    assert w >= min_size[0] and h >= min_size[1] and w < 3 * min_size[0] and h < 3 * min_size[1], (path, w, h)
    colours = len(np.unique(img.reshape(-1, img.shape[-1]), axis=0))
    assert img[..., :3].std() > 0.05 and colours > 50, f"{path.name} looks blank: std {img.std()}, {colours} colours"
    return (img[..., :3] * 255).round().astype(int)


def _bars(rgb: np.ndarray, colour: tuple) -> list[tuple[int, float]]:
    """Vertical bars of one colour standing on the x axis: (left pixel, height as a
    fraction of the axes' height).  The axes' frame is the black spines: the first
    and last rows that are dark over a quarter of the width."""
    dark = (rgb < 60).all(-1)
    frame = np.flatnonzero(dark.sum(axis=1) > 0.25 * rgb.shape[1])
    top, bottom = int(frame[0]), int(frame[-1])
    hit = (rgb == colour).all(-1)
    on_axis = np.r_[0, hit[bottom - 2].astype(int), 0]  # the bars' pixels just above the x axis
    edges = np.flatnonzero(np.diff(on_axis))
    out = []
    for left, right in zip(edges[::2], edges[1::2]):
        # tallest unbroken run up from the axis (a legend drawn over a bar can only shorten a column)
        height = max(int(np.argmin(np.r_[hit[: bottom - 1, x][::-1], False])) for x in range(left, right))
        out.append((int(left), (height + 1) / (bottom - top)))
    return out


def corpus(lang: str, n: int = 400, seed: int = 0) -> list[str]:
    """Sentences over the language's own script: its sample sentence's words plus
    pseudo-words built from its letters (enough variety to learn ~100 pieces)."""
    rng = random.Random(seed)
    base = TEXTS[lang]
    letters = sorted({c for c in base if c.isalpha()})
    words = base.split() + ["".join(rng.choice(letters) for _ in range(rng.randint(2, 6))) for _ in range(150)]
    joiner = "" if lang in ("zh", "th") else " "
    return [joiner.join(rng.choice(words) for _ in range(rng.randint(5, 15))) for _ in range(n)]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("spm")
    cfg = VocabConfig(grid=[100], character_coverage=1.0, input_sentence_size=10_000)
    out = {}
    for lang in TEXTS:
        f = d / f"{lang}.txt"
        f.write_text("\n".join(corpus(lang)) + "\n", encoding="utf-8")
        size = 60 if lang in ("zh", "th") else 80
        train_model(f, d / f"{lang}", size, cfg, seed=0)
        out[lang] = d / f"{lang}.model"
    return out


def test_alp_matches_an_independent_computation(tiny_models):
    sents = corpus("en", 50, seed=9)
    sp = spm.SentencePieceProcessor(model_file=str(tiny_models["en"]))
    segs = [sp.EncodeAsIds(s) for s in sents]
    freq = Counter(t for seg in segs for t in seg)
    total = sum(freq.values())
    expected = sum(sum(math.log(freq[t] / total) for t in seg) for seg in segs) / len(segs)
    assert average_log_probability(str(tiny_models["en"]), sents) == pytest.approx(expected, rel=1e-12)


def test_concave_smoothing():
    sizes = [1000, 2000, 3000, 4000, 5000]
    bumpy = [-100.0, -90.0, -85.0, -75.0, -73.0]  # the third step gains more than the second
    smooth = concave_curve(sizes, bumpy)
    gains = np.diff(smooth)
    assert np.all(np.diff(gains) <= 1e-12), "gains are non-increasing"
    assert smooth[0] == bumpy[0] and smooth[-1] == pytest.approx(bumpy[-1])
    concave = [-100.0, -90.0, -83.0, -78.0, -75.0]
    assert concave_curve(sizes, concave) == pytest.approx(concave)
    uneven = [1000, 1500, 3000, 5000]
    c = concave_curve(uneven, [-50.0, -45.0, -40.0, -38.0])
    slopes = np.diff(c) / np.diff(uneven)
    assert np.all(np.diff(slopes) <= 1e-12)


def _synthetic(langs=("a", "b", "c", "d")):
    grid = [100, 200, 300, 400, 500]
    curves, rng = {}, np.random.default_rng(0)
    for i, lang in enumerate(langs):
        scale = 10 + 5 * i
        curves[lang] = [(s, -1000 + scale * math.log(s) + rng.normal(0, 0.5)) for s in grid]

    def pieces(lang, size):  # half of each vocabulary is shared between languages
        return {f"shared{k}" for k in range(size // 2)} | {f"{lang}{k}" for k in range(size - size // 2)}

    return curves, pieces, grid


def test_allocation_budget_floor_monotonicity_and_weights():
    curves, pieces, grid = _synthetic()
    weights = {"a": 0.4, "b": 0.3, "c": 0.2, "d": 0.1}
    previous = None
    for budget in (600, 800, 1000, 1200, 1500, 2000, 3000):
        report = {}
        chosen = allocate_vocabulary(curves, weights, budget, pieces, beta=0.7, report=report)
        union = set().union(*(pieces(lang, s) for lang, s in chosen.items()))
        assert len(union) <= budget and report["union_size"] == len(union)
        assert all(s >= grid[0] for s in chosen.values())
        if previous:
            assert all(chosen[lang] >= previous[lang] for lang in chosen), "monotone in the budget"
        previous = chosen
    assert report["capped"] == sorted(chosen), "a budget beyond the grid caps everyone, and says so"
    same = {lang: curves["b"] for lang in ("x", "y")}
    pick = allocate_vocabulary(same, {"x": 0.6, "y": 0.1}, 700, pieces)
    assert pick["x"] >= pick["y"], "higher weight never gets less"


def test_budget_below_the_floor_gives_every_language_the_smallest_size():
    curves, pieces, grid = _synthetic()
    report = {}
    chosen = allocate_vocabulary(curves, {k: 0.25 for k in curves}, 10, pieces, report=report)
    assert set(chosen.values()) == {grid[0]} and report["over_budget_at_floor"]


# -- VoCAP allocation against exhaustive search ---------------------------------
#
# What allocate_vocabulary guarantees (tasks/vocab/allocate.py, METHODS.md step 4):
# it is a *threshold* rule.  With gains g = w_i * (ALP_i(s_k) - ALP_i(s_{k-1})) /
# (s_k - s_{k-1}) per piece (w_i = q_i^beta), the allocation at threshold t takes,
# per language, the steps whose gain exceeds t; the rule returns the smallest
# threshold (among the distinct gains) whose allocation's piece union fits the
# budget (with nested pieces; in general the fitting one with the largest
# objective, which is the same).  GRID below is uniform, so the gains per piece
# are the gains per step divided by 100 and the tests work in steps.  Such an
# allocation x maximises  Obj(y) - t' * K(y)  over *all* grid allocations y, where
# K(y) = number of grid steps above the floor and t' = the largest gain x did not
# take (the upper concave hull of (K, Obj), supporting slope t').  Hence:
#   (a) Obj(y) <= Obj(x) + t' * (K(y) - K(x)) for every y;
#   (b) Obj(x) = max Obj(y) over K(y) <= K(x);
#   (c) OPT(budget) - Obj(x) <= t' * (max K(y) over union(y) <= budget  -  K(x)).
# When every step costs the same number of new pieces (uniform grid, languages'
# pieces disjoint) the union is linear in K, and with distinct gains x is exactly
# the exhaustive optimum.  With overlapping pieces it is not: a step that costs
# few new pieces (shared with another language) can be worth more per piece than
# the next step by gain, and the rule ignores that (see the numbers below).

GRID = [100, 200, 300, 400]
LANGS = ("en", "de", "fr", "zh")
Q = {"en": 0.4, "de": 0.25, "fr": 0.2, "zh": 0.15}
BETA = 0.7


def _concave_curves():
    """Strictly concave ALP curves (c_i * log size), so smoothing leaves them as they are."""
    scales = {"en": 40, "de": 33, "fr": 27, "zh": 52}
    return {lang: [(s, -1000 + scales[lang] * math.log(s) + 0.37 * i) for s in GRID]
            for i, lang in enumerate(LANGS)}


def _disjoint(lang, size):  # nested in size, nothing shared between languages
    return {f"{lang}{k}" for k in range(size)}


def _overlapping(lang, size):  # nested in size; en/de/fr share half their pieces, zh shares nothing
    if lang == "zh":
        return {f"zh{k}" for k in range(size)}
    return {f"latin{k}" for k in range(size // 2)} | {f"{lang}{k}" for k in range(size - size // 2)}


def _union(alloc, pieces):
    return len(set().union(*(pieces(lang, s) for lang, s in alloc.items())))


def _objective(curves, alloc):
    return sum(Q[lang] ** BETA * dict(curves[lang])[size] for lang, size in alloc.items())


def _steps(alloc):
    return sum(GRID.index(size) for size in alloc.values())


def _gains(curves):
    return {lang: Q[lang] ** BETA * np.diff([a for _, a in curves[lang]]) for lang in curves}


def _at_threshold(gains, t):
    """The rule, written independently: every step whose weighted gain exceeds t."""
    return {lang: GRID[int((g > t).sum())] for lang, g in gains.items()}


def _enumerate(curves, pieces):
    """Every grid allocation (each language at or above the floor GRID[0]): (sizes, union, objective)."""
    out = []
    for combo in itertools.product(GRID, repeat=len(LANGS)):
        y = dict(zip(LANGS, combo))
        out.append((y, _union(y, pieces), _objective(curves, y)))
    return out


def test_synthetic_curves_are_concave_with_distinct_gains():
    curves = _concave_curves()
    for points in curves.values():
        alps = [a for _, a in points]
        assert concave_curve(GRID, alps) == pytest.approx(alps, abs=1e-12), "smoothing is the identity"
        assert np.all(np.diff(alps, 2) < 0), "strictly concave"
    flat = np.concatenate(list(_gains(curves).values()))
    assert len(set(np.round(flat, 9))) == len(flat), "no two steps tie"


def test_vocap_allocation_is_the_exhaustive_optimum_when_every_step_costs_the_same():
    curves = _concave_curves()
    table = _enumerate(curves, _disjoint)
    floor, full = 100 * len(LANGS), 400 * len(LANGS)
    for budget in range(floor, full + 1, 10):  # every multiple of a step, and budgets in between
        chosen = allocate_vocabulary(curves, Q, budget, _disjoint, beta=BETA)
        feasible = [(y, obj) for y, u, obj in table if u <= budget]
        best_y, best = max(feasible, key=lambda r: r[1])
        assert _union(chosen, _disjoint) <= budget
        assert _objective(curves, chosen) == pytest.approx(best, abs=1e-9), budget
        assert chosen == best_y, f"budget {budget}: the unique optimum"
        # the budget is used up to less than one step (100 pieces)
        assert budget - _union(chosen, _disjoint) < 100


def test_vocap_allocation_with_overlapping_pieces_is_on_the_upper_hull():
    curves = _concave_curves()
    gains = _gains(curves)
    all_gains = np.sort(np.concatenate(list(gains.values())))[::-1]
    table = _enumerate(curves, _overlapping)
    # the threshold allocations, in order of decreasing threshold, and their unions (monotone: nested pieces)
    ladder = [_at_threshold(gains, t) for t in [np.inf, *all_gains, -np.inf]]
    unions = [_union(x, _overlapping) for x in ladder]
    assert unions == sorted(unions)

    gaps = {}
    for budget in range(350, 1300, 10):
        report = {}
        chosen = allocate_vocabulary(curves, Q, budget, _overlapping, beta=BETA, report=report)
        union, obj, k = _union(chosen, _overlapping), _objective(curves, chosen), _steps(chosen)
        assert union <= budget and report["union_size"] == union
        # a threshold allocation, and the last one on the ladder that fits
        fits = [x for x, u in zip(ladder, unions) if u <= budget]
        assert chosen == fits[-1], budget
        untaken = [g for lang in LANGS for g in gains[lang][GRID.index(chosen[lang]):]]
        t_next = max(untaken) if untaken else 0.0
        # (a) the supporting line of slope t_next lies above every allocation
        for y, _u, o in table:
            assert o <= obj + t_next * (_steps(y) - k) + 1e-9, (budget, y)
        # (b) exhaustive optimum among allocations with no more grid steps
        assert obj == pytest.approx(max(o for y, _u, o in table if _steps(y) <= k), abs=1e-9)
        # (c) the gap to the exhaustive optimum under the union budget is bounded
        feasible = [(y, o) for y, u, o in table if u <= budget]
        opt = max(o for _, o in feasible)
        k_max = max(_steps(y) for y, _ in feasible)
        assert obj <= opt + 1e-9
        assert opt - obj <= t_next * (k_max - k) + 1e-9, budget
        gaps[budget] = opt - obj

    # Budgets where it matters: here the union-constrained optimum is no threshold
    # allocation at all, so no threshold rule can reach it.  Measured: at budget 500
    # the rule picks en 200, de/fr 100, zh 200 (union 500) while en/de/fr 200, zh 100
    # (union 500: the Latin languages share pieces) scores 5.18 higher; at 450 the rule
    # leaves 50 pieces unused (the next step by gain, zh, costs 100) where de's step
    # costs 50 and is worth 8.67.
    for budget in (450, 500, 600, 750, 1000):
        best_y = max(((y, o) for y, u, o in table if u <= budget), key=lambda r: r[1])[0]
        assert best_y not in ladder, budget
        assert gaps[budget] > 1.0, budget
    assert gaps[350] == gaps[400] == 0.0 and gaps[1290] == pytest.approx(0.0, abs=1e-9)


def test_vocap_on_a_doubling_grid_uses_the_budget():
    grid = [100, 200, 400, 800]
    curves = {"a": [(s, 10 * math.log(s)) for s in grid], "b": [(s, 6 * math.log(s)) for s in grid]}
    q = {"a": 0.5, "b": 0.5}
    chosen = allocate_vocabulary(curves, q, 800, _disjoint, beta=BETA)
    # disjoint pieces: the union is the sum of the sizes; exhaustive optimum is a 400, b 400
    best = max((dict(zip("ab", c)) for c in itertools.product(grid, grid) if sum(c) <= 800),
               key=lambda y: 10 * math.log(y["a"]) + 6 * math.log(y["b"]))  # equal weights
    assert best == {"a": 400, "b": 400}
    assert chosen == best  # comparing gains per grid step gave {"a": 100, "b": 100}, 600 pieces unused


def test_vocap_finds_the_last_fitting_threshold_when_pieces_are_not_nested():
    curves = {"a": [(100, 0.0), (200, 5.0)], "b": [(100, 0.0), (200, 4.0)], "c": [(100, 0.0), (200, 3.0)]}
    own = {lang: [f"{lang}{k}" for k in range(200)] for lang in "abc"}

    def pieces(lang, size):
        if lang == "c" and size == 200:  # c's larger model keeps none of its smaller model's pieces
            return set(own["a"][:100] + own["b"][:100])
        return set(own[lang][:size])

    # thresholds 5 > 4 > 3 > 0 (per 100 pieces) give unions 300, 400, 500, 400: all three grown (400) fits 450
    assert _union({"a": 200, "b": 200, "c": 200}, pieces) == 400
    chosen = allocate_vocabulary(curves, {"a": 1.0, "b": 1.0, "c": 1.0}, 450, pieces)
    assert chosen == {"a": 200, "b": 200, "c": 200}  # a bisection on the threshold gave a 200, b 100, c 100


def test_merged_model_loads_and_round_trips_multilingual_text(tiny_models, tmp_path):
    q = {lang: 1 / len(TEXTS) for lang in TEXTS}
    out = merge_vocab_model(tiny_models["en"], {lang: model_pieces(m) for lang, m in tiny_models.items()}, q, True,
                      tmp_path / "spm.model")
    sp = spm.SentencePieceProcessor(model_file=str(out))
    assert [sp.id_to_piece(i) for i in range(5)] == ["<unk>", "<s>", "</s>", "<pad>", "<mask>"]
    assert sp.piece_to_id("<mask>") == 4 and sp.pad_id() == 3
    union = set().union(*(model_pieces(m) for m in tiny_models.values()))
    normal = {sp.id_to_piece(i) for i in range(sp.get_piece_size())
              if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i))}
    assert normal == union
    for text in list(TEXTS.values()) + ["Emoji 👍🏽 and ☕ are not in any model: bytes carry them. 한국어도."]:
        ids = sp.encode(text)
        normalized = sp.normalize(text).replace("\u2581", " ").strip()
        assert sp.decode(ids) == normalized, "lossless modulo the model's NFKC normalisation"
    assert sp.encode("👍")[0] != sp.unk_id(), "byte fallback, not <unk>"
    assert len(sp.encode(TEXTS["zh"])) < len(TEXTS["zh"].encode("utf-8")), "real pieces, not only bytes"


def test_vocab_stage_with_a_tiny_language(run_cli, tmp_path):
    for lang in ("en", "de"):
        (tmp_path / f"{lang}.txt").write_text("\n".join(corpus(lang, 600, seed=1)) + "\n", encoding="utf-8")
    (tmp_path / "sw.txt").write_text("Habari.\nAsante sana.\nKaribu.\n", encoding="utf-8")
    spec = write_spec(tmp_path / "spec.yaml", {
        "name": "vocab-test", "languages": ["de", "en", "sw"],
        "sources": [{"name": f"{lang}-text", "kind": "local", "path": f"{lang}.txt", "format": "text", "lang": lang}
                    for lang in ("de", "en", "sw")],
        "dedup": {"near": False, "exact": False},
        "vocab": {"grid": [40, 60, 80], "budget": 130, "held_sentences": 50},
        "tracking": {"experiment": "vocab-test"},
    })
    rc, out, err = run_cli("run", "vocab", "--spec", spec, "--workspace", tmp_path / "ws", "--json")
    assert rc == 0, err
    vdir = Path(json.loads(out)["stages"]["vocab"]["output_dir"])
    alloc = {r["lang"]: r for r in pl.read_parquet(vdir / "allocation.parquet").to_dicts()}
    assert alloc["sw"]["chosen_size"] is None and "corpus too small" in alloc["sw"]["failed_sizes"][0]
    assert alloc["de"]["chosen_size"] in (40, 60, 80) and alloc["en"]["chosen_size"] in (40, 60, 80)
    notes = json.loads((vdir / "_manifest.json").read_text())["notes"]
    assert any(n.startswith("sw: no grid size could be trained") for n in notes)
    sp = spm.SentencePieceProcessor(model_file=str(vdir / "spm.model"))
    assert sp.decode(sp.encode("Asante sana, Fuchs! 🦊")) == "Asante sana, Fuchs! 🦊"
    cmp = pl.read_parquet(vdir / "comparison.parquet")
    assert set(cmp["lang"]) == {"de", "en", "sw"} and (cmp["tokens_per_sentence_joint"] > 0).all()
    metrics = json.loads((vdir / "_manifest.json").read_text())["metrics"]
    assert metrics["union_size"] <= 130 and metrics["languages"] == 2
    assert {lang: metrics[f"allocated.{lang}"] for lang in ("de", "en")} == {
        lang: alloc[lang]["chosen_size"] for lang in ("de", "en")}
    # the merged model: the union's pieces + <unk> <s> </s> <pad> <mask> + 256 byte-fallback pieces
    assert metrics["vocab_size"] == metrics["union_size"] + 5 + 256 == sp.get_piece_size()
    for row in cmp.to_dicts():
        assert row["unk_rate_vocap"] == 0.0, "byte fallback: nothing is <unk>"
        assert row["tokens_per_sentence_vocap"] > 1 and row["tokens_per_sentence_joint"] > 1
        # both tokenizers were evaluated on the same held sentences: same characters per sentence
        chars_v = row["chars_per_token_vocap"] * row["tokens_per_sentence_vocap"]
        chars_j = row["chars_per_token_joint"] * row["tokens_per_sentence_joint"]
        assert chars_v == pytest.approx(chars_j, rel=1e-9), row["lang"]

    # the pictures show the tables (not just: a file was written)
    ymargin = matplotlib.rcParams["axes.ymargin"]
    rgb = _png(vdir / "allocation.png", min_size=(500, 300))  # measured 532 x 373
    chosen = [alloc[lang]["chosen_size"] for lang in ("de", "en")]
    heights = [v for _, v in _bars(rgb, PALETTE[0])]
    assert len(heights) == 2, "one bar per language with a chosen size (sw has none)"
    top = max(chosen) * (1 + ymargin)
    assert sorted(h * top for h in heights) == pytest.approx(sorted(chosen), abs=0.015 * top)

    rgb = _png(vdir / "tokens_per_sentence.png", min_size=(600, 300))  # measured 725 x 373
    vocap, joint = _bars(rgb, PALETTE[0]), _bars(rgb, PALETTE[1])
    assert len(vocap) == len(joint) == 3, "a VoCAP and a joint bar for each of de, en, sw"
    assert all(abs(xj - xv) < 80 for (xv, _), (xj, _) in zip(vocap, joint)), "side by side"
    rows = cmp.to_dicts()
    top = max(max(r["tokens_per_sentence_vocap"], r["tokens_per_sentence_joint"]) for r in rows) * (1 + ymargin)
    expected = sorted((r["tokens_per_sentence_vocap"], r["tokens_per_sentence_joint"]) for r in rows)
    drawn = sorted((hv * top, hj * top) for (_, hv), (_, hj) in zip(vocap, joint))
    for (ev, ej), (dv, dj) in zip(expected, drawn):
        assert abs(ev - dv) < 0.015 * top and abs(ej - dj) < 0.015 * top, (expected, drawn)

    rgb = _png(vdir / "alp_curves.png", min_size=(700, 450))  # measured 786 x 546
    de_px, en_px = ((rgb == PALETTE[k]).all(-1) for k in (0, 1))
    assert de_px.sum() > 200 and en_px.sum() > 200, "a curve (and its chosen-size dot) for de and en"
    assert not (rgb == PALETTE[2]).all(-1).any(), "no curve for sw, which has no grid model"
    # de's ALP is above en's at every grid size, so its curve is drawn above en's in every column
    assert all(a > b for a, b in zip(alloc["de"]["alp_smoothed"], alloc["en"]["alp_smoothed"]))
    shared = np.flatnonzero(de_px.any(0) & en_px.any(0))
    assert len(shared) > 150 and np.ptp(shared) > 0.6 * rgb.shape[1], "both curves span the plot"
    for x in shared:
        assert np.flatnonzero(de_px[:, x]).mean() < np.flatnonzero(en_px[:, x]).mean(), x
