"""overhead: the fixed costs every command pays before it does any work, against floors.

1. ``cli``: ``xylent --help``, ``xylent stages`` and ``xylent status --spec
   data_specs/demo.yaml`` on a new empty workspace, each a cold start in a fresh
   process (the installed ``xylent`` script, run as the console script runs it),
   side by side with two floors in fresh processes: ``python -c pass`` and
   ``python -c "import torch"``. Wall time from spawn to exit, and the process's
   own peak RSS (VmHWM, read at exit). Target (issue 31): <= 1.0 s and <= 150 MB.
2. ``store``: a new workspace's MLflow store (``xylent.tracking.Tracker`` on a
   new folder: ``sqlite:///<ws>/mlflow.db``, the experiment created), in fresh
   processes with MLflow already imported: MLflow's own creation (its alembic
   migrations: the code before the template, ``new_store_from_template`` skipped),
   the first creation on a machine (migrations into the template, then its copy)
   and the usual case (a copy of the cached template).
3. ``launch``: one-rank DeepSpeed launches to the first step, a tiny pretrain of
   the demo (its shards built once with the real CLI, ``xylent run pipeline
   --until shards``, into a scratch workspace; a few steps, one checkpoint), through
   ``xylent.launch`` exactly as the pretrain stage calls it: through the
   ``deepspeed`` launcher (``XYLENT_DEEPSPEED_LAUNCHER=1``, what every launch did
   before) and started directly (what every local CPU launch does now). The rank
   writes when each phase of its start ended (``XYLENT_LAUNCH_PHASES``); every
   launch runs in a fresh process that has imported torch, as the pretrain flow
   has. A warm-up launch first (DeepSpeed's compiled CPU op is built on a machine's
   first launch, ~30 s) is not timed; the op's load alone is timed apart.
4. ``pipeline``: ``xylent run pipeline --spec data_specs/demo.yaml --until shards``
   on the prepared workspace (every stage cached, still recorded in Prefect and MLflow),
   in a fresh process, with no Prefect server configured (the CLI starts its temporary
   one) and with one (``prefect server start`` on loopback, its own PREFECT_HOME).
   Targets (issue 31): <= 8 s and <= 4 s.

Sides alternate (ABBA) after the same warm-up. The machine this runs on is shared:
compare rows of one result file only.

    .venv/bin/python benchmarks/overhead.py            # ~10 min on 2 cores (the demo's shards: ~1.5 min of it)
    .venv/bin/python benchmarks/overhead.py --quick    # cli + store, 1 run each, no warm-up: ~40 s (`make test`'s smoke)
    .venv/bin/python benchmarks/overhead.py --sections launch --repeats 5

Writes benchmarks/results/overhead.json (``--quick``: benchmarks/results/quick/).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

import harness  # noqa: E402

SPEC = ROOT / "data_specs" / "demo.yaml"
SECTIONS = ("cli", "store", "launch", "pipeline")
QUICK_SECTIONS = ("cli", "store")
TARGET_S, TARGET_MB = 1.0, 150.0
LAUNCH_STEPS = 3
FLOOR_PASS, FLOOR_TORCH = "python -c pass", 'python -c "import torch"'
BEFORE, AFTER = "through the deepspeed launcher", "started directly"

# the child: reports its own peak RSS at exit, then runs a floor or the installed xylent script
_WRAP = r"""
import atexit, os, sys
def _peak():
    with open("/proc/self/status") as f:
        kb = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))
    with open(os.environ["OVERHEAD_PEAK_FILE"], "w") as f:
        f.write(str(kb))
atexit.register(_peak)
what = sys.argv[1]
if what == "torch":
    import torch
