"""Fine-tuning: each head learns, tagging aligns to first sub-tokens and back,
zero-shot selects on the train language's dev set only, kill -9 resumes the
same run, malformed files name file and line."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from finetune_fixtures import (
    pair_examples,
    qa_examples,
    tag_examples,
    tiny_encoder,
    tiny_tokenizer,
    write_conll,
    write_squad,
    write_xnli,
)
from xylent.models.heads import IGNORE
from xylent.tasks.evaluate.scoring import score_language
from xylent.tasks.evaluate.submission import submission_file
from xylent.tasks.evaluate.finetune.data import Example, read_classification, read_squad, read_tagging
from xylent.tasks.evaluate.finetune.encoders import factory
from xylent.tasks.evaluate.finetune.features import tagging_features, tagging_predictions
from xylent.tasks.evaluate.finetune.run import finetune_task
from xylent.tasks.evaluate.finetune.task import TaskData
from xylent.tasks.evaluate.finetune.tokens import SentencePieceTokenizer
from xylent.errors import XylentError
from xylent.spec.evaluate import EvalTask

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sp():
    return tiny_tokenizer()


def task_dir(root: Path, kind: str, n_train: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("dev", 60), ("test", 80)):
        for lang in (("en",) if split != "test" else ("en", "de")):
            if kind == "classification":
                write_xnli(root / f"{split}-{lang}.tsv", pair_examples(rng, n))
            elif kind == "tagging":
                write_conll(root / f"{split}-{lang}.tsv", tag_examples(rng, n), lang)
            else:
                write_squad(root / f"{split}-{lang}.json", qa_examples(rng, n, f"{split}{lang}"))
    return root


SETUP = {  # kind -> (xtreme task, train examples, hyperparameters, score it must reach on English test)
    "classification": ("xnli", 400, {"lr": 1e-3, "epochs": 3, "batch_size": 16, "max_length": 64}, 90),
    "tagging": ("panx", 400, {"lr": 1e-3, "epochs": 8, "batch_size": 16, "max_length": 64}, 85),
    "qa": ("xquad", 400, {"lr": 1e-3, "epochs": 6, "batch_size": 16, "max_length": 48, "doc_stride": 24,
                          "max_query_length": 8, "warmup": 0.1}, 80),
}


def make_task(kind: str, path: Path, **finetune) -> EvalTask:
    xtreme, _, hp, _ = SETUP[kind]
    return EvalTask(name=f"t-{kind}", kind=kind, xtreme_task=xtreme, path=str(path), languages=["en", "de"],
                    finetune={**hp, **finetune})


@pytest.mark.parametrize("kind", list(SETUP))
def test_each_head_learns_a_separable_task_and_its_predictions_score_as_recorded(sp, tmp_path, kind):
    xtreme, n_train, _, must_reach = SETUP[kind]
    data = TaskData(make_task(kind, task_dir(tmp_path / "data", kind, n_train)), tmp_path / "data")
    result = finetune_task(data, factory(lambda: tiny_encoder(sp), kind), tmp_path / "ck", tmp_path / "preds",
                           tmp_path / "labels")
    metric = {"classification": "accuracy", "qa": "f1", "tagging": "f1"}[kind]
    en = result["languages"]["en"]
    assert en[metric] >= must_reach, result
    if kind != "qa":  # the commonest label scores far lower
        assert en[metric] > en["majority_baseline"] + 30
    else:
        assert en["exact_match"] >= must_reach - 10
    fmt = {"classification": "lines", "qa": "qa", "tagging": "tags"}[kind]
    for lang in ("en", "de"):
        pred = submission_file(tmp_path / "preds" / "seed-1", xtreme, lang, fmt)
        gold = submission_file(tmp_path / "labels", xtreme, lang, fmt)
        assert score_language(pred, gold, xtreme, lang)[metric] == pytest.approx(result["languages"][lang][metric])
    history = result["per_seed"]["1"]["history"]
    assert history[-1]["loss"] < history[0]["loss"]


def test_tagging_labels_sit_on_first_sub_tokens_and_come_back_per_word(sp):
    tok = SentencePieceTokenizer(sp, {"bos": 1, "eos": 2, "pad": 3, "unk": 0})
    words = ["Straße", "paris", "東京", "the", "ภาษา", "cat"] * 4
    tags = ["O", "B-LOC", "B-LOC", "O", "B-MISC", "O"] * 4
    pieces = tok.word_ids(words)
    assert any(len(p) > 1 for p in pieces), "the test needs words of several pieces"
    labels = {"B-LOC": 0, "B-MISC": 1, "O": 2}
    ex = Example(tokens=words, tags=tags)
    feats = tagging_features([ex], tok, labels, max_length=16)  # too short for one window: chunks of whole words
    assert len(feats) > 1 and all(len(f.ids) <= 16 for f in feats)
    covered = []
    for f in feats:
        marked = [p for p, t in enumerate(f.target["labels"]) if t != IGNORE]
        assert marked == f.first_tokens  # one label per word, on its first piece; specials and later pieces ignored
        for k, p in enumerate(f.first_tokens):
            w = f.first_word + k
            covered.append(w)
            assert f.ids[p] == pieces[w][0] and f.target["labels"][p] == labels[tags[w]]
    assert covered == list(range(len(words))), "every word once, in order"
    # logits that put each word's tag on its first piece read back as the tags, word for word
    names = sorted(labels, key=labels.get)
    logits = []
    for f in feats:
        row = np.zeros((len(f.ids), 3))
        for k, p in enumerate(f.first_tokens):
            row[p, labels[tags[f.first_word + k]]] = 5.0
        logits.append(row)
    assert tagging_predictions([ex], feats, logits, names) == [tags]


def test_zero_shot_selects_on_the_train_language_dev_only(sp, tmp_path):
    root = task_dir(tmp_path / "data", "classification", 200)
    (root / "dev-de.tsv").write_bytes(b"\xff not even text\n")  # never read by zero-shot
    (root / "translate-train-de.tsv").write_text("broken line\n")  # nor this
    data = TaskData(make_task("classification", root, epochs=4, seeds=[1, 2]), root)
    result = finetune_task(data, factory(lambda: tiny_encoder(sp), "classification"), tmp_path / "ck",
                           tmp_path / "preds", tmp_path / "labels")
    for seed in result["per_seed"].values():
        devs = [h["dev"] for h in seed["history"]]
        assert seed["selected_epoch"] == 1 + int(np.argmax(devs)) and seed["dev"] == max(devs)
    assert set(result["per_seed"]) == {"1", "2"} and "accuracy_sd" in result["languages"]["de"]
    # translate-train reads every language's translated training file: the broken one now stops it
    with pytest.raises(XylentError, match=r"translate-train-de\.tsv:1"):
        TaskData(make_task("classification", root, protocol="translate-train"), root)


def test_a_grid_keeps_the_point_with_the_best_mean_dev_score_and_submits_its_predictions(sp, tmp_path):
    """finetune.lr / epochs as lists (XY-LENT's Table 15 grids): every point on every seed, the best
    mean dev score over the seeds kept; the test scores of each point are reported, its predictions not."""
    root = task_dir(tmp_path / "data", "classification", 400)
    data = TaskData(make_task("classification", root, lr=[1e-6, 1e-3], seeds=[1, 2]), root)  # 3 epochs
    result = finetune_task(data, factory(lambda: tiny_encoder(sp), "classification"), tmp_path / "ck",
                           tmp_path / "preds", tmp_path / "labels")
    points = result["grid"]["points"]
    assert list(points) == ["lr1e-06-epochs3", "lr0.001-epochs3"] and result["grid"]["kept"] == "lr0.001-epochs3"
    assert points["lr0.001-epochs3"]["dev"] > points["lr1e-06-epochs3"]["dev"] + 20, points
    kept = points["lr0.001-epochs3"]
    assert kept["dev"] == pytest.approx(np.mean([v["dev"] for v in result["per_seed"].values()]))
    assert kept["avg"] == pytest.approx(result["avg"]) and result["hyperparameters"]["lr"] == 1e-3
    for seed in ("1", "2"):  # the submission is the kept point's
        ours = submission_file(tmp_path / "preds" / f"seed-{seed}", "xnli", "de", "lines")
        assert ours.read_bytes() == submission_file(tmp_path / "ck" / "lr0.001-epochs3" / "predictions" /
                                                    f"seed-{seed}", "xnli", "de", "lines").read_bytes()


def test_the_xy_lent_defaults_are_table_15_and_xnli_warms_up_for_12500_steps_at_most_the_run():
    """defaults: xy-lent resolves each XTREME task to the paper's Table 15 (the shared TSV), grids included."""
    import csv

    from xylent.tasks.evaluate.finetune.train import loop_config

    rows = {r["task"]: r for r in csv.DictReader(open(ROOT.parent / "shared" / "data" / "xylent_paper" /
                                                      "finetune_hparams.tsv"), delimiter="\t")}
    assert set(rows) == {"xquad", "mlqa", "tydiqa", "xnli", "pawsx"}
    for name, row in rows.items():
        kind = "classification" if name in ("xnli", "pawsx") else "qa"
        ft = EvalTask(name="t", kind=kind, xtreme_task=name, path="p", languages=["en"],
                      finetune={"defaults": "xy-lent"}).finetune
        lrs = [float(x) for x in row["learning_rate"].split(",")]
        epochs = [int(x) for x in row["epochs"].split(",")]
        assert (ft.lr if isinstance(ft.lr, list) else [ft.lr]) == lrs, name
        assert (ft.epochs if isinstance(ft.epochs, list) else [ft.epochs]) == epochs, name
        assert (ft.batch_size, ft.weight_decay) == (int(row["batch_size"]), float(row["weight_decay"])), name
        warmup = (ft.warmup_steps, None) if row["warmup"].endswith("steps") else (None, ft.warmup)
        assert warmup == ((12500, None) if name == "xnli" else (None, 0.1)), name
    pinned = EvalTask(name="t", kind="classification", xtreme_task="xnli", path="p", languages=["en"],
                      finetune={"defaults": "xy-lent", "lr": 1e-5, "warmup": 0.0}).finetune
    assert (pinned.lr, pinned.warmup, pinned.warmup_steps) == (1e-5, 0.0, None), "a pinned warmup wins, either form"
    assert loop_config(pinned.model_copy(update={"warmup": None, "warmup_steps": 12500}), 1).rising(800) == 800
    assert loop_config(pinned.model_copy(update={"warmup": 0.1}), 1).rising(800) == 80
    for bad, what in (({"lr": []}, "an empty grid"), ({"epochs": [2, 2]}, "repeats a value"),
                      ({"lr": [1e-5, -1.0]}, "must be > 0"), ({"warmup": 0.1, "warmup_steps": 10}, "not both")):
        with pytest.raises(ValueError, match=what):
            EvalTask(name="t", kind="classification", xtreme_task="xnli", path="p", languages=["en"], finetune=bad)


def test_without_a_dev_file_a_fixed_share_of_train_is_held_out(tmp_path):
    root = task_dir(tmp_path / "data", "classification", 200)
    (root / "dev-en.tsv").unlink()
    a = TaskData(make_task("classification", root, dev_fraction=0.2), root)
    b = TaskData(make_task("classification", root, dev_fraction=0.2), root)
    assert 20 <= len(a.dev) <= 60 and len(a.dev) + len(a.train) == 200
    assert [e.texts for e in a.dev] == [e.texts for e in b.dev]
    assert not {e.texts for e in a.dev} & {e.texts for e in a.train}


RESUME_SCRIPT = """
import sys, json
from pathlib import Path
sys.path[:0] = [{tests!r}, {root!r}]
from finetune_fixtures import tiny_encoder, tiny_tokenizer
from xylent.tasks.evaluate.finetune.encoders import factory
from xylent.tasks.evaluate.finetune.run import finetune_task
from xylent.tasks.evaluate.finetune.task import TaskData
from xylent.spec.evaluate import EvalTask
sp = tiny_tokenizer()
out = Path(sys.argv[1])
task = EvalTask(name="t", kind="classification", xtreme_task="xnli", path={data!r}, languages=["en", "de"],
                finetune=dict(lr=1e-3, epochs=3, batch_size=8, max_length=64, checkpoint_every=5))
res = finetune_task(TaskData(task, Path({data!r})), factory(lambda: tiny_encoder(sp), "classification"),
                    out / "ck", out / "preds", out / "labels", lambda m: print(m, flush=True))
(out / "result.json").write_text(json.dumps(res))
"""


def test_kill_9_during_fine_tuning_then_rerun_resumes_the_same_run(tmp_path):
    data = task_dir(tmp_path / "data", "classification", 240)
    script = tmp_path / "ft.py"
    script.write_text(RESUME_SCRIPT.format(tests=str(ROOT / "tests"), root=str(ROOT), data=str(data)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(out: Path) -> dict:
        subprocess.run([sys.executable, str(script), str(out)], check=True, env=env, cwd=ROOT, timeout=300)
        return json.loads((out / "result.json").read_text())

    whole = run(tmp_path / "whole")
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, str(script), str(killed)], env=env, cwd=ROOT)
    state = killed / "ck" / "seed-1" / "state.pt"
    deadline = time.time() + 240
    while not state.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "finished before a checkpoint was seen: make the run longer"
    time.sleep(0.5)  # into the next stretch of steps, past the checkpoint
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "result.json").exists()
    resumed = run(killed)
    assert resumed["per_seed"]["1"]["resumed_from"] > 0
    assert resumed["languages"] == whole["languages"]
    assert resumed["per_seed"]["1"]["history"] == whole["per_seed"]["1"]["history"]
    for lang in ("en", "de"):
        a = submission_file(tmp_path / "whole" / "preds" / "seed-1", "xnli", lang)
        assert a.read_bytes() == submission_file(killed / "preds" / "seed-1", "xnli", lang).read_bytes()


