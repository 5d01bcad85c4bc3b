"""One encoder on one fine-tuned task: every seed trained, selected on the train
language's dev set, tested on every language; predictions in XTREME's
submission layout, scored by part 1's scorer (:func:`score_language`).

Protocols (XTREME): ``zero-shot`` trains on the train language only;
``translate-train`` also on each language's ``translate-train-<lang>`` file.
Both select on the train language's dev set only: nothing is chosen on the
languages the model is tested on.

A finished seed leaves ``result.json`` in its checkpoint folder, so a rerun
after a kill skips it; an unfinished one resumes from ``state.pt``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from tasks.evaluate.metrics import accuracy, tag_f1
from tasks.evaluate.qa_metrics import mlqa_scores, squad_scores
from tasks.evaluate.scoring import XTREME_TASK_LANGS, score_language, score_submission
from tasks.evaluate.submission import submission_file, write_predictions
from tasks.finetune.data import Example, carve_dev, read_examples, split_file
from tasks.finetune.features import (
    Feature,
    classification_features,
    classification_predictions,
    tagging_features,
    tagging_predictions,
)
from tasks.finetune.qa import best_span, char_span_of_answer, qa_windows
from tasks.finetune.train import logits_of, loop_config, train
from xylent.errors import XylentError

PRIMARY = {"classification": "accuracy", "qa": "f1", "tagging": "f1"}
GAP_METRIC = {"classification": "accuracy", "qa": "exact_match", "tagging": "f1"}  # XTREME: QA's gap on EM
RESULT = "result.json"


class TaskData:
    """A task's examples, read (and so checked) before any model is trained."""

    def __init__(self, task, root: Path):
        ft, kind, lang = task.finetune, task.kind, task.train_language
        self.task, self.kind, self.root = task, kind, Path(root)
        fmt = task.format if task.format != "holdout" else "tsv"
        cap = slice(ft.max_train_examples)  # per file: translated sets never crowd out the train language
        train = read_examples(root, kind, fmt, "train", lang)
        if split_file(root, kind, "dev", lang).is_file():
            self.dev = read_examples(root, kind, fmt, "dev", lang)
        else:  # carved from the train language alone: nothing is selected on a language it is tested on
            train, self.dev = carve_dev(train, ft.dev_fraction)
        train = train[cap]
        if ft.protocol == "translate-train":
            for other in task.languages:
                if other != lang:
                    train += read_examples(root, kind, fmt, "translate-train", other)[cap]
        self.train = train
        self.tests = {other: read_examples(root, kind, fmt, "test", other) for other in task.languages}
        self.test_files = {other: split_file(root, kind, "test", other) for other in task.languages}
        if kind == "qa":
            self._check_answers(lang)
        if kind == "classification":
            names = sorted({e.label for e in self.train})
        elif kind == "tagging":
            names = sorted({t for e in self.train for t in e.tags})
        else:
            names = []
        if kind != "qa" and len(names) < 2:
            raise XylentError(f"the training data of task {task.name!r} has {len(names)} label(s); a classifier "
                              "needs two", where=str(split_file(root, kind, "train", lang)),
                              fix="check the file's label column")
        self.labels = names

    def majority(self) -> str | None:
        if self.kind == "classification":
            return Counter(e.label for e in self.train).most_common(1)[0][0]
        if self.kind == "tagging":
            return Counter(t for e in self.train for t in e.tags).most_common(1)[0][0]
        return None

    def _check_answers(self, lang: str) -> None:
        """Dev and test questions are scored against their answers: one without any
        (a SQuAD 2.0 file) would stop the run after training; refuse it now."""
        dev = split_file(self.root, "qa", "dev", lang)
        files = [(dev if dev.is_file() else split_file(self.root, "qa", "train", lang), self.dev)]
        files += [(self.test_files[code], examples) for code, examples in self.tests.items()]
        for path, examples in files:
            if missing := next((e for e in examples if not e.answers), None):
                raise XylentError(f"question {missing.qid!r} has no answer; SQuAD v1.1 scoring needs at least one "
                                  "per question", where=str(path),
                                  fix="use SQuAD v1.1-style files (unanswerable SQuAD 2.0 questions removed)")


