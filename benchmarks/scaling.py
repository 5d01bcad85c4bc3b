"""Cost against size for every data stage: wall time, peak RSS and disk of
download, prepare, dedup, vocab, sampling and shards at three corpus sizes
spanning 10x, each stage run the way a user runs it (one `xylent run STAGE` in
a fresh process, everything upstream already published), with the log-log
slope, what 100x more data would cost by it, and each stage's MB/s per core
beside the one-core floor that bounds it (`xz -dc` and unzip, reading the Parquet
parts the stage reads).

The corpus (benchmarks/corpus.py, generated as a stream, then served over HTTP
from 127.0.0.1 by a thread of this process, so the download stage runs its real
HTTP code): CC-100-layout `.txt.xz` files in 10 languages of 8 scripts whose
sizes follow a Zipf law (the largest ~40 % of the text), and OPUS-layout moses
zips for all 45 pairs, PAIRS_PER_MB rows per MB of monolingual text (20 M pairs
beside 2 GB). A size is MB of *monolingual* text; the tables' sizes are all the text,
bitext included (about 2.6x). The spec is every stage's defaults (`prepare.part_rows` included,
so that the largest languages span many parts at the larger sizes) except a
small vocab grid (1k/2k/4k pieces, budget 16k, `input_sentence_size` 5 000 so
that the cap binds within the sizes measured) and `runner.max_workers` =
`--threads`.

Per size and repeat a fresh workspace; per stage one process
(`harness.in_fresh_process` -> `run_stage` -> `xylent.cli.main`, the CLI
preloaded before the clock starts): the stage's own time (its manifest's
`seconds`), the command's time, the process's wall time (with Python's start-up
and the CLI's imports) and its peak RSS (VmHWM). Then `xylent run shards` again
with every stage cached: the fixed cost of a command. Sizes run ascending on
odd repeats and descending on even ones; every run is kept. One Prefect API
server (Prefect's test harness, or --prefect-api-url's: a separate process, in no
command's memory or time) and one MLflow sqlite store (created before the first timed command)
serve every command, as a user's running `prefect server start` would; the
start-up of Prefect's ephemeral server, which a command without PREFECT_API_URL
pays, is measured apart (the second of two runs with a fresh PREFECT_HOME).

Sampling reads per-language counts only, so its cost follows the number of
languages and pairs, not the text: it is also measured against L = 30 ... 1000
with the stage's computation and output (`build_tables`, `write_output`; one
fresh process per L).

    .venv/bin/python benchmarks/scaling.py            # full: 190 MB, 600 MB, 2 GB x 3 repeats; hours on 2 cores
    .venv/bin/python benchmarks/scaling.py --quick    # smoke: 0.1 MB, 1 repeat, one process, no slope; ~1 min
    .venv/bin/python benchmarks/scaling.py --sizes-mb 19 60 200 --part-rows 20000 --languages 30 100

--quick runs every command in one process (one start-up instead of one per command) and
resets its peak RSS before each, so a quick peak also counts what earlier
commands kept: its memory figures are a smoke test, not a measurement.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import corpus  # noqa: E402
import harness  # noqa: E402

STAGES = ("download", "prepare", "dedup", "vocab", "sampling", "shards")
FULL_SIZES_MB = (190.0, 600.0, 2000.0)  # of monolingual text, spanning > 10x; the bitext beside it (PAIRS_PER_MB)
QUICK_SIZES_MB = (0.1,)  # the smallest size alone: a smoke run checks that every command runs, not slopes
FULL_LANGUAGES = (30, 100, 300, 1000)
QUICK_LANGUAGES = (10, 30)

PAIRS_PER_MB = 10_000  # bitext rows per MB of monolingual text: 20 M pairs beside 2 GB, as the issue sizes it


FULL_CORPUS_LANGUAGES, QUICK_CORPUS_LANGUAGES = len(corpus.SCRIPTS), 4  # the smoke run's: the four largest


def corpus_folder(tmp: Path, mono_mb: float) -> Path:
    return tmp / "corpus" / f"{mono_mb:g}mb"


def make_corpus(folder: Path, mono_mb: float, langs: list[str]) -> dict:
    """``mono_mb`` MB of CC-100-layout text over ``langs`` with Zipf sizes and ``PAIRS_PER_MB``
    bitext rows per MB of it for every pair of them (benchmarks/corpus.py)."""
    return corpus.make_corpus(folder, mono_mb, mono_mb * PAIRS_PER_MB / 1e6, langs=langs)


@contextlib.contextmanager
def serve(folder: Path):
    """Serve ``folder`` over HTTP on 127.0.0.1 (a thread of this process); yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        return None


def bench_spec(base: str, *, quick: bool, workers: int, langs: list[str], part_rows: int | None = None) -> dict:
    """The spec every size runs: the stages' defaults except where noted."""
    vocab = ({"grid": [200, 400], "budget": 3000, "input_sentence_size": 300, "held_sentences": 50} if quick else
             {"grid": [1000, 2000, 4000], "budget": 16000, "input_sentence_size": 5000, "held_sentences": 1000})
    return {
        "name": "scaling",
        "languages": sorted(langs),
        "sources": [
            {"name": "cc100", "kind": "cc100", "languages": sorted(langs),
             "url_template": f"{base}/{corpus.MONO_FILE}"},
            {"name": "bitext", "kind": "opus", "corpus": corpus.OPUS_CORPUS, "version": corpus.OPUS_VERSION,
             "pairs": sorted(corpus.pair_shares(langs)), "url_template": f"{base}/{corpus.MOSES_FILE}"},
        ],
        "runner": {"kind": "threads", "max_workers": workers},
        "tracking": {"experiment": "scaling"},
        "vocab": {**vocab, "character_coverage": 0.9995},
        **({"prepare": {"part_rows": part_rows}} if part_rows else {}),
    }


# ---------------------------------------------------------------- measuring

CLI = ("xylent.cli",)  # preloaded in every command's process: its import is start-up, not the command


