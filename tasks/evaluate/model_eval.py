"""One encoder on every task of the spec: scores, and predictions in XTREME's
submission layout.

Retrieval (Tatoeba-style) embeds each sentence once with every layer's pooled
state and scores every layer (the scorecard plots them); the task's number is
the one at its ``layer``.  BUCC mines at its layer only (its test sets are
large).  The probe trains on the task's train language at its layer.
Fine-tuned kinds (classification, QA, tagging) go to ``xylent.tasks.evaluate.finetune``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from xylent.tasks.evaluate.data import read_probe
from xylent.tasks.evaluate.encoders import SentenceEncoder
from xylent.tasks.evaluate.probe import evaluate_probe
from xylent.tasks.evaluate.retrieval import evaluate_bucc, tatoeba_accuracy
from xylent.tasks.evaluate.retrieval_data import read_tatoeba, tatoeba_code
from xylent.tasks.evaluate.submission import write_predictions
from xylent.tasks.evaluate.surface import stripped_pairs, surface_overlap

# where a kind's predictions go in the submission layout (XTREME's task folder names)
SUBMISSION_TASK = {"tatoeba": "tatoeba", "bucc": "bucc2018"}


class Embedder:
    """Batches of one layer's pooled states, with the spec's batch size and length."""

    def __init__(self, enc: SentenceEncoder, batch_size: int, max_length: int, on_batch: Callable[[int], None]):
        self.enc, self.batch_size, self.max_length, self.on_batch = enc, batch_size, max_length, on_batch

    def layers(self, texts, layers) -> dict[int, np.ndarray]:
        parts = list(self.enc.embed_batches(texts, layers, batch_size=self.batch_size, max_length=self.max_length,
                                            on_batch=self.on_batch))
        return {i: np.concatenate([p[i] for p in parts]) for i in layers}

    def fn(self, layer: int):
        def embed(texts):
            for batch in self.enc.embed_batches(texts, [layer], batch_size=self.batch_size,
                                                max_length=self.max_length, on_batch=self.on_batch):
                yield batch[layer]
        return embed


DIAGNOSTICS = ("mean_cosine", "accuracy_centred")


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def diagnostics(x: np.ndarray, y: np.ndarray, src: list[str], tgt: list[str]) -> dict:
    """Not scores: why a retrieval score is what it is.  ``mean_cosine``: the mean
    cosine between two different sentences (anisotropy: near 1, every sentence
    looks alike); ``accuracy_centred``: xx->en acc@1 after subtracting each
    language's mean vector (what a per-language offset costs)."""
    both = _unit(np.concatenate([x, y]))
    n = len(both)
    total = float(np.square(both.sum(0)).sum())  # sum of all pairwise cosines, the diagonal included
    centred = tatoeba_accuracy(lambda texts: iter([x - x.mean(0) if texts is src else y - y.mean(0)]), src, tgt)
    return {"mean_cosine": (total - n) / (n * n - n), "accuracy_centred": centred["accuracy"]}


def _labels_file(labels: Path | None, lang: str) -> Path | None:
    # absent: read_tatoeba then says which gold file the preprocessed layout needs
    path = labels / f"test-{lang}.tsv" if labels is not None else None
    return path if path is not None and path.is_file() else None


def _file_order(data: Path, lang: str, gold_file: Path | None, tgt: list[str]) -> list[int]:
    """For each English sentence as retrieval saw it, its line in the English file
    XTREME's gold indexes: the file itself in the preprocessed layout (the gold
    says where), the stable text sort of LASER's raw file otherwise (XTREME's
    preprocessing sorts it)."""
    if gold_file is not None and not (data / f"tatoeba.{tatoeba_code(lang)}-eng.eng").is_file():
        return [int(x) for x in gold_file.read_text().split()]
    rank = {i: r for r, i in enumerate(sorted(range(len(tgt)), key=lambda i: tgt[i]))}
    return [rank[i] for i in range(len(tgt))]


STRIPPED_MIN_PAIRS = 2  # fewer pairs left after stripping: that language has no stripped score


def _every_layer(emb: Embedder, src: list[str], tgt: list[str], every: list[int], layer: int):
    """(acc@1 of each layer, the used layer's whole result, its xx and en vectors)."""
    xs, ys = emb.layers(src, every), emb.layers(tgt, every)
    accuracy, used = {}, None
    for i in every:
        r = tatoeba_accuracy(lambda texts, i=i: iter([xs[i] if texts is src else ys[i]]), src, tgt)
        accuracy[i] = r["accuracy"]
        used = r if i == layer else used
    return accuracy, used, xs[layer], ys[layer]


