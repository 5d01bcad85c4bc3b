"""The evaluate stage end to end: the demo's scorecard, its contract, MLflow and the
held-out guarantee; a local Hugging Face encoder side by side; tasks fetched from
a URL with a checksum; user mistakes -> exit 2 naming what and where."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
import sentencepiece as spm
import yaml

from xylent.tasks.evaluate.data import holdout_messages
from xylent.tasks.evaluate.retrieval_data import read_tatoeba
from xylent.tasks.evaluate.scoring import score_language
from xylent.tasks.evaluate.surface import stripped_pairs, surface_overlap
from xylent.spec import load_spec

from conftest import DEMO_SHORT  # the session demo's spec (tests/data/demo-short.yaml)
from test_evaluate_probe import xtreme_layer_states  # the transcription of XTREME's layer slicing
ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data_specs" / "demo.yaml"
TASKS = {"django-topics": "probe", "django-topics-ft": "classification", "django-holdout": "tatoeba",
         "allauth": "tatoeba"}


def _scores(res: dict) -> tuple[Path, dict]:
    out = Path(res["stages"]["evaluate"]["output_dir"])
    return out, json.loads((out / "scores.json").read_text())


def test_demo_scorecard_contract(demo_run):
    res, _ = demo_run
    out, scores = _scores(res)
    assert list(scores["models"]) == ["pipeline", "random-init", "bag-of-subwords"]
    spec = load_spec(DEMO_SHORT)
    for model, tasks in scores["models"].items():
        assert set(tasks) == set(TASKS)
        for name, kind in TASKS.items():
            r = tasks[name]
            task = next(t for t in spec.evaluate.tasks if t.name == name)
            if kind == "classification":
                _check_finetuned(out, model, name, task, r)
                continue
            assert set(r["languages"]) == set(task.languages) - ({"en"} if kind == "tatoeba" else set()) | (
                {"en"} if kind == "probe" else set()), (model, name)
            metric = "accuracy"
            vals = [v[metric] for v in r["languages"].values()]
            assert all(0 <= v <= 100 for v in vals)
            assert r["avg"] == pytest.approx(np.mean(vals))
            layers = {"0"} if model == "bag-of-subwords" else {"0", "1", "2"}
            assert r["layer"] == int(max(layers)), "the tiny model's middle layer: hidden-state index 2 of 0..2"
            if kind == "tatoeba":
                assert set(r["by_layer"]) == layers
                assert r["by_layer"][max(layers)] == pytest.approx(r["avg"]), "the layer used is the one reported"
                for lang, v in r["languages"].items():
                    assert v["n"] > 100 and 0 <= v["accuracy_en_to_xx"] <= 100
                    pred = out / "predictions" / model / name / "tatoeba" / f"test-{lang}.tsv"
                    gold = out / "data" / name / "labels" / f"test-{lang}.tsv"
                    en = (out / "data" / name / f"{lang}-en.en").read_text().splitlines()
                    assert en == sorted(en), "XTREME's layout: the English side is sorted"
                    # the submission file, read back by the XTREME scorer, gives the stage's number
                    assert score_language(pred, gold, "tatoeba", lang)["accuracy"] == pytest.approx(v["accuracy"])
                # beside it, the pairs with the surface a translator copies stripped (what the verdict reads)
                data = out / "data" / name
                for lang, v in r["stripped"]["languages"].items():
                    src, tgt = read_tatoeba(data, lang, data / "labels" / f"test-{lang}.tsv")
                    assert v["n"] == len(stripped_pairs(src, tgt)[0]) and v["n"] + v["dropped"] == r["languages"][lang]["n"]
                    assert r["surface_overlap_by_language"][lang] == pytest.approx(surface_overlap(src, tgt))
                assert set(r["stripped"]["languages"]) == set(r["languages"]) and set(r["stripped"]["by_layer"]) == layers
                assert r["stripped"]["by_layer"][max(layers)] == pytest.approx(r["stripped"]["avg"])
                assert 5 < r["surface_overlap"] < 60, "Django's and allauth's catalogs: placeholders in many messages"
            else:
                assert r["train_examples"] > 100 and len(r["labels"]) >= 4
                assert r["transfer_gap"] == pytest.approx(
                    r["languages"]["en"]["accuracy"] - np.mean([v["accuracy"] for k, v in r["languages"].items()
                                                                if k != "en"]))
    excluded = scores["tasks"]["allauth"]["excluded_seen"]
    assert set(excluded) == set(scores["tasks"]["allauth"]["languages"]) and sum(excluded.values()) > 100
    # the pipeline's random-init baseline has the pipeline's shape and tokenizer but not its weights
    pipe, rand = scores["models"]["pipeline"]["allauth"], scores["models"]["random-init"]["allauth"]
    assert pipe["languages"]["de"]["n"] == rand["languages"]["de"]["n"]
    assert pipe["by_layer"] != rand["by_layer"]
    # the bag of subwords is what a random table approximates: the same ballpark, no model at all
    bag = scores["models"]["bag-of-subwords"]["allauth"]
    assert bag["languages"]["de"]["n"] == pipe["languages"]["de"]["n"] and bag["avg"] > 5
    card = (out / "scorecard.md").read_text()
    for needle in ("## allauth (tatoeba, accuracy)", "| random-init |", "majority class", "Transfer gap",
                   "## django-topics-ft (classification, accuracy)", "mean ± sd over seeds", "not applicable",
                   "Published reference scores", "XLM-E Base (Tatoeba-36)", "The XY-LENT paper's numbers",
                   "## Verdict", "**pipeline**: ", "Surface overlap:", "pairs kept / dropped"):
        assert needle in card, needle
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", card)  # the page links every figure it has, under its task
    assert sorted(linked) == sorted(p.name for p in out.glob("*.png")), linked
    allauth = card.split("## allauth (tatoeba, accuracy)", 1)[1].split("\n## ", 1)[0]
    assert "![by layer](allauth_layers.png)" in allauth and "Published Tatoeba acc@1" in allauth, \
        "Tatoeba's published numbers beside the retrieval rows, not in a table of dashes at the end"
    for png in ("allauth_languages.png", "allauth_layers.png", "django-topics_languages.png", "transfer_gap.png"):
        img = plt_read(out / png)
        assert img.shape[0] > 200 and img.std() > 10, png


def plt_read(path: Path) -> np.ndarray:
    import matplotlib.image as mpimg

    return (mpimg.imread(path)[..., :3] * 255).astype(np.uint8)


def test_demo_evaluate_in_mlflow_one_nested_run_per_model(demo_run):
    from mlflow.tracking import MlflowClient

    res, ws = demo_run
    _, scores = _scores(res)
    client = MlflowClient(f"sqlite:///{ws / 'mlflow.db'}")
    stage_run = client.get_run(res["stages"]["evaluate"]["mlflow_run_id"])
    children = client.search_runs([stage_run.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{stage_run.info.run_id}'")
    by_model = {r.data.tags["xylent.model"]: r for r in children}
    assert set(by_model) == {"pipeline", "random-init", "bag-of-subwords"}
    for model, run in by_model.items():
        m = run.data.metrics
        assert m["eval/allauth/de/accuracy"] == pytest.approx(scores["models"][model]["allauth"]["languages"]["de"][
            "accuracy"])
        assert m["eval/django-topics/avg"] == pytest.approx(scores["models"][model]["django-topics"]["avg"])
        assert "eval/django-topics/transfer_gap" in m and "eval/allauth/layer_0/avg" in m
        assert run.info.status == "FINISHED" and run.data.params["model"] == model
    assert stage_run.data.metrics["eval/allauth/avg"] == pytest.approx(scores["models"]["pipeline"]["allauth"]["avg"])
    assert stage_run.data.metrics["vs/random-init/eval/allauth/avg"] == pytest.approx(
        scores["models"]["random-init"]["allauth"]["avg"]), "the peers after the encoder's own sections"
    # the registered encoder carries its headline evaluation and a link to its logged model
    pre = json.loads((Path(res["stages"]["pretrain"]["output_dir"]) / "_manifest.json").read_text())
    version = client.get_model_version(pre["registered_model"], str(pre["registered_version"]))
    r, peers = scores["models"]["pipeline"]["allauth"], scores["models"]
    assert version.tags["eval.allauth"] == (f"{r['avg']:.1f} (random-init {peers['random-init']['allauth']['avg']:.1f}"
                                            f", bag-of-subwords {peers['bag-of-subwords']['allauth']['avg']:.1f})")
    assert "majority class" in version.tags["eval.django-topics"] and version.tags["eval.verdict"]
    assert version.tags["eval.output"] == Path(res["stages"]["evaluate"]["output_dir"]).name
    logged = client.search_logged_models([stage_run.info.experiment_id])
    assert version.tags["logged_model_id"] in {m.model_id for m in logged}
    assert f"/models/{version.tags['logged_model_id']})" in version.description


def _arrow_rows(path: Path, column: str) -> list[list[int]]:
    return ipc.open_file(pa.memory_map(str(path))).read_all().column(column).to_pylist()


def test_demo_holdout_never_reaches_the_shards(demo_run):
    res, ws = demo_run
    spec = load_spec(DEMO_SHORT)
    source = spec.sources[0]
    shards = Path(res["stages"]["shards"]["output_dir"])
    index = json.loads((shards / "index.json").read_text())
    sp = spm.SentencePieceProcessor(model_file=str(ws / index["tokenizer"]["path"]))
    eos = index["specials"]["eos"]
    seen: dict[str, set[str]] = {}
    for lang, entry in index["mrtd"].items():
        # documents run across sequence boundaries: join the sequences' bodies, then split at </s>
        stream = np.concatenate([np.array(row[1:-1]) for sh in entry["shards"]
                                 for row in _arrow_rows(shards / sh["path"], "input_ids")])
        for doc in np.split(stream, np.flatnonzero(stream == eos)):
            seen.setdefault(lang, set()).add(sp.decode(doc[doc != eos].tolist()))
    for pair, entry in index["trtd"].items():
        a, b = pair.split("-")
        for sh in entry["shards"]:
            for col, lang in (("src_ids", a), ("tgt_ids", b)):
                seen.setdefault(lang, set()).update(sp.decode(r) for r in _arrow_rows(shards / sh["path"], col))

    def norm(t: str) -> str:  # what decoding a text's ids gives back
        return sp.normalize(t).replace("\u2581", " ").strip()

    held = holdout_messages(Path(res["stages"]["download"]["output_dir"]), source.name,
                            source.holdout.model_dump(), source.plurals, spec.languages)
    total = 0
    for lang, rows in held.items():
        texts = {norm(text) for _, _, text, _ in rows}
        total += len(texts)
        leaked = texts & seen[lang]
        assert not leaked, f"{lang}: reserved messages in the shards: {sorted(leaked)[:5]}"
    assert total > 20 * 150, "a quarter of ~900 messages in 20 languages is reserved"
    # the other package's pairs (exclude_seen) share no sentence with the shards either
    allauth = Path(res["stages"]["evaluate"]["output_dir"]) / "data" / "allauth"
    for path in allauth.glob("*-en.*"):
        lang = path.suffix[1:]
        texts = {norm(t) for t in path.read_text().splitlines()}
        assert len(texts) > 200 and not texts & seen[lang], path.name
    # and the check can see a message when it is there: the English messages not reserved are in the shards
    from xylent.tasks.download.contract import read_records
    from xylent.tasks.prepare.gettext import read_catalog
    from xylent.tasks.prepare.holdout import is_reserved

    download = Path(res["stages"]["download"]["output_dir"])
    english = set()
    for rec in read_records(download):
        english.update(read_catalog(download / rec["source"] / rec["filename"], rec["catalog"], "singular")[1].values())
    kept = {norm(t) for t in english if not is_reserved(t, source.holdout.model_dump())}
    assert len(kept) > 500 and len(kept & seen["en"]) > 0.9 * len(kept)


def _tiny_hf_encoder(path: Path, texts: list[str]) -> Path:
    """A randomly initialised BERT with a WordPiece tokenizer built from the texts' characters."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    chars = sorted({c for t in texts for c in t if not c.isspace()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars)]
    path.mkdir(parents=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tok = BertTokenizerFast(vocab_file=str(path / "vocab.txt"), do_lower_case=False, tokenize_chinese_chars=True)
    tok.save_pretrained(str(path))
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=256)
    BertModel(cfg).save_pretrained(str(path))
    return path