def folder_bytes(root: Path, seen: set | None = None) -> int:
    """Disk held by the regular files under ``root``: their allocated blocks, each file once however many
    hard links name it (download and prepare link their units into their output), links not followed,
    files vanishing meanwhile skipped. ``seen``: (device, inode) pairs counted already, shared by callers
    that add up several folders."""
    seen = set() if seen is None else seen
    total, stack = 0, [str(root)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    if (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        total += st.st_blocks * 512
            except OSError:
                pass
    return total


class DiskWatch:
    """The disk held under some folders before, during (polled by a thread, the peak) and after a command:
    what it left written and the most it held at once, its scratch files included. Run it in the process
    that waits for the command, not in the command's: the walks would take its CPU and count in its RSS."""

    def __init__(self, roots: list[Path], interval: float = 0.5):
        self.roots, self.interval, self.stop = roots, interval, threading.Event()

    def size(self) -> int:
        seen: set = set()
        return sum(folder_bytes(r, seen) for r in self.roots)

    def __enter__(self):
        self.before = self.peak = self.size()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self):
        while not self.stop.wait(self.interval):
            self.peak = max(self.peak, self.size())

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.after = self.size()
        self.peak = max(self.peak, self.after)

    def record(self) -> dict:
        return {"written_mb": round((self.after - self.before) / 1e6, 3),
                "peak_disk_mb": round((self.peak - self.before) / 1e6, 3)}


def disk_roots(workspace: Path) -> list[Path]:
    """Where a command may write: its workspace and the temporary folder (`_isolate` points TMPDIR at a
    folder of the benchmark's own; read from the environment, as tempfile caches the first one it saw)."""
    return [Path(workspace), Path(os.environ.get("TMPDIR") or tempfile.gettempdir())]


def run_stage(stage: str, spec: str, workspace: str, watch_disk: bool = False) -> dict:
    """`xylent run STAGE --spec SPEC --workspace WS --json` in this process, as a user runs it.
    Returns whether the stage was cached (and its upstream), its manifest's seconds and metrics,
    its output folder and size; ``watch_disk`` (the quick path, where no other process waits for
    it): also the disk it wrote, left behind and at its peak."""
    from xylent.cli import main as cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), (DiskWatch(disk_roots(Path(workspace))) if watch_disk
                                           else contextlib.nullcontext()) as disk:
        rc = cli(["run", stage, "--spec", spec, "--workspace", workspace, "--json"])
    if rc != 0:
        raise RuntimeError(f"xylent run {stage} exited {rc}:\n{out.getvalue()[-3000:]}")
    stages = json.loads(out.getvalue())["stages"]
    output = Path(stages[stage]["output_dir"])
    manifest = json.loads((output / "_manifest.json").read_text())
    return {"cached": stages[stage]["cached"],
            "upstream_cached": all(r["cached"] for s, r in stages.items() if s != stage),
            "manifest_seconds": manifest["seconds"], "metrics": manifest.get("metrics", {}),
            "output_dir": str(output), "output_mb": round(folder_bytes(output) / 1e6, 3),
            **(disk.record() if watch_disk else {})}


def _read_parts(output: Path) -> tuple[float, int, int]:
    """Seconds to read every text part a stage wrote (``mono/`` and ``bitext/``), its rows, its parts."""
    import pyarrow.parquet as pq

    t, rows, parts = time.perf_counter(), 0, 0
    for f in sorted([*output.glob("mono/**/*.parquet"), *output.glob("bitext/**/*.parquet")]):
        rows += pq.read_table(f).num_rows
        parts += 1
    return time.perf_counter() - t, rows, parts


def floors(folder: str, prepared: str, deduped: str) -> dict:
    """What bounds the data stages on one core here, at one size: `xz -dc` of every CC-100 file and a
    read of every bitext zip's members (the decompression prepare must do), a read of every Parquet part
    prepare wrote (what dedup must read at least) and of every part dedup wrote (what shards must read)."""
    import pyarrow.parquet as pq

    folder = Path(folder)
    first = next(Path(prepared).glob("mono/**/*.parquet"), None)
    if first is not None:  # untimed: pyarrow's first read pays for its thread pool and readers
        pq.read_table(first)
    t = time.perf_counter()
    for f in sorted((folder / "cc100").glob("*.txt.xz")):
        subprocess.run(["xz", "-dc", "-T1", str(f)], stdout=subprocess.DEVNULL, check=True)
    xz_s = time.perf_counter() - t
    t = time.perf_counter()
    for f in sorted(folder.glob("opus/**/*.zip")):
        with zipfile.ZipFile(f) as zf:
            for name in zf.namelist():
                with zf.open(name) as member:
                    while member.read(8 << 20):
                        pass
    unzip_s = time.perf_counter() - t
    prepared_s, rows, parts = _read_parts(Path(prepared))
    deduped_s, _, _ = _read_parts(Path(deduped))
    return {"xz_s": round(xz_s, 4), "unzip_s": round(unzip_s, 4), "prepared_parts_s": round(prepared_s, 4),
            "deduped_parts_s": round(deduped_s, 4), "parquet_rows": rows, "parquet_parts": parts}


def prime_mlflow(uri: str) -> int:
    """Create the MLflow store's schema once, so no timed command pays for it."""
    from mlflow import MlflowClient

    return len(MlflowClient(tracking_uri=uri).search_experiments())


def in_sequence(calls: list[list]) -> list[dict]:
    """``[function name, kwargs]`` calls of this module one after the other in this
    process (the --quick path: one start-up for all), its peak RSS reset (Linux
    clear_refs) before each: a call's peak then still counts what earlier calls kept."""
    out = []
    for name, kwargs in calls:
        reset = harness.reset_peak_rss()
        before = harness.vm_rss_mb()
        t = time.perf_counter()
        result = globals()[name](**kwargs)
        out.append({"result": result, "seconds": time.perf_counter() - t, "peak_rss_mb": round(harness.vm_hwm_mb(), 1),
                    "rss_before_mb": round(before, 1), "peak_reset": reset})
    return out

def _record(r: dict, process_s: float | None) -> dict:
    res = r["result"]
    return {"process_s": None if process_s is None else round(process_s, 4), "command_s": round(r["seconds"], 4),
            "stage_s": res["manifest_seconds"], "peak_rss_mb": r["peak_rss_mb"], "rss_before_mb": r["rss_before_mb"],
            "cached": res["cached"], "upstream_cached": res["upstream_cached"], "metrics": res["metrics"],
            **{k: res[k] for k in ("output_dir", "output_mb", "written_mb", "peak_disk_mb")}}


def _command(stage: str, spec: Path, ws: Path, threads: int) -> dict:
    """One `xylent run STAGE` in a fresh process: the whole process's wall time, the
    command's (imports excluded), the stage's own (its manifest's `seconds`: the body,
    without the Prefect/MLflow records around it) and the process's peak RSS."""
    with DiskWatch(disk_roots(ws)) as disk:
        t = time.perf_counter()
        r = harness.in_fresh_process("scaling", "run_stage", {"stage": stage, "spec": str(spec), "workspace": str(ws)},
                                     threads=threads, preload=CLI)
        elapsed = time.perf_counter() - t
    r["result"].update(disk.record())
    return _record(r, elapsed)


def _pass_calls(spec: Path, ws: Path) -> list[tuple[str, Path, Path]]:
    """Every data stage once, in pipeline order, then `xylent run shards` again with
    everything cached (the fixed cost of a command)."""
    return [(stage, spec, ws) for stage in STAGES] + [("shards", spec, ws)]


