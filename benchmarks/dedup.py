"""Near-duplicate detection vs datasketch, and the dedup stage's memory.

1. Quality and speed, side by side, on one corpus with planted near-duplicates
   (every 4th original followed by a copy with 1 % of its words replaced, word
   5-gram Jaccard about 0.9):
   - xylent `near_duplicate_clusters`: the stage's own map -> reduce -> resolve
     code in one process (MinHash 112 perms, 14 bands x 8 rows, candidates
     verified at estimated Jaccard >= 0.8, union-find);
   - datasketch, used the fastest documented way: `MinHash.bulk`-style
     `MinHash.generator` (permutations built once), `MinHashLSH` with the same
     14 x 8 bands, candidates verified with `MinHash.jaccard >= 0.8`, union-find.
   Each thread setting runs in its own fresh process with every pool capped
   before import; inside it both sides get the same warm-up and alternate
   over the timed runs (`harness.side_by_side`).  Rows: both at 1 thread;
   xylent at all cores; datasketch (pure Python, the GIL: one core) with its
   hashing spread over a `multiprocessing` pool of all cores, the standard way
   a user parallelises it.  Precision/recall against the planted pairs, the
   agreement of the two sides' pairs; xylent at 1 and N threads, and datasketch
   serial and pooled, must give identical clusters or the script fails.
   xylent runs on the row's thread count (`near_duplicate_clusters(threads=)`: the MinHash
   blocks and the buckets reduced at once; its default is the cores the process may use).
   Targets: >= 5x datasketch at 1 thread, and xylent no slower on all cores than on one;
   all cores against datasketch's best configuration is reported beside them.
2. Memory: peak RSS (VmHWM) of each side alone on the same corpus, one fresh
   process each, peak reset after the corpus is built; and the stage's
   map/reduce/resolve/apply (xylent.tasks.dedup.mono) over generated Parquet parts at
   two corpus sizes, each run in a fresh process: the peak must grow <= 20 %
   for the larger corpus.

Full size (about 7 min on 2 cores: 3 stage runs per size, about 17 s at 250 MB and 65 s at 1 GB each,
plus about 90 s writing the Parquet parts):

    PYTHONPATH=. .venv/bin/python benchmarks/dedup.py --docs 20000 --sizes-mb 250 1000

Smoke size (about 15 s of work, results under benchmarks/results/quick/):

    PYTHONPATH=. .venv/bin/python benchmarks/dedup.py --quick
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
from itertools import combinations
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
for _p in (str(HERE.parent), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)
import harness  # noqa: E402

NUM_PERM, BANDS, ROWS, THRESHOLD, NGRAM = 112, 14, 8, 0.8, 5
TARGETS = {"precision_recall": 0.95, "speedup_vs_datasketch": 5.0, "rss_growth": 1.2}


# ---------------------------------------------------------------- corpus and scores

def corpus(n_docs: int, seed: int = 0) -> tuple[list[str], list[int]]:
    """Random 80-200 word documents; every 4th original is followed by a near
    copy with 1 word in 100 replaced. truth[i] = the original's group."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(50_000)]
    texts, truth = [], []
    g = 0
    while len(texts) < n_docs:
        words = [rng.choice(vocab) for _ in range(rng.randint(80, 200))]
        texts.append(" ".join(words))
        truth.append(g)
        if g % 4 == 0:
            near = words[:]
            for k in rng.sample(range(len(near)), max(1, len(near) // 100)):
                near[k] = rng.choice(vocab)
            texts.append(" ".join(near))
            truth.append(g)
        g += 1
    return texts[:n_docs], truth[:n_docs]


def pairs(labels) -> set[tuple[int, int]]:
    """Every pair of indices with the same label (cluster id or truth group)."""
    groups: dict[int, list[int]] = {}
    for i, c in enumerate(labels):
        groups.setdefault(int(c), []).append(i)
    return {p for members in groups.values() for p in combinations(members, 2)}


def scores(ids, truth) -> dict:
    true_pairs, pred_pairs = pairs(truth), pairs(ids)
    tp = len(true_pairs & pred_pairs)
    return {"precision": round(tp / max(len(pred_pairs), 1), 6), "recall": round(tp / max(len(true_pairs), 1), 6),
            "true_pairs": len(true_pairs), "predicted_pairs": len(pred_pairs), "true_positives": tp}


# ---------------------------------------------------------------- the two sides

def xylent_clusters(texts: list[str], threads: int) -> np.ndarray:
    from xylent.tasks.dedup import near_duplicate_clusters
    from xylent.spec import DedupConfig

    cfg = DedupConfig(num_perm=NUM_PERM, bands=BANDS, rows=ROWS, threshold=THRESHOLD, ngram=NGRAM)
    return near_duplicate_clusters(texts, cfg, threads=threads)


def _shingles(text: str) -> list[bytes]:
    w = text.split()
    return [" ".join(w[k:k + NGRAM]).encode() for k in range(max(1, len(w) - NGRAM + 1))]


def _ds_hashvalues(texts: list[str]) -> np.ndarray:
    """datasketch MinHash values of each text, (n, NUM_PERM); a pool worker's job."""
    from datasketch import MinHash

    return np.stack([m.hashvalues for m in MinHash.generator((_shingles(t) for t in texts),
                                                             num_perm=NUM_PERM, seed=0)])


def datasketch_clusters(texts: list[str], processes: int = 1) -> np.ndarray:
    """datasketch MinHash + MinHashLSH (14 x 8 bands), verified at MinHash.jaccard
    >= 0.8, union-find. processes > 1: hashing in a multiprocessing pool (fork),
    the index built and queried in this process."""
    from datasketch import MinHash, MinHashLSH

    if processes <= 1:
        hashes = list(MinHash.generator((_shingles(t) for t in texts), num_perm=NUM_PERM, seed=0))
    else:
        import multiprocessing

        cuts = np.linspace(0, len(texts), processes * 4 + 1).astype(int)
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            blocks = pool.map(_ds_hashvalues, [texts[a:b] for a, b in zip(cuts[:-1], cuts[1:]) if b > a])
        proto = MinHash(num_perm=NUM_PERM, seed=0)
        hashes = [MinHash(seed=0, hashvalues=hv, permutations=proto.permutations, scheme=proto.scheme)
                  for block in blocks for hv in block]
    lsh = MinHashLSH(num_perm=NUM_PERM, params=(BANDS, ROWS))
    with lsh.insertion_session() as session:
        for i, m in enumerate(hashes):
            session.insert(i, m)
    parent = list(range(len(texts)))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, m in enumerate(hashes):
        for j in lsh.query(m):
            if j != i and m.jaccard(hashes[j]) >= THRESHOLD:
                a, b = find(i), find(j)
                parent[max(a, b)] = min(a, b)
    return np.array([find(i) for i in range(len(texts))])


# ---------------------------------------------------------------- fresh-process entry points

def speed_child(docs: int, threads: int, repeats: int, warmup: int, pool: bool) -> dict:
    """In a process capped at `threads`: xylent on `threads` MinHash threads and
    datasketch (pooled over `threads` processes when `pool`), side by side."""
    texts, _ = corpus(docs)
    ds_processes = threads if pool else 1
    values, summaries = harness.side_by_side(
        {"xylent": lambda: xylent_clusters(texts, threads),
         "datasketch": lambda: datasketch_clusters(texts, ds_processes)},
        repeats=repeats, warmup=warmup)
    return {"summaries": summaries, "ids": {k: np.asarray(v).tolist() for k, v in values.items()},
            "datasketch_processes": ds_processes, "xylent_threads": threads}


def memory_child(docs: int, side: str, threads: int) -> dict:
    """One side once, its peak measured from after its imports and the corpus."""
    if side == "xylent":
        import xylent.tasks.dedup.run  # noqa: F401  (polars, pyarrow)
    else:
        import datasketch  # noqa: F401
    imported = harness.vm_rss_mb()
    texts, truth = corpus(docs)
    reset = harness.reset_peak_rss()
    corpus_rss = harness.vm_rss_mb()
    if side == "xylent":
        ids = xylent_clusters(texts, threads)
    else:
        ids = datasketch_clusters(texts, 1)
    return {"imports_rss_mb": round(imported, 1), "corpus_rss_mb": round(corpus_rss, 1), "peak_reset": reset,
            **scores(ids, truth)}


def stage_child(parts_dir: str, work: str, out: str) -> dict:
    """The stage's mono dedup over one language's parts: map, reduce, resolve, apply."""
    from xylent.tasks.dedup import mono
    from xylent.spec import DedupConfig

    parts, work_p, out_p = sorted(Path(parts_dir).glob("*.parquet")), Path(work), Path(out)
    cfg = DedupConfig(near_level="line", buckets=16)
    for i, p in enumerate(parts):
        mono.map_part(p, i, "xx", work_p, cfg)
    for b in range(cfg.buckets):
        mono.reduce_exact(work_p, b)
        mono.reduce_near(work_p, b, cfg)
    mono.resolve_near(work_p)
    totals = {"in": 0, "exact": 0, "near": 0, "out": 0}
    for i, p in enumerate(parts):
        counts, _ = mono.apply_part(p, i, out_p / p.name, work_p, cfg)
        for k in totals:
            totals[k] += counts[k]
    return totals


# ---------------------------------------------------------------- the parts

def quality_and_speed(args, cpus: int) -> dict:
    configs = [1] + ([cpus] if cpus > 1 else [])
    rows, ids = [], {}
    for threads in configs:
        res = harness.in_fresh_process("dedup", "speed_child", {"docs": args.docs, "threads": threads,
                                                                "repeats": args.repeats, "warmup": args.warmup,
                                                                "pool": threads > 1}, threads=threads)["result"]
        for side, s in res["summaries"].items():
            name = f"{side}@{threads}"
            ids[name] = res["ids"][side]
            rows.append({"name": name, "side": side, "threads": threads,
                         "processes": res["datasketch_processes"] if side == "datasketch" else 1,
                         "xylent_threads": res["xylent_threads"] if side == "xylent" else None,
                         **s, "docs_per_s": round(args.docs / s["median_s"])})
    _, truth = corpus(args.docs)
    for r in rows:
        r.update(scores(ids[r["name"]], truth))
        print(f"{r['name']}: median {r['median_s']:.3f} s, precision {r['precision']:.4f}, "
              f"recall {r['recall']:.4f}", flush=True)
    # where the results must be equal, fail instead of writing numbers
    for side in ("xylent", "datasketch"):
        names = [f"{side}@{t}" for t in configs]
        for other in names[1:]:
            if ids[other] != ids[names[0]]:
                raise SystemExit(f"{other} and {names[0]} give different clusters: not the same computation")
    ours, theirs = pairs(ids["xylent@1"]), pairs(ids["datasketch@1"])
    agreement = {"both": len(ours & theirs), "only_xylent": len(ours - theirs), "only_datasketch": len(theirs - ours),
                 "jaccard": round(len(ours & theirs) / max(len(ours | theirs), 1), 6)}
    by = {r["name"]: r for r in rows}
    best_ds = min((r for r in rows if r["side"] == "datasketch"), key=lambda r: r["median_s"])
    speedups = {"one_thread": harness.ratio(by["xylent@1"], by["datasketch@1"]),
                "one_thread_best": harness.ratio(by["xylent@1"], by["datasketch@1"], "best_s")}
    if cpus > 1:
        speedups.update({"all_cores": harness.ratio(by[f"xylent@{cpus}"], best_ds),
                         "all_cores_best": harness.ratio(by[f"xylent@{cpus}"], best_ds, "best_s"),
                         "all_cores_peer": best_ds["name"]})
    return {"docs": args.docs, "cpus": cpus, "rows": rows, "agreement": agreement, "speedup": speedups,
            "equal_across_threads": True}


def peer_memory(args, cpus: int) -> list[dict]:
    rows = []
    for side, threads in (("xylent", 1), ("datasketch", 1), *((("xylent", cpus),) if cpus > 1 else ())):
        r = harness.in_fresh_process("dedup", "memory_child", {"docs": args.docs, "side": side, "threads": threads},
                                     threads=threads)
        res = r["result"]
        rows.append({"side": side, "threads": threads, "runs": 1, "seconds": round(r["seconds"], 3),
                     "peak_rss_mb": r["peak_rss_mb"], "rss_after_imports_mb": res["imports_rss_mb"],
                     "rss_before_call_mb": r["rss_before_mb"], "corpus_rss_mb": res["corpus_rss_mb"],
                     "peak_reset": res["peak_reset"],
                     "above_corpus_mb": round(r["peak_rss_mb"] - res["corpus_rss_mb"], 1),
                     "precision": res["precision"], "recall": res["recall"]})
        print(f"memory {side}@{threads}: peak {r['peak_rss_mb']} MB", flush=True)
    return rows


def make_parts(root: Path, text_mb: float, rows_per_part: int = 100_000) -> int:
    """Parquet parts like prepare writes, ~600 B paragraphs, 5 % planted near copies."""
    import polars as pl

    rng = np.random.default_rng(1)
    vocab = np.array(["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=int(rng.integers(3, 9))))
                      for _ in range(50_000)])
    written, part = 0, 0
    root.mkdir(parents=True)
    while written < text_mb * 1_000_000:
        idx = rng.integers(0, len(vocab), size=(rows_per_part, 100))
        dup = rng.random(rows_per_part) < 0.05
        src = rng.integers(0, rows_per_part, size=rows_per_part)
        idx[dup] = idx[src[dup]]
        idx[dup, rng.integers(0, 100, size=int(dup.sum()))] = rng.integers(0, len(vocab), size=int(dup.sum()))
        texts = [" ".join(row) for row in vocab[idx]]
        df = pl.DataFrame({"doc_id": [f"d{part}:{i}" for i in range(rows_per_part)], "text": texts,
                           "source": ["bench"] * rows_per_part})
        df.write_parquet(root / f"part-{part:05d}.parquet")
        written += sum(len(t) for t in texts)
        part += 1
    return written


def stage_memory(args, cpus: int, tmp: Path) -> list[dict]:
    rows = []
    for mb in args.sizes_mb:
        d = tmp / f"c{mb}"
        text_bytes = make_parts(d / "in", mb, args.part_rows)
        runs, peaks, before, totals = [], [], [], None
        for _ in range(args.stage_repeats):
            shutil.rmtree(d / "work", ignore_errors=True)
            shutil.rmtree(d / "out", ignore_errors=True)
            r = harness.in_fresh_process("dedup", "stage_child", {"parts_dir": str(d / "in"), "work": str(d / "work"),
                                                                  "out": str(d / "out")}, threads=cpus)
            if totals is not None and r["result"] != totals:
                raise SystemExit(f"stage runs at {mb} MB disagree: {totals} vs {r['result']}")
            totals = r["result"]
            runs.append(r["seconds"])
            peaks.append(r["peak_rss_mb"])
            before.append(r["rss_before_mb"])
        s = harness.summary(runs)
        rows.append({"text_mb": round(text_bytes / 1e6, 1), "parts": len(list((d / "in").glob("*.parquet"))),
                     "rows_per_part": args.part_rows, "rows": totals["in"], "removed_exact": totals["exact"],
                     "removed_near": totals["near"], "threads": cpus, **s,
                     "docs_per_s": round(totals["in"] / s["median_s"]),
                     "peak_rss_mb_runs": peaks, "peak_rss_mb": max(peaks), "rss_after_imports_mb": max(before)})
        print(f"stage {rows[-1]['text_mb']} MB: median {s['median_s']:.1f} s, peak {max(peaks)} MB", flush=True)
        shutil.rmtree(d)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--docs", type=int, default=None, help="quality corpus size (default 20000, quick 3000)")
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=None,
                    help="stage memory corpus sizes, MB of text (default 250 1000, quick 2 8)")
    ap.add_argument("--part-rows", type=int, default=None, help="rows per Parquet part (default 100000, quick 4000)")
    ap.add_argument("--stage-repeats", type=int, default=None, help="stage runs per size (default --repeats)")
    args = harness.finish_args(ap.parse_args(argv))
    args.docs = args.docs or (3000 if args.quick else 20_000)
    args.sizes_mb = args.sizes_mb or ([2, 8] if args.quick else [250, 1000])
    args.part_rows = args.part_rows or (4000 if args.quick else 100_000)
    args.stage_repeats = args.stage_repeats or args.repeats
    cpus = len(os.sched_getaffinity(0))

    quality = quality_and_speed(args, cpus)
    memory = peer_memory(args, cpus)
    tmp = Path(tempfile.mkdtemp(prefix="xylent-dedup-bench-"))
    try:
        stage = stage_memory(args, cpus, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    growth = None
    if len(stage) > 1:
        growth = {"corpus_ratio": round(stage[-1]["text_mb"] / stage[0]["text_mb"], 3),
                  "rss_ratio": round(stage[-1]["peak_rss_mb"] / stage[0]["peak_rss_mb"], 3)}
    by = {r["name"]: r for r in quality["rows"]}
    quality_ok = all(by[n][k] >= TARGETS["precision_recall"] for n in ("xylent@1", "datasketch@1")
                     for k in ("precision", "recall"))
    checks = {"xylent_precision_recall": all(by["xylent@1"][k] >= TARGETS["precision_recall"]
                                             for k in ("precision", "recall")),
              "speedup_one_thread": quality["speedup"]["one_thread"] >= TARGETS["speedup_vs_datasketch"],
              "all_cores_no_slower": (by[f"xylent@{cpus}"]["median_s"] <= by["xylent@1"]["median_s"]
                                      if cpus > 1 else None),
              "rss_growth": growth["rss_ratio"] <= TARGETS["rss_growth"] if growth else None}
    harness.write_result("dedup", {
        "peer": "datasketch MinHash.generator + MinHashLSH (112 perms, 14 bands x 8 rows, MinHash.jaccard >= 0.8)",
        "targets": TARGETS, "quality_and_speed": quality, "peer_memory": memory, "stage_memory": stage,
        "rss_growth": growth, "both_sides_meet_quality": quality_ok, "checks": checks}, args)


# ---------------------------------------------------------------- the doc section

def _met(ok: bool | None) -> str:
    return "met" if ok else "**missed**"


def markdown(result: dict) -> str:
    q = result["quality_and_speed"]
    if "rows" not in q:
        return "*This result predates the side-by-side harness: rerun `python benchmarks/dedup.py`.*\n"
    t = result["targets"]
    by = {r["name"]: r for r in q["rows"]}
    cpus = q["cpus"]
    label = {"xylent": "xylent `near_duplicate_clusters`", "datasketch": "datasketch MinHash + MinHashLSH"}

    def how(r):
        if r["side"] == "xylent":
            return f"{r['threads']} thread{'s' if r['threads'] > 1 else ''}"
        if r["processes"] > 1:
            return f"1 thread, hashing in a pool of {r['processes']} processes"
        return "1 thread (pure Python)"

    rows = [[label[r["side"]], how(r), f"{r['precision']:.4f}", f"{r['recall']:.4f}", harness.num(r["predicted_pairs"]),
             harness.seconds(r["best_s"]), harness.seconds(r["median_s"]), harness.num(r["docs_per_s"])]
            for r in sorted(q["rows"], key=lambda r: (r["threads"], r["side"] != "xylent"))]
    out = [f"**Quality and speed** ({harness.num(q['docs'])} documents, "
           f"{harness.num(by['xylent@1']['true_pairs'])} planted near-duplicate pairs; "
           f"{result['repeats']} timed run{'s' if result['repeats'] > 1 else ''} per side after {result['warmup']} "
           "warm-up, alternating, both sides in one process per thread setting; "
           "docs/s from the median):", "",
           harness.table(["side", "threads", "precision", "recall", "predicted pairs", "best", "median", "docs/s"],
                         rows), ""]
    sp = q["speedup"]
    target = t["speedup_vs_datasketch"]
    out.append(f"- 1 thread vs 1 thread: xylent is **{sp['one_thread']:.2f}×** datasketch (median; "
               f"{sp['one_thread_best']:.2f}× best-of): target ≥ {target:g}× {_met(sp['one_thread'] >= target)}.")
    if "all_cores" in sp:
        peer = by[sp["all_cores_peer"]]
        one, all_ = by["xylent@1"], by[f"xylent@{cpus}"]
        out.append(f"- xylent on {cpus} threads against 1: **{one['median_s'] / all_['median_s']:.2f}×** "
                   f"(median; {one['best_s'] / all_['best_s']:.2f}× best-of): target no slower "
                   f"{_met(all_['median_s'] <= one['median_s'])}.")
        out.append(f"- All {cpus} cores: xylent on {cpus} threads is **{sp['all_cores']:.2f}×** datasketch's best "
                   f"configuration ({how(peer)}; {sp['all_cores_best']:.2f}× best-of).")
    pr = t["precision_recall"]
    for side in ("xylent", "datasketch"):
        r = by[f"{side}@1"]
        ok = r["precision"] >= pr and r["recall"] >= pr
        out.append(f"- {side} precision {r['precision']:.4f}, recall {r['recall']:.4f} against the planted pairs: "
                   f"target ≥ {pr:g} {_met(ok)}.")
    a = q["agreement"]
    out.append(f"- The two sides' predicted pairs: {harness.num(a['both'])} found by both, "
               f"{harness.num(a['only_xylent'])} by xylent alone, {harness.num(a['only_datasketch'])} by datasketch "
               f"alone (Jaccard {a['jaccard']:.4f}); they hash differently, so equality is not expected.")
    if cpus > 1:
        out.append(f"- xylent on 1 and {cpus} threads, and datasketch serial and pooled, gave identical clusters "
                   "(checked; the script stops otherwise).")
    mem = result.get("peer_memory") or []
    if mem:
        out += ["", "**Peak memory on the same corpus** (each side alone, once, in a fresh process: its libraries "
                "imported, the corpus built, then the peak counted from there):", "",
                harness.table(["side", "threads", "after imports", "with the corpus", "peak RSS", "peak − corpus"],
                              [[label[m["side"]], m["threads"], f"{harness.num(m['rss_after_imports_mb'])} MB",
                                f"{harness.num(m['corpus_rss_mb'])} MB", f"{harness.num(m['peak_rss_mb'])} MB",
                                f"{harness.num(m['above_corpus_mb'])} MB"] for m in mem])]
        if not all(m["peak_reset"] for m in mem):
            out += ["", "The kernel refused to reset the peak here, so peaks include building the corpus."]
        mx = {m["side"]: m for m in mem if m["threads"] == 1}
        if "xylent" in mx and "datasketch" in mx and mx["datasketch"]["above_corpus_mb"] > 0:
            ratio = mx["xylent"]["above_corpus_mb"] / mx["datasketch"]["above_corpus_mb"]
            out.append("")
            out.append(f"At 1 thread xylent's working memory above the corpus is {ratio:.2f}× datasketch's.")
    stage = result.get("stage_memory") or []
    if stage:
        n_runs = stage[0]["n"]
        timing = "best / median" if n_runs > 1 else "one run"
        out += ["", f"**Memory of the stage** (map/reduce/resolve/apply over generated "
                f"{harness.num(stage[0]['rows_per_part'])}-row Parquet parts of ~600-byte paragraphs with 5 % "
                f"planted near copies, line-level near dedup, 16 buckets; {n_runs} run{'s' if n_runs > 1 else ''} "
                f"per size, each in a fresh process on {stage[0]['threads']} threads; time is the call, imports "
                "excluded):", "",
                harness.table(["text", "parts", "rows", "near dups removed", f"time ({timing})", "docs/s",
                               "peak RSS (worst run)"],
                              [[f"{harness.num(s['text_mb'])} MB", s["parts"], harness.num(s["rows"]),
                                harness.num(s["removed_near"]),
                                (f"{harness.seconds(s['best_s'])} / {harness.seconds(s['median_s'])}" if n_runs > 1
                                 else harness.seconds(s["median_s"])),
                                harness.num(s["docs_per_s"]), f"{harness.num(s['peak_rss_mb'])} MB"] for s in stage])]
        g = result.get("rss_growth")
        if g:
            out.append("")
            out.append(f"Peak RSS grows {100 * (g['rss_ratio'] - 1):+.1f} % for {g['corpus_ratio']:.2g}× the "
                       f"corpus: target ≤ {100 * (t['rss_growth'] - 1):.0f} % {_met(g['rss_ratio'] <= t['rss_growth'])}"
                       + (" (quick sizes of a few thousand rows per part; the target is for the full sizes)."
                          if result.get("quick") else "."))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
