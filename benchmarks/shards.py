"""shards: tokenisation vs plain SentencePiece, and the training loader vs pyarrow and torch.

1. Tokenisation, the same text and the same cores on both sides. For each core
   count (1, 2 and all usable CPUs) one fresh process, pinned to that many CPUs
   (every thread, so helper threads share them) with every pool capped, runs
   side by side (`harness.side_by_side`: the same warm-up, alternating timed runs):
   - `sentencepiece`: plain batch encode, `sp.encode(texts, num_threads=cores)`,
     of the text already in memory (Python lists out): the peer;
   - `sentencepiece_arrays`: the same, then the lists flattened into int32 ids +
     lengths, the output the stage keeps;
   - `tokenize_part`: the stage's per-part task (read Parquet, encode, flatten,
     save the ids) over every part, one task. It runs two threads: the next chunk
     is segmented on a helper thread while the main thread converts this one;
   - `tokenize_part xN` (2+ cores): the parts spread over N worker threads, as
     the stage's threads runner does with N workers (2N threads);
   - `pack_language`: the per-language path (tokenise + pack 512-token sequences
     + write Arrow, same helper thread).
   The ids must be identical on every side (the packed shards with their
   <s>/</s> taken out included) or the script fails. Target: tokenize_part's time
   ratio (peer / ours, medians) >= 0.8 on the same cores.
2. Loader: MRTD batches of 8 x 512 on one core (each run a fresh process pinned
   to one CPU, `harness.repeated_in_fresh_processes`, so the peak RSS is each
   run's own VmHWM), over the shards pack_language wrote; the same number of
   batches of the same shape on every side, tokens = non-pad ids; the timed
   call opens the shards and draws every batch:
   - `xylent`: `xylent.data.loader.TrainingLoader` (sampling, prefetch thread);
   - `pyarrow`: the floor: memory-map the same Arrow files and cut their ids,
     in file order, into 8 x 512 arrays (+ attention mask);
   - `torch`: `torch.utils.data.DataLoader` over a map-style Dataset on the same
     memory-mapped files (row -> padded ids + mask), shuffled, batch_size 8,
     num_workers 0 and 1.
   torch is imported before the timed call on every side (a trainer has it
   anyway); the loader's RSS without torch is measured in one more run. The
   DataLoader, fed the loader's own row order, must give identical batches.
   Target: >= 1M tokens/s.

Text: the demo's real text (Django's catalogs in 20 languages, read from the
installed package; documents of 3 rows, each row 4 random messages) tokenised by a unigram
model (3 000 pieces, the project's special ids) trained on it here, so no
workspace is needed; `--workspace DIR` uses a demo workspace's own tokenizer
and deduplicated text instead (after `make demo`).

Full size (about 5 min on 2 cores):

    PYTHONPATH=. .venv/bin/python benchmarks/shards.py --mb 60

Smoke size (about 25 s of CPU, a minute on a busy machine; results under benchmarks/results/quick/):

    PYTHONPATH=. .venv/bin/python benchmarks/shards.py --quick
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from itertools import chain
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)
import harness  # noqa: E402
from harness import pin_cores  # noqa: E402

SEQ_LEN, BATCH, SHARD_BYTES = 512, 8, 256 << 20
TARGETS = {"tokenize_ratio": 0.8, "loader_tokens_per_s": 1e6}
DEMO_LANGUAGES = ["en", "de", "fr", "es", "ca", "pt", "ru", "uk", "ar", "fa", "hi", "bn", "zh", "ja", "ko", "th",
                  "sw", "tr", "el", "he"]
PEER = "sentencepiece"


# ---------------------------------------------------------------- text and tokenizer

def stage_dir(ws: Path, stage: str) -> Path:
    out = subprocess.run([str(Path(sys.executable).with_name("xylent")), "status", "--spec",
                          str(ROOT / "data_specs" / "demo.yaml"), "--workspace", str(ws), "--json"],
                         capture_output=True, text=True, check=True).stdout
    return Path(json.loads(out)["stages"][stage]["output_dir"])


def demo_text() -> list[str]:
    """Every message of Django's catalogs in the demo's languages (English once)."""
    from xylent.tasks.evaluate.data import package_pairs

    pairs = package_pairs("django", DEMO_LANGUAGES[1:])
    return [t for lang in DEMO_LANGUAGES[1:] for t in pairs[lang][0]] + pairs["de"][1]


def train_tokenizer(lines: list[str], folder: Path, vocab_size: int = 3000) -> Path:
    """A unigram model with the vocab stage's special ids (<unk> <s> </s> <pad> <mask>) and byte fallback."""
    import sentencepiece as spm

    from xylent.tasks.vocab.specials import PAD, TRAINER_IDS

    folder.mkdir(parents=True, exist_ok=True)
    text = folder / "train.txt"
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spm.set_random_generator_seed(0)
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(folder / "spm"), vocab_size=vocab_size,
                                   model_type="unigram", character_coverage=0.9995, byte_fallback=True,
                                   num_threads=1, control_symbols=["<mask>"], pad_id=PAD, minloglevel=2,
                                   hard_vocab_limit=False, **TRAINER_IDS)
    return folder / "spm.model"


