"""vocab: the per-language SentencePiece grid, ALP throughput, VoCAP vs joint.

The inputs are a real workspace built by the CLI (`xylent run vocab`, everything
upstream included): the demo spec (20 languages x 6 grid sizes) for a full run,
a 4-language, 2-size variant of it built in a scratch folder for `--quick`.

1. Grid, like for like (the same sampled training and held sentences per
   language, the same trainer options, the same seed; in one process):
   - xylent: `xylent.tasks.vocab.train.train_grid` for every language (the stage's
     unit of work: write the sample, train each size, ALP on the held sample;
     the reference side reads its text files ready-made, written untimed);
   - reference method: VoCapXLM's `train_mono_spm.py` loop (github.com/
     bozheng-hit/VoCapXLM): per language, per size, `SentencePieceTrainer.train`
     on the prepared text file, then its `compute_alp` (a Python loop of
     `EncodeAsIds` per line, a dict of piece counts, `math.log` sums, `np.mean`),
     here on the same held sample and with the stage's trainer options.
   At 1 thread, and at all cores: xylent's languages on a thread pool (what the
   threads runner does), the reference loop's languages on a thread pool too
   (SentencePiece's trainer releases the GIL), and the reference loop with the
   trainer's own `num_threads` = all cores (SentencePiece's only built-in
   parallelism; its EM then sums in another order and the models differ, so
   that row reports its ALP difference instead of being checked).  Every ALP
   of every other side must equal xylent's to 1e-9 (relative) or the script
   stops without writing a number.
2. The stage through the CLI (`xylent run vocab --force`, threads and processes
   runners, 1 and 2 workers; full run only: each call costs ~10 s of CLI and
   Prefect start-up): the stage's own seconds (its manifest) and the command's.
   The stage also composes (merge, joint baseline, evaluation, plots); the grid
   alone is section 1.  The ALPs in its allocation.parquet must equal the
   reference loop's.
3. ALP throughput on the VoCAP model (German sentences of the workspace,
   repeated): `xylent.tasks.vocab.average_log_probability` vs VoCapXLM's `compute_alp`
   method (reference method, one thread), SentencePiece's batched multi-threaded
   `encode(..., num_threads=N)` and HF `tokenizers` (the same Unigram model
   converted with transformers' `SpmConverter`, byte fallback switched on as in
   the .model; `encode_batch` on rayon's pool), both counted with the same numpy
   code.  One fresh process per thread setting (1, all cores), pools capped
   before import, sides alternating; every value must equal xylent's to 1e-9.
4. Tokens per sentence of the VoCAP and joint models on the held samples.

Full size (about 8 min on a quiet 2-core machine: ~30 s to build the demo workspace in /tmp
once, ~6 min of CLI stage runs (16 calls of 15-30 s), ~1 min of grids and ALP):

    PYTHONPATH=. .venv/bin/python benchmarks/vocab.py [--workspace /tmp/xylent-vocab-bench]

Smoke size (about 30 s, most of it the one CLI call that builds the tiny
workspace; no CLI runner table):

    PYTHONPATH=. .venv/bin/python benchmarks/vocab.py --quick
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _p in (str(HERE.parent), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)
import harness  # noqa: E402

ROOT = HERE.parent
DEMO = ROOT / "data_specs" / "demo.yaml"
XYLENT = Path(sys.executable).with_name("xylent")
QUICK_LANGS = ["en", "de", "ja", "ar"]
QUICK_GRID = [200, 400]
REL_TOL = 1e-9
RUNNERS = [("threads", 1), ("threads", 2), ("processes", 1), ("processes", 2)]


# ---------------------------------------------------------------- the workspace, built by the CLI

def quick_spec(folder: Path) -> Path:
    """The demo spec cut to 4 languages and 2 grid sizes (no evaluate tasks, no langid)."""
    import yaml

    data = yaml.safe_load(DEMO.read_text(encoding="utf-8"))
    data.update(languages=QUICK_LANGS)
    data["vocab"]["grid"] = QUICK_GRID
    data["dedup"]["langid"] = False
    data.pop("evaluate", None)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "vocab-quick.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def cli_vocab(spec: Path, ws: Path, *sets: str, force: bool = False) -> dict:
    cmd = [str(XYLENT), "run", "vocab", "--spec", str(spec), "--workspace", str(ws), "--json",
           *(["--force"] if force else []), *(a for s in sets for a in ("--set", s))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def manifest(stage_dir: Path) -> dict:
    return json.loads((Path(stage_dir) / "_manifest.json").read_text())


# ---------------------------------------------------------------- the reference method (VoCapXLM)

def reference_alp(model_file: str, sentences: list[str]) -> float:
    """VoCapXLM's `compute_alp` method: segment line by line with `EncodeAsIds`,
    count pieces in a dict over the whole vocabulary, turn counts into
    frequencies, sum `math.log` of each piece's frequency per line, `np.mean`."""
    import numpy as np
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor()
    sp.Load(str(model_file))
    freq = {i: 0 for i in range(sp.GetPieceSize())}
    segmented, total = [], 0
    for line in sentences:
        ids = sp.EncodeAsIds(line.strip())
        total += len(ids)
        for i in ids:
            freq[i] += 1
        segmented.append(ids)
    for i in freq:
        freq[i] /= total
    per_line = []
    for ids in segmented:
        logp = 0.0
        for i in ids:
            logp += math.log(freq[i])
        per_line.append(logp)
    return float(np.mean(per_line))