def _tatoeba(emb: Embedder, task, data: Path, labels: Path | None, preds: Path) -> dict:
    """Every layer's acc@1 on the task's pairs as they are and on their stripped variant
    (:mod:`xylent.tasks.evaluate.surface`), with the surface-overlap share beside them."""
    layer = emb.enc.layer_index(task.layer)
    every = list(range(emb.enc.n_layers + 1))
    langs, by_layer, en_to_xx, diag = {}, {i: [] for i in every}, [], {}
    stripped, stripped_by_layer, overlap = {}, {i: [] for i in every}, {}
    for lang in task.languages:
        gold_file = _labels_file(labels, lang)
        src, tgt = read_tatoeba(data, lang, gold_file)
        to_file = _file_order(data, lang, gold_file, tgt)
        accuracy, r, x, y = _every_layer(emb, src, tgt, every, layer)
        for i in every:
            by_layer[i].append(accuracy[i])
        langs[lang] = {"accuracy": r["accuracy"], "accuracy_en_to_xx": r["accuracy_en_to_xx"], "n": r["n"]}
        diag[lang] = diagnostics(x, y, src, tgt)
        en_to_xx.append(r["accuracy_en_to_xx"])
        write_predictions(preds, SUBMISSION_TASK["tatoeba"], lang, [to_file[p] for p in r["predictions"]])
        overlap[lang] = surface_overlap(src, tgt)
        s_src, s_tgt, dropped = stripped_pairs(src, tgt)
        if len(s_src) < STRIPPED_MIN_PAIRS:
            continue
        accuracy, r, _, _ = _every_layer(emb, s_src, s_tgt, every, layer)
        for i in every:
            stripped_by_layer[i].append(accuracy[i])
        stripped[lang] = {"accuracy": r["accuracy"], "accuracy_en_to_xx": r["accuracy_en_to_xx"], "n": r["n"],
                          "dropped": dropped}
    out = {"kind": "tatoeba", "layer": layer, "languages": langs,
           "avg": float(np.mean([v["accuracy"] for v in langs.values()])),
           "diagnostics": {k: float(np.mean([v[k] for v in diag.values()])) for k in DIAGNOSTICS},
           "diagnostics_by_language": diag,
           "avg_en_to_xx": float(np.mean(en_to_xx)),
           "by_layer": {str(i): float(np.mean(v)) for i, v in by_layer.items()},
           "surface_overlap": float(np.mean(list(overlap.values()))), "surface_overlap_by_language": overlap}
    if stripped:
        out["stripped"] = {"languages": stripped, "avg": float(np.mean([v["accuracy"] for v in stripped.values()])),
                           "by_layer": {str(i): float(np.mean(v)) for i, v in stripped_by_layer.items()}}
    return out


def _bucc(emb: Embedder, task, data: Path, labels: Path | None, preds: Path) -> dict:
    layer = emb.enc.layer_index(task.layer)
    langs, notes, thresholds = {}, [], {}
    for lang in task.languages:
        r = evaluate_bucc(emb.fn(layer), data, lang)
        write_predictions(preds, SUBMISSION_TASK["bucc"], lang, [f"{s}\t{t}" for s, t in r["predictions"]])
        thresholds[lang] = r["threshold"]  # a margin, not a score: kept out of "languages"
        if r["test"] is None:
            notes.append(r["note"])
            langs[lang] = {"tune_f1": r["tune"]["f1"]}
        else:
            langs[lang] = {**r["test"], "tune_f1": r["tune"]["f1"]}
    scored = [v["f1"] for v in langs.values() if "f1" in v]
    out = {"kind": "bucc", "layer": layer, "languages": langs, "avg": float(np.mean(scored)) if scored else None,
           "thresholds": thresholds}
    if notes:
        out["notes"] = notes
    return out