def write_parts(texts: list[str], mb: float, n_parts: int, folder: Path) -> dict:
    """Documents of 3 rows, each row 4 random paragraphs joined, until `mb` MB;
    written as `n_parts` Parquet parts (doc_id, text, source) like dedup's."""
    import polars as pl

    rng = np.random.default_rng(0)
    rows, size = [], 0
    while size < mb * 1_000_000:
        rows.append(" ".join(texts[i] for i in rng.integers(0, len(texts), size=4)))
        size += len(rows[-1].encode())
    df = pl.DataFrame({"doc_id": [f"d{i // 3}" for i in range(len(rows))], "text": rows,
                       "source": ["bench"] * len(rows)})
    folder.mkdir(parents=True, exist_ok=True)
    cuts = np.linspace(0, len(rows), n_parts + 1).astype(int)
    parts = []
    for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        parts.append(str(folder / f"part-{k:05d}.parquet"))
        df.slice(int(a), int(b - a)).write_parquet(parts[-1])
    return {"parts": parts, "rows": len(rows), "text_mb": round(size / 1e6, 2)}


# ---------------------------------------------------------------- 1. tokenisation (one fresh process per core count)

def as_arrays(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """SentencePiece's lists as flat int32 ids + lengths."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    return np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum())), lengths


def tokenise_child(model: str, parts: list[str], cores: int, repeats: int, warmup: int, work: str) -> dict:
    """Every side on `cores` CPUs, side by side; fails unless all give the same ids."""
    from concurrent.futures import ThreadPoolExecutor

    import polars as pl
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import sentencepiece as spm

    from xylent.tasks.shards.build import pack_language, tokenize_part

    cpus = pin_cores(cores)
    sp = spm.SentencePieceProcessor(model_file=model)
    paths, work_p = [Path(p) for p in parts], Path(work)
    texts = pl.concat([pl.read_parquet(p, columns=["text"]) for p in paths])["text"].to_list()

    def tokenize_parts(workers: int, tag: str) -> list[Path]:
        dests = [work_p / tag / f"p{k:05d}.npz" for k in range(len(paths))]
        if workers == 1:  # one task: the parts one after the other
            for p, d in zip(paths, dests):
                tokenize_part(p, sp, d)
        else:  # the stage's threads runner with `workers` workers
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(lambda pd: tokenize_part(pd[0], sp, pd[1]), zip(paths, dests)))
        return dests

    def pack() -> dict:
        root = work_p / "pack"
        stats = pack_language(paths, sp, root / "mrtd" / "lang=xx", SEQ_LEN, SHARD_BYTES)
        return {**stats, "shards": stats["shards"].finish(root)}

    sides = {PEER: lambda: sp.encode(texts, num_threads=cores),
             "sentencepiece_arrays": lambda: as_arrays(sp.encode(texts, num_threads=cores)),
             "tokenize_part": lambda: tokenize_parts(1, "one")}
    threads = {PEER: cores, "sentencepiece_arrays": cores, "tokenize_part": 2}
    if cores > 1:
        sides[f"tokenize_part x{cores}"] = lambda: tokenize_parts(cores, "fan")
        threads[f"tokenize_part x{cores}"] = 2 * cores
    sides["pack_language"] = pack
    threads["pack_language"] = 2
    values, summaries = harness.side_by_side(sides, repeats=repeats, warmup=warmup)

    flat, lengths = as_arrays(values[PEER])
    equal = {"sentencepiece_arrays": bool(np.array_equal(values["sentencepiece_arrays"][0], flat)
                                          and np.array_equal(values["sentencepiece_arrays"][1], lengths))}
    for side in sides:
        if side.startswith("tokenize_part"):
            saved = [np.load(d) for d in values[side]]
            equal[side] = bool(np.array_equal(np.concatenate([s["flat"] for s in saved]), flat)
                               and np.array_equal(np.concatenate([s["lengths"] for s in saved]), lengths))
    packed = values["pack_language"]
    stream = np.concatenate([ipc.open_file(pa.memory_map(str(work_p / "pack" / s["path"]))).read_all()
                             .column("input_ids").combine_chunks().values.to_numpy() for s in packed["shards"]])
    text_ids = stream[(stream != sp.bos_id()) & (stream != sp.eos_id())]
    equal["pack_language"] = bool(np.array_equal(text_ids, flat) and packed["text_tokens"] == len(flat))
    bad = [k for k, v in equal.items() if not v]
    if bad:
        raise RuntimeError(f"{cores} cores: {', '.join(bad)} gave other ids than plain SentencePiece")
    return {"cpus": cpus, "tokens": len(flat), "texts": len(texts), "summaries": summaries, "threads": threads,
            "equal_ids": equal, "pack": {k: v for k, v in packed.items() if k != "shards"},
            "shards": packed["shards"], "shards_root": str(work_p / "pack")}


# ---------------------------------------------------------------- 2. the loader (one fresh process per run)

def _mapped_lists(shards: list[str]) -> list:
    """The input_ids ListArray chunks of the Arrow files, memory-mapped (nothing read yet)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    return [chunk for p in shards
            for chunk in ipc.open_file(pa.memory_map(p)).read_all().column("input_ids").chunks]


def torch_dataset(shards: list[str], pad: int):
    """The map-style Dataset a user would write over the Arrow files: row i -> padded ids + mask."""
    import torch

    class ArrowRows(torch.utils.data.Dataset):
        def __init__(self):
            chunks = _mapped_lists(shards)
            self.offsets = [c.offsets.to_numpy() for c in chunks]
            self.values = [c.values.to_numpy() for c in chunks]
            self.starts = np.cumsum([0] + [len(c) for c in chunks])

        def __len__(self):
            return int(self.starts[-1])

        def __getitem__(self, i):
            c = int(np.searchsorted(self.starts, i, side="right") - 1)
            j = i - int(self.starts[c])
            row = self.values[c][self.offsets[c][j]: self.offsets[c][j + 1]]
            ids = np.full(SEQ_LEN, pad, dtype=np.int32)
            ids[: len(row)] = row
            mask = (ids != pad).astype(np.int8)
            return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}

    return ArrowRows()


