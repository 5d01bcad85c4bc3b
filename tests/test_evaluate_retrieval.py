"""Retrieval without fine-tuning (Tatoeba, BUCC 2018) on hand-built embeddings
whose answers are known, with the real faiss (CPU) doing the search."""

from __future__ import annotations

import numpy as np
import pytest

from xylent.tasks.evaluate.retrieval import (
    bucc_mine,
    choose_threshold,
    evaluate_bucc,
    evaluate_tatoeba,
    f1_at_threshold,
    knn,
    margin_knn,
    mine_pairs,
    tatoeba_accuracy,
)
from xylent.tasks.evaluate.retrieval_data import LASER_TATOEBA, read_bucc, read_tatoeba, tatoeba_code
from xylent.errors import XylentError


def table_embed(table: dict[str, np.ndarray], batch: int = 64):
    """An EmbedFn that looks texts up: identical texts get identical vectors, as from a real encoder."""
    def embed(texts):
        for start in range(0, len(texts), batch):
            yield np.stack([table[t] for t in texts[start: start + batch]]).astype(np.float32)
    return embed


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


# -- Tatoeba accuracy ----------------------------------------------------------

def tatoeba_case() -> tuple[dict[str, np.ndarray], list[str], list[str]]:
    """en_i = e_i.  xx_2 and xx_5 lean towards en_{i+1} (0.9 vs 0.1): wrong xx→en,
    yet still en_i's only non-orthogonal xx, so right en→xx.  xx_0 is shared by
    en_0 (0.711) and en_9 (0.704) and xx_9 = e_9 + 1.2 e_13 has cos 0.640 with
    en_9: right xx→en for both, but en_9 retrieves xx_0.  Norms vary, so only a
    cosine search gets these answers."""
    e = np.eye(16)
    xx = {i: e[i].copy() for i in range(10)}
    for i in (2, 5):
        xx[i] = 0.1 * e[i] + 0.9 * e[i + 1]
    xx[0] = e[0] + 0.99 * e[9]
    xx[9] = e[9] + 1.2 * e[13]
    norms = np.linspace(0.5, 3.0, 10)
    table = {f"en{i}": e[i] * norms[i] for i in range(10)}
    table |= {f"xx{i}": xx[i] * norms[::-1][i] for i in range(10)}
    return table, [f"xx{i}" for i in range(10)], [f"en{i}" for i in range(10)]


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_tatoeba_accuracy_both_directions_on_known_answers(batch):
    table, src, tgt = tatoeba_case()
    before = {t: v.copy() for t, v in table.items()}
    got = tatoeba_accuracy(table_embed(table, batch), src, tgt)
    assert got["accuracy"] == pytest.approx(80.0)  # xx_2, xx_5 wrong
    assert got["accuracy_en_to_xx"] == pytest.approx(90.0)  # en_9 wrong
    assert got["n"] == 10
    assert got["predictions"] == [0, 1, 3, 3, 4, 6, 6, 7, 8, 9]
    assert all(np.array_equal(table[t], before[t]) for t in table), "the caller's vectors were normalised in place"


def test_tatoeba_gold_is_the_line_index_not_the_text():
    # Lines 3 and 4 hold the same English sentence: both xx queries find the
    # first copy (faiss CPU: lowest index among exact ties), so only line 3 counts.
    e = np.eye(8)
    table = {f"en{i}": e[i] for i in range(6)} | {f"xx{i}": e[i] + 0.05 * e[7] for i in range(6)}
    table["xx4"] = e[3] + 0.05 * e[7]
    src, tgt = [f"xx{i}" for i in range(6)], ["en0", "en1", "en2", "en3", "en3", "en5"]
    got = tatoeba_accuracy(table_embed(table), src, tgt)
    assert got["predictions"] == [0, 1, 2, 3, 3, 5]
    assert got["accuracy"] == pytest.approx(100 * 5 / 6)


# -- knn -----------------------------------------------------------------------

def test_knn_is_exact_and_batching_does_not_change_it():
    rng = np.random.default_rng(1)
    q, db = rng.standard_normal((37, 12)).astype(np.float32), rng.standard_normal((50, 12)).astype(np.float32)
    brute = q @ db.T
    expected = np.argsort(-brute, axis=1, kind="stable")[:, :5]
    for batch in (1, 7, 4096):
        scores, ids = knn(q, db, 5, batch)
        assert np.array_equal(ids, expected)
        np.testing.assert_allclose(scores, np.take_along_axis(brute, expected, 1), rtol=1e-5)
    assert knn(q, db[:3], 10)[1].shape == (37, 3)  # k capped at the database size


