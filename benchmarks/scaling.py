"""Cost against size for every data stage: wall time and peak RSS of
download, prepare, dedup, vocab, sampling and shards at three corpus sizes
spanning 10x, each stage run the way a user runs it (one `xylent run STAGE` in
a fresh process, everything upstream already published), with the log-log
slope and what 100x more data would cost by it.

The corpus (generated, then served over HTTP from 127.0.0.1 by a thread of this
process, so the download stage runs its real HTTP code): CC-100-layout `.txt.xz`
files in 5 languages over 5 scripts (en, de, ru, el, zh; Zipf-distributed words,
blank-line documents, 4 % boilerplate lines repeated across documents, 3 % of
documents near copies of the one before) and OPUS-layout moses zips for all 10
pairs of them, a fifth of the text. The spec is every stage's defaults except a
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
server (Prefect's test harness: a separate process, in no command's memory or
time) and one MLflow sqlite store (created before the first timed command)
serve every command, as a user's running `prefect server start` would; the
start-up of Prefect's ephemeral server, which a command without PREFECT_API_URL
pays, is measured apart (the second of two runs with a fresh PREFECT_HOME).

Sampling reads per-language counts only, so its cost follows the number of
languages and pairs, not the text: it is also measured against L = 30 ... 1000
with the stage's computation and output (`build_tables`, `write_output`; one
fresh process per L).

    .venv/bin/python benchmarks/scaling.py            # full: 10, 30, 100 MB x 3 repeats; ~15 min on 2 cores
    .venv/bin/python benchmarks/scaling.py --quick    # smoke: 0.1 MB, 1 repeat, one process, no slope; ~1 min
    .venv/bin/python benchmarks/scaling.py --sizes-mb 10 30 110 --languages 30 100 300 1000 --repeats 5

--quick runs every command in one process (one start-up instead of 22) and
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
import harness  # noqa: E402

STAGES = ("download", "prepare", "dedup", "vocab", "sampling", "shards")
FULL_SIZES_MB = (10.0, 30.0, 110.0)  # the generator overshoots small sizes a little: the text spans > 10x
QUICK_SIZES_MB = (0.1,)  # the smallest size alone: a smoke run checks that every command runs, not slopes
FULL_LANGUAGES = (30, 100, 300, 1000)
QUICK_LANGUAGES = (10, 30)

# language -> (letters, words separated by spaces, share of the monolingual text)
SCRIPTS = {
    "en": ("etaoinshrdlcumwfgypbvkjxqz", True, 0.34),
    "de": ("enisratdhulcgmobwfkzpvjyxqäöüß", True, 0.24),
    "ru": ("оеаинтсрвлкмдпуяызьбгчйхжшюцщэфъё", True, 0.2),
    "zh": ("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可里后"
           + "".join(map(chr, range(0x4E00, 0x4E00 + 3000))), False, 0.14),  # 3 000 characters
    "el": ("αοεινταςρπμκλυηδγωθφχβξζψ", True, 0.08),
}
# pair -> share of the bitext (every pair present: the Sinkhorn table is feasible)
PAIRS = {"de-en": 0.3, "en-ru": 0.2, "en-zh": 0.15, "el-en": 0.1, "de-ru": 0.07, "de-zh": 0.05, "ru-zh": 0.05,
         "de-el": 0.04, "el-ru": 0.02, "el-zh": 0.02}
BITEXT_SHARE = 0.2  # of the text bytes


# ---------------------------------------------------------------- the corpus

class _Language:
    """A word list over one script with Zipf frequencies; lines are drawn from it."""

    def __init__(self, lang: str, rng: np.random.Generator, words: int = 20_000):
        letters, self.spaced, _ = SCRIPTS[lang]
        ranks = 1.0 / np.arange(1, len(letters) + 1)
        lengths = rng.integers(1, 10, words) if self.spaced else rng.integers(1, 4, words)
        chars = rng.choice(list(letters), size=int(lengths.sum()), p=ranks / ranks.sum())
        cuts = np.cumsum(lengths)[:-1]
        self.words = ["".join(w).encode() for w in np.split(chars, cuts)]
        zipf = 1.0 / np.arange(1, words + 1) ** 1.05
        self.cdf = np.cumsum(zipf) / zipf.sum()
        self.sep = b" " if self.spaced else b""
        self.rng = rng

    def lines(self, n: int, low: int, high: int) -> list[bytes]:
        """n lines of low..high-1 words."""
        return self.lines_of(self.rng.integers(low, high, n))

    def lines_of(self, lengths: np.ndarray) -> list[bytes]:
        """One line per entry of ``lengths`` (words; zh's run together, as Chinese is written)."""
        ids = np.searchsorted(self.cdf, self.rng.random(int(lengths.sum()))).clip(max=len(self.words) - 1).tolist()
        ends = np.cumsum(lengths).tolist()
        words, sep, start, out = self.words, self.sep, 0, []
        for end in ends:
            out.append(sep.join(map(words.__getitem__, ids[start:end])) + "。".encode() * (not self.spaced))
            start = end
        return out


def _mono_text(lang: _Language, target: int, rng: np.random.Generator) -> bytes:
    """CC-100 layout, about ``target`` bytes: a paragraph per line, a blank line after each
    document; 4 % of lines are boilerplate from a pool (exact duplicates across documents),
    3 % of documents repeat the previous one with one word changed (near duplicates)."""
    pool = lang.lines(200, 4, 12)
    chunks, size, prev = [], 0, None
    while size < target:
        lines = lang.lines(int(np.clip((target - size) / 100, 50, 2000)), 6, 50)
        boiler = np.flatnonzero(rng.random(len(lines)) < 0.04)
        for i, j in zip(boiler, rng.integers(0, len(pool), len(boiler))):
            lines[i] = pool[j]
        i = 0
        while i < len(lines) and size < target:
            k = int(rng.geometric(0.3))
            doc = lines[i:i + k]
            i += k
            if prev is not None and rng.random() < 0.03:
                doc = list(prev)
                doc[0] = doc[0] + lang.sep + lang.words[int(rng.integers(len(lang.words)))]
            prev = doc
            chunks.append(b"\n".join(doc) + b"\n\n")
            size += len(chunks[-1])
    return b"".join(chunks)


def _xz(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        subprocess.run(["xz", "-0", "-T2", "-c"], input=data, stdout=f, check=True)


def make_corpus(folder: Path, text_mb: float, seed: int = 0) -> dict:
    """Write ``cc100/<lang>.txt.xz`` and ``opus/Bench/v1/moses/<pair>.txt.zip`` under
    ``folder`` (about ``text_mb`` MB of UTF-8 text in all); returns what was written."""
    rng = np.random.default_rng(seed)
    langs = {lang: _Language(lang, np.random.default_rng([seed, i])) for i, lang in enumerate(SCRIPTS)}
    total = text_mb * 1e6
    (folder / "cc100").mkdir(parents=True, exist_ok=True)
    (folder / "opus" / "Bench" / "v1" / "moses").mkdir(parents=True, exist_ok=True)
    files = {}
    for lang, (_, _, share) in SCRIPTS.items():
        text = _mono_text(langs[lang], int(total * (1 - BITEXT_SHARE) * share), rng)
        path = folder / "cc100" / f"{lang}.txt.xz"
        _xz(path, text)
        files[lang] = {"text_bytes": len(text), "lines": text.count(b"\n"), "file_bytes": path.stat().st_size}
    for pair, share in PAIRS.items():
        a, b = pair.split("-")
        target, src, tgt, size = total * BITEXT_SHARE * share, [], [], 0
        while size < target:
            # a translation's length follows its source's
            n = rng.integers(4, 30, int(np.clip((target - size) / 150, 20, 1000)))
            x = langs[a].lines_of(n)
            y = langs[b].lines_of(np.maximum(2, np.round(n * rng.uniform(0.8, 1.25, len(n)))).astype(int))
            dup = np.flatnonzero(rng.random(len(x)) < 0.01)  # exact repeated pairs
            for i in dup[dup > 0]:
                x[i], y[i] = x[i - 1], y[i - 1]
            src += x
            tgt += y
            size += sum(map(len, x)) + sum(map(len, y)) + 2 * len(x)
        path = folder / "opus" / "Bench" / "v1" / "moses" / f"{pair}.txt.zip"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            zf.writestr(f"Bench.{pair}.{a}", b"\n".join(src) + b"\n")
            zf.writestr(f"Bench.{pair}.{b}", b"\n".join(tgt) + b"\n")
        files[pair] = {"text_bytes": size, "lines": len(src), "file_bytes": path.stat().st_size}
    return {"text_mb": round(sum(f["text_bytes"] for f in files.values()) / 1e6, 3),
            "file_mb": round(sum(f["file_bytes"] for f in files.values()) / 1e6, 3), "files": files}


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


def bench_spec(base: str, *, quick: bool, workers: int) -> dict:
    """The spec every size runs: the stages' defaults except where noted."""
    vocab = ({"grid": [200, 400], "budget": 3000, "input_sentence_size": 300, "held_sentences": 50} if quick else
             {"grid": [1000, 2000, 4000], "budget": 16000, "input_sentence_size": 5000, "held_sentences": 1000})
    return {
        "name": "scaling",
        "languages": sorted(SCRIPTS),
        "sources": [
            {"name": "cc100", "kind": "cc100", "languages": sorted(SCRIPTS),
             "url_template": base + "/cc100/{lang}.txt.xz"},
            {"name": "bitext", "kind": "opus", "corpus": "Bench", "version": "v1", "pairs": sorted(PAIRS),
             "url_template": base + "/opus/{corpus}/{version}/moses/{pair}.txt.zip"},
        ],
        "runner": {"kind": "threads", "max_workers": workers},
        "tracking": {"experiment": "scaling"},
        "vocab": {**vocab, "character_coverage": 0.9995},
    }


# ---------------------------------------------------------------- measuring

CLI = ("xylent.cli",)  # preloaded in every command's process: its import is start-up, not the command


def run_stage(stage: str, spec: str, workspace: str) -> dict:
    """`xylent run STAGE --spec SPEC --workspace WS --json` in this process, as a user runs it.
    Returns whether the stage was cached (and its upstream), its manifest's seconds and metrics."""
    from xylent.cli import main as cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli(["run", stage, "--spec", spec, "--workspace", workspace, "--json"])
    if rc != 0:
        raise RuntimeError(f"xylent run {stage} exited {rc}:\n{out.getvalue()[-3000:]}")
    stages = json.loads(out.getvalue())["stages"]
    manifest = json.loads((Path(stages[stage]["output_dir"]) / "_manifest.json").read_text())
    return {"cached": stages[stage]["cached"],
            "upstream_cached": all(r["cached"] for s, r in stages.items() if s != stage),
            "manifest_seconds": manifest["seconds"], "metrics": manifest.get("metrics", {})}


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
            "cached": res["cached"], "upstream_cached": res["upstream_cached"], "metrics": res["metrics"]}


def _command(stage: str, spec: Path, ws: Path, threads: int) -> dict:
    """One `xylent run STAGE` in a fresh process: the whole process's wall time, the
    command's (imports excluded), the stage's own (its manifest's `seconds`: the body,
    without the Prefect/MLflow records around it) and the process's peak RSS."""
    t = time.perf_counter()
    r = harness.in_fresh_process("scaling", "run_stage", {"stage": stage, "spec": str(spec), "workspace": str(ws)},
                                 threads=threads, preload=CLI)
    return _record(r, time.perf_counter() - t)


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


# ---------------------------------------------------------------- the run

def _isolate(tmp: Path) -> str:
    """Nothing reaches the user's Prefect or MLflow: their variables are dropped, one
    MLflow sqlite store and one Prefect home under ``tmp`` serve every command."""
    for name in [n for n in os.environ if n.startswith(("MLFLOW_", "PREFECT_"))]:
        del os.environ[name]
    uri = f"sqlite:///{tmp}/mlflow.db"
    os.environ.update({"MLFLOW_TRACKING_URI": uri, "PREFECT_HOME": str(tmp / "prefect-home"),
                       "PREFECT_LOGGING_LEVEL": "WARNING", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    return uri


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
                            for key in ("stage_s", "command_s", "process_s", "peak_rss_mb", "rss_before_mb")},
                         "own_rss_mb": _spread([r["peak_rss_mb"] - r["rss_before_mb"] for r in runs]),
                         "metrics": runs[0]["metrics"]})
        stages[stage] = rows
    return stages