elif what == "xylent":
    import runpy
    sys.argv = [sys.argv[2], *sys.argv[3:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


# ---------------------------------------------------------------- 1. cold CLI starts

def cold_process(what: str, args: list[str], scratch: Path) -> dict:
    """One fresh process: wall seconds from spawn to exit, its peak RSS (MB) and exit code."""
    peak = scratch / f"peak-{os.getpid()}-{time.monotonic_ns()}"
    env = harness.thread_env(None)
    env["OVERHEAD_PEAK_FILE"] = str(peak)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _WRAP, what, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{what} {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    mb = int(peak.read_text()) / 1024
    peak.unlink()
    return {"wall_s": wall, "peak_rss_mb": mb}


def cli_benchmark(args, scratch: Path) -> dict:
    exe = shutil.which("xylent", path=str(Path(sys.executable).parent))
    if exe is None:
        raise SystemExit("the xylent CLI is not installed in this environment (pip install -e .)")
    peaks: dict[str, list[float]] = {}

    def status_args() -> list[str]:  # a new empty workspace every time
        return ["status", "--spec", str(SPEC), "--workspace", tempfile.mkdtemp(prefix="ws-", dir=scratch)]

    commands = {FLOOR_PASS: ("pass", lambda: []), FLOOR_TORCH: ("torch", lambda: []),
                "xylent --help": ("xylent", lambda: ["--help"]), "xylent stages": ("xylent", lambda: ["stages"]),
                "xylent status (empty workspace)": ("xylent", status_args)}

    def side(name: str):
        what, make_args = commands[name]

        def run():
            r = cold_process(what, [exe, *make_args()] if what == "xylent" else [], scratch)
            peaks.setdefault(name, []).append(r["peak_rss_mb"])
            return r
        return run

    _, timing = harness.side_by_side({n: side(n) for n in commands}, repeats=args.repeats, warmup=args.warmup)
    rows = {}
    for name in commands:
        rows[name] = {**timing[name], "peak_rss_mb": round(max(peaks[name]), 1),
                      "peak_rss_mb_runs": [round(x, 1) for x in peaks[name]]}
    return {"commands": rows, "floors": [FLOOR_PASS, FLOOR_TORCH], "target_s": TARGET_S, "target_mb": TARGET_MB,
            "workspace": "a new empty folder per run (status)"}


# ---------------------------------------------------------------- 2. a new workspace's MLflow store

def new_store(mode: str, scratch: str) -> dict:
    """Runs in a fresh process: a Tracker on a new workspace folder -> seconds (imports excluded)."""
    import xylent.tracking as tracking

    root = Path(scratch)
    ws = Path(tempfile.mkdtemp(prefix="ws-", dir=root))
    if mode == "migrations":  # the code before the template: MLflow creates the store itself
        tracking.new_store_from_template = lambda db, cache=None: False
    elif mode == "first":  # no template yet on this machine (an empty cache)
        os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="cache-", dir=root)
    t = time.perf_counter()
    tracker = tracking.Tracker(f"sqlite:///{ws}/mlflow.db", "overhead", artifact_root=ws / "mlartifacts",
                               workspace=ws)
    seconds = time.perf_counter() - t
    import sqlite3

    with sqlite3.connect(ws / "mlflow.db") as con:
        names = sorted(r[0] for r in con.execute("SELECT name FROM experiments"))
        revision = con.execute("SELECT version_num FROM alembic_version").fetchone()[0]
    assert names == ["Default", "overhead"] and tracker.experiment_id, names
    return {"seconds": seconds, "experiments": names, "alembic_revision": revision}


# imported before the timed call: what any use of a sqlite store imports, new or not
STORE_PRELOAD = ("mlflow", "mlflow.store.tracking.sqlalchemy_store", "mlflow.store.model_registry.sqlalchemy_store",
                 "mlflow.store.db.utils", "sqlalchemy.dialects.sqlite", "xylent.tracking")
STORE_SIDES = {"MLflow's own creation (alembic migrations)": "migrations",
               "first on this machine (migrations into the template, then a copy)": "first",
               "from the cached template (a copy)": "template"}


def store_benchmark(args, scratch: Path) -> dict:
    import mlflow

    from xylent.tracking import store_template

    store_template()  # the cached template exists before the timed runs (as after a machine's first run)
    sides = {name: ("overhead", "new_store", {"mode": mode, "scratch": str(scratch)})
             for name, mode in STORE_SIDES.items()}
    out = harness.repeated_in_fresh_processes(sides, repeats=args.repeats, warmup=args.warmup, threads=None,
                                              preload=STORE_PRELOAD)
    revisions = {r["result"]["alembic_revision"] for r in out.values()}
    if len(revisions) != 1:
        raise SystemExit(f"the stores are at different schema revisions: {revisions}")
    return {"sides": out, "mlflow": mlflow.__version__, "alembic_revision": revisions.pop(),
            "imports": f"imported before the timed call: {', '.join(STORE_PRELOAD)}"}


# ---------------------------------------------------------------- 3. one-rank launch to the first step

PHASES = (  # (phase the rank writes, what ends there)
    ("process_start", "the launcher's processes before the rank (direct: spawning it)"),
    ("trainer_module_start", "interpreter start"),
    ("torch_imported", "import torch"),
    ("xylent_modules_imported", "import xylent's models and shards loader"),
    ("deepspeed_imported", "import deepspeed (it imports MLflow, for its autotuner)"),
    ("process_group_ready", "process group: DeepSpeed's compiled CPU op loaded, gloo"),
    ("model_built", "model and optimizer built (the first optimizer imports torch._dynamo)"),
    ("engine_ready", "deepspeed.initialize (its ZeRO optimizer check imports torch's inductor)"),
    ("loaders_open", "data loaders opened"),
    ("metrics_sink_open", "metrics sink opened"),
    ("first_batch", "first batch read"),
    ("first_step", "first step (forward, backward, update)"),
)
TRAINED = "trained"  # the rank's last mark: every step and the final checkpoint done


def one_launch(config: str, direct: bool) -> dict:
    """Runs in a fresh process (torch imported, as in the pretrain flow): launch the rank of ``config``
    as the pretrain stage does -> seconds from the launch() call to each phase, and to its return."""
    from xylent.launch import deepspeed_command, launch

    cfg = Path(config)
    phases = cfg.parent / "phases.jsonl"
    phases.unlink(missing_ok=True)
    os.environ["XYLENT_LAUNCH_PHASES"] = str(phases)
    os.environ["XYLENT_DEEPSPEED_LAUNCHER"] = "0" if direct else "1"
    cmd = deepspeed_command(cfg, ranks=1)
    t0 = time.time()
    launch(cmd, cfg.parent / "train.log", ranks=1)
    returned = time.time() - t0
    marks = {}
    for ln in phases.read_text().splitlines():
        rec = json.loads(ln)
        marks.setdefault(rec["phase"], rec["t"] - t0)  # a phase's first mark (rank 0, the only rank)
    log = (cfg.parent / "train.log").read_text()
    return {"marks_s": marks, "returned_s": returned, "launcher_in_log": "launch.py" in log,
            "direct_line_in_log": "started without the launcher's processes" in log}


def op_load() -> float:
    """Runs in a fresh process (torch and deepspeed imported): load DeepSpeed's compiled CPU comm op."""
    from deepspeed.comm.torch import build_shm_op

    t = time.perf_counter()
    op = build_shm_op()
    seconds = time.perf_counter() - t
    assert op is not None, "DeepSpeed's CPU comm op is not usable here"
    return seconds


def launch_benchmark(args, scratch: Path, upstream: dict) -> dict:
    import audit  # its demo-shards builder and train.json writer, shared with the audit benchmark

    from xylent.spec import load_spec

    spec = load_spec(SPEC)
    tasks = list(spec.pretrain.batch_kinds)

    def config(name: str) -> str:
        return str(audit.write_config(spec, upstream, scratch / "runs" / name, steps=LAUNCH_STEPS, tasks=tasks,
                                      audit=False))

    t = time.perf_counter()  # a machine's first launch builds the op (~30 s): not timed
    harness.in_fresh_process("overhead", "one_launch", {"config": config("warmup"), "direct": False},
                             preload=("torch",))
    print(f"warm-up launch: {time.perf_counter() - t:.0f} s", flush=True)
    sides = {BEFORE: False, AFTER: True}
    runs: dict[str, list[dict]] = {n: [] for n in sides}
    k = 0
    for rep in range(args.warmup + args.repeats):
        for name in (list(sides) if rep % 2 == 0 else list(sides)[::-1]):
            k += 1
            r = harness.in_fresh_process("overhead", "one_launch", {"config": config(f"run-{k}"),
                                                                    "direct": sides[name]}, preload=("torch",))
            r["result"]["warmup"] = rep < args.warmup
            runs[name].append(r["result"])
            print(json.dumps({"side": name, "first_step_s": round(r["result"]["marks_s"]["first_step"], 2),
                              "returned_s": round(r["result"]["returned_s"], 2)}), flush=True)
    out = {}
    for name, rs in runs.items():
        timed = [r for r in rs if not r["warmup"]]
        med = {p: round(statistics.median(r["marks_s"][p] for r in timed), 4) for p in [*dict(PHASES), TRAINED]}
        med["returned"] = round(statistics.median(r["returned_s"] for r in timed), 4)
        out[name] = {"runs": rs, "median_marks_s": med,
                     "first_step": harness.summary([r["marks_s"]["first_step"] for r in timed]),
                     "returned": harness.summary([r["returned_s"] for r in timed]),
                     "launcher_in_log": all(r["launcher_in_log"] for r in timed) if name == BEFORE else
                     any(r["launcher_in_log"] for r in timed)}
    if out[AFTER]["launcher_in_log"] or not out[BEFORE]["launcher_in_log"]:
        raise SystemExit("a launch did not take the path its side names (see train.log)")
    op = harness.repeated_in_fresh_processes({"op": ("overhead", "op_load", {})}, repeats=args.repeats,
                                             warmup=args.warmup, threads=None, preload=("torch", "deepspeed"))
    import deepspeed
    import torch

    return {"sides": out, "steps": LAUNCH_STEPS, "tasks": tasks, "model_size": spec.model.size,
            "zero_stage": spec.pretrain.zero_stage, "ranks": 1, "backend": "gloo (CPU)",
            "op_load": {k: v for k, v in op["op"].items() if k != "result"},
            "versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__},
            "statistic": "seconds from the launch() call to the end of each phase, median over runs"}


# ---------------------------------------------------------------- 4. the cached data stages

IMPORT_FLOOR = "import prefect.flow_engine, mlflow, mlflow.store.tracking.sqlalchemy_store"
FLOOR_IMPORTS = f'floor: python -c "{IMPORT_FLOOR}"'
NO_SERVER, SERVER = "no Prefect server configured (the CLI starts its temporary one)", \
    "a Prefect server configured (PREFECT_API_URL: `prefect server start` on loopback)"


def pipeline_benchmark(args, scratch: Path, workspace: Path) -> dict:
    exe = shutil.which("xylent", path=str(Path(sys.executable).parent))
    cmd = [exe, "run", "pipeline", "--spec", str(SPEC), "--until", "shards", "--workspace", str(workspace), "--json"]
    cached: list[bool] = []
    base = {k: v for k, v in harness.thread_env(None).items() if not k.startswith("PREFECT_API")}

    def run(env: dict):
        def once():
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
            if proc.returncode:
                raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
            out = json.loads(proc.stdout)
            cached.append(all(s["cached"] for s in out["stages"].values()) and bool(out["prefect_flow_run_id"]))
        return once

    def floor():
        subprocess.run([sys.executable, "-c", IMPORT_FLOOR], cwd=ROOT, check=True, env=base)

    with _prefect_server(scratch) as url:
        _, timing = harness.side_by_side({NO_SERVER: run(base), SERVER: run({**base, "PREFECT_API_URL": url}),
                                          FLOOR_IMPORTS: floor}, repeats=args.repeats, warmup=args.warmup)
    if not all(cached):
        raise SystemExit("a rerun of the data stages was not a cache hit recorded in Prefect: nothing to time")
    return {"command": "xylent run pipeline --spec data_specs/demo.yaml --until shards --json",
            "sides": timing, "stages": ["download", "prepare", "dedup", "vocab", "sampling", "shards"],
            "targets_s": {NO_SERVER: 8.0, SERVER: 4.0}, "floor": FLOOR_IMPORTS,
            "records": "every run: a Prefect flow run with 6 cached subflow runs, an MLflow parent run with 6 "
                       "cached stage runs"}


@contextlib.contextmanager
def _prefect_server(scratch: Path):
    """A Prefect server of its own (its own PREFECT_HOME), as a team runs one."""
    import urllib.request

    import socket

    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PREFECT_HOME": str(scratch / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"the Prefect server on port {port} did not start")
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> dict:
    ap = harness.parser(__doc__.splitlines()[0])
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=None,
                    help=f"default: all ({' '.join(SECTIONS)}); --quick: {' '.join(QUICK_SECTIONS)}")
    ap.add_argument("--scratch", default=None, help="folder for workspaces and runs (default: a temporary one)")
    args = ap.parse_args(argv)
    if args.quick and args.warmup is None:  # the smoke run of `make test`: no untimed runs
        args.warmup = 0
    args = harness.finish_args(args)
    sections = args.sections or (QUICK_SECTIONS if args.quick else SECTIONS)
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="xylent-overhead-")).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    result: dict = {"sections": list(sections), "loadavg_after": {}}

    def load(section: str) -> None:  # how busy the (shared) machine was: 1-minute load average
        result["loadavg_after"][section] = round(os.getloadavg()[0], 2)
    try:
        if "cli" in sections:
            result["cli"] = cli_benchmark(args, scratch)
            print(json.dumps({k: v["median_s"] for k, v in result["cli"]["commands"].items()}), flush=True)
            load("cli")
        if "store" in sections:
            result["store"] = store_benchmark(args, scratch)
            print(json.dumps({k: v["median_s"] for k, v in result["store"]["sides"].items()}), flush=True)
            load("store")
        if "launch" in sections or "pipeline" in sections:
            import audit

            workspace = scratch / "ws"
            t = time.perf_counter()
            upstream = audit.build_upstream(workspace)
            print(f"shards ready ({time.perf_counter() - t:.0f} s): {upstream['shards']}", flush=True)
            if "launch" in sections:
                result["launch"] = launch_benchmark(args, scratch, upstream)
                load("launch")
            if "pipeline" in sections:
                result["pipeline"] = pipeline_benchmark(args, scratch, workspace)
                print(json.dumps({k: v["median_s"] for k, v in result["pipeline"]["sides"].items()}), flush=True)
                load("pipeline")
    finally:
        if args.scratch is None:
            shutil.rmtree(scratch, ignore_errors=True)
        from xylent.launch import sweep_stale_shm_buffers

        sweep_stale_shm_buffers()
    harness.write_result("overhead", result, args)
    return result