def _worker_hwm_mb(iterator) -> float | None:
    """Peak RSS of a DataLoader iterator's first worker process (torch internals; None if unavailable)."""
    workers = getattr(iterator, "_workers", None)
    if not workers:
        return None
    try:
        with open(f"/proc/{workers[0].pid}/status") as f:
            return round(next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024, 1)
    except (OSError, StopIteration):
        return None


def loader_child(side: str, shards_dir: str, sampling: str, steps: int) -> dict:
    """`steps` batches of 8 x 512 from one side, pinned to one CPU; tokens = non-pad ids."""
    cpus = pin_cores(1)
    index = json.loads((Path(shards_dir) / "index.json").read_text())
    pad = index["specials"]["pad"]
    shards = [str(Path(shards_dir) / s["path"]) for s in index["mrtd"]["xx"]["shards"]]
    tokens, extra = 0, {}
    if side == "xylent":
        from xylent.data.loader import TrainingLoader

        loader = TrainingLoader(shards_dir, sampling, task="mrtd", batch_size=BATCH, prefetch=4, verify=False)
        for batch in loader.batches(steps):
            tokens += int(batch["attention_mask"].sum())
        shape = batch["input_ids"].shape
    elif side == "pyarrow":
        values = [c.values.to_numpy() for c in _mapped_lists(shards)]
        need, k, pos = BATCH * SEQ_LEN, 0, 0
        for _ in range(steps):
            pieces, got = [], 0
            while got < need:  # the next `need` ids in file order, wrapping at the end
                take = min(need - got, len(values[k]) - pos)
                pieces.append(values[k][pos: pos + take])
                got, pos = got + take, pos + take
                if pos == len(values[k]):
                    k, pos = (k + 1) % len(values), 0
            ids = (pieces[0] if len(pieces) == 1 else np.concatenate(pieces)).reshape(BATCH, SEQ_LEN).copy()
            mask = (ids != pad).astype(np.int8)
            tokens += int(mask.sum())
        shape = ids.shape
    elif side.startswith("torch"):
        import torch

        torch.set_num_threads(1)
        workers = int(side.rsplit("w", 1)[1])
        ds = torch_dataset(shards, pad)
        sampler = torch.utils.data.RandomSampler(ds, num_samples=steps * BATCH,
                                                 generator=torch.Generator().manual_seed(0))
        dl = torch.utils.data.DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=workers)
        it = iter(dl)
        for k, batch in enumerate(it):
            tokens += int(batch["attention_mask"].sum())
            if k == steps - 1 and workers:
                extra["worker_peak_rss_mb"] = _worker_hwm_mb(it)
        shape = tuple(batch["input_ids"].shape)
    else:
        raise ValueError(side)
    return {"tokens": tokens, "batches": steps, "shape": list(shape), "cpus": cpus, **extra}