def train_options(cfg, threads: int) -> dict:
    """The stage's per-language trainer options (xylent.tasks.vocab.train.train_model)."""
    from xylent.tasks.vocab.specials import CONTROL_SYMBOLS

    return dict(model_type="unigram", character_coverage=cfg.character_coverage,
                input_sentence_size=cfg.input_sentence_size, shuffle_input_sentence=True, byte_fallback=False,
                num_threads=threads, control_symbols=CONTROL_SYMBOLS, minloglevel=2)


def reference_language(lang: str, text_file: Path, held: list[str], out: Path, cfg, seed: int,
                       threads: int) -> list[tuple[int, float]]:
    """VoCapXLM's per-language loop: every size trained, those that fail skipped, ALP of each."""
    import sentencepiece as spm

    points = []
    for size in cfg.grid:
        prefix = out / f"{lang}.{size}"
        spm.set_random_generator_seed(seed)
        try:
            spm.SentencePieceTrainer.train(input=str(text_file), model_prefix=str(prefix), vocab_size=size,
                                           **train_options(cfg, threads))
        except RuntimeError:
            continue
        points.append((size, reference_alp(f"{prefix}.model", held)))
    return points


# ---------------------------------------------------------------- 1. the grid, like for like

def grid_inputs(dedup_dir: Path, cfg, seed: int, folder: Path) -> dict:
    """The stage's own sample of every language (training and held sentences),
    and the training text written where the reference loop reads it."""
    from xylent.tasks.prepare import contract as layout  # the text layout
    from xylent.tasks.vocab.train import sample_language

    out = {}
    folder.mkdir(parents=True, exist_ok=True)
    for lang in layout.group_names(dedup_dir, layout.MONO):
        train, held = sample_language(layout.group_parts(dedup_dir, layout.MONO, lang), cfg, seed)
        text = folder / f"{lang}.txt"
        text.write_text("\n".join(train) + "\n", encoding="utf-8")
        out[lang] = {"train": train, "held": held, "text_file": text}
    return out


def _points(result: dict) -> dict[str, list[tuple[int, float]]]:
    return {lang: [(int(s), float(a)) for s, a in pts] for lang, pts in result.items()}