def test_a_local_hugging_face_encoder_is_evaluated_side_by_side(demo_run, run_cli, tmp_path):
    from xylent.tasks.evaluate.data import package_pairs

    res, ws = demo_run
    pairs = package_pairs("allauth", ["de", "ja"])
    hf = _tiny_hf_encoder(tmp_path / "tiny-bert", [t for xx, en in pairs.values() for t in xx + en])
    models = [{"name": "tiny-bert", "path": str(hf), "kind": "hf"}, "random-init"]
    tasks = [{"name": "allauth", "kind": "tatoeba", "format": "gettext", "package": "allauth",
              "languages": ["de", "ja"]}]
    rc, out, err = run_cli("run", "evaluate", "--spec", DEMO_SHORT, "--workspace", ws, "--json",
                           "--set", f"evaluate.models={json.dumps(models)}",
                           "--set", f"evaluate.tasks={json.dumps(tasks)}")
    assert rc == 0, err
    got = json.loads(out)
    assert got["stages"]["pretrain"]["cached"], "only evaluate ran again"
    scores = json.loads((Path(got["stages"]["evaluate"]["output_dir"]) / "scores.json").read_text())
    bert = scores["models"]["tiny-bert"]["allauth"]
    # XTREME's layer round(3 * 7 / 12) = 2 of the 3 blocks' outputs (the embeddings sliced off): index 3
    assert bert["layer"] == 3 and set(bert["by_layer"]) == {"0", "1", "2", "3"}
    assert bert["languages"]["de"]["n"] == len(pairs["de"][0])
    assert 0 <= bert["languages"]["de"]["accuracy"] <= 100
    # the same model through transformers directly, sliced as XTREME does: mean-pooled, cosine, xx -> en acc@1
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(str(hf)), AutoModel.from_pretrained(str(hf)).eval()

    def embed(texts):
        enc = tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
        with torch.no_grad():
            h = xtreme_layer_states(model(**enc, output_hidden_states=True).hidden_states, 3, 2)
        m = enc["attention_mask"].unsqueeze(-1).float()
        v = ((h * m).sum(1) / m.sum(1)).numpy()
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    xx, en = pairs["de"]
    # the stage's wrapper (length-sorted batches) gives the vectors of a plain forward pass
    from xylent.tasks.evaluate.encoders import HuggingFaceEncoder

    ours = np.concatenate([b[3] for b in HuggingFaceEncoder("tiny-bert", hf).embed_batches(
        xx, [3], batch_size=64, max_length=128)])
    ours /= np.linalg.norm(ours, axis=1, keepdims=True)
    assert np.abs(ours - embed(xx)).max() < 1e-4
    # a random tiny BERT puts every sentence in a narrow cone (mean cosine ~0.96): rounding differences of
    # other batch shapes flip a few near-tied neighbours, so the accuracies agree to a few items, not exactly
    acc = 100 * np.mean(np.argmax(embed(xx) @ embed(en).T, 1) == np.arange(len(xx)))
    assert bert["languages"]["de"]["accuracy"] == pytest.approx(acc, abs=5 * 100 / len(xx))