def loader_equality_child(shards_dir: str, sampling: str, steps: int) -> dict:
    """The torch DataLoader fed the TrainingLoader's own row order must give the same batches."""
    import torch

    from xylent.data.loader import TrainingLoader

    loader = TrainingLoader(shards_dir, sampling, task="mrtd", batch_size=BATCH, prefetch=4, verify=False)
    ours = list(loader.batches(steps))
    order = [i for b in ours for _, i in b["examples"]]
    index = json.loads((Path(shards_dir) / "index.json").read_text())
    ds = torch_dataset([str(Path(shards_dir) / s["path"]) for s in index["mrtd"]["xx"]["shards"]],
                       index["specials"]["pad"])
    theirs = list(torch.utils.data.DataLoader(ds, batch_size=BATCH, sampler=order, num_workers=0))
    same = len(ours) == len(theirs) and all(
        np.array_equal(a["input_ids"], b["input_ids"].numpy())
        and np.array_equal(a["attention_mask"], b["attention_mask"].numpy()) for a, b in zip(ours, theirs))
    if not same:
        raise RuntimeError("torch DataLoader over the same rows gave other batches than TrainingLoader")
    return {"batches_compared": len(ours), "identical": same}


def write_loader_inputs(res: dict, specials: dict) -> tuple[str, str]:
    """index.json next to pack_language's shards, and a one-language sampling table."""
    import polars as pl

    root = Path(res["shards_root"])
    index = {"seq_len": SEQ_LEN, "specials": specials,
             "mrtd": {"xx": {"rows": sum(s["rows"] for s in res["shards"]), "shards": res["shards"]}}, "trtd": {}}
    (root / "index.json").write_text(json.dumps(index))
    samp = root.parent / "sampling"
    samp.mkdir(exist_ok=True)
    pl.DataFrame({"lang": ["xx"], "examples": [1], "tokens": [None], "p_raw": [1.0], "p": [1.0]},
                 schema_overrides={"tokens": pl.Int64}).write_parquet(samp / "mono_sampling.parquet")
    return str(root), str(samp)


# ---------------------------------------------------------------- the run

