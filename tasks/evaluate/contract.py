"""The evaluate stage's output contract.

    scores.json     ``scores["models"][MODEL][TASK]["languages"][LANG][METRIC]`` (0-100): what other
                    tools read (``xylent compare``, the GPU check's results)
    scorecard.md    every model side by side per task, with the plots (:mod:`xylent.tasks.evaluate.scorecard`)
    predictions/<model>/<task>/<xtreme task>/test-<lang>.tsv, labels/, data/<task>/
                    (:func:`xylent.tasks.evaluate.submission.write_predictions`)
"""

from __future__ import annotations

import json
from pathlib import Path

from xylent.atomic import write_json_atomic

SCORES_FILE = "scores.json"


def write_scores(out: Path, scores: dict) -> Path:
    path = Path(out) / SCORES_FILE
    write_json_atomic(path, scores, indent=2)  # models and tasks in the spec's order
    return path


def read_scores(evaluate_dir: Path) -> dict:
    return json.loads((Path(evaluate_dir) / SCORES_FILE).read_text())
