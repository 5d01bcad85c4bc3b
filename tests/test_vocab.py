"""vocab: ALP, concave smoothing, allocation properties, the merged model."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import sentencepiece as spm

from conftest import write_spec
from tasks.vocab import allocate_vocabulary, average_log_probability, concave_curve
from tasks.vocab.merge import build_model
from tasks.vocab.train import model_pieces, train_model
from xylent.spec import VocabConfig

ROOT = Path(__file__).resolve().parents[1]
TEXTS = {
    "en": "The quick brown fox jumps over the lazy dog while the children watch from the garden window.",
    "de": "Der schnelle braune Fuchs springt über den faulen Hund, während die Kinder aus dem Fenster schauen.",
    "zh": "敏捷的棕色狐狸跳过了懒狗，孩子们在花园的窗户里看着。今天天气很好，我们去公园散步吧。",
    "th": "สุนัขจิ้งจอกสีน้ำตาลกระโดดข้ามสุนัขขี้เกียจ เด็กๆ มองจากหน้าต่างสวน",
    "ar": "الثعلب البني السريع يقفز فوق الكلب الكسول بينما يشاهد الأطفال من نافذة الحديقة.",
}


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


def test_merged_model_loads_and_round_trips_multilingual_text(tiny_models, tmp_path):
    q = {lang: 1 / len(TEXTS) for lang in TEXTS}
    out = build_model(tiny_models["en"], {lang: model_pieces(m) for lang, m in tiny_models.items()}, q, True,
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
    for png in ("alp_curves.png", "allocation.png", "tokens_per_sentence.png"):
        assert (vdir / png).stat().st_size > 5000