def compare_points(ours: dict, theirs: dict) -> dict:
    """Largest relative ALP difference and whether the trained sizes agree."""
    worst, same_sizes = 0.0, set(ours) == set(theirs)
    for lang in ours:
        a, b = dict(ours[lang]), dict(theirs.get(lang, []))
        same_sizes &= set(a) == set(b)
        for size in set(a) & set(b):
            worst = max(worst, abs(a[size] - b[size]) / max(abs(a[size]), 1e-300))
    return {"max_rel_diff": worst, "same_sizes": bool(same_sizes)}


def grid_sides(inputs: dict, cfg, seed: int, scratch: Path, threads: int) -> dict:
    """{side: (callable, threads of that side, checked for equality)} at one thread setting."""
    from xylent.tasks.vocab.train import train_grid

    one = cfg.model_copy(update={"threads_per_model": 1})
    langs = sorted(inputs)

    def xylent(workers: int):
        out = scratch / f"xylent-{workers}"

        def one_lang(lang):
            r = train_grid(lang, inputs[lang]["train"], inputs[lang]["held"], out, one, seed)
            return lang, r["points"]

        if workers == 1:
            return _points(dict(map(one_lang, langs)))
        with ThreadPoolExecutor(workers) as pool:
            return _points(dict(pool.map(one_lang, langs)))

    def reference(workers: int, trainer_threads: int):
        out = scratch / f"reference-{workers}-{trainer_threads}"
        out.mkdir(parents=True, exist_ok=True)

        def one_lang(lang):
            return lang, reference_language(lang, inputs[lang]["text_file"], inputs[lang]["held"], out, cfg, seed,
                                            trainer_threads)

        if workers == 1:
            return _points(dict(map(one_lang, langs)))
        with ThreadPoolExecutor(workers) as pool:
            return _points(dict(pool.map(one_lang, langs)))

    if threads == 1:
        return {"xylent": (lambda: xylent(1), 1, True), "reference": (lambda: reference(1, 1), 1, True)}
    return {"xylent": (lambda: xylent(threads), threads, True),
            "reference": (lambda: reference(threads, 1), threads, True),
            "reference_trainer_threads": (lambda: reference(1, threads), threads, False)}


def measure_grid(inputs: dict, cfg, seed: int, scratch: Path, cpus: int, args) -> dict:
    rows, checks, ref_points = [], [], None
    for threads in sorted({1, cpus}):
        sides = grid_sides(inputs, cfg, seed, scratch, threads)
        values, timings = harness.side_by_side({n: s[0] for n, s in sides.items()}, repeats=args.repeats,
                                               warmup=args.warmup)
        for name, (_, side_threads, checked) in sides.items():
            cmp = compare_points(values["xylent"], values[name])
            if checked and not (cmp["same_sizes"] and cmp["max_rel_diff"] <= REL_TOL):
                raise SystemExit(f"grid at {threads} thread(s): {name} disagrees with xylent ({cmp}); "
                                 "no number written")
            rows.append({"side": name, "setting": threads, "threads": side_threads, "checked": checked, **cmp,
                         **timings[name]})
            checks.append({"side": name, "setting": threads, **cmp, "checked": checked})
        if threads == 1:
            ref_points = values["reference"]
        print(json.dumps({n: timings[n]["median_s"] for n in sides} | {"threads": threads}), flush=True)
    models = sum(len(p) for p in ref_points.values())
    return {"languages": len(inputs), "grid": list(cfg.grid), "models": models,
            "train_sentences": {lang: len(v["train"]) for lang, v in inputs.items()},
            "held_sentences": {lang: len(v["held"]) for lang, v in inputs.items()},
            "rows": rows, "reference_points": ref_points}


# ---------------------------------------------------------------- 2. the stage through the CLI

def stage_alps(vocab_dir: Path) -> dict:
    import polars as pl

    alloc = pl.read_parquet(Path(vocab_dir) / "allocation.parquet")
    return {r["lang"]: list(zip(r["sizes"], r["alp"])) for r in alloc.select("lang", "sizes", "alp").to_dicts()}