def test_readers_name_file_and_line_of_malformed_input(tmp_path):
    bad = tmp_path / "train-en.tsv"
    bad.write_text("a premise\ta hypothesis\tentailment\nonly two\tcolumns\n")
    with pytest.raises(XylentError, match=r"train-en\.tsv:2"):
        read_classification(bad, "xnli")
    bad.write_bytes(b"x\ty\tz\n\xff\xfe\tq\tr\n")
    with pytest.raises(XylentError, match=r"(?s)UTF-8.*train-en\.tsv:2"):
        read_classification(bad, "xnli")
    tags = tmp_path / "test-de.tsv"
    tags.write_text("de:Berlin\tB-LOC\nde:liegt\n")
    with pytest.raises(XylentError, match=r"test-de\.tsv:2"):
        read_tagging(tags, "de")
    squad = tmp_path / "test-de.json"
    squad.write_text('{"data": [{"paragraphs": [{"context": "x", "qas": [{"id": "1"}]}]}]}')
    with pytest.raises(XylentError, match=r"SQuAD v1\.1.*\n.*test-de\.json"):
        read_squad(squad)
    squad.write_text('{"data": [')
    with pytest.raises(XylentError, match=r"not valid JSON"):
        read_squad(squad)


def test_original_headered_xnli_and_pawsx_files_are_read_by_column_name(tmp_path):
    paws = tmp_path / "dev-en.tsv"
    paws.write_text("id\tsentence1\tsentence2\tlabel\n1\tA b.\tB a.\t1\n2\tC d.\tD c.\t0\n")
    got = read_classification(paws, "pawsx")
    assert [(e.texts, e.label) for e in got] == [(("A b.", "B a."), "1"), (("C d.", "D c."), "0")]
    xnli = tmp_path / "test-de.tsv"
    xnli.write_text("language\tgold_label\tsentence1_binary_parse\tsentence1\tsentence2\tpremise\thypothesis\n"
                    "de\tneutral\t(x)\tbin\tbin2\tDer Hund.\tEin Tier.\n")
    got = read_classification(xnli, "xnli")
    assert got[0].texts == ("bin", "bin2") and got[0].label == "neutral"  # sentence1/2 win over premise/hypothesis
    conll = tmp_path / "train-en.tsv"
    conll.write_text("-DOCSTART-\tO\n\nen:Paris\tB-LOC\nen:is\tO\n\nRome B-LOC\n")
    assert [(e.tokens, e.tags) for e in read_tagging(conll, "en")] == [(["Paris", "is"], ["B-LOC", "O"]),
                                                                       (["Rome"], ["B-LOC"])]