def _slopes(rows: list[dict]) -> dict:
    """Log-log slopes against text size: of the median stage time, the median command time,
    the worst peak RSS and the worst growth above the post-import RSS; plus segment slopes."""
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
    calls += [["run_stage", {"stage": stage, "spec": str(spec), "workspace": str(ws)}]
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

    prepare, dedup, vocab, shards = PrepareConfig(), DedupConfig(), VocabConfig(**spec["vocab"]), ShardsConfig()
    return {"prepare.part_rows": prepare.part_rows, "dedup.buckets": dedup.buckets,
            "dedup.near_level": dedup.near_level, "dedup.langid": dedup.langid,
            "vocab.input_sentence_size": vocab.input_sentence_size, "vocab.held_sentences": vocab.held_sentences,
            "vocab.held_fraction": vocab.held_fraction, "vocab.grid": vocab.grid, "vocab.budget": vocab.budget,
            "vocab.threads_per_model": vocab.threads_per_model, "shards.seq_len": shards.seq_len}


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, warmup=0)
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=None,
                    help=f"corpus sizes, MB of text (default {' '.join(map(str, FULL_SIZES_MB))}; "
                    f"quick {' '.join(map(str, QUICK_SIZES_MB))})")
    ap.add_argument("--languages", type=int, nargs="+", default=None,
                    help=f"sampling: numbers of languages (default {FULL_LANGUAGES}, quick {QUICK_LANGUAGES})")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="thread pools of every command and runner.max_workers (default: the usable cores)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary corpus and workspaces")
    args = harness.finish_args(ap.parse_args(argv))
    sizes = sorted(args.sizes_mb or (QUICK_SIZES_MB if args.quick else FULL_SIZES_MB))
    languages = sorted(args.languages or (QUICK_LANGUAGES if args.quick else FULL_LANGUAGES))
    if not args.quick and (len(sizes) < 3 or sizes[-1] / sizes[0] < 10):
        raise SystemExit(f"--sizes-mb {sizes}: at least 3 sizes spanning 10x are needed for a slope")

    tmp = Path(tempfile.mkdtemp(prefix="xylent-scaling-"))
    saved_env = dict(os.environ)
    try:
        uri = _isolate(tmp)
        t0 = time.perf_counter()
        size_rows = []
        for mb in sizes:
            made = make_corpus(tmp / "corpus" / f"{mb:g}mb", mb)
            size_rows.append({"target_mb": mb, **made})
            print(f"corpus {mb:g} MB: {made['text_mb']} MB of text, {made['file_mb']} MB of files", flush=True)
        generate_s = time.perf_counter() - t0
        span = size_rows[-1]["text_mb"] / size_rows[0]["text_mb"]
        if span < 10 and not args.quick:
            raise SystemExit(f"the generated text spans only {span:.1f}x ({size_rows[0]['text_mb']} to "
                             f"{size_rows[-1]['text_mb']} MB): widen --sizes-mb so a slope covers 10x")

        from prefect.testing.utilities import prefect_test_harness

        passes: dict[int, list[dict]] = {k: [] for k in range(len(sizes))}
        warmups: list[dict] = []
        ephemeral, sequence = None, None
        with prefect_test_harness(server_startup_timeout=120), serve(tmp / "corpus") as base:
            from prefect.settings import PREFECT_API_URL

            os.environ["PREFECT_API_URL"] = PREFECT_API_URL.value()
            specs = []
            for mb in sizes:
                spec = bench_spec(f"{base}/{mb:g}mb", quick=args.quick, workers=args.threads)
                specs.append(tmp / f"spec-{mb:g}mb.yaml")
                specs[-1].write_text(json.dumps(spec, indent=1))  # YAML reads JSON
            if args.quick:
                passes, sampling_runs, sequence = _quick(specs, tmp, languages, args.threads)
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
    shown = bench_spec("http://127.0.0.1:PORT", quick=args.quick, workers=args.threads)
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
        "stages": stages,
        "slopes": {s: _slopes(stages[s]) for s in (*STAGES, "cached_rerun")} if len(sizes) > 1 else None,
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
    return "sublinear" if slope >= 0.2 else "flat"


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
    out.append(f"Corpus sizes {', '.join(head)} of text ({result['spec']['languages'].__len__()} languages, "
               f"{len(result['spec']['sources'][1]['pairs'])} pairs); {runs}; every command's thread pools and "
               f"`runner.max_workers` at {result['threads']}.")
    if quick:
        out.append("*Quick run: all commands in one process, its peak RSS reset before each, so a peak also "
                   "counts memory an earlier command kept; the full run gives each command its own process.*")
    if slopes is None:  # one size (the smoke run): what each command did there, no slope to draw
        out.append(_one_size(result))
        out.append(_fixed(result))
        return "\n\n".join(out) + "\n"
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
    base = _median([r["rss_before_mb"]["median"] for s in STAGES for r in stages[s]])
    out.append("**Peak RSS** of each command's process (VmHWM; in brackets: above what the process held before "
               f"the command, {harness.num(base)} MB (median) once the CLI is imported), the slope of the peak "
               "and of the part in brackets, and the peak 100× the data would reach by the slope:")
    out.append(harness.table(["stage", *head, "slope", "slope above baseline", f"100× ({_mb(big * 100)}), by slope"],
                             rows))
    out.append("![Stage time against corpus size, log-log](../img/benchmarks/scaling_time.png)\n"
               "![Peak RSS against corpus size, log-log](../img/benchmarks/scaling_rss.png)")
    out.append(_findings(result))
    out.append(_fixed(result))
    out.append(_sampling(result))
    return "\n\n".join(out) + "\n"


