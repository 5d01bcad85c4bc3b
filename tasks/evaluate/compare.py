"""Several runs side by side: one row per spec (a recipe), one column per task
score, each model beside the trivial peers the evaluate stage scored with it,
plus how the run's pretraining losses ended against their own trivial peers.

Input: each spec's published evaluate ``scores.json`` and pretrain
``metrics.jsonl`` (found by fingerprint, like ``xylent status``).  Output: a
Markdown table (``xylent compare``) and the same numbers as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

from xylent.errors import XylentError

# the final-steps pretraining numbers worth a column, each with the trivial peer it is read against
PRETRAIN_PAIRS = (
    ("trtd/contrast_accuracy", None),
    ("trtd/contrast_loss", "trtd/contrast_chance_loss"),
    ("mrtd/generator_loss", "mrtd/generator_unigram_loss"),
    ("trtd/discriminator_loss", "trtd/discriminator_base_loss"),
)


def final_metrics(metrics_file: Path, last: int = 50) -> dict[str, float]:
    """The mean of each metric over the run's last ``last`` steps that logged it."""
    rows = [json.loads(ln) for ln in Path(metrics_file).read_text().splitlines() if ln.strip()]
    out: dict[str, float] = {}
    for key in {k for r in rows for k in r} - {"step"}:
        vals = [r[key] for r in rows if key in r][-last:]
        out[key] = sum(vals) / len(vals)
    return out


def read_run(label: str, evaluate_dir: Path | None, pretrain_dir: Path | None) -> dict:
    if evaluate_dir is None or not (evaluate_dir / "scores.json").is_file():
        raise XylentError(f"{label}: the evaluate stage has no published scores for this spec",
                          where=str(evaluate_dir), fix="run it first: xylent run evaluate --spec <the same spec>")
    scores = json.loads((evaluate_dir / "scores.json").read_text())
    pretrain = {}
    if pretrain_dir is not None and (pretrain_dir / "metrics.jsonl").is_file():
        pretrain = final_metrics(pretrain_dir / "metrics.jsonl")
    objective = None
    if pretrain_dir is not None and (pretrain_dir / "model" / "config.json").is_file():
        objective = json.loads((pretrain_dir / "model" / "config.json").read_text()).get("objective")
    return {"label": label, "objective": objective, "scores": scores["models"], "pretrain": pretrain}


def task_columns(runs: list[dict]) -> list[str]:
    """Tasks every run scored, in the first run's order."""
    first = runs[0]["scores"].get("pipeline", {})
    return [t for t in first if all(t in r["scores"].get("pipeline", {}) for r in runs)]


def _avg(task_scores: dict | None) -> float | None:
    if not task_scores:
        return None
    v = task_scores.get("avg")
    return v.get("mean") if isinstance(v, dict) else v


def table(runs: list[dict]) -> str:
    """The Markdown scorecard: pipeline (random-init) per task; then pretraining's last steps."""
    if not runs:
        raise XylentError("nothing to compare", fix="name at least one spec: xylent compare --spec A --spec B")
    tasks = task_columns(runs)
    head = ["run", "objective", *(f"{t} (random-init)" for t in tasks),
            *(f"{m} ({peer.split('/')[-1]})" if peer else m for m, peer in PRETRAIN_PAIRS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        cells = [r["label"], r["objective"] or "?"]
        for t in tasks:
            ours, base = _avg(r["scores"]["pipeline"].get(t)), _avg(r["scores"].get("random-init", {}).get(t))
            if ours is None:  # e.g. a task with no test split, or "not applicable"
                cells.append("–")
                continue
            shown = (round(ours, 1), None if base is None else round(base, 1))  # what the reader compares
            mark = "" if base is None else " ▲" if shown[0] > shown[1] else " ▼" if shown[0] < shown[1] else " ="
            cells.append(f"{ours:.1f}{mark} ({base:.1f})" if base is not None else f"{ours:.1f}")
        for metric, peer in PRETRAIN_PAIRS:
            v, p = r["pretrain"].get(metric), r["pretrain"].get(peer) if peer else None
            cells.append("–" if v is None else f"{v:.3g} ({p:.3g})" if p is not None else f"{v:.3g}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Scores are averages over languages (0–100); ▲/▼: above/below the same architecture with "
              "untrained weights (= a tie at the precision shown).  Pretraining columns: the mean of the last 50 logged steps, with its trivial "
              "peer in brackets (chance contrast, unigram generator, base-rate discriminator)."]
    return "\n".join(lines) + "\n"