def test_a_hugging_face_tokenizer_joins_segments_as_its_own_post_processor_does(tmp_path):
    from transformers import BertTokenizerFast

    from xylent.tasks.evaluate.finetune.tokens import HuggingFaceTokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefgh", *(f"##{c}" for c in "abcdefgh")]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    hf = BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt"))
    tok = HuggingFaceTokenizer(hf)
    a, spans = tok.encode("a  b c")
    assert [(s, e) for s, e in spans] == [(0, 1), (3, 4), (5, 6)]  # character offsets per piece
    b = tok.ids("f g")
    ids, seg = tok.build(a, b)
    assert ids == hf("a  b c", "f g")["input_ids"]  # what the tokenizer itself gives for the pair
    assert seg == [-1, *[0] * len(a), -1, *[1] * len(b), -1]
    assert tok.build(a)[0] == hf("a  b c")["input_ids"]


def test_a_task_in_all_of_xtremes_languages_is_also_scored_by_score_submission(sp, tmp_path):
    from xylent.tasks.evaluate.scoring import XTREME_TASK_LANGS

    langs = XTREME_TASK_LANGS["pawsx"]
    rng = random.Random(3)
    root = tmp_path / "data"
    root.mkdir()
    write_xnli(root / "train-en.tsv", pair_examples(rng, 64))
    write_xnli(root / "dev-en.tsv", pair_examples(rng, 16))
    for lang in langs:
        write_xnli(root / f"test-{lang}.tsv", pair_examples(rng, 12))
    task = EvalTask(name="paws", kind="classification", xtreme_task="pawsx", path=str(root), languages=langs,
                    finetune={"lr": 1e-3, "epochs": 1, "batch_size": 16, "max_length": 48})
    result = finetune_task(TaskData(task, root), factory(lambda: tiny_encoder(sp), "classification"),
                           tmp_path / "ck", tmp_path / "preds", tmp_path / "labels")
    # the leaderboard's avg_metric over its 7 languages, from the same submission files
    assert result["xtreme_avg_metric"] == pytest.approx(result["avg"])