def measure_runners(spec: Path, ws: Path, ref_points: dict, args) -> dict:
    stage_s: dict[str, list[float]] = {}

    def side(kind: str, workers: int):
        name = f"{kind}-{workers}"

        def run():
            r = cli_vocab(spec, ws, f"runner.kind={kind}", f"runner.max_workers={workers}", force=True)
            vdir = Path(r["stages"]["vocab"]["output_dir"])
            stage_s.setdefault(name, []).append(manifest(vdir)["seconds"])
            return vdir
        return name, run

    sides = dict(side(k, w) for k, w in RUNNERS)
    values, timings = harness.side_by_side(sides, repeats=args.repeats, warmup=args.warmup)
    rows = []
    for (kind, workers), name in zip(RUNNERS, sides):
        runs = stage_s[name]
        warm, timed = runs[:args.warmup], runs[args.warmup:]
        cmp = compare_points(_points(stage_alps(values[name])), ref_points)
        if not (cmp["same_sizes"] and cmp["max_rel_diff"] <= REL_TOL):
            raise SystemExit(f"the stage ({name}) and the reference loop give different ALPs ({cmp}); "
                             "no number written")
        rows.append({"runner": kind, "workers": workers, "stage": harness.summary(timed, warm),
                     "command": timings[name], "alp_vs_reference": cmp})
        print(json.dumps({"runner": kind, "workers": workers, "stage_median_s": rows[-1]["stage"]["median_s"],
                          "command_median_s": timings[name]["median_s"]}), flush=True)
    return {"rows": rows}


# ---------------------------------------------------------------- 3. ALP throughput, in fresh processes

def hf_tokenizer(model_file: Path, out: Path) -> Path:
    """The SentencePiece model as an HF `tokenizers` Unigram (transformers' SpmConverter;
    byte fallback switched on as in the .model, which the converter leaves off)."""
    import types
    import warnings

    from tokenizers import models
    from transformers.convert_slow_tokenizer import SpmConverter

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the converter warns that it drops byte fallback: put back below
        conv = SpmConverter(types.SimpleNamespace(vocab_file=str(model_file)))
        tok = conv.converted()
    tok.model = models.Unigram(conv.vocab(conv.proto), conv.unk_id(conv.proto),
                               byte_fallback=conv.proto.trainer_spec.byte_fallback)
    tok.save(str(out))
    return out


def alp_child(model: str, hf_json: str, sentences_file: str, threads: int, repeats: int, warmup: int) -> dict:
    import sentencepiece as spm
    from tokenizers import Tokenizer

    from xylent.tasks.vocab import average_log_probability
    from xylent.tasks.vocab.alp import alp_from_ids

    sentences = json.loads(Path(sentences_file).read_text(encoding="utf-8"))

    def spm_batch():
        return alp_from_ids(spm.SentencePieceProcessor(model_file=model).encode(sentences, num_threads=threads))

    def hf():
        tok = Tokenizer.from_file(hf_json)
        return alp_from_ids([e.ids for e in tok.encode_batch(sentences, add_special_tokens=False)])

    sides = {"xylent": lambda: average_log_probability(model, sentences, num_threads=threads),
             "reference": lambda: reference_alp(model, sentences), "spm_batch": spm_batch, "hf_tokenizers": hf}
    values, timings = harness.side_by_side(sides, repeats=repeats, warmup=warmup)
    threads_of = {"xylent": threads, "reference": 1, "spm_batch": threads, "hf_tokenizers": threads}
    return {"values": values, "timings": {n: {**t, "threads": threads_of[n]} for n, t in timings.items()}}


