"""The child side of benchmarks/scaling.py: one `xylent run STAGE` per fresh process.

`flows.cli` (Prefect, MLflow, polars, every stage's flow) is imported when this
module is, so `harness.in_fresh_process("scaling_cli", "run_stage", ...)` times
the command's work alone; the import is the process's start-up, which
scaling.py measures around the call.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from flows.cli import main


def run_stage(stage: str, spec: str, workspace: str) -> dict:
    """`xylent run STAGE --spec SPEC --workspace WS --json`, in this process, as a user runs it.
    Returns whether the stage was cached, its manifest's own seconds and metrics."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["run", stage, "--spec", spec, "--workspace", workspace, "--json"])
    if rc != 0:
        raise RuntimeError(f"xylent run {stage} exited {rc}:\n{out.getvalue()[-3000:]}")
    stages = json.loads(out.getvalue())["stages"]
    done = stages[stage]
    manifest = json.loads((Path(done["output_dir"]) / "_manifest.json").read_text())
    return {"cached": done["cached"], "upstream_cached": all(r["cached"] for s, r in stages.items() if s != stage),
            "manifest_seconds": manifest["seconds"], "metrics": manifest.get("metrics", {})}


def in_sequence(calls: list[list]) -> list[dict]:
    """``[function name, kwargs]`` calls one after the other in this process (the --quick
    path: one interpreter start-up for all), this process's peak RSS reset (Linux
    clear_refs) before each: a call's peak then still counts memory an earlier call kept."""
    import time

    import harness
    from scaling import sampling_tables

    functions = {"run_stage": run_stage, "sampling_tables": sampling_tables}
    out = []
    for name, kwargs in calls:
        reset = harness.reset_peak_rss()
        before = harness.vm_rss_mb()
        t = time.perf_counter()
        result = functions[name](**kwargs)
        out.append({"result": result, "seconds": time.perf_counter() - t, "peak_rss_mb": round(harness.vm_hwm_mb(), 1),
                    "rss_before_mb": round(before, 1), "peak_reset": reset})
    return out


def prime_mlflow(uri: str) -> int:
    """Create the MLflow store's schema once, so no timed run pays for it."""
    from mlflow import MlflowClient

    return len(MlflowClient(tracking_uri=uri).search_experiments())