def _tatoeba_archive(langs=("de", "fr"), n=30) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for lang in langs:
            iso3 = {"de": "deu", "fr": "fra"}[lang]
            for side, fmt in ((iso3, "{lang} sentence {i}"), ("eng", "english sentence {i}")):
                data = "".join(fmt.format(lang=lang, i=i) + "\n" for i in range(n)).encode()
                info = tarfile.TarInfo(f"tatoeba/tatoeba.{iso3}-eng.{side}")  # LASER's raw layout
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_task_from_a_url_is_fetched_with_its_checksum(demo_run, run_cli, http_corpus, tmp_path):
    import hashlib

    _, ws = demo_run
    data = _tatoeba_archive()
    http_corpus.files["/tatoeba.tar.gz"] = data
    task = {"name": "tatoeba-url", "kind": "tatoeba", "path": f"{http_corpus.base}/tatoeba.tar.gz",
            "sha256": hashlib.sha256(data).hexdigest(), "languages": ["de", "fr"]}
    args = ("run", "evaluate", "--spec", DEMO_SHORT, "--workspace", ws, "--json", "--set", "evaluate.models=[random-init]")
    rc, out, err = run_cli(*args, "--set", f"evaluate.tasks={json.dumps([task])}")
    assert rc == 0, err
    stage = Path(json.loads(out)["stages"]["evaluate"]["output_dir"])
    scores = json.loads((stage / "scores.json").read_text())
    fr = scores["models"]["random-init"]["tatoeba-url"]["languages"]["fr"]
    assert fr["n"] == 30
    # LASER's raw files are line-aligned; XTREME's gold indexes the sorted English file, so do the predictions
    english = [f"english sentence {i}" for i in range(30)]
    rank = {i: r for r, i in enumerate(sorted(range(30), key=lambda i: english[i]))}
    gold = tmp_path / "gold-fr.tsv"
    gold.write_text("".join(f"{rank[i]}\n" for i in range(30)))
    pred = stage / "predictions" / "random-init" / "tatoeba-url" / "tatoeba" / "test-fr.tsv"
    assert score_language(pred, gold, "tatoeba", "fr")["accuracy"] == pytest.approx(fr["accuracy"])
    bad = {**task, "name": "tatoeba-bad", "sha256": "0" * 64}
    rc, out, err = run_cli(*args, "--set", f"evaluate.tasks={json.dumps([bad])}")
    assert rc == 2 and "sha256" in err.lower() and "tatoeba.tar.gz" in err, err


