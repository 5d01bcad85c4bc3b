"""Fine-tuned XTREME tasks through the real CLI on the demo's workspace: the
official formats in, the submission layout out, scored by part 1's scorer,
logged to MLflow; a malformed file exits 2 naming it before anything trains."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from finetune_fixtures import pair_examples, qa_examples, tag_examples, write_conll, write_squad, write_xnli
from xylent.tasks.evaluate.scoring import score_language
from xylent.tasks.evaluate.submission import submission_file

from conftest import DEMO_SHORT  # the session demo's spec (tests/data/demo-short.yaml)

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data_specs" / "demo.yaml"
HP = {"lr": 1e-3, "epochs": 1, "batch_size": 16, "max_length": 64}


def xtreme_dirs(root: Path) -> dict[str, Path]:
    rng = random.Random(1)
    dirs = {k: root / k for k in ("xnli", "xquad", "panx")}
    for d in dirs.values():
        d.mkdir(parents=True)
    for split, n in (("train", 120), ("dev", 30), ("test", 40)):
        for lang in (("en",) if split != "test" else ("en", "de", "th")):
            write_xnli(dirs["xnli"] / f"{split}-{lang}.tsv", pair_examples(rng, n))
            write_conll(dirs["panx"] / f"{split}-{lang}.tsv", tag_examples(rng, n), lang)
            write_squad(dirs["xquad"] / f"{split}-{lang}.json", qa_examples(rng, n, f"{split}-{lang}-"))
    return dirs


def test_xtreme_formats_fine_tune_through_the_stage(demo_run, run_cli, tmp_path):
    from mlflow.tracking import MlflowClient

    _, ws = demo_run
    dirs = xtreme_dirs(tmp_path / "tasks")
    tasks = [{"name": "my-xnli", "kind": "classification", "xtreme_task": "xnli", "path": str(dirs["xnli"]),
              "languages": ["en", "de", "th"], "finetune": HP},
             {"name": "my-xquad", "kind": "qa", "xtreme_task": "xquad", "path": str(dirs["xquad"]),
              "languages": ["en", "de", "th"], "finetune": {**HP, "doc_stride": 32, "max_query_length": 8}},
             {"name": "my-panx", "kind": "tagging", "xtreme_task": "panx", "path": str(dirs["panx"]),
              "languages": ["en", "de", "th"], "finetune": HP}]
    rc, out, err = run_cli("run", "evaluate", "--spec", DEMO_SHORT, "--workspace", ws, "--json",
                           "--set", "evaluate.models=[random-init]", "--set", f"evaluate.tasks={json.dumps(tasks)}")
    assert rc == 0, err
    res = json.loads(out)
    stage = Path(res["stages"]["evaluate"]["output_dir"])
    scores = json.loads((stage / "scores.json").read_text())["models"]["random-init"]
    metric = {"xnli": "accuracy", "xquad": "f1", "panx": "f1"}
    for t in tasks:
        r, m = scores[t["name"]], metric[t["xtreme_task"]]
        assert r["kind"] == t["kind"] and r["protocol"] == "zero-shot" and set(r["languages"]) == {"en", "de", "th"}
        assert r["hyperparameters"]["lr"] == 1e-3 and r["hyperparameters"]["warmup"] is not None
        for lang, v in r["languages"].items():
            pred = submission_file(stage / "predictions" / "random-init" / t["name"] / "seed-1", t["xtreme_task"],
                                   lang)
            gold = submission_file(stage / "labels", t["xtreme_task"], lang)
            assert score_language(pred, gold, t["xtreme_task"], lang)[m] == pytest.approx(v[m])
        gap = "exact_match" if t["kind"] == "qa" else m  # XTREME: QA's transfer gap is on exact match
        langs = r["languages"]
        assert r["transfer_gap"] == pytest.approx(langs["en"][gap] - (langs["de"][gap] + langs["th"][gap]) / 2)
    assert "exact_match" in scores["my-xquad"]["languages"]["th"]
    client = MlflowClient(f"sqlite:///{ws / 'mlflow.db'}")
    stage_run = client.get_run(res["stages"]["evaluate"]["mlflow_run_id"])
    child = client.search_runs([stage_run.info.experiment_id], f"tags.mlflow.parentRunId = '{stage_run.info.run_id}'")
    assert child[0].data.metrics["eval/my-xnli/avg"] == pytest.approx(scores["my-xnli"]["avg"])
    card = (stage / "scorecard.md").read_text()
    assert "## my-xquad (qa, f1)" in card and "Exact match (average)" in card


def test_a_malformed_fine_tuning_file_exits_2_naming_it_before_training(demo_run, run_cli, tmp_path):
    _, ws = demo_run
    dirs = xtreme_dirs(tmp_path / "tasks")
    (dirs["xnli"] / "test-de.tsv").write_text("ein Satz\tnoch einer\tentailment\nkaputt\n")
    task = {"name": "bad-xnli", "kind": "classification", "xtreme_task": "xnli", "path": str(dirs["xnli"]),
            "languages": ["en", "de"], "finetune": HP}
    rc, _, err = run_cli("run", "evaluate", "--spec", DEMO_SHORT, "--workspace", ws, "--set", "evaluate.models=[random-init]",
                         "--set", f"evaluate.tasks={json.dumps([task])}")
    assert rc == 2 and "test-de.tsv:2" in err and "Traceback" not in err, err
    assert not list((Path(ws) / "evaluate" / "_checkpoints").glob("*/random-init/bad-xnli")), "nothing trained"


def test_an_exported_hugging_face_dir_is_evaluated_and_fine_tuned_like_the_xylent_model(demo_run, run_cli, tmp_path):
    res, ws = demo_run
    model_dir = Path(res["stages"]["pretrain"]["output_dir"]) / "model"
    rc, out, err = run_cli("export-hf", str(model_dir), str(tmp_path / "hf"))
    assert rc == 0 and (tmp_path / "hf" / "config.json").is_file(), err
    dirs = xtreme_dirs(tmp_path / "tasks")
    models = ["pipeline", {"name": "pipeline-hf", "kind": "hf", "path": str(tmp_path / "hf"),
                           "trust_remote_code": True}]
    tasks = [{"name": "allauth", "kind": "tatoeba", "format": "gettext", "package": "allauth",
              "languages": ["de", "ja", "th"]},
             {"name": "my-xnli", "kind": "classification", "xtreme_task": "xnli", "path": str(dirs["xnli"]),
              "languages": ["en", "de"], "finetune": HP}]
    rc, out, err = run_cli("run", "evaluate", "--spec", DEMO_SHORT, "--workspace", ws, "--json",
                           "--set", f"evaluate.models={json.dumps(models)}",
                           "--set", f"evaluate.tasks={json.dumps(tasks)}")
    assert rc == 0, err
    stage = Path(json.loads(out)["stages"]["evaluate"]["output_dir"])
    scores = json.loads((stage / "scores.json").read_text())["models"]
    # the same weights and ids through transformers: the same hidden states, so the same retrieval scores
    for lang in ("de", "ja", "th"):
        ours, theirs = scores["pipeline"]["allauth"]["languages"][lang], scores["pipeline-hf"]["allauth"]["languages"][
            lang]
        assert theirs["accuracy"] == pytest.approx(ours["accuracy"], abs=0.5) and theirs["n"] == ours["n"]
    assert scores["pipeline-hf"]["allauth"]["by_layer"] == pytest.approx(scores["pipeline"]["allauth"]["by_layer"],
                                                                         abs=0.5)
    ft = scores["pipeline-hf"]["my-xnli"]
    assert set(ft["languages"]) == {"en", "de"} and ft["per_seed"]["1"]["steps"] > 0
