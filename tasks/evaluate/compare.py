"""Several runs side by side: one row per spec (a recipe), one column per task
score, each model beside the trivial peers the evaluate stage scored with it,
plus how the run's pretraining losses ended against their own trivial peers.

Input: each spec's published evaluate ``scores.json`` and pretrain
``metrics.jsonl`` (found by fingerprint, like ``xylent status``).  Output: a
Markdown table (``xylent compare``) and the same numbers as JSON.

Over several seeds (``xylent compare --seeds 0 1 2``, each run of a spec under
``--set seed=N``) a table gives every task's mean ± sd over seeds for the
encoder and its trivial peers, and each difference that a reader would state
as a claim (each run against its peers and against the first spec) is measured
on the scores paired per seed and language (tasks/evaluate/paired.py): a claim
is "shown" only where its 95 % interval over the seeds excludes zero.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from xylent.tasks.evaluate.contract import SCORES_FILE, read_scores
from xylent.tasks.pretrain.contract import METRICS_FILE, MODEL_DIR, read_metrics
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
    rows = read_metrics(metrics_file)
    out: dict[str, float] = {}
    for key in {k for r in rows for k in r} - {"step"}:
        vals = [r[key] for r in rows if key in r][-last:]
        out[key] = sum(vals) / len(vals)
    return out


def read_run(label: str, evaluate_dir: Path | None, pretrain_dir: Path | None,
             rerun: str = "xylent run evaluate --spec <the same spec>") -> dict:
    if evaluate_dir is None or not (evaluate_dir / SCORES_FILE).is_file():
        raise XylentError(f"{label}: the evaluate stage has no published scores for this spec",
                          where=str(evaluate_dir), fix=f"run it first: {rerun}")
    scores = read_scores(evaluate_dir)
    pretrain = {}
    if pretrain_dir is not None and (metrics := pretrain_dir / METRICS_FILE).is_file():
        pretrain = final_metrics(metrics)
    objective = None
    if pretrain_dir is not None and (config := pretrain_dir / MODEL_DIR / "config.json").is_file():
        objective = json.loads(config.read_text()).get("objective")
    kinds = {name: t["kind"] for name, t in scores.get("tasks", {}).items()}
    models = {m: with_stripped(results, kinds) for m, results in scores["models"].items()}
    return {"label": label, "objective": objective, "scores": models, "pretrain": pretrain,
            "kinds": {**kinds, **{f"{t} stripped": k for t, k in kinds.items()}}}


def with_stripped(results: dict, kinds: dict[str, str]) -> dict:
    """One model's results with each retrieval task's stripped variant (xylent.tasks.evaluate.surface) as a
    task of its own, ``<task> stripped``, right after it: every table and claim reads both."""
    out = {}
    for task, r in results.items():
        out[task] = r
        if "stripped" in r:
            out[f"{task} stripped"] = {"kind": kinds.get(task), **r["stripped"]}
    return out


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


PEER_MODELS = ("random-init", "bag-of-subwords")  # the trivial peers a claim is read against


def language_scores(run: dict, model: str, task: str) -> dict[str, float]:
    """One run's per-language primary score of ``model`` on ``task`` (0–100)."""
    from xylent.tasks.evaluate.scorecard import PRIMARY

    metric = PRIMARY.get(run["kinds"].get(task, ""), "accuracy")
    langs = run["scores"].get(model, {}).get(task, {}).get("languages", {})
    return {lang: float(v[metric]) for lang, v in langs.items()
            if isinstance(v, dict) and isinstance(v.get(metric), (int, float)) and math.isfinite(v[metric])}


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "–"
    m = sum(values) / len(values)
    if len(values) < 2:
        return f"{m:.1f}"
    sd = (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return f"{m:.1f} ± {sd:.1f}"


def seed_table(groups: list[dict], claims: list[tuple[str, str]] = ()) -> tuple[str, dict]:
    """Several recipes over several seeds: ``groups`` = [{"label", "objective", "runs": {seed: run}}].
    The Markdown (mean ± sd per task for the encoder and its peers, then every claim's paired
    difference) and the differences as numbers.  Claims: each run against its peers and against
    the first run, plus each ``(a, b)`` of ``claims`` (labels: a's encoder minus b's)."""
    from xylent.tasks.evaluate.paired import MIN_SEEDS, describe, difference

    if not groups:
        raise XylentError("nothing to compare", fix="name at least one spec: xylent compare --spec A --seeds 0 1 2")
    runs = [r for g in groups for r in g["runs"].values()]
    tasks = task_columns(runs)
    peers = [p for p in PEER_MODELS if any(p in r["scores"] for r in runs)]
    head = ["run", "objective", "seeds", *(f"{t}: {m}" for t in tasks for m in ("pipeline", *peers))]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in groups:
        cells = [g["label"], g["objective"] or "?", " ".join(str(s) for s in sorted(g["runs"]))]
        for t in tasks:
            for m in ("pipeline", *peers):
                vals = [v for v in (_avg(r["scores"].get(m, {}).get(t)) for r in g["runs"].values()) if v is not None]
                cells.append(_mean_sd(vals))
        lines.append("| " + " | ".join(cells) + " |")
    numbers: dict = {}
    lines += ["", "Scores are averages over languages (0–100), mean ± sd over the pretraining seeds (each seed a "
              "run of the spec under `--set seed=N`: its vocabulary, sampling order and initial weights).", "",
              "## Differences", "",
              "Each row pairs the two sides' scores per seed and language. Its difference is the mean over the "
              "seeds of each seed's mean difference over the languages; the interval is Student's t over those "
              "per-seed means (95 %; the seed is the unit: its languages share one model); then how many seeds, "
              f"and how many languages (by their mean over the seeds), go up and down; and the verdict: **shown** "
              f"only where the interval over at least {MIN_SEEDS} seeds excludes zero, otherwise not shown at this "
              "scale (tasks/evaluate/paired.py).", ""]
    by_label = {g["label"]: g for g in groups}
    if len(by_label) != len(groups):
        raise XylentError("two compared specs have the same file name", where="xylent compare --spec",
                          fix="give each run's spec its own file name: the name is the run's label")
    unknown = [x for pair in claims for x in pair if x not in by_label]
    if unknown:
        raise XylentError(f"--claim names {unknown}, which is not a compared run", where="xylent compare --claim",
                          fix=f"name two of {sorted(by_label)} (each spec's file name without .yaml)")
    pairs = [(g["label"], p) for g in groups for p in peers] + [(g["label"], groups[0]["label"]) for g in groups[1:]]
    for a, b in claims:  # a named claim reads as named: it replaces the same pair the other way round
        if (b, a) in pairs:
            pairs[pairs.index((b, a))] = (a, b)
        elif (a, b) not in pairs:
            pairs.append((a, b))
    for t in tasks:
        rows = []
        for label, name in pairs:
            g = by_label[label]
            ours = {s: language_scores(r, "pipeline", t) for s, r in g["runs"].items()}
            if name in peers:  # a trivial peer scored beside the same runs
                theirs = {s: language_scores(r, name, t) for s, r in g["runs"].items()}
            else:
                theirs = {s: language_scores(r, "pipeline", t) for s, r in by_label[name]["runs"].items()}
            d = difference(ours, theirs)
            if d is not None:
                numbers.setdefault(t, {})[f"{label} - {name}"] = d
                rows.append(f"| {label} − {name} | {describe(d)} |")
        if rows:
            lines += [f"### {t}", "", "| claim | difference |", "|---|---|", *rows, ""]
    return "\n".join(lines) + "\n", numbers