# -- BUCC: the margin ----------------------------------------------------------

def test_ratio_margin_matches_a_direct_numpy_computation():
    rng = np.random.default_rng(2)
    x, y = unit(np.abs(rng.standard_normal((6, 5)))), unit(np.abs(rng.standard_normal((7, 5))))
    k = 3
    cos = x @ y.T
    x_mean = np.sort(cos, axis=1)[:, -k:].mean(axis=1)  # mean cos to x's k nearest y
    y_mean = np.sort(cos, axis=0)[-k:, :].mean(axis=0)  # mean cos to y's k nearest x
    margin = cos / ((x_mean[:, None] + y_mean[None, :]) / 2)
    fwd_ids, fwd_margin, bwd_ids, bwd_margin = margin_knn(x.astype(np.float32), y.astype(np.float32), k)
    for i in range(6):
        assert set(fwd_ids[i]) == set(np.argsort(-cos[i])[:k])
        np.testing.assert_allclose(fwd_margin[i], margin[i, fwd_ids[i]], rtol=1e-5)
    for j in range(7):
        assert set(bwd_ids[j]) == set(np.argsort(-cos[:, j])[:k])
        np.testing.assert_allclose(bwd_margin[j], margin[bwd_ids[j], j], rtol=1e-5)


def test_a_non_positive_margin_denominator_scores_minus_infinity():
    x, y = np.array([[1.0, 0.0]], np.float32), np.array([[-1.0, 0.0]], np.float32)
    _, fwd_margin, _, bwd_margin = margin_knn(x, y, k=1)
    assert fwd_margin[0, 0] == -np.inf and bwd_margin[0, 0] == -np.inf  # cos -1 / mean -1 would be +1


# -- BUCC: mining a planted parallel set ---------------------------------------

N_PAIRS, N_DISTRACT, N_HUBBED, DIM = 100, 100, 20, 256


def planted(seed: int) -> tuple[dict[str, np.ndarray], list[str], list[str], set[tuple[str, str]]]:
    """100 pairs among 100 + 100 unrelated sentences per side, plus 2 English
    "hub" sentences.  Ordinary pairs: cos ≈ 0.8, margin ≈ 2.7.  The 20 hubbed xx
    sentences are 0.75 hub + 0.66 partner: cosine prefers the hub (by ≥ 0.05),
    but a hub is near 10 of them, so its high neighbourhood mean divides its
    margin down to ≈ 1.3 while the partner's is ≥ 1.7.  Unrelated sentences
    reach ≤ 1.5 (seeds 1-14 checked): the best of ~200 random cosines over the
    mean of the top 4."""
    rng = np.random.default_rng(seed)

    def rand(n):  # random unit vectors: cosines ≈ ±0.06
        return unit(rng.standard_normal((n, DIM)))

    partners, hubs = rand(N_PAIRS), rand(2)
    xx = unit(0.8 * partners + 0.6 * rand(N_PAIRS))
    hub_of = np.arange(N_HUBBED) % 2
    xx[:N_HUBBED] = 0.75 * hubs[hub_of] + 0.66 * partners[:N_HUBBED] + 0.1 * rand(N_HUBBED)
    en_vecs = np.concatenate([partners, rand(N_DISTRACT), hubs])
    xx_vecs = np.concatenate([xx, rand(N_DISTRACT)])
    perm_en, perm_xx = rng.permutation(len(en_vecs)), rng.permutation(len(xx_vecs))  # ids say nothing
    en_ids = [f"en-{seed}{p:06d}" for p in perm_en]
    xx_ids = [f"de-{seed}{p:06d}" for p in perm_xx]
    table = {f"text {i}": v for i, v in zip(en_ids, en_vecs)} | {f"text {i}": v for i, v in zip(xx_ids, xx_vecs)}
    gold = {(xx_ids[i], en_ids[i]) for i in range(N_PAIRS)}
    return table, xx_ids, en_ids, gold


def mine(table, xx_ids, en_ids, embed_batch=64, search_batch=4096):
    return bucc_mine(table_embed(table, embed_batch), xx_ids, [f"text {i}" for i in xx_ids],
                     en_ids, [f"text {i}" for i in en_ids], k=4, batch=search_batch)


