"""Score a submission folder for XTREME or XTREME-R exactly as the leaderboard does.

The result is shaped like the JSON report of google-research/xtreme
``evaluate.py``: group scores first (``all_task`` and one per group, each only
when all of its tasks were scored), then one entry per scored task::

    {"all_task": 71.2, "classification": 80.1, ...,
     "xnli": {"accuracy": {"ar": ..., ...}, "avg_accuracy": ..., "avg_metric": ...}, ...}

A task is scored when both folders have its sub-folder; it then needs a file
for every one of its languages.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from xylent.tasks.evaluate.metrics import accuracy, bucc_f1, map_at_k, tag_f1
from xylent.tasks.evaluate.qa_metrics import mlqa_scores, squad_scores
from xylent.tasks.evaluate.submission import (
    read_jsonl_labels,
    read_lines,
    read_mapping,
    read_qa_gold,
    read_tag_sentences,
    submission_file,
    task_format,
)
from xylent.errors import XylentError

log = logging.getLogger(__name__)

# The tables below match google-research/xtreme evaluate.py at commit
# 838c13b69daafb9328785d16caae2711e4012123 (XTREME_TASK2LANGS,
# XTREME_R_TASK2LANGS, XTREME_GROUP2TASK, XTREME_R_GROUP2TASK), orders included:
# languages are averaged in this order and tasks are reported in it.
XTREME_TASK_LANGS = {
    "pawsx": "de en es fr ja ko zh".split(),
    "xnli": "ar bg de el en es fr hi ru sw th tr ur vi zh".split(),
    "panx": ("ar he vi id jv ms tl eu ml ta te af nl en de el bn hi mr ur fa fr "
             "it pt es bg ru ja ka ko th sw yo my zh kk tr et fi hu").split(),
    "udpos": ("af ar bg de el en es et eu fa fi fr he hi hu id it ja kk ko mr "
              "nl pt ru ta te th tl tr ur vi yo zh").split(),
    "bucc2018": "de fr ru zh".split(),
    "tatoeba": ("ar he vi id jv tl eu ml ta te af nl de el bn hi mr ur fa fr it "
                "pt es bg ru ja ka ko th sw zh kk tr et fi hu").split(),
    "xquad": "en es de el ru tr ar vi th zh hi".split(),
    "mlqa": "en es de ar hi vi zh".split(),
    "tydiqa": "en ar bn fi id ko ru sw te".split(),
}
XTREME_GROUPS = {
    "classification": ["pawsx", "xnli"],
    "tagging": ["udpos", "panx"],
    "qa": ["xquad", "mlqa", "tydiqa"],
    "retrieval": ["bucc2018", "tatoeba"],
}

# XTREME-R drops PAWS-X and BUCC, adds XCOPA, LAReQA and Mewsli-X, and adds
# languages to PAN-X, UD-POS, Tatoeba and XQuAD.  LAReQA is listed without
# languages, as in the reference: it is never scored, so XTREME-R never gets an
# all_task score (the reference would crash computing one; see score_submission).
XTREME_R_TASK_LANGS = {
    "xnli": XTREME_TASK_LANGS["xnli"],
    "panx": XTREME_TASK_LANGS["panx"] + "qu pl uk az lt pa gu ro".split(),
    "udpos": XTREME_TASK_LANGS["udpos"] + "lt pl uk wo ro".split(),
    "tatoeba": XTREME_TASK_LANGS["tatoeba"] + "az lt pl uk ro".split(),
    "xcopa": "et ht id it qu sw ta th tr vi zh".split(),
    "lareqa": [],
    "mewslix": "ar de en es fa ja pl ro ta tr uk".split(),
    "xquad": XTREME_TASK_LANGS["xquad"] + ["ro"],
    "mlqa": XTREME_TASK_LANGS["mlqa"],
    "tydiqa": XTREME_TASK_LANGS["tydiqa"],
}
# XCOPA sits in two groups, as in the reference.
XTREME_R_GROUPS = {
    "classification": ["xnli", "xcopa"],
    "tagging": ["udpos", "panx"],
    "qa": ["xquad", "mlqa", "tydiqa"],
    "retrieval": ["tatoeba", "mewslix"],
    "multi_choice": ["xcopa"],
}

VERSIONS = {
    "xtreme": (XTREME_TASK_LANGS, XTREME_GROUPS),
    "xtreme-r": (XTREME_R_TASK_LANGS, XTREME_R_GROUPS),
}


def _count_mismatch(pred: Path, gold: Path, n_pred: int, n_gold: int, unit: str) -> XylentError:
    return XylentError(
        f"{pred} has {n_pred} {unit} but {gold} has {n_gold}",
        where=str(pred),
        fix=f"write exactly one entry per test example ({n_gold} {unit}), in the order of the test file",
    )


def _check_tag_lengths(pred: Path, gold: Path, pred_starts: list[int], gold_starts: list[int],
                       predicted: list[list[str]], labels: list[list[str]]) -> None:
    for i, (p, g) in enumerate(zip(predicted, labels)):
        if len(p) != len(g):
            raise XylentError(
                f"sentence {i + 1} has {len(p)} tags in {pred} (line {pred_starts[i]}) "
                f"but {len(g)} in {gold} (line {gold_starts[i]})",
                where=f"{pred}:{pred_starts[i]}",
                fix="predict one tag per gold token, one per line, with a blank line after each sentence",
            )


def score_language(pred: Path, gold: Path, task: str, lang: str, fmt: str | None = None) -> dict[str, float]:
    """The metrics of one task in one language, from its prediction and gold files
    (``fmt``: the layout of a task that is not one of XTREME's)."""
    fmt = fmt or task_format(task)
    if fmt in ("lines", "jsonl"):
        read = read_lines if fmt == "lines" else read_jsonl_labels
        predicted, labels = read(pred), read(gold)
        if len(predicted) != len(labels):
            raise _count_mismatch(pred, gold, len(predicted), len(labels), "lines")
        if not labels:
            raise XylentError(f"{gold} is empty", where=str(gold), fix="point at the real test labels")
        return accuracy(labels, predicted)
    if fmt == "pairs":
        return bucc_f1(read_lines(gold), read_lines(pred))
    if fmt == "tags":
        (predicted, pred_starts), (labels, gold_starts) = read_tag_sentences(pred), read_tag_sentences(gold)
        if len(predicted) != len(labels):
            raise _count_mismatch(pred, gold, len(predicted), len(labels), "sentences")
        _check_tag_lengths(pred, gold, pred_starts, gold_starts, predicted, labels)
        return tag_f1(labels, predicted)
    if fmt == "ranking":
        return map_at_k(read_mapping(gold, list), read_mapping(pred, list))
    dataset, answers = read_qa_gold(gold), read_mapping(pred, str)
    try:
        if task == "mlqa":
            return mlqa_scores(dataset, answers, lang, source=str(pred))
        return squad_scores(dataset, answers, source=str(pred))
    except (KeyError, TypeError, ValueError) as e:
        raise XylentError(f"{gold}: not usable SQuAD-format gold data ({type(e).__name__}: {e})",
                          where=str(gold), fix="every question needs an id and at least one answer text") from None


def _score_task(pred_root: Path, gold_root: Path, task: str, langs: list[str], qa_tasks: list[str]) -> dict:
    pairs = {lang: (submission_file(pred_root, task, lang), submission_file(gold_root, task, lang)) for lang in langs}
    missing = [f"{lang} ({path})" for lang, files in pairs.items() for path in files if not path.is_file()]
    if missing:
        raise XylentError(
            f"{task}: {len(missing)} file(s) missing for languages it is scored on: {'; '.join(missing)}",
            where=str(pred_root / task),
            fix=f"{task} is scored on {', '.join(langs)}: provide every one, or remove the {task} folder "
                "to leave the task (and its group and all_task) out",
        )
    per_metric: dict[str, dict[str, float]] = {}
    for lang, (pred, gold) in pairs.items():
        for metric, value in score_language(pred, gold, task, lang).items():
            per_metric.setdefault(metric, {})[lang] = value
    result: dict = dict(per_metric)
    for metric, by_lang in per_metric.items():
        result[f"avg_{metric}"] = sum(by_lang.values()) / len(by_lang)
    if task in qa_tasks:
        result["avg_metric"] = (result["avg_exact_match"] + result["avg_f1"]) / 2
    else:
        for key in ("avg_f1", "avg_accuracy", "avg_map@20"):
            if key in result:
                result["avg_metric"] = result[key]
                break
    return result


def _subdirs(root: Path, what: str) -> set[str]:
    if not root.is_dir():
        raise XylentError(f"{what} folder {root} does not exist", where=str(root),
                          fix=f"pass the folder holding one sub-folder per task ({what})")
    return {entry.name for entry in root.iterdir() if entry.is_dir()}


def score_submission(predictions_dir: str | os.PathLike, labels_dir: str | os.PathLike,
                     version: str = "xtreme") -> dict:
    """Score ``predictions_dir`` against ``labels_dir`` for ``version`` ("xtreme" or "xtreme-r").

    Scores are on the 0-100 scale; see the module docstring for the shape.
    """
    if version not in VERSIONS:
        raise XylentError(f"unknown XTREME version {version!r}", where="score_submission(version=...)",
                          fix=f"use one of: {', '.join(VERSIONS)}")
    task_langs, groups = VERSIONS[version]
    pred_root, gold_root = Path(predictions_dir), Path(labels_dir)
    pred_tasks, gold_tasks = _subdirs(pred_root, "predictions"), _subdirs(gold_root, "labels")
    for task in sorted(pred_tasks - gold_tasks):
        log.warning("%s: predictions but no labels in %s; task not scored", task, gold_root)
    for task in sorted(pred_tasks - set(task_langs)):
        log.warning("%s: not a %s task; folder ignored", task, version)

    detailed = {
        task: _score_task(pred_root, gold_root, task, langs, groups["qa"])
        for task, langs in task_langs.items()
        if task in pred_tasks and task in gold_tasks
    }

    overall: dict[str, float] = {}
    # The reference requires every task for all_task; for XTREME-R that
    # includes LAReQA, which has no languages and so no avg_metric, and the
    # reference then fails.  Reporting no all_task is the non-crashing reading.
    if set(detailed) == set(task_langs) and all("avg_metric" in s for s in detailed.values()):
        overall["all_task"] = sum(s["avg_metric"] for s in detailed.values()) / len(detailed)
    for group, members in groups.items():
        if all(task in detailed for task in members):
            overall[group] = sum(detailed[task]["avg_metric"] for task in members) / len(members)
    return {**overall, **detailed}