def _plug_in_probe(emb: Embedder, task, data: Path) -> dict:
    """The probe on VECO's plug-in states: each text read beside its translation.  Texts
    travel as (text, translation) pairs through evaluate_probe, which only filters them."""
    model = emb.enc.plug_in()
    if model is None:
        return {"kind": "probe", "plug_in": True, "languages": {}, "avg": None,
                "not_applicable": "no cross-attention to plug in (VECO models only)"}

    def embed(pairs):
        texts, translations = [p[0] for p in pairs], [p[1] for p in pairs]
        out = model.embed(texts, translations, batch_size=emb.batch_size, max_length=emb.max_length).numpy()
        emb.on_batch(len(pairs))
        return out

    def read(lang, split):
        lab, texts, trans = read_probe(data, lang, split, translations=True)
        return lab, list(zip(texts, trans))

    r = evaluate_probe(embed, read(task.train_language, "train"),
                       {lang: read(lang, "test") for lang in task.languages}, task.train_language)
    return {"kind": "probe", "plug_in": True, "layer": model.config.layers, **r}


def _probe(emb: Embedder, task, data: Path, labels: Path | None, preds: Path) -> dict:
    if task.plug_in:
        return _plug_in_probe(emb, task, data)
    layer = emb.enc.layer_index(task.layer)
    train = read_probe(data, task.train_language, "train")
    tests = {lang: read_probe(data, lang, "test") for lang in task.languages}
    embed = emb.fn(layer)
    r = evaluate_probe(lambda texts: np.concatenate(list(embed(texts))), train, tests, task.train_language)
    return {"kind": "probe", "layer": layer, **r}


RUNNERS = {"tatoeba": _tatoeba, "bucc": _bucc, "probe": _probe}
FINETUNED = ("classification", "qa", "tagging")


@dataclass
class FineTuning:
    """What fine-tuned tasks need beyond an encoder: a fresh copy of it per seed,
    the tasks' data (read and checked before any model runs), where checkpoints
    and gold labels go."""

    load: Callable[[], SentenceEncoder]
    data: dict            # task name -> TaskData
    checkpoints: Path     # <...>/_checkpoints/<fingerprint>/<model>
    labels: Path          # gold test labels in the submission layout
    log: Callable[[str], None] = lambda s: None
    model_ref: dict | None = None  # what DeepSpeed ranks rebuild the model from (finetune.launcher: deepspeed)


def _finetuned(enc: SentenceEncoder, task, ft: FineTuning, preds: Path) -> dict:
    from xylent.tasks.evaluate.finetune.encoders import factory
    from xylent.tasks.evaluate.finetune.run import finetune_task

    if enc.kind == "subwords":  # no weights to fine-tune; the random-init encoder is this kind's baseline
        return {"kind": task.kind, "languages": {}, "avg": None, "not_applicable": "no weights to fine-tune"}
    make = factory(ft.load, task.kind)
    return finetune_task(ft.data[task.name], make, ft.checkpoints / task.name, preds, ft.labels,
                         lambda msg: ft.log(f"{enc.name} / {task.name}: {msg}"), ft.model_ref)


def evaluate_model(enc: SentenceEncoder, tasks: list, data_dirs: dict[str, tuple], preds: Path, *, batch_size: int,
                   max_length: int, on_batch: Callable[[int], None] = lambda n: None,
                   finetuning: FineTuning | None = None) -> dict:
    """``data_dirs``: task name -> (data dir, labels dir or None).
    -> task name -> result (``languages`` -> lang -> metric -> value, ``avg``, ...)."""
    emb = Embedder(enc, batch_size, max_length, on_batch)
    out = {}
    for t in tasks:
        if t.kind in FINETUNED:
            out[t.name] = _finetuned(enc, t, finetuning, preds / t.name)
        else:
            out[t.name] = RUNNERS[t.kind](emb, t, *data_dirs[t.name], preds / t.name)
    return out


def sentences_to_embed(task, data: Path, labels: Path | None) -> int:
    """How many sentences a task embeds per model (for the progress bar); reading
    the files here also refuses malformed ones before any model is loaded."""
    if task.kind == "tatoeba":
        total = 0
        for lang in task.languages:
            src, tgt = read_tatoeba(data, lang, _labels_file(labels, lang))
            kept = len(stripped_pairs(src, tgt)[0])
            total += 2 * len(src) + (2 * kept if kept >= STRIPPED_MIN_PAIRS else 0)  # as given, then stripped
        return total
    if task.kind == "probe":
        return sum(len(read_probe(data, lang, "test")[1]) for lang in task.languages) + len(
            read_probe(data, task.train_language, "train")[1])
    return 0  # BUCC: its files are large; the bar counts without a total; fine-tuned tasks train, not embed