def measure_alp(model: Path, sentences: list[str], lang: str, cpus: int, scratch: Path, args) -> dict:
    hf_json = hf_tokenizer(model, scratch / "hf-tokenizer.json")
    sfile = scratch / "alp-sentences.json"
    sfile.write_text(json.dumps(sentences, ensure_ascii=False), encoding="utf-8")
    settings = []
    for threads in sorted({1, cpus}):
        r = harness.in_fresh_process("vocab", "alp_child", {
            "model": str(model), "hf_json": str(hf_json), "sentences_file": str(sfile), "threads": threads,
            "repeats": args.repeats, "warmup": args.warmup}, threads=threads)["result"]
        ours = r["values"]["xylent"]
        for name, v in r["values"].items():
            if not math.isclose(v, ours, rel_tol=REL_TOL, abs_tol=0.0):
                raise SystemExit(f"ALP at {threads} thread(s): {name} gives {v!r}, xylent {ours!r}; no number written")
        settings.append({"setting": threads, "alp": ours,
                         "max_rel_diff": max(abs(v - ours) / abs(ours) for v in r["values"].values()),
                         "sides": r["timings"]})
        print(json.dumps({n: t["median_s"] for n, t in r["timings"].items()} | {"threads": threads}), flush=True)
    return {"lang": lang, "sentences": len(sentences), "settings": settings}


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--workspace", default=None,
                    help="workspace the CLI builds (or reuses); default /tmp/xylent-vocab-bench, quick: "
                         "/tmp/xylent-vocab-bench-quick")
    ap.add_argument("--spec", default=None, help=f"spec (default {DEMO.relative_to(ROOT)}; quick: a 4-language cut "
                                                 "of it written into the workspace)")
    ap.add_argument("--alp-lang", default="de", help="language of the ALP throughput sentences")
    ap.add_argument("--alp-copies", type=int, default=None, help="times its sentences are repeated (40, quick 4)")
    ap.add_argument("--skip-runners", action="store_true", help="leave out the CLI runner table (always in --quick)")
    args = harness.finish_args(ap.parse_args(argv))
    ws = Path(args.workspace or ("/tmp/xylent-vocab-bench-quick" if args.quick else "/tmp/xylent-vocab-bench"))
    spec = Path(args.spec) if args.spec else (quick_spec(ws) if args.quick else DEMO)
    copies = args.alp_copies or (4 if args.quick else 40)
    cpus = len(os.sched_getaffinity(0))

    import polars as pl

    from xylent.tasks.prepare import contract as layout  # the text layout
    from xylent.spec import load_spec

    cfg_spec = load_spec(spec)
    cfg, seed = cfg_spec.vocab, cfg_spec.seed
    built = cli_vocab(spec, ws)  # builds (or reuses) everything upstream once
    dedup_dir = Path(built["stages"]["dedup"]["output_dir"])
    vocab_dir = Path(built["stages"]["vocab"]["output_dir"])
    build = {"vocab_cached": built["stages"]["vocab"]["cached"], "stage_seconds": manifest(vocab_dir)["seconds"]}

    with tempfile.TemporaryDirectory(prefix="xylent-vocab-bench-") as tmp:
        scratch = Path(tmp)
        inputs = grid_inputs(dedup_dir, cfg, seed, scratch / "text")
        grid = measure_grid(inputs, cfg, seed, scratch / "grid", cpus, args)
        if args.quick or args.skip_runners:
            runners = {"skipped": "--quick" if args.quick else "--skip-runners"}
        else:
            runners = measure_runners(spec, ws, grid["reference_points"], args)
        mono = pl.read_parquet(layout.group_parts(dedup_dir, layout.MONO, args.alp_lang), columns=["text"])
        sentences = mono["text"].to_list() * copies
        alp = measure_alp(vocab_dir / "spm.model", sentences, args.alp_lang, cpus, scratch, args)

    cmp = pl.read_parquet(vocab_dir / "comparison.parquet").sort("examples", descending=True)
    table = cmp.select("lang", "examples", "tokens_per_sentence_vocap", "tokens_per_sentence_joint",
                       "chars_per_token_vocap", "chars_per_token_joint").to_dicts()
    try:
        spec_shown = str(spec.resolve().relative_to(ROOT))
    except ValueError:
        spec_shown = str(spec)
    harness.write_result("vocab", {
        "spec": spec_shown, "languages": grid["languages"], "grid_sizes": grid["grid"], "cpus": cpus,
        "seed": seed, "tolerance_rel": REL_TOL, "build": build, "grid": grid, "runners": runners, "alp": alp,
        "tokens_per_sentence": table,
    }, args)