@pytest.mark.parametrize("task,message", [
    ({"name": "t", "kind": "tatoeba", "format": "bucc2018", "path": "x", "languages": ["de"]}, "does not fit kind"),
    ({"name": "t", "kind": "tatoeba", "path": "x", "languages": ["xx"]}, "xx"),
    ({"name": "t", "kind": "tatoeba", "path": "x", "languages": ["it"]}, "not in the spec's 'languages'"),
    ({"name": "t", "kind": "probe", "format": "holdout", "source": "nope", "languages": ["en"]}, "no gettext source"),
    ({"name": "t", "kind": "tatoeba", "format": "gettext", "languages": ["de"]}, "needs 'package'"),
    ({"name": "t", "kind": "xnli", "path": "x", "languages": ["de"]}, "kind"),
])
def test_bad_task_specs_exit_2_naming_the_field(run_cli, tmp_path, task, message):
    rc, _, err = run_cli("run", "evaluate", "--spec", DEMO, "--workspace", tmp_path / "ws",
                         "--set", f"evaluate.tasks={json.dumps([task])}")
    assert rc == 2 and message in err and "evaluate" in err, err


def test_malformed_task_files_exit_2_naming_file_and_line(demo_run, run_cli, tmp_path):
    _, ws = demo_run
    bad = tmp_path / "bad-tatoeba"
    bad.mkdir()
    (bad / "de-en.de").write_text("eins\nzwei\ndrei\n")
    (bad / "de-en.en").write_text("one\ntwo\n")
    task = {"name": "broken", "kind": "tatoeba", "path": str(bad), "languages": ["de"]}
    rc, _, err = run_cli("run", "evaluate", "--spec", DEMO_SHORT, "--workspace", ws, "--set", "evaluate.models=[random-init]",
                         "--set", f"evaluate.tasks={json.dumps([task])}")
    assert rc == 2 and "de-en.de" in err and "3" in err and "2" in err, err
    probe = tmp_path / "bad-probe"
    probe.mkdir()
    (probe / "train-en.tsv").write_text("a\tone\nb\ttwo\n")
    (probe / "test-en.tsv").write_text("a\tone\nb two\n")
    task = {"name": "broken-probe", "kind": "probe", "format": "tsv", "path": str(probe), "languages": ["en"]}
    rc, _, err = run_cli("run", "evaluate", "--spec", DEMO_SHORT, "--workspace", ws, "--set", "evaluate.models=[random-init]",
                         "--set", f"evaluate.tasks={json.dumps([task])}")
    assert rc == 2 and "test-en.tsv:2" in err, err


