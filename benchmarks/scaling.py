"""Cost against size for every data stage: wall time and peak RSS of
download, prepare, dedup, vocab, sampling and shards at three corpus sizes
spanning 10x, each stage run the way a user runs it (one `xylent run STAGE` in
a fresh process, everything upstream cached), with the log-log slope and what
100x more data would cost by it.

The corpus (generated, then served from 127.0.0.1 so the download stage runs
its real HTTP code): CC-100-layout `.txt.xz` files in 5 languages over 5
scripts (en, de, ru, el, zh; Zipf-distributed words, blank-line documents,
boilerplate lines repeated across documents, a few near-copied documents) and
OPUS-layout moses zips for all 10 pairs of them, about a fifth of the text.
Per size and repeat, a fresh workspace; per stage, one process
(`harness.in_fresh_process` -> `scaling_cli.run_stage` -> `flows.cli.main`);
then a rerun with every stage cached gives the fixed cost of a command.
One Prefect API server (Prefect's test harness, a separate process) and one
MLflow sqlite store serve every command, as a user's running `prefect server`
would; the start-up of Prefect's ephemeral server, which a command without
PREFECT_API_URL pays, is measured once apart.

Sampling reads only per-language counts, so its cost follows the number of
languages and pairs, not the text: it is measured against L with the stage's
computation (`tasks.sampling.build_tables`, one fresh process per L).

    .venv/bin/python benchmarks/scaling.py            # full: 10, 30, 100 MB x 3; ~12 min on 2 cores
    .venv/bin/python benchmarks/scaling.py --quick    # smoke: tiny sizes, 1 repeat, no warm-up
    .venv/bin/python benchmarks/scaling.py --sizes-mb 10 30 100 --languages 30 100 300 1000
"""

from __future__ import annotations

import contextlib
import functools
import http.server
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
FULL_SIZES_MB = (10.0, 30.0, 100.0)
QUICK_SIZES_MB = (0.1, 0.3, 1.0)
FULL_LANGUAGES = (30, 100, 300, 1000)
QUICK_LANGUAGES = (10, 30, 100)

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
    r = harness.in_fresh_process("scaling_cli", "run_stage", {"stage": stage, "spec": str(spec), "workspace": str(ws)},
                                 threads=threads)
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


def sampling_tables(languages: int, seed: int = 0) -> dict:
    """The sampling stage's work on L languages: its computation (`build_tables`:
    alpha-smoothing, Sinkhorn P*, M2M LP, temperature table, diagnostics), then its output
    (`write_output`: Parquet tables, heatmaps, report) into a temporary folder. Counts:
    log-normal example counts, a pair with data for 30 % of the language pairs (and for
    neighbours, so none is isolated)."""
    from tasks.sampling import build_tables
    from tasks.sampling.output import write_output
    from xylent.spec import SamplingConfig

    cfg = SamplingConfig()
    with tempfile.TemporaryDirectory() as tmp:
        for sub in ("warm", "out"):
            (Path(tmp) / sub).mkdir()
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
        t = time.perf_counter()
        tables = build_tables({n: int(m) + 1 for n, m in zip(names, mono)},
                              {(names[a], names[b]): int(c) + 1 for a, b, c in zip(i, j, pairs)}, cfg)
        t1 = time.perf_counter()
        write_output(tables, cfg, Path(tmp) / "out")
        t2 = time.perf_counter()
    return {"seconds": t1 - t, "output_seconds": t2 - t1, "pairs": int(len(i)),
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
    for name, key, stat in (("stage_s", "stage_s", "median"), ("command_s", "command_s", "median"),
                            ("peak_rss_mb", "peak_rss_mb", "max"), ("own_rss_mb", "own_rss_mb", "max")):
        ys = [max(r[key][stat], 1e-3) for r in rows]
        out[name] = harness.loglog_slope(xs, ys)
        out[name + "_segments"] = [harness.loglog_slope(xs[i:i + 2], ys[i:i + 2]) for i in range(len(xs) - 1)]
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
    rows = harness.in_fresh_process("scaling_cli", "in_sequence", {"calls": calls}, threads=threads)["result"][1:]
    per = len(STAGES) + 1
    passes = {k: [_checked([_record(r, None) for r in rows[k * per:(k + 1) * per]])] for k in range(len(specs))}
    for k, mb in enumerate(specs):
        _progress(float(mb.stem.removeprefix("spec-").removesuffix("mb")), 0, passes[k][0])
    sampling = {n: [r] for n, r in zip(languages, rows[len(specs) * per:])}
    return passes, sampling, {"process_s": round(time.perf_counter() - t, 3),
                              "peak_reset": all(r["peak_reset"] for r in rows)}


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
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
    if len(sizes) < 3 or sizes[-1] / sizes[0] < 10:
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
                harness.in_fresh_process("scaling_cli", "prime_mlflow", {"uri": uri})
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
        if not args.quick:
            sampling_runs = {n: [harness.in_fresh_process("scaling", "sampling_tables", {"languages": n},
                                                          threads=args.threads) for _ in range(args.repeats)]
                             for n in languages}
        sampling = []
        for n, runs in sampling_runs.items():
            sampling.append({"languages": n, "pairs": runs[0]["result"]["pairs"],
                             "max_marginal_error": runs[0]["result"]["max_marginal_error"],
                             "seconds": _spread([r["result"]["seconds"] for r in runs]),
                             "output_seconds": _spread([r["result"]["output_seconds"] for r in runs]),
                             "peak_rss_mb": _spread([r["peak_rss_mb"] for r in runs]),
                             "rss_before_mb": _spread([r["rss_before_mb"] for r in runs])})
            print(f"sampling, L = {n}: {sampling[-1]['seconds']['median']:.3f} s", flush=True)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        if not args.keep:
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
        "spec": shown, "generate_seconds": round(generate_s, 2),
        "sizes": [{k: v for k, v in s.items() if k != "files"} | {"files": s["files"]} for s in size_rows],
        "stages": stages,
        "slopes": {s: _slopes(stages[s]) for s in (*STAGES, "cached_rerun")},
        "warmup_passes": warmups,
        "ephemeral_prefect": ephemeral,
        "sampling_vs_languages": {"rows": sampling,
                                  "slope_time": harness.loglog_slope([r["languages"] for r in sampling],
                                                                     [r["seconds"]["median"] for r in sampling]),
                                  "slope_rss": harness.loglog_slope([r["languages"] for r in sampling],
                                                                    [r["peak_rss_mb"]["max"] for r in sampling])},
    }
    harness.write_result("scaling", payload, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
