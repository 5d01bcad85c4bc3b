"""The zero-shot probe, the holdout reservation and the evaluation data builders, on small known cases."""

from __future__ import annotations

import numpy as np
import pytest

from xylent.tasks.evaluate.data import package_pairs, read_probe, write_probe
from xylent.tasks.evaluate.encoders import default_layer, family
from xylent.tasks.evaluate.probe import MIN_TRAIN_PER_LABEL, evaluate_probe
from xylent.tasks.prepare.holdout import drop_reserved, is_reserved, probe_split, reserved_keys
from xylent.errors import XylentError


@pytest.fixture(autouse=True)
def prefect_server():  # nothing here needs the Prefect server
    yield


def _embedder(vectors: dict[str, np.ndarray]):
    return lambda texts: np.stack([vectors[t] for t in texts])


def test_probe_transfers_where_the_label_is_in_the_same_place_across_languages():
    rng = np.random.default_rng(0)
    centres = {lab: rng.normal(size=16) * 3 for lab in ("a", "b", "c")}
    vectors, train, tests = {}, ([], []), {"en": ([], []), "de": ([], []), "xx": ([], [])}
    for i in range(90):
        lab = "abc"[i % 3]
        for lang, shift in (("en", 0.0), ("de", 0.0), ("xx", None)):
            # de: same place as English (transfers); xx: labels permuted (cannot transfer)
            centre = centres[lab] if shift is not None else centres["abc"[(i + 1) % 3]]
            text = f"{lang}-{i}"
            vectors[text] = centre + rng.normal(size=16) * 0.5
            (train if lang == "en" and i < 60 else tests[lang])[0].append(lab)
            (train if lang == "en" and i < 60 else tests[lang])[1].append(text)
    r = evaluate_probe(_embedder(vectors), train, tests, "en")
    assert r["languages"]["en"]["accuracy"] == 100.0 and r["languages"]["en"]["n"] == 30
    assert r["languages"]["de"]["accuracy"] == 100.0 and r["languages"]["de"]["n"] == 90
    assert r["languages"]["xx"]["accuracy"] == 0.0, "a permuted language gets every item wrong"
    assert r["transfer_gap"] == pytest.approx(100.0 - (100.0 + 0.0) / 2)
    assert r["languages"]["de"]["majority_baseline"] == pytest.approx(100 / 3)
    assert r["avg"] == pytest.approx((100 + 100 + 0) / 3)


def test_probe_leaves_out_labels_too_rare_to_learn():
    vectors = {f"t{i}": np.eye(4)[i % 2] + 0.01 * i for i in range(40)}
    labels = ["x" if i % 2 else "y" for i in range(38)] + ["rare"] * 2  # 2 < MIN_TRAIN_PER_LABEL
    texts = [f"t{i}" for i in range(40)]
    r = evaluate_probe(_embedder(vectors), (labels, texts), {"en": (labels, texts)}, "en")
    assert MIN_TRAIN_PER_LABEL > 2 and r["labels"] == ["x", "y"]
    assert r["test_items_dropped"] == 2 and r["languages"]["en"]["n"] == 38


def test_holdout_reserves_by_english_text_in_every_language():
    hold = {"fraction": 0.3, "test_fraction": 0.5, "seed": 0}
    english = {("c1", "", f"msg {i}"): f"msg {i}" for i in range(2000)}
    english[("c2", "", "msg 1")] = "msg 1"  # the same text in another catalog
    keys = reserved_keys(english, hold)
    assert 0.27 < len(keys) / len(english) < 0.33
    assert (("c1", "", "msg 1") in keys) == (("c2", "", "msg 1") in keys), "reserved by text, not by key"
    texts = {"en": dict(english), "de": {k: f"de {v}" for k, v in english.items()}}
    reserved_de = {texts["de"][k] for k in keys}
    other = next(k for k in english if k not in keys)
    texts["de"][other] = next(iter(reserved_de))  # a kept key whose German text equals a reserved one
    lost = drop_reserved(texts, english, hold)
    assert lost["en"] == len(keys) and lost["de"] == len(keys) + 1
    assert not (set(texts["de"].values()) & reserved_de), "no reserved German text survives"
    assert is_reserved("msg 7", hold) == is_reserved("msg 7", dict(hold)), "deterministic"
    splits = [probe_split(english[k], hold) for k in keys]
    assert 0.4 < splits.count("test") / len(splits) < 0.6
    other_seed = reserved_keys(english, {**hold, "seed": 1})
    assert 0.05 < len(keys & other_seed) / len(keys) < 0.6, "the seed changes the choice"


def test_package_pairs_are_real_parallel_messages_without_duplicates():
    pairs = package_pairs("allauth", ["de", "ja"])
    xx, en = pairs["de"]
    assert len(xx) == len(en) > 250
    assert len(set(xx)) == len(xx) and len(set(en)) == len(en)
    assert "Password" in en and xx[en.index("Password")] == "Passwort"
    assert all(any("\u3040" <= ch <= "\u30ff" or "\u4e00" <= ch <= "\u9fff" for ch in t) for t in pairs["ja"][0][:50])