def test_margin_mining_recovers_planted_pairs_and_rejects_distractors():
    dev, test = planted(1), planted(2)
    threshold = choose_threshold(mine(*dev[:3]), dev[3])
    table, xx_ids, en_ids, gold = test
    candidates = mine(table, xx_ids, en_ids)
    # Every planted pair outscores everything else by a clear gap, so the
    # threshold tuned on another draw separates them exactly.
    planted_scores = [s for s, a, b in candidates if (a, b) in gold]
    other_scores = [s for s, a, b in candidates if (a, b) not in gold]
    assert len(planted_scores) == N_PAIRS
    assert min(planted_scores) > max(other_scores) + 0.15
    assert max(other_scores) < threshold < min(planted_scores)
    assert f1_at_threshold(candidates, gold, threshold) == {"f1": 100.0, "precision": 100.0, "recall": 100.0}
    predicted = {(a, b) for s, a, b in candidates if s >= threshold}
    distractors = set(xx_ids[N_PAIRS:]) | set(en_ids[N_PAIRS:])
    assert not any(a in distractors or b in distractors for a, b in predicted)


def test_ratio_margin_rejects_the_hubs_that_cosine_picks():
    table, xx_ids, en_ids, _ = planted(3)
    x = np.stack([table[f"text {i}"] for i in xx_ids]).astype(np.float32)
    y = np.stack([table[f"text {i}"] for i in en_ids]).astype(np.float32)
    x, y = unit(x), unit(y)
    hubs = {N_PAIRS + N_DISTRACT, N_PAIRS + N_DISTRACT + 1}
    nearest = knn(x, y, 1)[1][:, 0]
    assert set(nearest[:N_HUBBED].tolist()) == hubs  # plain cosine: every hubbed sentence goes to a hub
    fwd_ids, fwd_margin, _, _ = margin_knn(x, y, k=4)
    best = fwd_ids[np.arange(len(x)), fwd_margin.argmax(axis=1)]
    assert np.array_equal(best[:N_HUBBED], np.arange(N_HUBBED))  # ratio margin: the partner
    src, tgt, _ = mine_pairs(x, y, k=4)
    mined = dict(zip(src.tolist(), tgt.tolist()))
    assert all(mined[i] == i for i in range(N_PAIRS))
    assert len(set(src.tolist())) == len(src) and len(set(tgt.tolist())) == len(tgt)  # one pair per sentence


def test_mining_does_not_depend_on_batch_sizes():
    table, xx_ids, en_ids, _ = planted(4)
    small = mine(table, xx_ids, en_ids, embed_batch=1, search_batch=1)
    large = mine(table, xx_ids, en_ids, embed_batch=1000, search_batch=4096)
    assert [c[1:] for c in small] == [c[1:] for c in large]
    np.testing.assert_allclose([c[0] for c in small], [c[0] for c in large], rtol=1e-5)


def test_a_sentence_repeated_on_its_side_is_never_proposed():
    # XTREME maps texts back to ids and drops a text with two ids.
    e = np.eye(6)
    table = {"a": e[0], "b": e[1], "c": e[2], "A": e[0] + 0.1 * e[5], "B": e[1] + 0.1 * e[5], "C": e[2]}
    got = bucc_mine(table_embed(table), ["x1", "x2", "x3"], ["A", "B", "C"],
                    ["y1", "y2", "y3", "y4"], ["a", "b", "b", "c"], k=1)
    assert {(s, t) for _, s, t in got} == {("x1", "y1"), ("x3", "y4")}


# -- BUCC: threshold -----------------------------------------------------------

def test_threshold_on_a_hand_computed_case():
    gold = {("s1", "t1"), ("s3", "t3"), ("s9", "t9")}  # s9-t9 is never mined
    candidates = [(3.0, "s1", "t1"), (2.0, "s2", "t2"), (1.5, "s3", "t3"), (1.0, "s4", "t4")]
    # F1 after 1, 2, 3, 4 kept: 0.5, 0.4, 0.667, 0.571 -> keep 3, cut halfway to the 4th
    assert choose_threshold(candidates, gold) == 1.25
    assert f1_at_threshold(candidates, gold, 1.25)["f1"] == pytest.approx(200 / 3)
    assert choose_threshold([(2.0, "s2", "t2")], gold) == 0.0  # nothing right: the reference's 0


def test_threshold_maximises_f1_like_brute_force():
    rng = np.random.default_rng(5)
    for _ in range(20):
        n = int(rng.integers(5, 60))
        scores = np.round(rng.uniform(0, 3, n), 1)  # one decimal: many ties
        candidates = [(float(s), f"s{i}", f"t{i}") for i, s in enumerate(scores)]
        gold = {(f"s{i}", f"t{i}") for i in range(n) if rng.random() < scores[i] / 3} | {("s-x", "t-x")}
        best = max(f1_at_threshold(candidates, gold, t)["f1"] for t in set(scores.tolist()))
        threshold = choose_threshold(candidates, gold)
        assert f1_at_threshold(candidates, gold, threshold)["f1"] == pytest.approx(best)


