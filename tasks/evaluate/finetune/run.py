"""One encoder on one fine-tuned task: every seed trained, selected on the train
language's dev set, tested on every language; predictions in XTREME's
submission layout, scored by part 1's scorer (:func:`score_language`).

A grid (``finetune.lr`` or ``epochs`` a list, as XY-LENT's Table 15 gives them)
fine-tunes every point on every seed, each in its own checkpoint folder, and
keeps the point with the best mean dev score over the seeds; the test scores
of every point are reported beside it, and only the kept point's predictions
are the submission.

Protocols (XTREME): ``zero-shot`` trains on the train language only;
``translate-train`` also on each language's ``translate-train-<lang>`` file.
Both select on the train language's dev set only: nothing is chosen on the
languages the model is tested on.

A finished seed leaves ``result.json`` in its checkpoint folder, so a rerun
after a kill skips it; an unfinished one resumes from ``state.pt``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from xylent.tasks.evaluate.finetune.task import PRIMARY, Runner, TaskData
from xylent.tasks.evaluate.finetune.train import loop_config, train
from xylent.tasks.evaluate.metrics import accuracy, tag_f1
from xylent.tasks.evaluate.scoring import XTREME_TASK_LANGS, score_language, score_submission
from xylent.tasks.evaluate.submission import submission_file, write_predictions
from xylent.atomic import write_atomic, write_json_atomic
from xylent.errors import XylentError

GAP_METRIC = {"classification": "accuracy", "qa": "exact_match", "tagging": "f1"}  # XTREME: QA's gap on EM
RESULT = "result.json"


def write_gold(data: TaskData, labels_root: Path) -> None:
    """The test labels in the submission layout, for the scorer (QA: the SQuAD file itself)."""
    task = data.task
    folder = task.xtreme_task or task.name
    for lang, examples in data.tests.items():
        if data.kind == "qa":
            dest = submission_file(labels_root, folder, lang, "qa")
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(dest, lambda tmp, src=data.test_files[lang]: shutil.copyfile(src, tmp))
        elif data.kind == "classification":
            write_predictions(labels_root, folder, lang, [e.label for e in examples], fmt="lines")
        else:
            write_predictions(labels_root, folder, lang, [e.tags for e in examples], fmt="tags")


def run_seed(data: TaskData, make_model: Callable[[int, int], tuple], seed: int, ckdir: Path, preds_root: Path,
             labels_root: Path, log: Callable[[str], None], model_ref: dict | None = None, task=None) -> dict:
    """Train one seed (or read its finished result) -> {lang: metrics}, plus its training record.
    ``model_ref`` (kind, name, path, ...) lets the DeepSpeed ranks rebuild the same model; ``task``:
    the task with one point of its grid (default: the data's own)."""
    if (ckdir / RESULT).is_file():
        return json.loads((ckdir / RESULT).read_text())
    task = task or data.task
    ft = task.finetune
    if ft.launcher == "deepspeed":
        from xylent.tasks.evaluate.finetune.distributed import train_on_ranks

        # the ranks build their own models: this process loads one only afterwards (GPU memory)
        record = train_on_ranks(task, data.root, model_ref, seed, ckdir, log)
    model, tok = make_model(seed, max(1, len(data.labels)))
    runner = Runner(data, tok)
    feats = runner.features(data.train, training=True)
    if not feats:
        raise XylentError(f"task {task.name!r}: no usable training example", where="its train file",
                          fix="check that answers occur in their contexts / lines have labels")
    if ft.launcher == "deepspeed":
        model.load_state_dict(torch.load(ckdir / record["best_file"], map_location="cpu", weights_only=True))
    else:
        record = train(model, feats, runner.dev_score, loop_config(ft, seed), ckdir, tok.pad_id, log)
    folder, fmt = task.xtreme_task or task.name, task.submission_format
    langs = {}
    for lang, examples in data.tests.items():
        pred = write_predictions(preds_root / f"seed-{seed}", folder, lang, runner.predict(model, examples), fmt=fmt)
        scores = score_language(pred, submission_file(labels_root, folder, lang, fmt), folder, lang, fmt)
        langs[lang] = {**scores, "n": len(examples)}
    if task.xtreme_task and set(XTREME_TASK_LANGS[task.xtreme_task]) <= set(task.languages):
        # every language the benchmark scores: the leaderboard's own number, from the same files
        report = score_submission(preds_root / f"seed-{seed}", labels_root)[task.xtreme_task]
        record["xtreme_avg_metric"] = report["avg_metric"]
    result = {"languages": langs, "train_features": len(feats), "train_examples": len(data.train),
              **({"xtreme_avg_metric": record["xtreme_avg_metric"]} if "xtreme_avg_metric" in record else {}),
              **{k: record[k] for k in ("history", "selected_epoch", "dev", "steps", "resumed_from")}}
    write_json_atomic(ckdir / RESULT, result, indent=2)
    (ckdir / "state.pt").unlink(missing_ok=True)  # the optimiser state is dead weight once a seed is done
    (ckdir / record["best_file"]).unlink(missing_ok=True)  # its predictions and scores are written
    shutil.rmtree(ckdir / "ds", ignore_errors=True)
    for rng in ckdir.glob("rng-step*.pt"):
        rng.unlink()
    return result


def summarise(data: TaskData, per_seed: dict[int, dict], task=None) -> dict:
    """Mean ± sd over seeds per language and metric, the transfer gap, the trivial baseline."""
    kind, task = data.kind, task or data.task
    langs = {}
    for lang in task.languages:
        metrics = [k for k in per_seed[next(iter(per_seed))]["languages"][lang] if k != "n"]
        row = {}
        for m in metrics:
            vals = [r["languages"][lang][m] for r in per_seed.values()]
            row[m] = float(np.mean(vals))
            row[f"{m}_sd"] = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
        row["n"] = per_seed[next(iter(per_seed))]["languages"][lang]["n"]
        if (major := data.majority()) is not None:  # what always predicting the commonest label scores
            if kind == "classification":
                row["majority_baseline"] = accuracy([e.label for e in data.tests[lang]],
                                                    [major] * len(data.tests[lang]))["accuracy"]
            else:
                row["majority_baseline"] = tag_f1([e.tags for e in data.tests[lang]],
                                                  [[major] * len(e.tags) for e in data.tests[lang]])["f1"]
        langs[lang] = row
    primary, gap = PRIMARY[kind], GAP_METRIC[kind]
    out = {"kind": kind, "protocol": task.finetune.protocol, "seeds": sorted(per_seed), "languages": langs,
           "avg": float(np.mean([v[primary] for v in langs.values()])),
           "per_seed": {str(s): {k: r[k] for k in ("selected_epoch", "dev", "steps", "history", "resumed_from")}
                        | {"avg": float(np.mean([v[primary] for v in r["languages"].values()]))}
                        for s, r in per_seed.items()},
           "hyperparameters": task.finetune.model_dump(mode="json", exclude=set(task.finetune.OPERATIONAL))}
    if all("xtreme_avg_metric" in r for r in per_seed.values()):  # score_submission's number (all its languages)
        out["xtreme_avg_metric"] = float(np.mean([r["xtreme_avg_metric"] for r in per_seed.values()]))
    avgs = [v["avg"] for v in out["per_seed"].values()]
    out["avg_sd"] = float(np.std(avgs, ddof=1)) if len(avgs) > 1 else 0.0
    if "majority_baseline" in next(iter(langs.values())):
        out["majority_baseline"] = float(np.mean([v["majority_baseline"] for v in langs.values()]))
    others = [v[gap] for lang, v in langs.items() if lang != task.train_language]
    if task.train_language in langs and others:
        out["transfer_gap"] = langs[task.train_language][gap] - float(np.mean(others))
    return out


def grid_points(ft) -> list[tuple[float, int]]:
    """Every (lr, epochs) a task's finetune section asks for, in order."""
    lrs = ft.lr if isinstance(ft.lr, list) else [ft.lr]
    epochs = ft.epochs if isinstance(ft.epochs, list) else [ft.epochs]
    return [(lr, ep) for lr in lrs for ep in epochs]


def finetune_task(data: TaskData, make_model: Callable[[int, int], tuple], ckroot: Path, preds_root: Path,
                  labels_root: Path, log: Callable[[str], None] = lambda s: None, model_ref: dict | None = None
                  ) -> dict:
    """``make_model(seed, n_labels) -> (TaskModel, TextTokenizer)``, a fresh model per seed."""
    write_gold(data, labels_root)
    seeds, points = data.task.finetune.seeds, grid_points(data.task.finetune)
    if len(points) == 1:
        per_seed = {s: run_seed(data, make_model, s, ckroot / f"seed-{s}", preds_root, labels_root, log, model_ref)
                    for s in seeds}
        return summarise(data, per_seed)
    tried = {}
    for lr, epochs in points:
        tag = f"lr{lr!r}-epochs{epochs}"  # repr: two learning rates never share a folder
        log(f"grid point {tag} ({len(tried) + 1}/{len(points)})")
        task = data.task.model_copy(update={"finetune": data.task.finetune.model_copy(
            update={"lr": lr, "epochs": epochs})})
        per_seed = {s: run_seed(data, make_model, s, ckroot / tag / f"seed-{s}", ckroot / tag / "predictions",
                                labels_root, log, model_ref, task=task) for s in seeds}
        tried[tag] = {"lr": lr, "epochs": epochs, "task": task, "per_seed": per_seed,
                      "dev": float(np.mean([r["dev"] for r in per_seed.values()]))}
    # a tie keeps the earlier point; a point whose dev score is not a number is never kept over one that is
    kept = max(tried, key=lambda tag: tried[tag]["dev"] if np.isfinite(tried[tag]["dev"]) else -np.inf)
    for s in seeds:  # the kept point's predictions are the submission
        shutil.copytree(ckroot / kept / "predictions" / f"seed-{s}", preds_root / f"seed-{s}", dirs_exist_ok=True)
    out = summarise(data, tried[kept]["per_seed"], tried[kept]["task"])
    primary = PRIMARY[data.kind]
    out["grid"] = {"kept": kept, "by": "the best mean dev score over the seeds",
                   "points": {tag: {"lr": t["lr"], "epochs": t["epochs"], "dev": t["dev"],
                                    "avg": float(np.mean([np.mean([v[primary] for v in r["languages"].values()])
                                                          for r in t["per_seed"].values()]))}
                              for tag, t in tried.items()}}
    return out