# ---------------------------------------------------------------- the doc

GRID_LABELS = {"xylent": "xylent `train_grid`", "reference": "reference method (VoCapXLM loop)",
               "reference_trainer_threads": "reference method, trainer `num_threads`"}
ALP_LABELS = {"xylent": "xylent `average_log_probability`", "reference": "reference method (VoCapXLM `compute_alp`)",
              "spm_batch": "SentencePiece batched `encode(num_threads)` + numpy", "hf_tokenizers":
              "HF `tokenizers` Unigram `encode_batch` + numpy"}


def _cell(s: dict, n: int) -> str:
    return f"{harness.seconds(s['median_s'])} ({harness.seconds(s['best_s'])})" if n > 1 else harness.seconds(
        s["median_s"])


def markdown(result: dict) -> str:
    if "grid" not in result:
        return "*This result predates the side-by-side harness: rerun `python benchmarks/vocab.py`.*\n"
    n, g = result["repeats"], result["grid"]
    timing = "median (best)" if n > 1 else "one run"
    runs = f"{n} timed run{'s' if n > 1 else ''} per side after {result['warmup']} warm-up, alternating"
    out = [f"**Grid, like for like** ({g['languages']} languages × sizes {', '.join(map(str, g['grid']))}: "
           f"{g['models']} models trained; the stage's own sample of each language; {runs}; {timing}):", ""]
    by = {(r["setting"], r["side"]): r for r in g["rows"]}
    rows = []
    for r in g["rows"]:
        x = by[(r["setting"], "xylent")]
        eq = (f"equal (max rel. diff {harness.num(r['max_rel_diff'])})" if r["checked"]
              else f"not checked: other models (max rel. ALP diff {harness.num(r['max_rel_diff'])})")
        how = "1" if r["threads"] == 1 else (f"{r['threads']} (trainer threads)" if r["side"].endswith("threads")
                                             else f"{r['threads']} (languages on a thread pool)")
        rows.append([GRID_LABELS[r["side"]], how, _cell(r, n), f"{r['median_s'] / x['median_s']:.2f}×", eq])
    out += [harness.table(["side", "threads", "time", "time ÷ xylent's", "ALPs vs xylent"], rows), ""]
    if (1, "reference") in by:
        r = by[(1, "reference")]["median_s"] / by[(1, "xylent")]["median_s"]
        out.append(f"- At 1 thread the reference loop takes {r:.2f}× xylent's time for the same {g['models']} models "
                   "and ALPs.")
    cpus = result["cpus"]
    if (cpus, "xylent") in by and cpus > 1:
        x1, xn = by[(1, "xylent")]["median_s"], by[(cpus, "xylent")]["median_s"]
        out.append(f"- xylent on {cpus} threads: {x1 / xn:.2f}× its 1-thread speed.")
        if (cpus, "reference_trainer_threads") in by:
            rt = by[(cpus, "reference_trainer_threads")]
            speed = by[(1, "reference")]["median_s"] / rt["median_s"]
            out.append(f"- SentencePiece's own trainer threads: {speed:.2f}× the speed of the 1-thread reference loop, "
                       "and the models change (EM sums in another order).")

    rn = result["runners"]
    if "rows" in rn:
        out += ["", f"**The stage through the CLI** (`xylent run vocab --force`; {runs}; stage = the manifest's "
                "seconds, which include composing the merged model, the joint baseline, evaluation and plots; "
                "command = the whole CLI call; the reference loop is the grid alone, from the table above):", ""]
        rows = [[f"{r['runner']}", r["workers"], _cell(r["stage"], n), _cell(r["command"], n),
                 f"equal (max rel. diff {harness.num(r['alp_vs_reference']['max_rel_diff'])})"] for r in rn["rows"]]
        for key, label in (((1, "reference"), "reference loop, one process (grid only)"),
                           ((cpus, "reference"), f"reference loop, {cpus} threads (grid only)")):
            if key in by and (key[0] == 1 or cpus > 1):
                rows.append([label, key[0], _cell(by[key], n), "–", "–"])
        out += [harness.table(["runner", "workers", "stage", "command", "ALPs vs reference loop"], rows), ""]
        st = {(r["runner"], r["workers"]): r["stage"]["median_s"] for r in rn["rows"]}
        if ("threads", 1) in st and ("threads", 2) in st:
            out.append(f"- Threads runner: 2 workers run the stage {st[('threads', 1)] / st[('threads', 2)]:.2f}× "
                       "as fast as 1.")
        if ("processes", 2) in st and ("threads", 2) in st:
            out.append(f"- Processes vs threads at 2 workers: the process runner takes "
                       f"{st[('processes', 2)] / st[('threads', 2)]:.2f}× the time.")
    else:
        out += ["", f"*The CLI runner table was not measured in this run ({rn['skipped']}).*"]

    a = result["alp"]
    out += ["", f"**ALP throughput** ({harness.num(a['sentences'])} {a['lang']} sentences, the VoCAP model; {runs}, "
            f"one fresh process per thread setting; sentences/s from the median):", ""]
    rows = []
    for s in a["settings"]:
        x = s["sides"]["xylent"]
        for name, t in s["sides"].items():
            rows.append([ALP_LABELS[name], s["setting"], t["threads"], _cell(t, n),
                         harness.num(round(a["sentences"] / t["median_s"])), f"{t['median_s'] / x['median_s']:.2f}×"])
    out += [harness.table(["side", "cores given", "threads used", "time", "sentences/s", "time ÷ xylent's"], rows), ""]
    worst = max(s["max_rel_diff"] for s in a["settings"])
    out.append(f"- Every side gives the same ALP as xylent (max relative difference {harness.num(worst)}; checked "
               f"against {result['tolerance_rel']:g}, the script stops otherwise).")
    for s in a["settings"]:
        sd = s["sides"]
        best_peer = min((k for k in sd if k != "xylent"), key=lambda k: sd[k]["median_s"])
        r = sd[best_peer]["median_s"] / sd["xylent"]["median_s"]
        ref = sd["reference"]["median_s"] / sd["xylent"]["median_s"]
        verdict = "faster than" if r > 1 else "slower than"
        out.append(f"- {s['setting']} thread setting: xylent is {ref:.2f}× the reference method's speed; the "
                   f"fastest peer ({ALP_LABELS[best_peer]}) takes {r:.2f}× xylent's time, so xylent is "
                   f"{verdict} it.")

    tps = result.get("tokens_per_sentence") or []
    if tps:
        rows = [[t["lang"], harness.num(t["examples"]), f"{t['tokens_per_sentence_vocap']:.2f}",
                 f"{t['tokens_per_sentence_joint']:.2f}" if t["tokens_per_sentence_joint"] is not None else "–",
                 f"{t['chars_per_token_vocap']:.2f}",
                 f"{t['chars_per_token_joint']:.2f}" if t["chars_per_token_joint"] is not None else "–"]
                for t in tps]
        shorter = [t["lang"] for t in tps if t["tokens_per_sentence_joint"] is not None
                   and t["tokens_per_sentence_vocap"] < t["tokens_per_sentence_joint"]]
        out += ["", "**VoCAP vs joint** (tokens per sentence and characters per token on each language's held "
                "sample; the joint model has the same size):", "",
                harness.table(["lang", "examples", "tokens/sentence VoCAP", "joint", "chars/token VoCAP", "joint"],
                              rows), "",
                f"VoCAP is shorter for {len(shorter)} of {len(tps)} languages"
                + (f" ({', '.join(shorter)})." if shorter else ".")]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