# -- readers -------------------------------------------------------------------

EN = ["Tom is here.", "I like tea.", "", "Where is it?", "I like tea.", "Good night."]
DE = ["Tom ist hier.", "Ich mag Tee.", "", "Wo ist es?", "Tee mag ich.", "Gute Nacht."]


def write(path, lines, end="\n"):
    path.write_text("".join(line + end for line in lines), encoding="utf-8")
    return path


# XTREME's utils_preprocess.py `tatoeba_preprocess` (lang3_dict, snapshot 838c13b): its 36 languages and
# the 5 XTREME-R added, 2-letter code -> LASER's file code
XTREME_LANG3 = {
    "af": "afr", "ar": "ara", "bg": "bul", "bn": "ben", "de": "deu", "el": "ell", "es": "spa", "et": "est",
    "eu": "eus", "fa": "pes", "fi": "fin", "fr": "fra", "he": "heb", "hi": "hin", "hu": "hun", "id": "ind",
    "it": "ita", "ja": "jpn", "jv": "jav", "ka": "kat", "kk": "kaz", "ko": "kor", "ml": "mal", "mr": "mar",
    "nl": "nld", "pt": "por", "ru": "rus", "sw": "swh", "ta": "tam", "te": "tel", "th": "tha", "tl": "tgl",
    "tr": "tur", "ur": "urd", "vi": "vie", "zh": "cmn", "az": "aze", "lt": "lit", "pl": "pol", "uk": "ukr",
    "ro": "ron"}


def test_every_laser_tatoeba_language_is_found_by_its_usual_code(tmp_path):
    assert len(LASER_TATOEBA) == len(set(LASER_TATOEBA)) == 112
    assert {k: tatoeba_code(k) for k in XTREME_LANG3} == XTREME_LANG3, "XTREME's own table, from the library"
    assert all(tatoeba_code(c) == c for c in LASER_TATOEBA), "each LASER code reaches its own files"
    assert (tatoeba_code("ca"), tatoeba_code("cat"), tatoeba_code("zho"), tatoeba_code("nb")) == ("cat", "cat", "cmn",
                                                                                                  "nob")
    assert (tatoeba_code("lv"), tatoeba_code("ms"), tatoeba_code("cy")) == ("lvs", "zsm", "cym")
    assert tatoeba_code("qqq") == "qqq" and tatoeba_code("not a code") == "not a code", "unknown: used as is"
    write(tmp_path / "tatoeba.cat-eng.cat", DE)
    write(tmp_path / "tatoeba.cat-eng.eng", EN)
    assert read_tatoeba(tmp_path, "ca") == (DE, EN), "Catalan, outside XTREME's 41, is no longer 'not found'"


def test_both_tatoeba_layouts_read_the_same_pairs(tmp_path):
    raw, pre = tmp_path / "raw", tmp_path / "pre"
    raw.mkdir(), pre.mkdir()
    write(raw / "tatoeba.deu-eng.deu", DE, end="\r\n")
    write(raw / "tatoeba.deu-eng.eng", EN)
    # XTREME's preprocessing: the xx file copied, the English side sorted
    # (stable), the position of each sentence's translation kept as the labels.
    order = sorted(range(len(EN)), key=EN.__getitem__)
    write(pre / "de-en.de", DE)
    write(pre / "de-en.en", [EN[i] for i in order])
    labels = write(tmp_path / "test-de.tsv", [str(order.index(i)) for i in range(len(EN))])
    assert read_tatoeba(raw, "de") == (DE, EN)
    assert read_tatoeba(pre, "de", labels) == (DE, EN)
    with pytest.raises(XylentError, match="sorted"):
        read_tatoeba(pre, "de")


def test_evaluate_tatoeba_reads_and_scores(tmp_path):
    table, src, tgt = tatoeba_case()
    write(tmp_path / "tatoeba.cmn-eng.cmn", src)
    write(tmp_path / "tatoeba.cmn-eng.eng", tgt)
    assert evaluate_tatoeba(table_embed(table), tmp_path, "zh")["accuracy"] == pytest.approx(80.0)