def _check_finetuned(out: Path, model: str, name: str, task, r: dict) -> None:
    if model == "bag-of-subwords":
        assert r["avg"] is None and r["not_applicable"] and r["languages"] == {}
        return
    assert set(r["languages"]) == set(task.languages) and r["seeds"] == task.finetune.seeds
    per_seed = {s: [] for s in r["per_seed"]}
    from collections import Counter

    from xylent.tasks.evaluate.finetune.task import TaskData

    # the trivial baseline: always answer the commonest label of what was trained on (train-en minus the dev share)
    commonest = Counter(e.label for e in TaskData(task, out / "data" / name).train).most_common(1)[0][0]
    for lang, v in r["languages"].items():
        gold = (out / "labels" / name / f"test-{lang}.tsv").read_text().splitlines()
        assert v["n"] == len(gold) > 50
        assert v["majority_baseline"] == pytest.approx(100 * gold.count(commonest) / len(gold))
        for seed in per_seed:  # every seed's submission, read back by the XTREME scorer
            pred = out / "predictions" / model / name / f"seed-{seed}" / name / f"test-{lang}.tsv"
            per_seed[seed].append(score_language(pred, out / "labels" / name / f"test-{lang}.tsv", name, lang,
                                                 "lines")["accuracy"])
    accs = np.array(list(per_seed.values()))  # seeds x languages
    assert [v["accuracy"] for v in r["languages"].values()] == pytest.approx(accs.mean(0).tolist())
    assert [v["accuracy_sd"] for v in r["languages"].values()] == pytest.approx(accs.std(0, ddof=1).tolist())
    assert r["avg"] == pytest.approx(accs.mean()) and r["avg_sd"] == pytest.approx(accs.mean(1).std(ddof=1))
    for seed in r["per_seed"].values():
        assert 1 <= seed["selected_epoch"] <= task.finetune.epochs and len(seed["history"]) == task.finetune.epochs