# ---------------------------------------------------------------- markdown

def _x(a: float, b: float) -> str:
    if not b:
        return "–"
    r = a / b
    return f"{round(r):,}×".replace(",", " ") if r >= 10 else f"{r:.2g}×"


def _cli_md(cli: dict) -> list[str]:
    rows_in = cli["commands"]
    floor, torch_floor = rows_in[FLOOR_PASS], rows_in[FLOOR_TORCH]
    rows = []
    for name, r in rows_in.items():
        is_floor = name in (FLOOR_PASS, FLOOR_TORCH)
        met = "floor" if is_floor else ("met" if r["median_s"] <= cli["target_s"] and
                                        r["peak_rss_mb"] <= cli["target_mb"] else "**not met**")
        rows.append([f"`{name}`", f"{harness.seconds(r['median_s'])} ({harness.seconds(r['best_s'])})",
                     _x(r["median_s"], floor["median_s"]), _x(r["median_s"], torch_floor["median_s"]),
                     f"{harness.num(r['peak_rss_mb'])} MB", _x(r["peak_rss_mb"], floor["peak_rss_mb"]),
                     _x(r["peak_rss_mb"], torch_floor["peak_rss_mb"]), met])
    head = ["cold, fresh process", "wall median (best)", "× `pass`", "× `import torch`", "peak RSS", "× `pass`",
            "× `import torch`", f"target ≤ {cli['target_s']:g} s and ≤ {cli['target_mb']:g} MB"]
    return ["**Cold commands** (wall from spawn to exit; peak RSS is the process's own VmHWM):", "",
            harness.table(head, rows)]