def _checked(records: list[dict]) -> dict:
    """A pass's records by stage; fails loudly unless every stage was computed over a
    cached upstream and the rerun was a cache hit."""
    out = dict(zip((*STAGES, "cached_rerun"), records))
    for stage in STAGES:
        if out[stage]["cached"] or not out[stage]["upstream_cached"]:
            raise RuntimeError(f"{stage}: expected a computed stage over a cached upstream, got {out[stage]}")
    if not out["cached_rerun"]["cached"]:
        raise RuntimeError(f"the rerun of shards was not a cache hit: {out['cached_rerun']}")
    return out


def run_pass(spec: Path, ws: Path, threads: int) -> dict:
    """A pass, each command in its own process (the full path)."""
    return _checked([_command(*call, threads) for call in _pass_calls(spec, ws)])


def ephemeral_prefect(spec: Path, ws: Path, threads: int, home: Path) -> dict:
    """The cached rerun once more without PREFECT_API_URL: the command starts Prefect's
    ephemeral server itself (a subprocess whose memory is not the command's)."""
    saved = {k: os.environ.pop(k) for k in ("PREFECT_API_URL",) if k in os.environ}
    os.environ["PREFECT_HOME"] = str(home)
    try:
        r = _command("shards", spec, ws, threads)
    finally:
        os.environ.pop("PREFECT_HOME", None)
        os.environ.update(saved)
    return {k: r[k] for k in ("process_s", "command_s", "peak_rss_mb", "cached")}


def sampling_tables(languages: int, repeats: int = 1, seed: int = 0) -> dict:
    """The sampling stage's work on L languages, ``repeats`` times: its computation
    (`build_tables`: alpha-smoothing, Sinkhorn P*, M2M LP, temperature table, diagnostics),
    then its output (`write_output`: Parquet tables, heatmaps, report) into a temporary
    folder. Counts: log-normal example counts, a pair with data for 30 % of the language
    pairs (and for neighbours, so none is isolated)."""
    from xylent.tasks.sampling import build_tables
    from xylent.tasks.sampling.run import write_output
    from xylent.spec import SamplingConfig

    cfg = SamplingConfig()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "warm").mkdir()
        # once untimed: the first call pays for imports inside the solvers and matplotlib
        write_output(build_tables({"a": 3, "b": 2, "c": 1}, {("a", "b"): 3, ("a", "c"): 2, ("b", "c"): 1}, cfg),
                     cfg, Path(tmp) / "warm")
        rng = np.random.default_rng(seed)
        names = [f"l{i:04d}" for i in range(languages)]
        mono = np.exp(rng.normal(13, 2, languages))
        present = np.triu(rng.random((languages, languages)) < 0.3, k=1)
        present[np.arange(languages - 1), np.arange(1, languages)] = True
        i, j = np.nonzero(present)
        pairs = np.sqrt(mono[i] * mono[j]) * np.exp(rng.normal(-2, 1, len(i)))
        mono_counts = {n: int(m) + 1 for n, m in zip(names, mono)}
        pair_counts = {(names[a], names[b]): int(c) + 1 for a, b, c in zip(i, j, pairs)}
        runs, output_runs = [], []
        for r in range(repeats):
            t = time.perf_counter()
            tables = build_tables(mono_counts, pair_counts, cfg)
            t1 = time.perf_counter()
            (Path(tmp) / f"out{r}").mkdir()
            write_output(tables, cfg, Path(tmp) / f"out{r}")
            runs.append(t1 - t)
            output_runs.append(time.perf_counter() - t1)
    return {"seconds": runs, "output_seconds": output_runs, "pairs": int(len(i)),
            "max_marginal_error": tables.metrics.get("max_marginal_error.star")}


# ---------------------------------------------------------------- memory bounds

# Each stage's stated bound on its peak RSS above the CLI's own, which is the peak of a command that does
# no stage work (the cached rerun at the same size: imports, Prefect's flow run, MLflow's runs);
# docs/stages/<stage>.md gives the same numbers, a test holds them equal. FIXED MB, plus PER_PART times
# the text of the largest part for each of the command's `threads` (a runner task per thread, each
# holding one part). Download streams, prepare
# holds a few 8 MB blocks, vocab its capped sample and sampling counts, so theirs is FIXED alone.
MEMORY_BOUNDS = {"download": (150, 0), "prepare": (350, 0), "dedup": (450, 6), "vocab": (450, 0),
                 "sampling": (250, 0), "shards": (350, 4)}
FLAT_SLOPE = 0.1  # the most a peak above the CLI's may grow with the text once the largest group spans parts