def test_demo_spec_evaluates_only_held_out_text():
    spec = yaml.safe_load(DEMO.read_text())
    assert spec["sources"][0]["holdout"]["fraction"] > 0
    kinds = {t["name"]: (t["kind"], t["format"]) for t in spec["evaluate"]["tasks"]}
    assert kinds == {"django-topics": ("probe", "holdout"), "django-topics-ft": ("classification", "holdout"),
                     "django-holdout": ("tatoeba", "holdout"), "allauth": ("tatoeba", "gettext")}
    assert all(s["package"] != "allauth" for s in spec["sources"]), "allauth never reaches pretraining"


def _bucc_split(root: Path, split: str, rng: np.random.Generator, n_pairs: int, n_noise: int) -> set:
    """Planted pairs share their text on both sides (any encoder embeds them identically);
    the distractors are unrelated sentences on each side."""
    words = [f"w{i}" for i in range(500)]
    def sentence():
        return " ".join(rng.choice(words, size=rng.integers(4, 9)))
    de, en, gold = [], [], set()
    for i in range(n_pairs):
        text = sentence()
        de.append((f"de-{split}-{i:05d}", text))
        en.append((f"en-{split}-{i:05d}", text))
        gold.add((de[-1][0], en[-1][0]))
    de += [(f"de-{split}-x{i:04d}", sentence()) for i in range(n_noise)]
    en += [(f"en-{split}-x{i:04d}", sentence()) for i in range(n_noise)]
    rng.shuffle(de)
    rng.shuffle(en)
    (root / f"de-en.{split}.de").write_text("".join(f"{i}\t{t}\n" for i, t in de))
    (root / f"de-en.{split}.en").write_text("".join(f"{i}\t{t}\n" for i, t in en))
    (root / f"de-en.{split}.gold").write_text("".join(f"{a}\t{b}\n" for a, b in sorted(gold)))
    return gold


def test_bucc_mining_runs_in_the_stage_and_writes_a_scorable_submission(demo_run, run_cli, tmp_path):
    _, ws = demo_run
    root = tmp_path / "bucc"
    root.mkdir()
    rng = np.random.default_rng(0)
    _bucc_split(root, "dev", rng, 60, 60)
    gold = _bucc_split(root, "test", rng, 80, 80)
    task = {"name": "bucc-planted", "kind": "bucc2018", "path": str(root), "languages": ["de"]}
    rc, out, err = run_cli("run", "evaluate", "--spec", DEMO_SHORT, "--workspace", ws, "--json",
                           "--set", "evaluate.models=[random-init]", "--set", f"evaluate.tasks={json.dumps([task])}")
    assert rc == 0, err
    stage = Path(json.loads(out)["stages"]["evaluate"]["output_dir"])
    r = json.loads((stage / "scores.json").read_text())["models"]["random-init"]["bucc-planted"]
    assert r["kind"] == "bucc" and r["languages"]["de"]["f1"] > 90, r
    pred = stage / "predictions" / "random-init" / "bucc-planted" / "bucc2018" / "test-de.tsv"
    gold_file = tmp_path / "gold-de.tsv"
    gold_file.write_text("".join(f"{a}\t{b}\n" for a, b in sorted(gold)))
    assert score_language(pred, gold_file, "bucc2018", "de")["f1"] == pytest.approx(r["languages"]["de"]["f1"])