class Runner:
    """Features, predictions and scores of one task for one tokenizer."""

    def __init__(self, data: TaskData, tok):
        self.data, self.tok, self.ft = data, tok, data.task.finetune
        self.index = {name: i for i, name in enumerate(data.labels)}
        # never more positions than the model has (a 384-token QA default on a 128-position model)
        self.max_length = min(self.ft.max_length, tok.max_positions or self.ft.max_length)

    def features(self, examples: list[Example], training: bool) -> list:
        kind, ft = self.data.kind, self.ft
        if kind == "classification":
            return classification_features(examples, self.tok, self.index, self.max_length)
        if kind == "tagging":
            return tagging_features(examples, self.tok, self.index, self.max_length)
        out = []
        for i, e in enumerate(examples):
            span = char_span_of_answer(e.context, *e.answers[0]) if training and e.answers else None
            if training and span is None:
                continue  # an answer not in its context can't be a target (counted by the caller's n)
            for w in qa_windows(e.qid, e.question, e.context, self.tok.encode, self.tok.build,
                                max_length=self.max_length, doc_stride=ft.doc_stride,
                                max_query_length=ft.max_query_length, answer=span):
                out.append(Feature(ids=w.input_ids, target={"start": w.start_position, "end": w.end_position},
                                   example=i, window=w))
        return out

    def predict(self, model, examples: list[Example]):
        feats = self.features(examples, training=False)
        logits = logits_of(model, feats, self.tok.pad_id)
        if self.data.kind == "classification":
            return classification_predictions(feats, logits, self.data.labels)
        if self.data.kind == "tagging":
            return tagging_predictions(examples, feats, logits, self.data.labels)
        by_example: dict[int, list] = {}
        for f, lg in zip(feats, logits):
            by_example.setdefault(f.example, []).append((f.window, lg))
        answers = {}
        for i, e in enumerate(examples):
            parts = by_example.get(i, [])
            answers[e.qid] = best_span([w for w, _ in parts], [lg[:, 0] for _, lg in parts],
                                       [lg[:, 1] for _, lg in parts], e.context,
                                       max_answer_length=self.ft.max_answer_length)
        return answers

    def dev_score(self, model) -> float:
        """The selection score: the primary metric on the train language's dev set."""
        dev = self.data.dev
        return self.score(dev, self.predict(model, dev), self.data.task.train_language)[PRIMARY[self.data.kind]]

    def score(self, examples: list[Example], predictions, lang: str) -> dict:
        """In-memory scores of the dev set, with the same metrics the test files get."""
        if self.data.kind == "classification":
            return accuracy([e.label for e in examples], predictions)
        if self.data.kind == "tagging":
            return tag_f1([e.tags for e in examples], predictions)
        dataset = [{"paragraphs": [{"context": e.context, "qas": [
            {"id": e.qid, "question": e.question, "answers": [{"text": t, "answer_start": s} for t, s in e.answers]}
            ]}]} for e in examples]
        if self.data.task.xtreme_task == "mlqa":
            return mlqa_scores(dataset, predictions, lang)
        return squad_scores(dataset, predictions)


def write_gold(data: TaskData, labels_root: Path) -> None:
    """The test labels in the submission layout, for the scorer (QA: the SQuAD file itself)."""
    task = data.task
    folder = task.xtreme_task or task.name
    for lang, examples in data.tests.items():
        if data.kind == "qa":
            dest = submission_file(labels_root, folder, lang, "qa")
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.tmp")
            shutil.copyfile(data.test_files[lang], tmp)
            os.replace(tmp, dest)
        elif data.kind == "classification":
            write_predictions(labels_root, folder, lang, [e.label for e in examples], fmt="lines")
        else:
            write_predictions(labels_root, folder, lang, [e.tags for e in examples], fmt="tags")


def run_seed(data: TaskData, make_model: Callable[[int, int], tuple], seed: int, ckdir: Path, preds_root: Path,
             labels_root: Path, log: Callable[[str], None], model_ref: dict | None = None) -> dict:
    """Train one seed (or read its finished result) -> {lang: metrics}, plus its training record.
    ``model_ref`` (kind, name, path, ...) lets the DeepSpeed ranks rebuild the same model."""
    if (ckdir / RESULT).is_file():
        return json.loads((ckdir / RESULT).read_text())
    task, ft = data.task, data.task.finetune
    if ft.launcher == "deepspeed":
        from tasks.finetune.distributed import train_on_ranks

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
    tmp = ckdir / f".{RESULT}.tmp"
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, ckdir / RESULT)
    (ckdir / "state.pt").unlink(missing_ok=True)  # the optimiser state is dead weight once a seed is done
    (ckdir / record["best_file"]).unlink(missing_ok=True)  # its predictions and scores are written
    shutil.rmtree(ckdir / "ds", ignore_errors=True)
    for rng in ckdir.glob("rng-step*.pt"):
        rng.unlink()
    return result


def summarise(data: TaskData, per_seed: dict[int, dict]) -> dict:
    """Mean ± sd over seeds per language and metric, the transfer gap, the trivial baseline."""
    kind, task = data.kind, data.task
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


def finetune_task(data: TaskData, make_model: Callable[[int, int], tuple], ckroot: Path, preds_root: Path,
                  labels_root: Path, log: Callable[[str], None] = lambda s: None, model_ref: dict | None = None
                  ) -> dict:
    """``make_model(seed, n_labels) -> (TaskModel, TextTokenizer)``, a fresh model per seed."""
    write_gold(data, labels_root)
    per_seed = {s: run_seed(data, make_model, s, ckroot / f"seed-{s}", preds_root, labels_root, log, model_ref)
                for s in data.task.finetune.seeds}
    return summarise(data, per_seed)