def _one_size(result: dict) -> str:
    stages = result["stages"]
    rows = [[f"`{stage}`", harness.seconds(stages[stage][0]["stage_s"]["median"]),
             harness.seconds(stages[stage][0]["command_s"]["median"]),
             f"{harness.num(stages[stage][0]['peak_rss_mb']['max'])} MB"] for stage in STAGES]
    return ("One corpus size, so no slope: each stage's own time, its command's and its peak RSS.\n\n"
            + harness.table(["stage", "stage time", "command", "peak RSS"], rows))


def _findings(result: dict) -> str:
    stages, slopes, knobs = result["stages"], result["slopes"], result["knobs"]
    sizes = [r["text_mb"] for r in stages["download"]]
    lines = [f"- `{stage}`: time {_trend(slopes[stage]['stage_s'])} (slope {slopes[stage]['stage_s']:.2f}), "
             f"peak RSS {_trend(slopes[stage]['peak_rss_mb'])} (slope {slopes[stage]['peak_rss_mb']:.2f}; "
             f"above the baseline {slopes[stage]['own_rss_mb']:.2f})." for stage in STAGES]
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
    verdict = "flat" if prep < 0.2 else "it grows"
    bound = "."
    if largest_file < 32:
        bound = (f"; every file here is smaller than that (the largest: {harness.num(largest_file)} MB of text), so "
                 "growth is possible at these sizes and says nothing of larger files.")
    lines.append("- `prepare` streams each file in 8 MB blocks of text (up to 3 queued and 1 in work), so its memory "
                 "should stop following the files once they pass ~32 MB: slope above the baseline "
                 f"{prep:.2f} ({verdict})" + bound)
    lines.append(f"- `dedup` holds one Parquet part (`prepare.part_rows` = {harness.num(part)} rows) or one bucket "
                 f"at a time: the largest language here has {harness.num(round(biggest))} rows at {_mb(sizes[-1])}, "
                 + ("so every language fits in one part and its peak may still grow with the text at these sizes; "
                    "past one part it should stop (`benchmarks/dedup.py` measures corpora of several parts)."
                    if biggest <= part else "more than one part: its peak should stop growing from there."))
    return "\n".join(lines)


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