def test_on_several_ranks_a_last_batch_too_small_to_share_is_left_out():
    from xylent.tasks.evaluate.finetune.train import LoopConfig, optimiser_steps

    cfg = LoopConfig(lr=1e-3, epochs=3, batch_size=16, warmup=0.0, weight_decay=0.0, selection="dev",
                     checkpoint_every=10, seed=1)
    assert optimiser_steps(33, cfg) == (3, 9)  # one process: the last batch of 1 is a step
    assert optimiser_steps(33, cfg, world=2) == (2, 6)  # 2 ranks: 1 example can't feed both
    assert optimiser_steps(34, cfg, world=2) == (3, 9)
    assert optimiser_steps(32, cfg, world=4) == (2, 6)


def test_a_qa_test_question_without_an_answer_is_refused_before_training(tmp_path):
    root = task_dir(tmp_path / "data", "qa", 20)
    doc = json.loads((root / "test-de.json").read_text())
    doc["data"][3]["paragraphs"][0]["qas"][0]["answers"] = []  # a SQuAD 2.0 unanswerable question
    (root / "test-de.json").write_text(json.dumps(doc))
    with pytest.raises(XylentError, match=r"(?s)no answer.*test-de\.json"):
        TaskData(make_task("qa", root), root)


def test_translate_train_holds_dev_out_of_the_train_language_only(tmp_path):
    root = task_dir(tmp_path / "data", "classification", 200)
    (root / "dev-en.tsv").unlink()
    write_xnli(root / "translate-train-de.tsv", pair_examples(random.Random(9), 50))
    data = TaskData(make_task("classification", root, protocol="translate-train", dev_fraction=0.2,
                              max_train_examples=120), root)
    english = {e.texts for e in read_classification(root / "train-en.tsv", "xnli")}
    german = {e.texts for e in read_classification(root / "translate-train-de.tsv", "xnli")}
    assert data.dev and all(e.texts in english for e in data.dev)
    assert len([e for e in data.train if e.texts in german]) == 50  # the cap is per file
    assert len([e for e in data.train if e.texts in english]) == 120
