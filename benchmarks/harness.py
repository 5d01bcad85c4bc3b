"""The one harness every benchmark script uses, so that every side of every
comparison is measured the same way and every result file says how.

- `parser()`: the common flags (`--quick`, `--repeats`, `--warmup`, `--out`).
- `side_by_side()`: the same warm-up for every side, then `repeats` rounds in
  alternating order (ABBA...), every run kept; best and median per side.
- `in_fresh_process()`: one call of a function in a new interpreter whose thread
  pools are capped *before* any library is imported (polars, for one, sizes its
  pool once, at import), returning its result, wall time and the process's own
  peak RSS (VmHWM; a parent's `ru_maxrss` would count pages shared at spawn).
- `write_result()`: JSON with the machine, package versions, git commit, thread
  settings, the argv and every repeat; `--quick` results go to a scratch folder
  so a smoke run never overwrites the committed numbers.
- `loglog_slope()`/`plot_loglog()`: cost-against-size curves.
- Markdown helpers for `markdown(result)`, the function each script exposes and
  `benchmarks/render.py` calls to write docs/records/benchmarks.md from the JSON.

Module level imports stay stdlib + numpy: render.py imports every script.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib.metadata as _md
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
QUICK_RESULTS = RESULTS / "quick"  # git-ignored: smoke runs land here

# every variable a library we call reads to size its thread pool
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
               "POLARS_MAX_THREADS", "RAYON_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
PACKAGES = ("numpy", "pyarrow", "polars", "sentencepiece", "torch", "deepspeed", "faiss-cpu", "pot", "scipy",
            "datasketch", "transformers", "accelerate", "prefect", "mlflow", "xylent")


# ---------------------------------------------------------------- the run's flags

def parser(description: str | None, *, repeats: int = 3, warmup: int = 1) -> argparse.ArgumentParser:
    """Common flags. `--quick` is a smoke size (scripts shrink their inputs and
    may take 1 repeat); full runs must keep repeats >= 3."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke size; results go to benchmarks/results/quick/")
    ap.add_argument("--repeats", type=int, default=None, help=f"timed runs per side (default {repeats}, quick 1)")
    ap.add_argument("--warmup", type=int, default=None, help=f"untimed runs per side first (default {warmup})")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results, quick: results/quick)")
    ap.set_defaults(_repeats_default=repeats, _warmup_default=warmup)
    return ap


def add_prefect_api_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--prefect-api-url", default=None,
                    help="a Prefect API that is up already, for every command (the test session's, in a smoke "
                    "run); default: a temporary server of this run's own, on a new database")


@contextlib.contextmanager
def prefect_api(url: str | None = None):
    """PREFECT_API_URL for every command of a run (the fresh processes inherit it): ``url`` when given,
    else a temporary server of the run's own (Prefect's test harness: its new database's migrations
    cost about 25 s of CPU on a 2-core host, which a smoke run inside the test session need not pay).
    PREFECT_API_URL is as it was again afterwards."""
    before = os.environ.get("PREFECT_API_URL")
    try:
        if url:
            os.environ["PREFECT_API_URL"] = url
            yield url
            return
        from prefect.settings import PREFECT_API_URL
        from prefect.testing.utilities import prefect_test_harness

        with prefect_test_harness(server_startup_timeout=120):
            os.environ["PREFECT_API_URL"] = PREFECT_API_URL.value()
            yield os.environ["PREFECT_API_URL"]
    finally:
        if before is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = before