def test_probe_files_round_trip_and_bad_lines_name_file_and_line(tmp_path):
    msgs = {"en": [("a", "train", "one", None), ("b", "test", "two", None)], "de": [("b", "test", "zwei", None)]}
    root = write_probe(tmp_path / "p", msgs, "en")
    assert read_probe(root, "en", "train") == (["a"], ["one"])
    assert read_probe(root, "de", "test") == (["b"], ["zwei"])
    keyed = {"en": [("a", "train", "one", 1), ("b", "test", "two", 2)], "de": [("b", "test", "zwei", 2),
                                                                          ("a", "test", "eins", 9)]}
    plug = write_probe(tmp_path / "plug", keyed, "en", {1: "one", 2: "two"})  # key 9 has no English: left out
    assert read_probe(plug, "de", "test", translations=True) == (["b"], ["zwei"], ["two"])
    assert read_probe(plug, "en", "train") == (["a"], ["one"]), "the plain probe reads the same files"
    with pytest.raises(XylentError, match=r"(?s)no third column.*test-de.tsv:1"):
        read_probe(root, "de", "test", translations=True)
    (root / "test-fr.tsv").write_text("a\tun\nno tab here\n")
    with pytest.raises(XylentError, match=r"test-fr.tsv:2"):
        read_probe(root, "fr", "test")
    (root / "test-es.tsv").write_bytes(b"a\tok\nb\t\xff\xfe\n")
    with pytest.raises(XylentError, match=r"(?s)UTF-8.*test-es.tsv:2"):
        read_probe(root, "es", "test")
    with pytest.raises(XylentError, match="no test file for language 'it'"):
        read_probe(root, "it", "test")


def xtreme_layer_states(hidden_states: tuple, num_layers: int, specific_layer: int):
    """A transcription of XTREME's run_retrieval.py: it keeps ``all_layer_outputs[-num_layers:]`` and
    indexes that list with ``--specific_layer`` (7 by default)."""
    return hidden_states[-num_layers:][specific_layer]


def test_default_layer_reads_the_state_xtremes_retrieval_reads():
    import torch
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=12, num_attention_heads=2,
                                 intermediate_size=16)).eval()
    with torch.no_grad():
        hidden = model(torch.tensor([[1, 5, 7, 2]]), output_hidden_states=True).hidden_states
    assert len(hidden) == 13, "embeddings + 12 blocks"
    # XLM-R in XTREME: layer 7; XLM-E §4: layer 9 for the ELECTRA-style encoder, in the same numbering
    assert hidden[default_layer(12, "mlm")] is xtreme_layer_states(hidden, 12, 7)
    assert hidden[default_layer(12, "electra")] is xtreme_layer_states(hidden, 12, 9)
    assert (default_layer(12), default_layer(12, "electra")) == (8, 10)
    assert default_layer(24) == 15 and default_layer(2) == 2 and default_layer(2, "electra") == 2
    assert family("electra") == "electra" and {family(o) for o in ("mlm", "infoxlm", "veco", None)} == {"mlm"}


def test_holdout_drops_texts_that_differ_only_by_format_characters_or_case():
    hold = {"fraction": 0.5, "test_fraction": 0.5, "seed": 0}
    english = {("c", "", f"m{i}"): f"m{i}" for i in range(200)}
    keys = sorted(reserved_keys(english, hold))
    kept = next(k for k in english if k not in keys)
    fa = {k: f"fa {k[2]}" for k in english}
    fa[keys[0]] = "سه\u200cشنبه"       # reserved, with a zero-width non-joiner
    fa[kept] = "سه شنبه"                # kept key, the same word with a space: a tokenizer may merge them
    texts = {"fa": fa}
    drop_reserved(texts, english, hold)
    assert kept not in texts["fa"] and keys[0] not in texts["fa"]
    assert len(texts["fa"]) == 200 - len(keys) - 1


def test_a_probe_with_fewer_than_two_learnable_labels_is_a_user_error():
    vectors = {f"t{i}": np.eye(3)[i % 3] for i in range(12)}
    labels = ["a"] * 10 + ["b", "c"]
    texts = [f"t{i}" for i in range(12)]
    with pytest.raises(XylentError, match="a classifier needs two"):
        evaluate_probe(_embedder(vectors), (labels, texts), {"en": (labels, texts)}, "en")


def test_a_probe_file_with_an_ignored_column_or_in_another_language_is_warned_about(tmp_path):
    from types import SimpleNamespace

    from xylent.tasks.evaluate.data import probe_warnings

    pairs = package_pairs("django", ["de", "fr"])  # real catalog text
    long = {lang: [t for t in pairs[lang][0] if len(t) >= 30][:60] for lang in ("de", "fr")}
    long["en"] = [t for t in pairs["de"][1] if len(t) >= 30][:60]
    write = lambda name, texts, extra="": (tmp_path / name).write_text(  # noqa: E731
        "".join(f"lab{i % 3}\t{t}{extra}\n" for i, t in enumerate(texts)))
    write("train-en.tsv", long["en"])
    write("test-de.tsv", long["de"])
    write("test-fr.tsv", long["fr"])
    task = SimpleNamespace(name="t", languages=["de", "en", "fr"], train_language="en", plug_in=False)
    assert probe_warnings(tmp_path, task) == [], "each file in its own language, two columns"
    write("test-de.tsv", long["fr"])  # the French file copied over the German one
    write("test-fr.tsv", long["fr"], extra="\tsomething else")
    got = probe_warnings(tmp_path, task)
    assert len(got) == 2, got
    language, column = got
    write("test-xx.tsv", long["fr"])  # a language lingua does not know is not judged (its lines have no own vote)
    task.languages.append("xx")
    assert len(probe_warnings(tmp_path, task)) == 2
    assert "test-de.tsv read as 'fr', 0 as 'de' (lingua)" in language.replace(str(tmp_path) + "/", ""), got
    assert "60 line(s)" in column and "test-fr.tsv" in column and "plug_in: true" in column, got