def main(argv: list[str] | None = None) -> dict:
    ap = harness.parser(__doc__)
    ap.add_argument("--workspace", default=None, help="use this demo workspace's tokenizer and dedup text "
                                                      "(default: build both from Django's catalogs)")
    ap.add_argument("--mb", type=float, default=None, help="text to tokenise (default 60, quick 1)")
    ap.add_argument("--parts", type=int, default=None, help="Parquet parts (default max(4, cores), quick 2)")
    ap.add_argument("--steps", type=int, default=None, help="loader batches per run (default 5000, quick 200)")
    args = harness.finish_args(ap.parse_args(argv))
    cpus = len(os.sched_getaffinity(0))
    mb = args.mb or (1 if args.quick else 60)
    steps = args.steps or (200 if args.quick else 5000)
    n_parts = args.parts or (2 if args.quick else max(4, cpus))
    tmp = Path(tempfile.mkdtemp(prefix="xylent-shards-bench-"))
    try:
        import polars as pl
        import sentencepiece as spm

        from xylent.tasks.vocab.specials import special_ids

        if args.workspace:
            ws = Path(args.workspace)
            model = stage_dir(ws, "vocab") / "spm.model"
            texts = pl.read_parquet(stage_dir(ws, "dedup") / "mono" / "**" / "*.parquet")["text"].to_list()
            source = f"demo workspace {ws}: its tokenizer and deduplicated text"
        else:
            texts = demo_text()
            model = train_tokenizer(texts, tmp / "tokenizer")
            source = "the demo's text, Django's catalogs read from the installed package; a unigram model trained on it"
        sp = spm.SentencePieceProcessor(model_file=str(model))
        specials = special_ids(sp)
        corpus = write_parts(texts, mb, n_parts, tmp / "parts")
        print(f"{corpus['text_mb']} MB in {corpus['rows']} rows, {n_parts} parts; tokenizer {sp.vocab_size()} pieces",
              flush=True)

        tokenisation = []
        for cores in sorted({1, min(2, cpus), cpus}):
            res = harness.in_fresh_process("shards", "tokenise_child", {
                "model": str(model), "parts": corpus["parts"], "cores": cores, "repeats": args.repeats,
                "warmup": args.warmup, "work": str(tmp / f"tok-{cores}")}, threads=cores)["result"]
            tokenisation.append(condition(res, cores))
            print({k: tokenisation[-1][k] for k in ("cores", "ratio")}, flush=True)

        shards_dir, sampling = write_loader_inputs(res, specials)
        kw = {"shards_dir": shards_dir, "sampling": sampling, "steps": steps}
        equality = harness.in_fresh_process("shards", "loader_equality_child", {**kw, "steps": min(steps, 300)},
                                            threads=1)["result"]
        runs = harness.repeated_in_fresh_processes(
            {side: ("shards", "loader_child", {"side": side, **kw})
             for side in ("xylent", "pyarrow", "torch w0", "torch w1")},
            repeats=args.repeats, warmup=args.warmup, threads=1,
            preload=("torch", "xylent.tasks.shards", "pyarrow.ipc", "pandas"))  # pyarrow imports pandas on first use
        alone = harness.in_fresh_process("shards", "loader_child", {"side": "xylent", **kw}, threads=1,
                                         preload=("xylent.tasks.shards",))
        loader = {"batch": f"{BATCH} x {SEQ_LEN}", "batches": steps, "cores": 1,
                  "shard_mb": round(sum((Path(shards_dir) / s["path"]).stat().st_size for s in res["shards"]) / 1e6,
                                    1),
                  "rows": sum(s["rows"] for s in res["shards"]),
                  "threads": {"xylent": "main + prefetch thread", "pyarrow": "1", "torch w0": "1 (torch 1 thread)",
                              "torch w1": "main + 1 worker process"},
                  "sides": runs, "equality": equality,
                  "xylent_alone": {"peak_rss_mb": alone["peak_rss_mb"], "rss_before_mb": alone["rss_before_mb"],
                                   "seconds": alone["seconds"], "preload": "xylent.tasks.shards (no torch)"}}
        for side, s in runs.items():
            s["tokens_per_s"] = round(s["result"]["tokens"] / s["median_s"])
            s["tokens_per_s_best"] = round(s["result"]["tokens"] / s["best_s"])
        print({side: s["tokens_per_s"] for side, s in runs.items()}, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    payload = {"peer": "plain sentencepiece batch encode (num_threads = cores) of the same text; "
                       "pyarrow (floor) and torch DataLoader over the same shards",
               "targets": {"tokenize_ratio": f">= {TARGETS['tokenize_ratio']}",
                           "loader_tokens_per_s": f">= {TARGETS['loader_tokens_per_s']:g}"},
               "cpus": cpus, "text": {"source": source, **{k: v for k, v in corpus.items() if k != "parts"},
                                      "parts": n_parts, "tokenizer_pieces": sp.vocab_size(), "specials": specials},
               "tokenisation": tokenisation, "loader": loader}
    payload.update(verdict(payload))
    harness.write_result("shards", payload, args)
    return payload


def condition(res: dict, cores: int) -> dict:
    """One core count's sides with tokens/s and ratios to the peer (medians)."""
    s = res["summaries"]
    sides = {name: {**summ, "threads": res["threads"][name], "equal_ids": res["equal_ids"].get(name, True),
                    "tokens_per_s": round(res["tokens"] / summ["median_s"]),
                    "ratio_to_peer": harness.ratio(summ, s[PEER]),
                    "ratio_to_peer_best": harness.ratio(summ, s[PEER], "best_s")} for name, summ in s.items()}
    return {"cores": cores, "cpus": res["cpus"], "tokens": res["tokens"], "texts": res["texts"], "sides": sides,
            "ratio": sides["tokenize_part"]["ratio_to_peer"], "pack": res["pack"]}


def verdict(result: dict) -> dict:
    tok = {str(c["cores"]): c["ratio"] >= TARGETS["tokenize_ratio"] for c in result["tokenisation"]}
    load = result["loader"]["sides"]["xylent"]["tokens_per_s"] >= TARGETS["loader_tokens_per_s"]
    return {"met": {"tokenize_ratio_by_cores": tok, "loader_tokens_per_s": load},
            "pass": all(tok.values()) and load}


# ---------------------------------------------------------------- the doc

def _met(ok: bool) -> str:
    return "met" if ok else "**MISSED**"


def markdown(result: dict) -> str:
    tok, load = result["tokenisation"], result["loader"]
    text = result["text"]
    out = [f"{harness.num(text['text_mb'])} MB of text in {harness.num(text['rows'])} rows, {text['parts']} "
           f"Parquet parts, {harness.num(tok[0]['tokens'])} tokens; tokenizer: {text['tokenizer_pieces']} pieces "
           f"({text['source']}).",
           harness.table(
               ["cores", "side", "threads", "best", "median", "tokens/s (median)", "vs plain sentencepiece",
                "same ids"],
               [[c["cores"], f"`{name}`", s["threads"], harness.seconds(s["best_s"]), harness.seconds(s["median_s"]),
                 harness.num(s["tokens_per_s"]),
                 "peer" if name == PEER
                 else f"{harness.num(s['ratio_to_peer'])}× (best {harness.num(s['ratio_to_peer_best'])}×)",
                 "–" if name == PEER else ("yes" if s["equal_ids"] else "**NO**")]
                for c in tok for name, s in c["sides"].items()])]
    lines = []
    for c in tok:
        s = c["sides"]
        line = (f"{c['cores']} core{'s' if c['cores'] > 1 else ''}: `tokenize_part` (2 threads) runs at "
                f"**{harness.num(c['ratio'])}×** the speed of `sentencepiece` on {c['cores']} thread"
                f"{'s' if c['cores'] > 1 else ''} (target ≥ {TARGETS['tokenize_ratio']}: "
                f"{_met(c['ratio'] >= TARGETS['tokenize_ratio'])}), "
                f"{harness.num(s['tokenize_part']['ratio_to_peer'] / s['sentencepiece_arrays']['ratio_to_peer'])}× "
                f"the peer that also turns the lists into arrays")
        fan = next((n for n in s if n.startswith("tokenize_part x")), None)
        if fan:
            line += f"; spread over {c['cores']} workers as the stage does, {harness.num(s[fan]['ratio_to_peer'])}×"
        lines.append(line + f"; `pack_language` {harness.num(s['pack_language']['ratio_to_peer'])}×.")
    out.append("\n".join(f"- {x}" for x in lines))
    sides = load["sides"]
    x, floor = sides["xylent"], sides["pyarrow"]
    out.append(harness.table(
        ["loader, 1 core", "threads", "best", "median", "tokens/s (median)", "speed relative to xylent", "peak RSS",
         "RSS before the call"],
        [[f"`{name}`", load["threads"][name], harness.seconds(s["best_s"]), harness.seconds(s["median_s"]),
          harness.num(s["tokens_per_s"]), f"{s['tokens_per_s'] / x['tokens_per_s']:.2f}×",
          f"{harness.num(s['peak_rss_mb'])} MB"
          + (f" + worker {harness.num(s['result']['worker_peak_rss_mb'])} MB"
             if s["result"].get("worker_peak_rss_mb") else ""),
          f"{harness.num(s['rss_before_mb'])} MB"] for name, s in sides.items()]))
    torch_best = max((s["tokens_per_s"] for n, s in sides.items() if n.startswith("torch")), default=None)
    alone = load["xylent_alone"]
    out.append(
        f"{harness.num(load['batches'])} batches of {load['batch']} per run over {harness.num(load['rows'])} packed "
        f"rows ({harness.num(load['shard_mb'])} MB of Arrow). `TrainingLoader` delivers "
        f"**{harness.num(x['tokens_per_s'])}** tokens/s on one core (target ≥ 1 M: "
        f"{_met(x['tokens_per_s'] >= TARGETS['loader_tokens_per_s'])}), "
        f"{x['tokens_per_s'] / floor['tokens_per_s']:.2f}× the pyarrow floor"
        + (f" and {x['tokens_per_s'] / torch_best:.1f}× the faster torch DataLoader" if torch_best else "")
        + f". Its peak RSS without torch imported: {harness.num(alone['peak_rss_mb'])} MB "
        f"({harness.num(alone['rss_before_mb'])} MB after imports). The DataLoader given the loader's own row order "
        f"returned identical batches ({load['equality']['batches_compared']} compared); the floor reads rows in file "
        f"order, so only its shape and token count compare.")
    return "\n\n".join(out) + "\n"


if __name__ == "__main__":
    main()
