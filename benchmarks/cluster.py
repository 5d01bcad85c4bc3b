"""Does a cluster spread one large language? dedup on threads, a local Ray cluster and a local Dask
cluster, each at 1 and 2 workers of one core apiece, over the same prepared corpus.

    .venv/bin/python benchmarks/cluster.py              # 100 MB of monolingual text, the largest group in parts
    .venv/bin/python benchmarks/cluster.py --quick      # a smoke run: 2 MB, one repeat
    .venv/bin/python benchmarks/cluster.py --runners threads ray   # leave Dask out

The corpus is the scaling benchmark's (benchmarks/corpus.py, served over 127.0.0.1, downloaded and
prepared once by the CLI with `prepare.part_rows` small enough that the largest language spans many
parts). Then `xylent run dedup --force` per runner and worker count, each in a fresh process whose
thread pools are capped at one thread (POLARS_MAX_THREADS=1, which also caps MinHash's threads, and the
rest; Ray's and Dask's worker processes inherit the cap): a worker is one thread. Nothing pins them to
cores: on a 2-core machine the flow's process, Prefect's server and the cluster's own processes share the
cores with 2 workers (the `cores busy` column), and the threads runner's 2 workers are 2 threads of one
process under one GIL. Per run: the stage's own time (its manifest's
`seconds`, the cluster's start outside it), the command's, how the map phase's tasks spread over the
worker processes (the manifest's `workers`: tasks per worker, and how many workers ran the largest
language's parts), and whether the output files are byte-identical to threads' (the manifest's
sha256 of every file). Target: 2 workers take at most 0.65x one worker's time on each runner. A full run
without --prefect-api-url lets each command start its own temporary Prefect server, as the CLI does without
PREFECT_API_URL; --quick (a smoke run beside other tests, whose servers would race it for a port) shares one
among its commands; --prefect-api-url (either size) uses that API for every command.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import tempfile
import os
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import harness  # noqa: E402
import corpus  # noqa: E402
import scaling  # noqa: E402

RUNNERS = ("threads", "ray", "dask")
WORKERS = (1, 2)
TARGET = 0.65  # 2 workers' time over 1 worker's, each worker one core
LANGS = sorted(corpus.SCRIPTS)[:8]


def run_forced(stage: str, spec: str, workspace: str, overrides: list[str]) -> dict:
    """`xylent run STAGE --force` in this process; the manifest's seconds, files and workers."""
    from xylent.cli import main as cli

    out = io.StringIO()
    args = ["run", stage, "--spec", spec, "--workspace", workspace, "--json", "--force"]
    for o in overrides:
        args += ["--set", o]
    import psutil

    busy = psutil.cpu_times()
    t = time.perf_counter()
    with contextlib.redirect_stdout(out):
        rc = cli(args)
    command_s = time.perf_counter() - t
    after = psutil.cpu_times()
    # every process on the machine, the clusters' workers and Prefect's server included
    cpu_s = sum(getattr(after, k) - getattr(busy, k) for k in ("user", "system", "nice"))
    if rc != 0:
        raise RuntimeError(f"xylent run {stage} exited {rc}:\n{out.getvalue()[-3000:]}")
    output = Path(json.loads(out.getvalue())["stages"][stage]["output_dir"])
    manifest = json.loads((output / "_manifest.json").read_text())
    return {"stage_s": manifest["seconds"], "command_s": round(command_s, 3), "machine_cpu_s": round(cpu_s, 2),
            "cpus": psutil.cpu_count(), "phase_seconds": manifest.get("phase_seconds"),
            "files": sorted([f["path"], f["sha256"]] for f in manifest["files"]),
            "workers": manifest.get("workers")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mono-mb", type=float, default=None, help="MB of monolingual text (default 100; quick 2)")
    ap.add_argument("--part-rows", type=int, default=None, help="prepare.part_rows (default 20 000; quick 1 000)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per runner and worker count (default 3)")
    ap.add_argument("--warmup", type=int, default=0, help="untimed runs per runner and worker count, first")
    ap.add_argument("--runners", nargs="+", choices=RUNNERS, default=list(RUNNERS),
                    help="which runners (threads always: the others' output is compared with it)")
    ap.add_argument("--out", default=str(harness.RESULTS))
    harness.add_prefect_api_flag(ap)
    args = ap.parse_args(argv)
    mb = args.mono_mb or (2.0 if args.quick else 100.0)
    part_rows = args.part_rows or (1_000 if args.quick else 20_000)
    args.repeats = args.repeats or (1 if args.quick else 3)
    kinds = ["threads", *(k for k in args.runners if k != "threads")]
    saved_env = dict(os.environ)
    tmp = Path(tempfile.mkdtemp(prefix="xylent-cluster-"))
    runs: dict[str, list[dict]] = {}
    try:
        scaling._isolate(tmp)
        folder = scaling.corpus_folder(tmp, mb)
        size = scaling.make_corpus(folder, mb, LANGS)
        ws = tmp / "ws"
        with contextlib.ExitStack() as stack:
            if args.quick or args.prefect_api_url:
                # a smoke run shares the machine with other tests, whose commands' temporary Prefect servers
                # would race this one's for a port: one API for every command here instead (the given one)
                stack.enter_context(harness.prefect_api(args.prefect_api_url))
            prepared = _measure(args, kinds, folder, ws, tmp, part_rows, runs)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        shutil.rmtree(tmp, ignore_errors=True)
    payload = summarise(runs, size, prepared, part_rows)
    harness.write_result("cluster", payload, args)
    return 0


def _measure(args, kinds: list[str], folder: Path, ws: Path, tmp: Path, part_rows: int, runs: dict) -> dict:
    """Prepare once, then dedup per runner, worker count and repeat into ``runs``; prepare's result."""
    with scaling.serve(folder) as base:
        spec = tmp / "spec.json"
        spec.write_text(json.dumps(scaling.bench_spec(base, quick=True, workers=2, langs=LANGS,
                                                      part_rows=part_rows)))
        prepared = harness.in_fresh_process("scaling", "run_stage", {
            "stage": "prepare", "spec": str(spec), "workspace": str(ws)}, threads=2)["result"]
    for rep in range(args.warmup + args.repeats):
        # 1 and 2 workers in turn, the order flipped each repeat: drift on the host falls on both
        for kind in kinds:
            for w in (WORKERS if rep % 2 == 0 else WORKERS[::-1]):
                r = harness.in_fresh_process("cluster", "run_forced", {
                    "stage": "dedup", "spec": str(spec), "workspace": str(ws),
                    "overrides": [f"runner.kind={kind}", f"runner.max_workers={w}"]},
                    threads=1, preload=scaling.CLI)
                print(f"{kind} x{w}: dedup {r['result']['stage_s']:.2f} s", flush=True)
                if rep >= args.warmup:
                    runs.setdefault(f"{kind}-{w}", []).append({**r["result"], "peak_rss_mb": r["peak_rss_mb"]})
    return prepared


def summarise(runs: dict[str, list[dict]], size: dict, prepared: dict, part_rows: int) -> dict:
    reference = runs["threads-1"][0]["files"]
    rows = {}
    for name, rs in runs.items():
        kind, w = name.rsplit("-", 1)
        spread = rs[-1]["workers"]
        rows[name] = {"runner": kind, "workers": int(w),
                      "stage_s": scaling._spread([r["stage_s"] for r in rs]),
                      "command_s": scaling._spread([r["command_s"] for r in rs]),
                      "identical_to_threads": all(r["files"] == reference for r in rs),
                      "phase_s": {ph: scaling._spread([r["phase_seconds"][ph] for r in rs])
                                  for ph in rs[0]["phase_seconds"]},
                      # the share of the machine's cores busy during the command (any process)
                      "machine_busy": scaling._spread([r["machine_cpu_s"] / (r["command_s"] * r["cpus"]) for r in rs]),
                      # the map phase's task bodies: the busiest worker's seconds in them and a task's mean, so the
                      # phase's wall time splits into work and what the runner cost around it
                      "map_busy_max_s": scaling._spread([r["workers"]["phases"]["map"]["busy_max_s"] for r in rs]),
                      "map_task_s": scaling._spread([r["workers"]["phases"]["map"]["busy_sum_s"]
                                                     / max(1, sum(r["workers"]["phases"]["map"]["tasks"].values()))
                                                     for r in rs]),
                      "largest_group": spread["largest_group"], "phases": spread["phases"]}
    ratios = {kind: rows[f"{kind}-2"]["stage_s"]["median"] / rows[f"{kind}-1"]["stage_s"]["median"]
              for kind in dict.fromkeys(r["runner"] for r in rows.values())}
    metrics = prepared["metrics"]
    return {"text_mb": size["text_mb"], "mono_mb": size["mono_mb"], "bitext_pairs": size["bitext_pairs"],
            "part_rows": part_rows, "languages": LANGS, "largest": scaling.largest_parts(size, metrics, part_rows),
            "rows": rows, "ratio_2_over_1": ratios, "target": TARGET,
            "within": {k: r <= TARGET for k, r in ratios.items()}}


# ---------------------------------------------------------------- docs/records/benchmarks.md (benchmarks/render.py)

def markdown(result: dict) -> str:
    g = result["largest"]
    rows = []
    measured = next(iter(result["rows"].values()))["phase_s"]
    phases = [ph for ph in ("map", "reduce", "resolve", "apply", "assemble") if ph in measured]
    for name, r in result["rows"].items():
        m = r["phases"]["map"]
        rows.append([f"{r['runner']}", r["workers"], harness.seconds(r["stage_s"]["median"]),
                     *[harness.seconds(r["phase_s"][ph]["median"]) for ph in phases],
                     harness.seconds(r["command_s"]["median"]), f"{100 * r['machine_busy']['median']:.0f} %",
                     *([harness.seconds(r["map_task_s"]["median"]), harness.seconds(r["map_busy_max_s"]["median"])]
                       if "map_task_s" in r else ["–", "–"]),
                     " / ".join(str(n) for n in sorted(m["tasks"].values(), reverse=True)),
                     m.get("largest_group_workers", "–"), "yes" if r["identical_to_threads"] else "**no**"])
    ratios = ", ".join(f"{k} {v:.2f} ({'within' if result['within'][k] else '**over**'})"
                       for k, v in result["ratio_2_over_1"].items())
    return (f"dedup over {harness.num(result['text_mb'])} MB of text ({len(result['languages'])} languages; the "
            f"largest group, {g['group']}, in {g['parts']} parts of {harness.num(g['part_mb'])} MB at "
            f"`prepare.part_rows` = {harness.num(result['part_rows'])}), per runner at 1 and 2 workers of one thread "
            "each (on "
            f"{result.get('environment', {}).get('machine', {}).get('cpus', '?')} cores shared with the flow and "
            "Prefect's server; the threads runner's under one GIL): the stage's time, "
            "each phase's (the flow's own clock; assemble: stats, samples and plots in the flow's process), the "
            "command's (the cluster's start included), the share of the machine's cores busy meanwhile (every "
            "process: workers, the flow, Prefect's server), a map task's mean time in its body and the busiest "
            "worker process's time in map task bodies (the threads runner's one process adds up both its "
            "threads), the map phase's tasks per worker process, how many "
            "workers mapped the largest group's parts, and whether the output is byte-identical to threads':\n\n"
            + harness.table(["runner", "workers", "stage", *phases, "command", "cores busy", "map task",
                             "busiest map worker", "map tasks per worker",
                             "workers on the largest group", "identical"], rows)
            + f"\n\nTime on 2 workers over 1 worker's (target ≤ {result['target']}): {ratios}." + _work_ratios(result))


def _work_ratios(result: dict) -> str:
    """The map phase split into its task bodies and the rest, 2 workers over 1: what the work scales by,
    and the fixed cost around it that a second worker cannot share."""
    rows = result["rows"]
    # not threads': its workers are threads of one process, whose busy seconds add both up
    kinds = [k for k in result["ratio_2_over_1"]
             if k != "threads" and f"{k}-1" in rows and "map_busy_max_s" in rows[f"{k}-1"]]
    if not kinds:  # results measured before the task bodies were timed
        return ""

    def rest(name: str) -> float:
        return rows[name]["phase_s"]["map"]["median"] - rows[name]["map_busy_max_s"]["median"]

    parts = [f"{k} {rows[f'{k}-2']['map_busy_max_s']['median'] / rows[f'{k}-1']['map_busy_max_s']['median']:.2f} "
             f"(the rest {harness.seconds(rest(f'{k}-1'))} at 1 worker, {harness.seconds(rest(f'{k}-2'))} at 2)"
             for k in kinds]
    return (" The map phase's task bodies alone (the busiest worker's seconds in them), 2 workers over 1: "
            + ", ".join(parts) + "; the rest of the map phase is spent outside the task bodies, where a second "
            "worker does not shorten it: the worker processes' first import of the task's modules, the "
            "runner's submission of each task and Prefect's records of its run.")


if __name__ == "__main__":
    sys.exit(main())