def test_tatoeba_reader_errors_name_files(tmp_path):
    with pytest.raises(XylentError) as err:
        read_tatoeba(tmp_path, "fa")
    assert "tatoeba.pes-eng.pes" in str(err.value) and "fa-en.fa" in str(err.value) and str(tmp_path) in str(err.value)
    write(tmp_path / "tatoeba.pes-eng.pes", DE)
    with pytest.raises(XylentError, match="only tatoeba.pes-eng.pes is there"):
        read_tatoeba(tmp_path, "fa")
    write(tmp_path / "tatoeba.pes-eng.eng", EN[:-1])
    with pytest.raises(XylentError) as err:
        read_tatoeba(tmp_path, "fa")
    assert "tatoeba.pes-eng.pes has 6 lines" in str(err.value) and "tatoeba.pes-eng.eng has 5" in str(err.value)
    (tmp_path / "tatoeba.pes-eng.eng").write_bytes("\n".join(EN[:4]).encode() + b"\nbad \xff byte\n")
    with pytest.raises(XylentError) as err:
        read_tatoeba(tmp_path, "fa")
    assert f"{tmp_path / 'tatoeba.pes-eng.eng'}:5" in str(err.value)


def write_bucc(folder, split, lang, src, tgt, gold=None):
    write(folder / f"{lang}-en.{split}.{lang}", [f"{i}\t{t}" for i, t in src])
    write(folder / f"{lang}-en.{split}.en", [f"{i}\t{t}" for i, t in tgt])
    if gold is not None:
        write(folder / f"{lang}-en.{split}.gold", [f"{a}\t{b}" for a, b in gold])


def test_bucc_reader_errors_name_file_and_line(tmp_path):
    src = [("de-000001", "Hallo Welt"), ("de-000002", "Gute Nacht")]
    tgt = [("en-000001", "Hello world"), ("en-000002", "Good night"), ("en-000003", "")]
    write_bucc(tmp_path, "dev", "de", src, tgt, [("de-000001", "en-000001")])
    split = read_bucc(tmp_path, "de", "dev")
    assert split.src_ids == ["de-000001", "de-000002"] and split.tgt_texts == ["Hello world", "Good night", ""]
    assert split.gold == {("de-000001", "en-000001")}
    cases = [
        ("de-en.dev.de", ["de-000001\tHallo", "de-000002 no tab here"], "de-en.dev.de:2"),
        ("de-en.dev.de", ["de-000001\tHallo", "de-000001\tnochmal"], "de-en.dev.de:2"),
        ("de-en.dev.gold", ["de-000001 en-000001"], "de-en.dev.gold:1"),
        ("de-en.dev.gold", ["de-000001\ten-000001", "de-000009\ten-000002"], "de-en.dev.gold:2"),
    ]
    for name, lines, where in cases:
        write_bucc(tmp_path, "dev", "de", src, tgt, [("de-000001", "en-000001")])
        write(tmp_path / name, lines)
        with pytest.raises(XylentError) as err:
            read_bucc(tmp_path, "de", "dev")
        assert where in str(err.value), str(err.value)
    (tmp_path / "de-en.dev.en").unlink()
    with pytest.raises(XylentError, match="de-en.dev.en"):
        read_bucc(tmp_path, "de", "dev")


def test_evaluate_bucc_tunes_on_dev_and_predicts_test(tmp_path):
    (dev_table, dev_xx, dev_en, dev_gold), (test_table, test_xx, test_en, test_gold) = planted(6), planted(7)
    write_bucc(tmp_path, "dev", "de", [(i, f"text {i}") for i in dev_xx], [(i, f"text {i}") for i in dev_en],
               dev_gold)
    write_bucc(tmp_path, "test", "de", [(i, f"text {i}") for i in test_xx], [(i, f"text {i}") for i in test_en])
    embed = table_embed(dev_table | test_table)
    result = evaluate_bucc(embed, tmp_path, "de")
    assert (result["tune_split"], result["test_split"]) == ("dev", "test")
    assert result["tune"]["f1"] == 100.0
    assert result["test"] is None and "test-de.tsv" in result["note"]  # XTREME ships no test gold
    assert set(result["predictions"]) == test_gold and len(result["predictions"]) == N_PAIRS
    write(tmp_path / "de-en.test.gold", [f"{a}\t{b}" for a, b in sorted(test_gold)])
    assert evaluate_bucc(embed, tmp_path, "de")["test"]["f1"] == 100.0


def test_a_non_finite_embedding_is_a_user_error_naming_the_text():
    table = {"fine": np.ones(4), "broken": np.full(4, np.nan)}
    with pytest.raises(XylentError, match="'broken'"):
        tatoeba_accuracy(table_embed(table, 1), ["fine", "broken"], ["fine", "fine"])