def _store_md(store: dict) -> list[str]:
    sides = store["sides"]
    fresh = sides[next(iter(STORE_SIDES))]
    rows = [[name, f"{harness.seconds(r['median_s'])} ({harness.seconds(r['best_s'])})",
             _x(fresh["median_s"], r["median_s"]) if r is not fresh else "1×"]
            for name, r in sides.items()]
    return [f"**A new workspace's MLflow store** (`Tracker` on a new folder, MLflow {store['mlflow']}'s sqlite "
            f"store modules already imported; every store checked to hold the Default and the new experiment at schema revision "
            f"`{store['alembic_revision']}`):", "",
            harness.table(["how the store is created", "median (best)", "faster than MLflow's own"], rows)]


def _s(x: float) -> str:
    return f"{x:.2f} s" if round(x, 2) else "0.00 s"  # not "-0.00 s" for a phase of no time


def _launch_md(launch: dict) -> list[str]:
    b, a = launch["sides"][BEFORE], launch["sides"][AFTER]
    rows, prev_b, prev_a = [], 0.0, 0.0
    for key, what in PHASES:
        mb, ma = b["median_marks_s"][key], a["median_marks_s"][key]
        rows.append([what, _s(mb - prev_b), _s(ma - prev_a), _s(mb), _s(ma)])
        prev_b, prev_a = mb, ma
    for key, what in ((TRAINED, f"the other {launch['steps'] - 1} steps and a checkpoint"),
                      ("returned", "the rank's exit, until launch() returns")):
        mb, ma = b["median_marks_s"][key], a["median_marks_s"][key]
        rows.append([what, _s(mb - prev_b), _s(ma - prev_a), _s(mb), _s(ma)])
        prev_b, prev_a = mb, ma
    fb, fa = b["first_step"], a["first_step"]
    op = launch["op_load"]
    return [f"**One-rank DeepSpeed launch to the first step** (the demo's `{launch['model_size']}` model, ZeRO-"
            f"{launch['zero_stage']}, {launch['steps']} steps, gloo on the CPU; each phase's median duration, and "
            "the median time since the `launch()` call at its end):", "",
            harness.table(["phase", f"{BEFORE}", f"{AFTER}", "since launch(): before", "after"], rows), "",
            f"To the first step: {harness.seconds(fb['median_s'])} → {harness.seconds(fa['median_s'])} "
            f"(best {harness.seconds(fb['best_s'])} → {harness.seconds(fa['best_s'])}), "
            f"{_x(fb['median_s'], fa['median_s'])} faster; the whole launch: "
            f"{harness.seconds(b['returned']['median_s'])} → {harness.seconds(a['returned']['median_s'])}. "
            f"DeepSpeed's compiled CPU comm op, loaded alone from its cache: {harness.seconds(op['median_s'])} "
            f"(median of {op['n']}). Versions: torch {launch['versions']['torch']}, DeepSpeed "
            f"{launch['versions']['deepspeed']}."]


