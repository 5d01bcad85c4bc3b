"""A fine-tuned task's data and its model-side plumbing, shared by the stage's process
and the DeepSpeed ranks: :class:`TaskData` (the examples, read and checked before any
model is trained) and :class:`Runner` (features, predictions and dev scores for one
tokenizer)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from xylent.tasks.evaluate.finetune.data import Example, carve_dev, read_examples, split_file
from xylent.tasks.evaluate.finetune.features import (
    Feature,
    classification_features,
    classification_predictions,
    tagging_features,
    tagging_predictions,
)
from xylent.tasks.evaluate.finetune.qa import best_span, char_span_of_answer, qa_windows
from xylent.tasks.evaluate.finetune.train import logits_of
from xylent.tasks.evaluate.metrics import accuracy, tag_f1
from xylent.tasks.evaluate.qa_metrics import mlqa_scores, squad_scores
from xylent.errors import XylentError

PRIMARY = {"classification": "accuracy", "qa": "f1", "tagging": "f1"}


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
