"""The evaluate stage around the models, as the evaluate flow calls it: every
task's files read and checked first (:func:`read_tasks`), the scores started
(:func:`new_scores`), each model through :func:`evaluate_model` (one encoder on
every task: ``xylent.tasks.evaluate.model_eval``), the scorecard and the stage run's
metrics at the end (:func:`write_results`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from xylent.tasks.evaluate.curve import KINDS as CURVE_KINDS
from xylent.tasks.evaluate.curve import final_point, learning_curve, mlflow_series, snapshots
from xylent.tasks.evaluate.data import probe_warnings
from xylent.tasks.evaluate.encoders import check_layers, load_ref
from xylent.tasks.evaluate.finetune.task import TaskData
from xylent.tasks.evaluate.model_eval import FINETUNED, FineTuning, evaluate_model, sentences_to_embed
from xylent.tasks.evaluate.scorecard import PRIMARY, headline_tags, mlflow_metrics, references, write_scorecard
from xylent.tasks.evaluate.sources import EXCLUDED_FILE, task_dirs


# ---- the stage around the models: what the evaluate flow calls before, between and after them ----

@dataclass
class TaskInputs:
    """Every task's files, read (and so checked) before any model is loaded or trained."""

    data_dirs: dict[str, tuple]  # task name -> (data dir, labels dir or None)
    sentences_per_model: int     # for the progress bar
    warnings: list[str]
    finetune_data: dict[str, TaskData]  # the fine-tuned tasks'


def read_tasks(spec, upstream: dict[str, Path], data_out: Path, cache: Path) -> TaskInputs:
    tasks = spec.evaluate.tasks
    dirs = {t.name: task_dirs(t, spec, upstream, data_out, cache) for t in tasks}
    return TaskInputs(data_dirs=dirs,
                      sentences_per_model=sum(sentences_to_embed(t, *dirs[t.name]) for t in tasks),
                      warnings=[w for t in tasks if t.kind == "probe" for w in probe_warnings(dirs[t.name][0], t)],
                      finetune_data={t.name: TaskData(t, dirs[t.name][0]) for t in tasks if t.kind in FINETUNED})


def new_scores(spec, data_dirs: dict[str, tuple]) -> dict:
    """scores.json before any model: the tasks as run, the paper's references, the recipe the pipeline's
    encoder was trained with, and how much of a task was left out because pretraining saw it."""
    cfg, pre = spec.evaluate, spec.pretrain
    scores = {"models": {}, "tasks": {t.name: t.model_dump(mode="json") for t in cfg.tasks},
              "references": references(),
              **({"pipeline": {"objective": pre.objective,
                                "variant": {k: list(v) for k, v in pre.objective_variant().items()}}}
                 if "pipeline" in cfg.models else {})}
    for t in cfg.tasks:
        if (excluded := data_dirs[t.name][0] / EXCLUDED_FILE).is_file():
            scores["tasks"][t.name]["excluded_seen"] = json.loads(excluded.read_text())
    return scores


@dataclass
class StageResults:
    metrics: dict[str, float]  # the stage run's: the pipeline's under eval/, the others under vs/<model>/
    table: list[dict]          # one row per model, task and language
    summary: str


def write_results(out: Path, scores: dict) -> StageResults:
    """scorecard.md and scores.json, and what the stage run logs of them."""
    write_scorecard(out, scores)
    metrics, table = {}, []
    for name, result in scores["models"].items():
        # MLflow's UI lists vs/<model>/ after eval/ (a model name sorts anywhere: "bag-of-subwords/" came
        # before the encoder's own sections)
        for m, v in mlflow_metrics(result).items():
            metrics[m if name == "pipeline" else f"vs/{name}/{m}"] = v
        for tname, r in result.items():
            metric = PRIMARY[r["kind"]]
            for lang, vals in r["languages"].items():
                table.append({"model": name, "task": tname, "language": lang, "metric": metric,
                              "value": round(vals.get(metric, float("nan")), 2)})
    summary = "\n".join(f"- **{t}**: " + ", ".join(f"{m} {r[t]['avg']:.1f}" if r[t]["avg"] is not None else f"{m} –"
                                                   for m, r in scores["models"].items()) for t in scores["tasks"])
    return StageResults(metrics={k: v for k, v in metrics.items() if v is not None}, table=table,
                        summary="Average score per task (0–100; details in scorecard.md):\n\n" + summary)


__all__ = ["CURVE_KINDS", "FINETUNED", "FineTuning", "StageResults", "TaskInputs", "check_layers", "evaluate_model",
           "final_point", "headline_tags", "learning_curve", "load_ref", "mlflow_metrics", "mlflow_series",
           "new_scores", "read_tasks", "sentences_to_embed", "snapshots", "write_results"]
