"""Held-out retrieval against tokens trained on (issue 63, item 4): the pipeline's encoder at each of
pretraining's snapshots (``pretrain.snapshot_tokens``, xylent.tasks.pretrain.contract) and at its end,
scored on the retrieval tasks only, beside its trivial peers' flat lines.  One run gives the curve
that tells a model still learning from one that has stopped (or never started).

In scores.json: ``curve`` = {"points": [{"tokens", "step", "tasks": {task: {"avg", "stripped", "layer"}}}],
"peers": {model: {task: {...}}}}, the last point the pipeline's final model."""

from __future__ import annotations

import json
from pathlib import Path

from xylent.markdown import markdown_table, score
from xylent.tasks.pretrain.contract import METRICS_FILE, SNAPSHOTS_DIR, read_metrics

KINDS = ("tatoeba",)  # the tasks a curve scores: retrieval embeds, it trains nothing


def snapshots(pretrain_out: Path) -> list[tuple[dict, Path]]:
    """(its step and tokens, its folder) for each exported snapshot, fewest tokens first."""
    root = Path(pretrain_out) / SNAPSHOTS_DIR
    found = [(json.loads((d / "config.json").read_text())["snapshot"], d)
             for d in root.glob("tokens-*") if (d / "config.json").is_file()] if root.is_dir() else []
    return sorted(found, key=lambda x: x[0]["tokens"])


def final_point(pretrain_out: Path) -> dict:
    """The final model's step and tokens, from the run's own metrics."""
    rows = read_metrics(Path(pretrain_out) / METRICS_FILE)
    return {"step": rows[-1]["step"], "tokens": int(sum(r["tokens"] for r in rows))}


def reading(results: dict) -> dict:
    """One model's retrieval results as the curve keeps them."""
    return {t: {"avg": r.get("avg"), "stripped": (r.get("stripped") or {}).get("avg"), "layer": r.get("layer")}
            for t, r in results.items() if r.get("kind") in KINDS}


def learning_curve(points: list[tuple[dict, dict]], final: dict, models: dict[str, dict]) -> dict:
    """``points``: (step and tokens, results) per snapshot; ``final``: the end's step and tokens;
    ``models``: scores.json's, the pipeline's final results and its peers'."""
    rows = [{**info, "tasks": reading(res)} for info, res in points]
    if not rows or rows[-1]["tokens"] != final["tokens"]:  # a snapshot at the last step is the final model
        rows.append({**final, "tasks": reading(models["pipeline"])})
    return {"points": rows, "peers": {m: reading(r) for m, r in models.items() if m != "pipeline"}}


def mlflow_series(curve: dict) -> list[tuple[int, dict[str, float]]]:
    """(tokens, metrics) per point: MLflow's step is the token count, so the run's chart is the curve."""
    return [(p["tokens"], {f"eval/{t}/curve/{k}": v for t, r in p["tasks"].items()
                           for k in ("avg", "stripped") if (v := r[k]) is not None})
            for p in curve["points"]]


def section(curve: dict) -> list[str]:
    """The scorecard's table: one row per point, each task stripped (as given), then the peers'."""
    tasks = sorted({t for p in curve["points"] for t in p["tasks"]})

    def cells(by_task: dict) -> dict:
        return {t: f"{score((by_task.get(t) or {}).get('stripped'))} ({score((by_task.get(t) or {}).get('avg'))})"
                for t in tasks}

    rows = [{"model": "pipeline", "tokens": f"{p['tokens']:,}", "step": p["step"], **cells(p["tasks"])}
            for p in curve["points"]]
    rows += [{"model": m, "tokens": "", "step": "", **cells(r)} for m, r in curve["peers"].items()]
    return ["## Learning against tokens", "",
            "Held-out retrieval (acc@1, stripped first, as given in brackets) at each snapshot of pretraining "
            "(pretrain.snapshot_tokens), the last row of the pipeline its final model; the trivial peers below "
            "do not train, so they are one line each (learning_curve.png).", "",
            markdown_table(rows), ""]


__all__ = ["KINDS", "final_point", "learning_curve", "mlflow_series", "section", "snapshots"]