def _pipeline_md(p: dict) -> list[str]:
    if "sides" not in p:  # a result from before the configured-server side
        c = p["cached"]
        return [f"**Fully cached data stages**: `{p['command']}`: median {harness.seconds(c['median_s'])}."]
    floor = p["sides"].get(p.get("floor"))
    rows = []
    for side, r in p["sides"].items():
        target = p["targets_s"].get(side)
        rows.append([side if target else f"*{side}*", f"{harness.seconds(r['median_s'])} ({harness.seconds(r['best_s'])})",
                     _x(r["median_s"], floor["median_s"]) if floor else "–",
                     f"≤ {target:g} s" if target else "–",
                     ("met" if r["median_s"] <= target else "**not met**") if target else "floor"])
    return [f"**Fully cached data stages**: `{p['command']}` on the prepared workspace, every stage a cache hit "
            f"that is still recorded ({p['records']}); a fresh process per run, sides alternating, beside the "
            "imports no recorded run can do without:", "",
            harness.table(["Prefect", "wall median (best)", "× floor", "target", ""], rows)]


def markdown(result: dict) -> str:
    out: list[str] = []
    for key, fn in (("cli", _cli_md), ("store", _store_md), ("launch", _launch_md), ("pipeline", _pipeline_md)):
        if key in result:
            out += [*fn(result[key]), ""]
    if result.get("loadavg_after"):
        out.append("The machine's 1-minute load average at the end of each part (it is shared; "
                   f"{(result.get('environment') or {}).get('machine', {}).get('usable_cpus', '?')} CPUs): "
                   + ", ".join(f"{k} {v:g}" for k, v in result["loadavg_after"].items()) + ".")
    left = [s for s in SECTIONS if s not in result]
    if left:
        out.append(f"Not measured in this run: {', '.join(left)}.")
    return "\n".join(out).rstrip("\n") + "\n"


if __name__ == "__main__":
    main()