def finish_args(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the defaults that depend on --quick; refuse a full run with fewer than 3 repeats."""
    if args.repeats is None:
        args.repeats = 1 if args.quick else args._repeats_default
    if args.warmup is None:
        args.warmup = min(1, args._warmup_default) if args.quick else args._warmup_default
    if args.out is None:
        args.out = str(QUICK_RESULTS if args.quick else RESULTS)
    if not args.quick and args.repeats < 3:
        raise SystemExit(f"--repeats {args.repeats}: a full run needs at least 3 repeats for best-of and median "
                         "(use --quick for a smoke run)")
    return args


# ---------------------------------------------------------------- timing

def summary(runs: list[float], warmup: list[float] | None = None) -> dict:
    """Every run plus best (min) and median; the spread is the machine's noise."""
    return {"runs_s": [round(r, 6) for r in runs], "warmup_s": [round(r, 6) for r in (warmup or [])],
            "n": len(runs), "best_s": round(min(runs), 6), "median_s": round(statistics.median(runs), 6)}


def timed(fn: Callable[[], Any], *, repeats: int, warmup: int) -> tuple[Any, dict]:
    """(value of the last run, summary) for one side."""
    values, out = side_by_side({"only": fn}, repeats=repeats, warmup=warmup)
    return values["only"], out["only"]


def side_by_side(sides: dict[str, Callable[[], Any]], *, repeats: int, warmup: int) -> tuple[dict, dict]:
    """Warm every side up the same number of times, then time `repeats` rounds,
    alternating the order each round (A B, B A, ...) so drift on a shared
    machine hits both sides alike. Returns ({side: last value}, {side: summary})."""
    names = list(sides)
    warm: dict[str, list[float]] = {n: [] for n in names}
    runs: dict[str, list[float]] = {n: [] for n in names}
    values: dict[str, Any] = {}
    for _ in range(warmup):
        for n in names:
            t = time.perf_counter()
            values[n] = sides[n]()
            warm[n].append(time.perf_counter() - t)
    for r in range(repeats):
        for n in (names if r % 2 == 0 else names[::-1]):
            t = time.perf_counter()
            values[n] = sides[n]()
            runs[n].append(time.perf_counter() - t)
    return values, {n: summary(runs[n], warm[n]) for n in names}


def ratio(a: dict, b: dict, key: str = "median_s") -> float:
    """How many times faster side a is than side b (b's time over a's)."""
    return round(b[key] / a[key], 3)


# ---------------------------------------------------------------- processes, threads, memory

def thread_env(threads: int | None) -> dict[str, str]:
    """Environment that caps every pool we know of at `threads` (None: leave as is)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    if threads is not None:
        env.update({v: str(threads) for v in THREAD_VARS})
    return env


def vm_hwm_mb() -> float:
    """This process's peak resident set (VmHWM), MB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def vm_rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux clear_refs 5); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def pin_cores(cores: int | None) -> list[int]:
    """Pin this process to its first `cores` usable CPUs: every thread it has now
    (pools started at import included) and, by inheritance, every thread or
    process it starts later. None: leave it on all. Returns the CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    if cores is None or cores >= len(cpus):
        return cpus
    mask = set(cpus[:cores])
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), mask)
    return sorted(mask)


_CHILD = """
import json, sys, time, importlib
sys.path[:0] = {paths!r}
import harness
for name in {preload!r}:  # imports the timed call must not pay for
    importlib.import_module(name)
mod = importlib.import_module({module!r})
fn = getattr(mod, {func!r})
kwargs = json.loads(sys.argv[1])
before = harness.vm_rss_mb()
t = time.perf_counter()
result = fn(**kwargs)
seconds = time.perf_counter() - t
print("\\n@@RESULT@@" + json.dumps({{"result": result, "seconds": seconds, "peak_rss_mb": harness.vm_hwm_mb(),
                                   "rss_before_mb": before}}))
"""


def in_fresh_process(module: str, func: str, kwargs: dict | None = None, *, threads: int | None = None,
                     timeout: float | None = None, preload: tuple[str, ...] = ()) -> dict:
    """Run `module.func(**kwargs)` (JSON in, JSON out) in a new interpreter with
    thread pools capped at `threads`. Returns {"result", "seconds" (the call
    alone, imports excluded), "peak_rss_mb" (the child's VmHWM), "rss_before_mb"
    (after imports, before the call), "threads"}. `preload`: modules imported
    before the call (the script itself keeps its imports light for render.py).
    A failing child raises with its stderr, so a broken benchmark never writes a number."""
    code = _CHILD.format(paths=[str(ROOT), str(ROOT / "benchmarks")], module=module, func=func,
                         preload=tuple(preload))
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(kwargs or {})], env=thread_env(threads),
                          capture_output=True, text=True, timeout=timeout)
    marker = proc.stdout.rfind("@@RESULT@@")
    if proc.returncode != 0 or marker < 0:
        raise RuntimeError(f"{module}.{func} failed in a fresh process (exit {proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout[marker + len("@@RESULT@@"):])
    out["peak_rss_mb"] = round(out["peak_rss_mb"], 1)
    out["rss_before_mb"] = round(out["rss_before_mb"], 1)
    out["threads"] = threads
    return out


def repeated_in_fresh_processes(sides: dict[str, tuple[str, str, dict]], *, repeats: int, warmup: int,
                                threads: int | None, preload: tuple[str, ...] = ()) -> dict:
    """side_by_side, each run in its own process (module, func, kwargs per side):
    the timing is the call's, the memory the worst run's peak. Returns
    {side: summary + peak_rss_mb + rss_before_mb + result (last run)}."""
    runs: dict[str, list[dict]] = {n: [] for n in sides}
    warm: dict[str, list[dict]] = {n: [] for n in sides}
    names = list(sides)
    for _ in range(warmup):
        for n in names:
            warm[n].append(in_fresh_process(*sides[n], threads=threads, preload=preload))
    for r in range(repeats):
        for n in (names if r % 2 == 0 else names[::-1]):
            runs[n].append(in_fresh_process(*sides[n], threads=threads, preload=preload))
    out = {}
    for n in names:
        s = summary([x["seconds"] for x in runs[n]], [x["seconds"] for x in warm[n]])
        s["peak_rss_mb"] = max(x["peak_rss_mb"] for x in runs[n])
        s["rss_before_mb"] = max(x["rss_before_mb"] for x in runs[n])
        s["threads"] = threads
        s["result"] = runs[n][-1]["result"]
        out[n] = s
    return out


# ---------------------------------------------------------------- provenance and results

def git_state() -> dict:
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.rstrip("\n")
    commit = git("rev-parse", "HEAD").strip()
    # result files are tracked and rewritten by `make bench` itself: they are not changes to the measured code
    changed = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()
               if not line[3:].startswith("benchmarks/results/")]
    return {"commit": commit or None, "dirty": bool(changed), "changed_files": changed[:20]}


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        return None


def environment() -> dict:
    """Machine, versions, git state and thread settings of this run."""
    versions = {}
    for p in PACKAGES:
        with contextlib.suppress(_md.PackageNotFoundError):  # a peer not installed here
            versions[p] = _md.version(p)
    mem = None
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:  # not Linux: memory left unknown
        mem = round(int(next(line for line in f if line.startswith("MemTotal")).split()[1]) / 2**20, 1)
    return {
        "machine": {"cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)), "cpu_model": _cpu_model(),
                    "memory_gib": mem, "platform": platform.platform(), "python": platform.python_version()},
        "versions": versions,
        "git": git_state(),
        "thread_env": {v: os.environ[v] for v in THREAD_VARS if v in os.environ},
    }


def write_result(name: str, payload: dict, args: argparse.Namespace) -> Path:
    """Write `<out>/<name>.json` atomically with the provenance every result carries."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": name,
           "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "argv": [Path(sys.argv[0]).name, *sys.argv[1:]],
           "quick": bool(args.quick), "repeats": args.repeats, "warmup": args.warmup,
           "environment": environment(), **payload}
    path = out / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
    print(f"wrote {path}")
    return path


def load_result(name: str, results: Path = RESULTS) -> dict | None:
    path = Path(results) / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


# ---------------------------------------------------------------- cost against size

def loglog_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y on log x: 1 = linear, 0 = flat, 2 = quadratic."""
    import numpy as np

    lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    return round(float(np.polyfit(lx, ly, 1)[0]), 3)


def plot_loglog(path: Path, series: dict[str, tuple[list[float], list[float]]], *, xlabel: str, ylabel: str,
                title: str) -> Path:
    """One log-log panel, a line per series with its slope in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, (xs, ys) in series.items():
        ax.loglog(xs, ys, marker="o", label=f"{name} (slope {loglog_slope(xs, ys):.2f})")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


# ---------------------------------------------------------------- markdown for render.py

def num(x: float | int | None, digits: int = 3) -> str:
    """3 significant digits, thin grouping for large numbers: 31 923, 4.28, 0.012."""
    if x is None:
        return "–"
    if isinstance(x, int) or (abs(x) >= 1000 and float(x).is_integer()) or abs(x) >= 10 ** digits:
        return f"{round(x):,}".replace(",", " ")
    if x == 0:
        return "0"
    return f"{x:.{digits}g}"


def seconds(s: float | None) -> str:
    if s is None:
        return "–"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s"


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A markdown table; cells are str()'d."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def provenance(result: dict) -> str:
    """One line: when, where, which commit, how many repeats."""
    env = result.get("environment", {})
    m = env.get("machine", {})
    git = env.get("git", {})
    commit = (git.get("commit") or "unknown")[:10] + (" + local changes" if git.get("dirty") else "")
    n = result.get("repeats")
    reps = f"{n} timed run{'s' if n != 1 else ''} per side after {result.get('warmup')} warm-up"
    if result.get("quick"):
        reps += " (**--quick smoke size, not the reference numbers**)"
    return (f"*Measured {result.get('date', '?')[:10]} on {m.get('usable_cpus', '?')} CPUs "
            f"({m.get('cpu_model') or 'unknown CPU'}), Python {m.get('python', '?')}, commit {commit}; {reps}; "
            f"command `{' '.join(result.get('argv', []))}`; "
            f"file `{'benchmarks/results/quick' if result.get('quick') else 'benchmarks/results'}/"
            f"{result.get('benchmark')}.json`.*")