def _group_part(size: dict, prepare_metrics: dict, part_rows: int, name: str) -> dict:
    """One group's (language's or pair's) rows, parts and the MB of text in a full part of it (``part_rows``
    of its mean row, at most prepare's cap)."""
    cap = _part_cap_mb() * 1e6
    rows = prepare_metrics.get(f"mono.rows.{name}", prepare_metrics.get(f"bitext.rows.{name}", 0))
    text = size["files"][name]["text_bytes"]
    per_row = text / max(rows, 1)
    return {"group": name, "rows": rows, "parts": max(-(-rows // part_rows), int(-(-text // cap))),
            "part_mb": round(min(min(rows, part_rows) * per_row, cap) / 1e6, 3)}


def largest_parts(size: dict, prepare_metrics: dict, part_rows: int) -> dict:
    """The group with the most rows at one size (the one a cluster must split): its parts and part MB."""
    groups = [_group_part(size, prepare_metrics, part_rows, name) for name in size["files"]]
    return max(groups, key=lambda g: g["rows"])


def biggest_part(size: dict, prepare_metrics: dict, part_rows: int) -> dict:
    """The group whose full part holds the most text at one size, what sets the stages' memory (each
    thread holds a part): not the group with the most rows, as a part of Hindi holds ~2.7x the bytes
    of a part of English."""
    groups = [_group_part(size, prepare_metrics, part_rows, name) for name in size["files"]]
    return max(groups, key=lambda g: g["part_mb"])


def memory_checks(sizes: list[dict], stages: dict, knobs: dict, threads: int) -> dict:
    """Per stage: its peak above the CLI's at each size beside its bound, and the log-log slope of that
    peak over the sizes at which the biggest part is full (flat: at most FLAT_SLOPE): its group spans several
    parts and the part holds what it holds at the largest size (within 10 %), so that more text there adds
    parts, not bytes to a part."""
    biggest = [biggest_part(size, stages["prepare"][k]["metrics"], knobs["prepare.part_rows"])
               for k, size in enumerate(sizes)]
    full = [k for k, g in enumerate(biggest) if g["parts"] >= 2 and g["part_mb"] >= 0.9 * biggest[-1]["part_mb"]]
    cli = [r["peak_rss_mb"]["median"] for r in stages["cached_rerun"]]
    out = {"biggest_part": biggest, "full_part_sizes": full, "flat_slope": FLAT_SLOPE, "cli_rss_mb": cli,
           "stages": {}}
    for stage, (fixed, per_part) in MEMORY_BOUNDS.items():
        own = [round(r["own_rss_mb"]["max"], 1) for r in stages[stage]]
        bound = [round(fixed + per_part * threads * g["part_mb"], 1) for g in biggest]
        slope = (harness.loglog_slope([sizes[k]["text_mb"] for k in full], [max(own[k], 1.0) for k in full])
                 if len(full) >= 2 else None)
        out["stages"][stage] = {"own_rss_mb": own, "bound_mb": bound, "within": all(o <= b for o, b in zip(own, bound)),
                                "slope": slope, "flat": None if slope is None else slope <= FLAT_SLOPE}
    return out


# ---------------------------------------------------------------- the run

def _isolate(tmp: Path) -> str:
    """Nothing reaches the user's Prefect or MLflow: their variables are dropped, one
    MLflow sqlite store and one Prefect home under ``tmp`` serve every command."""
    for name in [n for n in os.environ if n.startswith(("MLFLOW_", "PREFECT_"))]:
        del os.environ[name]
    uri = f"sqlite:///{tmp}/mlflow.db"
    (tmp / "scratch").mkdir()
    os.environ.update({"MLFLOW_TRACKING_URI": uri, "TMPDIR": str(tmp / "scratch"), "PREFECT_HOME": str(tmp / "prefect-home"),
                       "PREFECT_LOGGING_LEVEL": "WARNING", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    return uri


def _floors(tmp: Path, mb: float, done: dict) -> dict:
    """floors() in a fresh process of one thread, over a pass's outputs (``done``): the one-core bound
    beside each stage."""
    return harness.in_fresh_process("scaling", "floors", {
        "folder": str(corpus_folder(tmp, mb)), "prepared": done["prepare"]["output_dir"],
        "deduped": done["dedup"]["output_dir"]}, threads=1)["result"]


def _spread(values: list[float | None]) -> dict | None:
    if any(v is None for v in values):
        return None
    return {"runs": [round(v, 4) for v in values], "n": len(values), "best": round(min(values), 4),
            "median": round(float(np.median(values)), 4), "max": round(max(values), 4)}


def _summarise(size_rows: list[dict], passes: dict[int, list[dict]]) -> dict:
    """Per stage and size: every run's times and memory, best/median/max."""
    stages = {}
    for stage in (*STAGES, "cached_rerun"):
        rows = []
        for k, size in enumerate(size_rows):
            runs = [p[stage] for p in passes[k]]
            rows.append({"target_mb": size["target_mb"], "text_mb": size["text_mb"],
                         **{key: _spread([r[key] for r in runs])
                            for key in ("stage_s", "command_s", "process_s", "peak_rss_mb", "rss_before_mb",
                                        "output_mb", "written_mb", "peak_disk_mb")},
                         # above the CLI's own: the same pass's cached rerun, a command that does no stage work;
                         # --quick runs every command in one process (process_s None), where a command's peak is
                         # reset before it and the rerun's holds what earlier commands kept: above its start there
                         "own_rss_mb": _spread([max(r["peak_rss_mb"] - (r["rss_before_mb"] if r["process_s"] is None
                                                                        else p["cached_rerun"]["peak_rss_mb"]), 0.0)
                                                for r, p in zip(runs, passes[k])]),
                         "metrics": runs[0]["metrics"]})
        stages[stage] = rows
    return stages


def _slopes(rows: list[dict]) -> dict:
    """Log-log slopes against text size: of the median stage time, the median command time,
    the worst peak RSS and the worst peak above the CLI's own; plus segment slopes."""
    xs = [r["text_mb"] for r in rows]
    out = {}
    for key, stat, floor in (("stage_s", "median", 1e-3), ("command_s", "median", 1e-3),
                             ("peak_rss_mb", "max", 1.0), ("own_rss_mb", "max", 1.0)):
        ys = [max(r[key][stat], floor) for r in rows]
        out[key] = harness.loglog_slope(xs, ys)
        out[key + "_segments"] = [harness.loglog_slope(xs[i:i + 2], ys[i:i + 2]) for i in range(len(xs) - 1)]
    return out


def _progress(mb: float, rep: int, done: dict) -> None:
    print(f"{mb:g} MB, repeat {rep + 1}: " + ", ".join(
        f"{s} {done[s]['stage_s']:.2f} s / {done[s]['peak_rss_mb']:.0f} MB" for s in STAGES), flush=True)


def _quick(specs: list[Path], tmp: Path, languages: list[int], threads: int) -> tuple[dict, dict, dict]:
    """--quick: every command and every sampling table in one fresh process (one start-up
    instead of one per command), the peak RSS reset before each; an untimed download into
    a throwaway workspace first (it creates the MLflow store and warms the process up)."""
    calls = [["run_stage", {"stage": "download", "spec": str(specs[0]), "workspace": str(tmp / "ws-warmup")}]]
    calls += [["run_stage", {"stage": stage, "spec": str(spec), "workspace": str(ws), "watch_disk": True}]
             for k, s in enumerate(specs) for stage, spec, ws in _pass_calls(s, tmp / f"ws-{k}-0")]
    calls += [["sampling_tables", {"languages": n}] for n in languages]
    t = time.perf_counter()
    rows = harness.in_fresh_process("scaling", "in_sequence", {"calls": calls}, threads=threads,
                                    preload=CLI)["result"][1:]
    per = len(STAGES) + 1
    passes = {k: [_checked([_record(r, None) for r in rows[k * per:(k + 1) * per]])] for k in range(len(specs))}
    for k, mb in enumerate(specs):
        _progress(float(mb.stem.removeprefix("spec-").removesuffix("mb")), 0, passes[k][0])
    sampling = dict(zip(languages, rows[len(specs) * per:]))
    return passes, sampling, {"process_s": round(time.perf_counter() - t, 3),
                              "peak_reset": all(r["peak_reset"] for r in rows)}


def _knobs(spec: dict) -> dict:
    """The effective values of the knobs that bound a stage's memory or work."""
    from xylent.spec import DedupConfig, PrepareConfig, ShardsConfig, VocabConfig

    prepare = PrepareConfig(**spec.get("prepare", {}))
    dedup, vocab, shards = DedupConfig(), VocabConfig(**spec["vocab"]), ShardsConfig()
    return {"prepare.part_rows": prepare.part_rows, "dedup.buckets": dedup.buckets,
            "dedup.near_level": dedup.near_level, "dedup.langid": dedup.langid,
            "vocab.input_sentence_size": vocab.input_sentence_size, "vocab.held_sentences": vocab.held_sentences,
            "vocab.held_fraction": vocab.held_fraction, "vocab.grid": vocab.grid, "vocab.budget": vocab.budget,
            "vocab.threads_per_model": vocab.threads_per_model, "shards.seq_len": shards.seq_len}


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, warmup=0)
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=None,
                    help=f"corpus sizes, MB of monolingual text, {PAIRS_PER_MB} bitext pairs beside each MB "
                    f"(default {' '.join(map(str, FULL_SIZES_MB))}; "
                    f"quick {' '.join(map(str, QUICK_SIZES_MB))})")
    ap.add_argument("--languages", type=int, nargs="+", default=None,
                    help=f"sampling: numbers of languages (default {FULL_LANGUAGES}, quick {QUICK_LANGUAGES})")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="thread pools of every command and runner.max_workers (default: the usable cores)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary corpus and workspaces")
    ap.add_argument("--corpus-languages", type=int, default=None, choices=range(2, len(corpus.SCRIPTS) + 1),
                    metavar="N", help=f"the corpus's N largest languages (default {FULL_CORPUS_LANGUAGES}, quick "
                    f"{QUICK_CORPUS_LANGUAGES}; at most {len(corpus.SCRIPTS)})")
    ap.add_argument("--part-rows", type=int, default=None,
                    help="prepare.part_rows (default: the stage's own, so that memory is measured at the defaults)")
    harness.add_prefect_api_flag(ap)
    args = harness.finish_args(ap.parse_args(argv))
    sizes = sorted(args.sizes_mb or (QUICK_SIZES_MB if args.quick else FULL_SIZES_MB))
    languages = sorted(args.languages or (QUICK_LANGUAGES if args.quick else FULL_LANGUAGES))
    langs = list(corpus.SCRIPTS)[:args.corpus_languages or (QUICK_CORPUS_LANGUAGES if args.quick else
                                                              FULL_CORPUS_LANGUAGES)]
    if not args.quick and (len(sizes) < 3 or sizes[-1] / sizes[0] < 10):
        raise SystemExit(f"--sizes-mb {sizes}: at least 3 sizes spanning 10x are needed for a slope")

    tmp = Path(tempfile.mkdtemp(prefix="xylent-scaling-"))
    saved_env = dict(os.environ)
    try:
        uri = _isolate(tmp)
        t0 = time.perf_counter()
        size_rows = []
        for mb in sizes:
            made = make_corpus(corpus_folder(tmp, mb), mb, langs)
            size_rows.append({"target_mb": mb, **made})
            print(f"corpus {mb:g} MB of monolingual text + {made['bitext_pairs']} pairs: {made['text_mb']} MB of "
                  f"text, {made['file_mb']} MB of files", flush=True)
        generate_s = time.perf_counter() - t0
        span = size_rows[-1]["text_mb"] / size_rows[0]["text_mb"]
        if span < 10 and not args.quick:
            raise SystemExit(f"the generated text spans only {span:.1f}x ({size_rows[0]['text_mb']} to "
                             f"{size_rows[-1]['text_mb']} MB): widen --sizes-mb so a slope covers 10x")

        passes: dict[int, list[dict]] = {k: [] for k in range(len(sizes))}
        warmups: list[dict] = []
        ephemeral, sequence = None, None
        with harness.prefect_api(args.prefect_api_url), serve(tmp / "corpus") as base:
            specs = []
            for mb in sizes:
                spec = bench_spec(f"{base}/{mb:g}mb", quick=args.quick, workers=args.threads, langs=langs,
                                  part_rows=args.part_rows)
                specs.append(tmp / f"spec-{mb:g}mb.yaml")
                specs[-1].write_text(json.dumps(spec, indent=1))  # YAML reads JSON
            floor_rows: dict[int, dict] = {}
            if args.quick:
                passes, sampling_runs, sequence = _quick(specs, tmp, languages, args.threads)
                floor_rows = {k: _floors(tmp, sizes[k], passes[k][0]) for k in range(len(sizes))}
            else:
                harness.in_fresh_process("scaling", "prime_mlflow", {"uri": uri})
                for w in range(args.warmup):  # untimed: the smallest size, whole passes
                    warmups.append(run_pass(specs[0], tmp / f"ws-warmup-{w}", args.threads))
                    shutil.rmtree(tmp / f"ws-warmup-{w}")
                for rep in range(args.repeats):
                    order = range(len(sizes)) if rep % 2 == 0 else reversed(range(len(sizes)))
                    for k in order:
                        ws = tmp / f"ws-{k}-{rep}"
                        passes[k].append(run_pass(specs[k], ws, args.threads))
                        _progress(sizes[k], rep, passes[k][-1])
                        if k not in floor_rows:
                            floor_rows[k] = _floors(tmp, sizes[k], passes[k][-1])
                        if k or rep < args.repeats - 1:
                            shutil.rmtree(ws)
                ephemeral = [ephemeral_prefect(specs[0], tmp / f"ws-0-{args.repeats - 1}", args.threads,
                                               tmp / "prefect-ephemeral") for _ in range(2)]
        if not args.quick:  # one process per L, its repeats inside
            sampling_runs = {n: harness.in_fresh_process("scaling", "sampling_tables",
                                                         {"languages": n, "repeats": args.repeats},
                                                         threads=args.threads) for n in languages}
        sampling = []
        for n, run in sampling_runs.items():
            res = run["result"]
            sampling.append({"languages": n, "pairs": res["pairs"], "max_marginal_error": res["max_marginal_error"],
                             "seconds": _spread(res["seconds"]), "output_seconds": _spread(res["output_seconds"]),
                             "peak_rss_mb": run["peak_rss_mb"], "rss_before_mb": run["rss_before_mb"]})
            print(f"sampling, L = {n}: {sampling[-1]['seconds']['median']:.3f} s", flush=True)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    stages = _summarise(size_rows, passes)
    shown = bench_spec("http://127.0.0.1:PORT", quick=args.quick, workers=args.threads, langs=langs,
                       part_rows=args.part_rows)
    payload = {
        "method": ("quick: every command in one process, its peak RSS reset before each" if args.quick else
                   "one `xylent run STAGE` per fresh process, upstream cached; a fresh workspace per size and "
                   "repeat; sizes ascending on the 1st, 3rd ... repeat, descending on the others"),
        "one_process": sequence,
        "threads": args.threads, "runner_workers": args.threads,
        "thread_note": "every command's thread pools (OMP, MKL, OpenBLAS, polars, rayon, XYLENT_THREADS) capped at "
                       "`threads`; runner.kind threads with max_workers = `threads`; SentencePiece trainer "
                       "threads_per_model = 1 (the default)",
        "spec": shown, "knobs": _knobs(shown), "generate_seconds": round(generate_s, 2),
        "sizes": size_rows,
        "floors": [floor_rows[k] for k in range(len(sizes))],
        "stages": stages,
        "slopes": {s: _slopes(stages[s]) for s in (*STAGES, "cached_rerun")} if len(sizes) > 1 else None,
        "memory": memory_checks(size_rows, stages, _knobs(shown), args.threads),
        "warmup_passes": [{s: {k: p[s][k] for k in ("process_s", "command_s", "stage_s", "peak_rss_mb")} for s in p}
                          for p in warmups],
        "ephemeral_prefect": ephemeral,
        "sampling_vs_languages": {"rows": sampling,
                                  "slope_time": harness.loglog_slope([r["languages"] for r in sampling],
                                                                     [r["seconds"]["median"] for r in sampling]),
                                  "slope_rss": harness.loglog_slope([r["languages"] for r in sampling],
                                                                    [r["peak_rss_mb"] for r in sampling])},
    }
    harness.write_result("scaling", payload, args)
    return 0



# ---------------------------------------------------------------- the doc

def _trend(slope: float) -> str:
    if slope > 1.15:
        return "superlinear"
    if slope >= 0.85:
        return "linear"
    return "sublinear" if slope > FLAT_SLOPE else "flat"


def _mb(x: float) -> str:
    return f"{harness.num(x / 1000)} GB" if x >= 1000 else f"{harness.num(x)} MB"


def _rows_per_language(result: dict, k: int) -> dict[str, float]:
    """Monolingual rows per language after dedup at size k (prepare's rows x dedup's kept share)."""
    prep, dd = result["stages"]["prepare"][k]["metrics"], result["stages"]["dedup"][k]["metrics"]
    return {lang: prep.get(f"mono.rows.{lang}", 0) * dd.get(f"mono.kept_fraction.{lang}", 1.0)
            for lang in result["spec"]["languages"]}


def markdown(result: dict) -> str:
    stages, slopes = result["stages"], result["slopes"]
    first = stages["download"]
    sizes = [r["text_mb"] for r in first]
    n = first[0]["stage_s"]["n"]
    quick = result.get("quick")
    head = [f"{_mb(x)}" for x in sizes]
    big = sizes[-1]
    out = []
    runs = (f"median of {n} runs per point (every run in the JSON)" if n > 1 else
            "one run per point (a --quick smoke run)")
    made = ", ".join(f"{_mb(r['mono_mb'])} + {harness.num(r['bitext_pairs'])} pairs" for r in result["sizes"]
                     if "mono_mb" in r)
    out.append(f"Corpus sizes {', '.join(head)} of text ({len(result['spec']['languages'])} languages, "
               f"{len(result['spec']['sources'][1]['pairs'])} pairs" + (f"; monolingual + bitext: {made}" if made else "")
               + f"); {runs}; every command's thread pools and `runner.max_workers` at {result['threads']}.")
    if quick:
        out.append("*Quick run: all commands in one process, its peak RSS reset before each, so a peak also "
                   "counts memory an earlier command kept; the full run gives each command its own process.*")
    if slopes is None:  # one size (the smoke run): what each command did there, no slope to draw
        out.append(_one_size(result))
        out.append(_memory(result))
        out.append(_throughput(result))
        out.append(_fixed(result))
        return "\n\n".join(x for x in out if x) + "\n"
    rows = []
    for stage in STAGES:
        rs, sl = stages[stage], slopes[stage]
        t = [r["stage_s"]["median"] for r in rs]
        rows.append([f"`{stage}`", *[harness.seconds(x) for x in t], f"**{sl['stage_s']:.2f}**",
                     " → ".join(f"{x:.2f}" for x in sl["stage_s_segments"]),
                     harness.seconds(t[-1] * 100 ** max(sl["stage_s"], 0)),
                     harness.seconds(rs[-1]["command_s"]["median"])])
    out.append("**Time** of each stage's own work (its manifest's `seconds`: the stage body, without the "
               "command's start-up and records), log-log slope against the text size, and what 100× the "
               f"largest corpus ({_mb(big * 100)}) would take by that slope (a slope below 0 counts as 0):")
    out.append(harness.table(["stage", *head, "slope", "segment slopes", f"100× ({_mb(big * 100)}), by slope",
                              f"whole command at {_mb(big)}"], rows))
    rows = []
    for stage in STAGES:
        rs, sl = stages[stage], slopes[stage]
        m = [r["peak_rss_mb"]["max"] for r in rs]
        own = [r["own_rss_mb"]["max"] for r in rs]
        rows.append([f"`{stage}`", *[f"{harness.num(a)} MB (+{harness.num(round(b))})" for a, b in zip(m, own)],
                     f"**{sl['peak_rss_mb']:.2f}**", f"{sl['own_rss_mb']:.2f}",
                     f"{harness.num(m[-1] * 100 ** max(sl['peak_rss_mb'], 0))} MB"])
    out.append("**Peak RSS** of each command's process (VmHWM; in brackets: above the CLI's own, the peak of the "
               "same pass's cached rerun, a command that does no stage work, so the modules a stage imports lazily "
               "count in its part), the slope of the peak and of the part in brackets, and the peak 100× the data "
               "would reach by the slope:")
    out.append(harness.table(["stage", *head, "slope", "slope above the CLI's", f"100× ({_mb(big * 100)}), by slope"],
                             rows))
    out.append("![Stage time against corpus size, log-log](../img/benchmarks/scaling_time.png)\n"
               "![Peak RSS against corpus size, log-log](../img/benchmarks/scaling_rss.png)")
    out.append(_findings(result))
    out.append(_memory(result))
    out.append(_throughput(result))
    out.append(_fixed(result))
    out.append(_sampling(result))
    return "\n\n".join(x for x in out if x) + "\n"


def _memory(result: dict) -> str:
    """The stated bounds beside the measured peaks, and whether memory stayed flat once parts were many."""
    mem = result.get("memory")
    if not mem:  # results measured before the bounds were stated
        return ""
    head = [_mb(r["text_mb"]) for r in result["sizes"]]
    rows = []
    for stage, m in mem["stages"].items():
        fixed, per_part = MEMORY_BOUNDS[stage]
        formula = f"{fixed} MB" + (f" + {per_part} × threads × part" if per_part else "")
        cells = [f"{harness.num(round(o))} / {harness.num(round(b))} MB" for o, b in zip(m["own_rss_mb"], m["bound_mb"])]
        flat = "–" if m["slope"] is None else f"{m['slope']:.3f} ({'flat' if m['flat'] else 'grows'})"
        rows.append([f"`{stage}`", formula, *cells, "yes" if m["within"] else "**no**", flat])
    parts = ", ".join(f"{_mb(r['text_mb'])}: {g['group']} in {harness.num(g['parts'])} part"
                      f"{'s' if g['parts'] > 1 else ''} of {harness.num(g['part_mb'])} MB"
                      for r, g in zip(result["sizes"], mem.get("biggest_part") or mem["largest"]))
    cli = ", ".join(f"{harness.num(round(c))} MB" for c in mem["cli_rss_mb"])
    basis = ("above what the process held before the command (--quick runs every command in one process, so "
             "the cached rerun's peak is no baseline there)" if result.get("quick") else
             f"above the CLI's own (the peak of the same pass's cached rerun, a command that does no stage work; "
             f"medians: {cli})")
    return (f"**Memory against its bound** (docs/stages/*.md): each command's peak RSS {basis}, beside the "
            f"stage's stated bound at this run's `threads` = {result['threads']} "
            f"and `prepare.part_rows` = {harness.num(result['knobs']['prepare.part_rows'])} (a part: the biggest "
            f"part's text, `part_rows` × the mean row of the group whose rows are longest, at most {_part_cap_mb():.0f} MB (prepare's cap); "
            f"{parts}); and the log-log slope of that peak over the sizes at which that part is full (its group "
            f"spans several parts and its part holds within 10 % of what it holds at the largest size; "
            f"flat: ≤ {mem['flat_slope']}):\n\n"
            + harness.table(["stage", "bound", *[f"at {h}" for h in head], "within", "slope over full-part sizes"],
                            rows))


def _part_cap_mb() -> float:
    """Prepare's cap on a part's bytes of strings, in MB (imported late: render.py loads this module light)."""
    from xylent.tasks.prepare.writer import PART_TEXT_BYTES

    return PART_TEXT_BYTES / 1e6


def _one_size(result: dict) -> str:
    stages = result["stages"]
    rows = [[f"`{stage}`", harness.seconds(stages[stage][0]["stage_s"]["median"]),
             harness.seconds(stages[stage][0]["command_s"]["median"]),
             f"{harness.num(stages[stage][0]['peak_rss_mb']['max'])} MB"] for stage in STAGES]
    return ("One corpus size, so no slope: each stage's own time, its command's and its peak RSS.\n\n"
            + harness.table(["stage", "stage time", "command", "peak RSS"], rows))


# the one-core bound beside each stage: which floors add up to it, and what they read. Not download's: it
# copies the compressed files and checks their ends, so decompressing them (a 2026-12-07 preview: 1.75x its
# speed) bounds nothing it does; vocab and sampling read a sample and counts, not the text
FLOOR_OF = {"prepare": (("xz_s", "unzip_s"), "`xz -dc` + unzip of every file"),
            "dedup": (("prepared_parts_s",), "reading prepare's Parquet parts"),
            "shards": (("deduped_parts_s",), "reading dedup's Parquet parts")}
TEXT_RATE = ("download", "prepare", "dedup", "shards")  # the stages whose work follows the text


def _throughput(result: dict) -> str:
    """At the largest size: MB of text per second per core of each stage beside the floor that bounds
    it on one core of the same machine, and the disk each command wrote and held at its peak."""
    if "floors" not in result:  # results measured before the floors were
        return ""
    k, stages, threads = -1, result["stages"], result["threads"]
    size, floor = result["sizes"][k], result["floors"][k]
    text = size["text_mb"]
    rows = []
    for stage in STAGES:
        r = stages[stage][k]
        own = text / max(r["stage_s"]["median"], 1e-9) / threads if stage in TEXT_RATE else None
        keys, name = FLOOR_OF.get(stage, ((), "–"))
        bound = text / max(sum(floor[x] for x in keys), 1e-9) if keys and all(x in floor for x in keys) else None
        rows.append([f"`{stage}`", harness.num(own) if own else "–", name, harness.num(bound) if bound else "–",
                     f"{harness.num(own / bound)}×" if bound else "–", _mb(r["output_mb"]["max"]),
                     _mb(r["written_mb"]["max"]), _mb(r["peak_disk_mb"]["max"])])
    return (f"**Throughput and disk** at {_mb(text)} of text ({harness.num(size.get('bitext_pairs'))} bitext pairs; "
            f"prepare wrote {harness.num(floor['parquet_parts'])} Parquet parts): each stage's MB of text per second "
            f"per core (the stage's time × {threads} threads), the one-core floor that bounds it, the output's size, "
            "what the command left on disk and the most it held at once (workspace and temporary files):\n\n"
            + harness.table(["stage", "MB/s per core", "floor", "floor MB/s", "share of the floor", "output",
                             "written", "peak disk"], rows))


def _findings(result: dict) -> str:
    stages, slopes, knobs = result["stages"], result["slopes"], result["knobs"]
    sizes = [r["text_mb"] for r in stages["download"]]
    lines = [f"- `{stage}`: time {_trend(slopes[stage]['stage_s'])} (slope {slopes[stage]['stage_s']:.2f}), "
             f"peak RSS {_trend(slopes[stage]['peak_rss_mb'])} (slope {slopes[stage]['peak_rss_mb']:.2f}; "
             f"above the CLI's own {slopes[stage]['own_rss_mb']:.2f})." for stage in STAGES]
    # vocab: from which size on its training sample stops growing
    want = knobs["vocab.input_sentence_size"] + knobs["vocab.held_sentences"]
    fewest = [min(_rows_per_language(result, k).values()) for k in range(len(sizes))]
    capped = [k for k, f in enumerate(fewest) if f >= want]
    seg = " → ".join(f"{x:.2f}" for x in slopes["vocab"]["stage_s_segments"])
    cap = (f"`vocab` trains on at most `vocab.input_sentence_size` + `held_sentences` = {harness.num(want)} "
           "sentences per language (this run's setting; the defaults are 1 000 000 + 10 000)")
    if capped:
        lines.append(f"- {cap}. From {_mb(sizes[capped[0]])} on every language has more (the smallest: "
                     f"{harness.num(round(fewest[capped[0]]))} rows after dedup), so only the pass that samples "
                     f"the text still grows: segment slopes {seg}. Past the cap, vocab's cost is the cap's, "
                     "whatever the corpus; below it, it follows the text of the smaller languages.")
    else:
        lines.append(f"- {cap}; at no size here does every language reach it (the smallest: "
                     f"{harness.num(round(fewest[-1]))} rows), so vocab still grows with the text (segments {seg}).")
    # memory bounds the stages are designed to
    part, biggest = knobs["prepare.part_rows"], max(_rows_per_language(result, len(sizes) - 1).values())
    prep = slopes["prepare"]["own_rss_mb"]
    largest_file = max(f["text_bytes"] for f in result["sizes"][-1]["files"].values()) / 1e6
    verdict = "flat" if prep <= FLAT_SLOPE else "it grows"
    bound = "."
    if largest_file < 32:
        bound = (f"; every file here is smaller than that (the largest: {harness.num(largest_file)} MB of text), so "
                 "growth is possible at these sizes and says nothing of larger files.")
    lines.append("- `prepare` streams each file in 8 MB blocks of text (up to 3 queued and 1 in work), so its memory "
                 "should stop following the files once they pass ~32 MB: slope above the CLI's own "
                 f"{prep:.2f} ({verdict})" + bound)
    lines.append(f"- `dedup` holds one Parquet part (`prepare.part_rows` = {harness.num(part)} rows) or one bucket (a language has one per part or more) "
                 f"at a time: the largest language here has {harness.num(round(biggest))} rows at {_mb(sizes[-1])}, "
                 + ("so every language fits in one part and its peak may still grow with the text at these sizes; "
                    "past one part it should stop (`benchmarks/dedup.py` measures corpora of several parts)."
                    if biggest <= part else _past_one_part(result)))
    return "\n".join(lines)


def _past_one_part(result: dict) -> str:
    full = (result.get("memory") or {}).get("full_part_sizes")
    if full is not None and len(full) < 2:
        return (f"more than one part, but the biggest part (the group whose rows are longest) is full at "
                f"{len(full)} size{'s' if len(full) != 1 else ''} here, so the memory table below gives no slope yet.")
    return "more than one part: the memory table below gives the slope over the sizes at which the biggest part is full."


def _fixed(result: dict) -> str:
    stages = result["stages"]
    rerun = [r["command_s"]["median"] for r in stages["cached_rerun"]]
    overhead = [r["command_s"]["median"] - r["stage_s"]["median"] for s in STAGES for r in stages[s]]
    startup = [r["process_s"]["median"] - r["command_s"]["median"] for s in (*STAGES, "cached_rerun")
               for r in stages[s] if r["process_s"] is not None]
    text = ("**Fixed cost of a command**, beside the stage's work: "
            + (f"starting Python and importing the CLI (process wall − command) {harness.seconds(_median(startup))} "
               "(median over every command); " if startup else "")
            + f"a rerun with every stage cached {harness.seconds(_median(rerun))} (Prefect flow run, MLflow runs, "
            f"the cache check); around a computed stage (command − stage time) {harness.seconds(_median(overhead))}. "
            "The Prefect API server (one for the whole run, a separate process like a user's `prefect server "
            "start`) is not in any command's memory or time.")
    fractions = [r["command_s"]["median"] % 1 for s in (*STAGES, "cached_rerun") for r in stages[s]]
    if max(fractions) - min(fractions) < 0.25:
        text += (f" Every command's time lies between {min(fractions):.2f} and {max(fractions):.2f} s past a whole "
                 "second: Prefect's flow-run heartbeat thread sleeps in 1 s steps and is joined when the flow ends, "
                 "so a command's end waits for the next whole second of its flow run.")
    eph = result.get("ephemeral_prefect")
    if eph:
        e = eph[-1]
        text += (f" Without `PREFECT_API_URL` a command starts Prefect's ephemeral server itself (a subprocess, "
                 f"its memory not counted): the cached rerun then took {harness.seconds(e['command_s'])} "
                 f"(+{harness.seconds(e['command_s'] - _median(rerun))}; the second of two such runs, so its "
                 "database already existed).")
    else:
        text += " The ephemeral-server start-up (no `PREFECT_API_URL`) is measured by the full run only."
    return text


def _median(xs: list[float]) -> float:
    return float(np.median(xs))


def _sampling(result: dict) -> str:
    samp = result["sampling_vs_languages"]
    stages = result["stages"]
    flat = result["slopes"]["sampling"]["stage_s"]
    rows = [[r["languages"], harness.num(r["pairs"]), harness.seconds(r["seconds"]["median"]),
             harness.seconds(r["output_seconds"]["median"]), f"{harness.num(r['peak_rss_mb'])} MB",
             f"{r['max_marginal_error']:.1e}"] for r in samp["rows"]]
    ls, tables = [r["languages"] for r in samp["rows"]], [r["seconds"]["median"] for r in samp["rows"]]
    out_slope = harness.loglog_slope(ls, [r["output_seconds"]["median"] for r in samp["rows"]])
    pair_slope = harness.loglog_slope([r["pairs"] for r in samp["rows"]], tables)
    big = samp["rows"][-1]
    return ("**Sampling against the number of languages.** The stage reads per-language and per-pair counts, "
            f"not text: against text size its time is {_trend(flat)} (slope {flat:.2f}, "
            f"{harness.seconds(stages['sampling'][-1]['stage_s']['median'])} at the largest size). Its cost "
            "follows L, the number of languages: the stage's computation (`build_tables`: α-smoothing, Sinkhorn "
            "P\\*, M2M LP, temperature table, diagnostics) and its output (`write_output`: Parquet, heatmaps, "
            "report) on synthetic counts (log-normal sizes, 30 % of pairs with data), "
            + ("all in the quick run's one process" if result.get("quick") else
               "one fresh process per L, its runs inside it after an untimed call; the peak RSS is that process's")
            + ":\n\n"
            + harness.table(["L", "pairs with data", "tables", "output", "peak RSS", "max marginal error"], rows)
            + "\n\n![Sampling stage against the number of languages, log-log]"
              "(../img/benchmarks/scaling_sampling_languages.png)"
            + f"\n\nSlope against L: tables {samp['slope_time']:.2f} (of pairs, ~L², "
            f"{pair_slope:.2f}), output {out_slope:.2f}, peak RSS {samp['slope_rss']:.2f}. "
            f"At L = {big['languages']} the stage's work takes "
            f"{harness.seconds(big['seconds']['median'] + big['output_seconds']['median'])}.")


def plots(result: dict, folder: Path) -> list[Path]:
    stages = result["stages"]
    xs = [r["text_mb"] for r in stages["download"]]
    time_series = {s: (xs, [max(r["stage_s"]["median"], 1e-3) for r in stages[s]]) for s in STAGES}
    rss_series = {s: (xs, [r["peak_rss_mb"]["max"] for r in stages[s]]) for s in STAGES}
    samp = result["sampling_vs_languages"]["rows"]
    ls = [r["languages"] for r in samp]
    against_size = [
        harness.plot_loglog(folder / "scaling_time.png", time_series, xlabel="text (MB)",
                            ylabel="stage time (s, median)", title="Stage time against corpus size"),
        harness.plot_loglog(folder / "scaling_rss.png", rss_series, xlabel="text (MB)",
                            ylabel="peak RSS of the command (MB)", title="Peak memory against corpus size"),
    ] if len(xs) > 1 else []  # one size (a smoke run): no line to draw
    return [
        *against_size,
        harness.plot_loglog(folder / "scaling_sampling_languages.png",
                            {"tables": (ls, [r["seconds"]["median"] for r in samp]),
                             "output": (ls, [r["output_seconds"]["median"] for r in samp])},
                            xlabel="languages (L)", ylabel="seconds (median)", title="Sampling stage against L"),
    ]


if __name__ == "__main__":
    sys.exit(main())
