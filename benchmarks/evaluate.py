"""evaluate benchmarks, each side by side with its peers in one run, at 1 thread
and at all cores (the same thread count for every side of a comparison):

1. embedding throughput: the stage's encoder wrapper
   (``xylent.tasks.evaluate.encoders.HuggingFaceEncoder.embed_batches``: texts sorted by
   length within chunks, pooled, put back in order) against the loop a user
   writes with ``transformers`` (batches in the given order, padded to the
   batch's longest, the same mean pooling), on the same model and tokenizer
   objects, the same texts, the same batch size; torch threads set with
   ``torch.set_num_threads``. The pooled vectors must agree to ``--atol`` or the
   run fails.
2. retrieval and margin mining for N x N unit vectors: faiss exact search
   (``xylent.tasks.evaluate.retrieval.knn`` / ``mine_pairs``) against a blocked NumPy
   matmul with ``argpartition`` top-k and a blocked torch matmul with
   ``torch.topk``. Mining runs ``mine_pairs`` itself with its k-NN search swapped
   for the peer's, so only the search differs. faiss threads via
   ``faiss.omp_set_num_threads``, BLAS via threadpoolctl, torch via
   ``torch.set_num_threads``. Nearest-neighbour answers must be the same (a
   different id only where both candidates' cosines tie within ``--tie-tol``)
   and the mined pairs the same (at most ``--mine-tol`` of them differing), or
   the run fails. Each run's peak RSS above its start is recorded too.

Repeated timing runs at ``--n`` 20 000, not 100 000: at 100 000 one round of
search + mining took about 5 min for faiss and NumPy alone on 2 cores, so a
warm-up and 3 rounds of three sides at two thread counts would take hours, not
~10 min. ``--one-shot-n 100000`` adds one run per side at that size (all cores,
no warm-up; reported as a single run, not best-of).

    .venv/bin/python benchmarks/evaluate.py                        # ~6 min on 2 cores (idle machine)
    .venv/bin/python benchmarks/evaluate.py --one-shot-n 100000    # + ~10 min: one run per side at 100k
    .venv/bin/python benchmarks/evaluate.py --quick                # ~20 s: 200 texts, 2 000 vectors

Writes benchmarks/results/evaluate.json (``--quick``: benchmarks/results/quick/).
"""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import harness  # noqa: E402

LANGS = ["de", "fr", "es", "ru", "ar", "ja", "zh", "ko", "th", "tr", "el", "he", "fa", "uk", "ca", "pt"]
BLOCK = 4096  # query rows per block of the NumPy and torch peers (faiss's SEARCH_BATCH is the same)
SIDES = ("faiss", "numpy", "torch")
MARGIN_TOL = 1e-4  # largest margin difference of a pair both faiss and a peer mine


# ---------------------------------------------------------------- embedding throughput

def real_sentences(n: int) -> list[str]:
    """Real UI messages in 16 languages and English (allauth's catalogs), cycled to n."""
    from xylent.tasks.evaluate.data import package_pairs

    texts = [t for xx, en in package_pairs("allauth", LANGS).values() for t in xx + en]
    return [texts[i % len(texts)] for i in range(n)]


def tiny_bert(path: Path, texts: list[str], hidden: int, layers: int) -> Path:
    """A randomly initialised BERT with a WordPiece vocabulary of the texts' characters."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    chars = sorted({c for t in texts for c in t if not c.isspace()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars)]
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    BertTokenizerFast(vocab_file=str(path / "vocab.txt"), do_lower_case=False).save_pretrained(str(path))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden,
                         max_position_embeddings=512)).eval().save_pretrained(str(path))
    return path


def plain_loop(tok, model, texts: list[str], layer: int, batch: int, max_length: int) -> np.ndarray:
    """What a user writes with transformers: batches in the given order, padding to the batch's longest."""
    import torch

    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            enc = tok(texts[i: i + batch], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            h = model(**enc, output_hidden_states=True).hidden_states[layer]
            m = enc["attention_mask"].unsqueeze(-1).float()
            out.append(((h * m).sum(1) / m.sum(1)).numpy())
    return np.concatenate(out)


def bench_embedding(args) -> dict:
    import torch

    from xylent.tasks.evaluate.encoders import CHUNK_BATCHES, HuggingFaceEncoder

    texts = real_sentences(args.sentences)
    layer = args.layers // 2 + 1
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        enc = HuggingFaceEncoder("bench", tiny_bert(Path(tmp) / "bert", texts, args.hidden, args.layers))
        sides = {"xylent": lambda: np.concatenate([b[layer] for b in enc.embed_batches(
                     texts, [layer], batch_size=args.batch, max_length=args.max_length)]),
                 "transformers loop": lambda: plain_loop(enc.tokenizer, enc.model, texts, layer, args.batch,
                                                         args.max_length)}
        for t in args.thread_counts:
            torch.set_num_threads(t)
            values, summ = harness.side_by_side(sides, repeats=args.repeats, warmup=args.warmup)
            diff = float(np.abs(values["xylent"] - values["transformers loop"]).max())
            if not diff <= args.atol:
                raise SystemExit(f"embedding benchmark: the pooled vectors differ by {diff:.3g} (> --atol "
                                 f"{args.atol}) at {t} thread(s); no number is written")
            for s in summ.values():
                s.update(threads=t, sentences_per_s_best=round(len(texts) / s["best_s"], 1),
                         sentences_per_s_median=round(len(texts) / s["median_s"], 1))
            runs[str(t)] = {"sides": summ, "max_abs_diff": diff}
            print(f"embedding, {t} thread(s): " + ", ".join(
                f"{n} {s['sentences_per_s_median']:,.0f}/s" for n, s in summ.items()), flush=True)
    lengths = [len(t) for t in texts]
    return {"sentences": len(texts), "distinct_sentences": len(set(texts)), "languages": len(LANGS) + 1,
            "model": {"kind": "randomly initialised BERT", "layers": args.layers, "hidden": args.hidden},
            "batch": args.batch, "max_length": args.max_length, "layer": layer, "chunk_batches": CHUNK_BATCHES,
            "chars_median": float(np.median(lengths)), "chars_max": int(max(lengths)), "atol": args.atol,
            "by_threads": runs}


# ---------------------------------------------------------------- retrieval and mining peers

def numpy_knn(q: np.ndarray, db: np.ndarray, k: int, batch: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k by inner product: blocked ``q @ db.T`` and argpartition, best first."""
    k = min(k, len(db))
    scores, ids = np.empty((len(q), k), np.float32), np.empty((len(q), k), np.int64)
    for s in range(0, len(q), batch):
        sim = q[s: s + batch] @ db.T
        part = np.argpartition(-sim, k - 1, axis=1)[:, :k]
        val = np.take_along_axis(sim, part, 1)
        order = np.argsort(-val, axis=1, kind="stable")
        ids[s: s + batch], scores[s: s + batch] = np.take_along_axis(part, order, 1), np.take_along_axis(val, order, 1)
    return scores, ids


def torch_knn(q: np.ndarray, db: np.ndarray, k: int, batch: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k by inner product: blocked ``torch.mm`` and ``torch.topk`` (sorted)."""
    import torch

    k = min(k, len(db))
    dbt = torch.from_numpy(np.ascontiguousarray(db)).T
    scores, ids = np.empty((len(q), k), np.float32), np.empty((len(q), k), np.int64)
    with torch.no_grad():
        for s in range(0, len(q), batch):
            val, idx = torch.topk(torch.from_numpy(np.ascontiguousarray(q[s: s + batch])) @ dbt, k, dim=1)
            scores[s: s + batch], ids[s: s + batch] = val.numpy(), idx.numpy()
    return scores, ids


def side_knn(side: str):
    from xylent.tasks.evaluate import retrieval

    return {"faiss": retrieval.knn, "numpy": numpy_knn, "torch": torch_knn}[side]


@contextmanager
def search_backend(side: str):
    """``mine_pairs`` with its k-NN search done by ``side``: the margin and the greedy selection stay its own."""
    from xylent.tasks.evaluate import retrieval

    original = retrieval.knn
    retrieval.knn = side_knn(side)
    try:
        yield retrieval.mine_pairs
    finally:
        retrieval.knn = original


def mine(side: str, x: np.ndarray, y: np.ndarray, k: int):
    with search_backend(side) as mine_pairs:
        return mine_pairs(x, y, k)


@contextmanager
def threads(t: int):
    """The same thread count for faiss (OpenMP), every BLAS / OpenMP pool threadpoolctl sees, and torch."""
    import faiss
    import torch
    from threadpoolctl import threadpool_limits

    before_faiss, before_torch = faiss.omp_get_max_threads(), torch.get_num_threads()
    faiss.omp_set_num_threads(t)
    torch.set_num_threads(t)
    try:
        with threadpool_limits(limits=t):
            yield
    finally:
        faiss.omp_set_num_threads(before_faiss)
        torch.set_num_threads(before_torch)


def with_memory(fn):
    """fn's value and the peak RSS above the RSS at its start (MB; None where VmHWM cannot be reset)."""
    peaks: list = []

    def run():
        before = harness.vm_rss_mb()
        ok = harness.reset_peak_rss()
        value = fn()
        peaks.append(round(harness.vm_hwm_mb() - before, 1) if ok else None)
        return value
    return run, peaks


def _worst(peaks: list) -> float | None:
    known = [p for p in peaks if p is not None]
    return max(known) if known else None


def vectors(n: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors x and their noisy "translations" y = x + 3·noise (cosine ~0.3: acc@1 < 1)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, dim), dtype=np.float32)
    y = x + 3.0 * rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    return x, y


def check_knn(x: np.ndarray, y: np.ndarray, ids: dict[str, np.ndarray], tol: float) -> dict:
    """Every side's nearest neighbour against faiss's: the same id, or a tie within ``tol`` (float64 cosines)."""
    out = {}
    ref = ids["faiss"]
    for side, got in ids.items():
        diff = np.flatnonzero(got != ref)
        gap = np.abs(np.einsum("ij,ij->i", x[diff].astype(np.float64), y[got[diff]].astype(np.float64))
                     - np.einsum("ij,ij->i", x[diff].astype(np.float64), y[ref[diff]].astype(np.float64)))
        if (gap > tol).any():
            raise SystemExit(f"retrieval benchmark: {side} finds another nearest neighbour than faiss for "
                             f"{int((gap > tol).sum())} of {len(x)} queries (cosine gap up to {gap.max():.3g} > "
                             f"--tie-tol {tol}); no number is written")
        out[side] = {"different_ids": int(len(diff)), "tie_tol": tol}
    return out


def check_mined(pairs: dict[str, tuple], tol: float) -> dict:
    """Every side's mined pairs against faiss's: at most ``tol`` of them differing, margins of shared pairs close."""
    out = {}
    ref = dict(zip(zip(pairs["faiss"][0].tolist(), pairs["faiss"][1].tolist()), pairs["faiss"][2].tolist()))
    for side, (src, tgt, score) in pairs.items():
        got = dict(zip(zip(src.tolist(), tgt.tolist()), score.tolist()))
        shared = ref.keys() & got.keys()
        differing = len(ref.keys() ^ got.keys()) / max(len(ref), 1)
        margin_gap = max((abs(ref[p] - got[p]) for p in shared), default=0.0)
        if differing > tol or margin_gap > MARGIN_TOL:
            raise SystemExit(f"mining benchmark: {side} mines other pairs than faiss ({differing:.2%} of the pairs "
                             f"differ, --mine-tol {tol}; margins of shared pairs differ by up to {margin_gap:.3g}, "
                             f"tolerance {MARGIN_TOL}); "
                             "no number is written")
        out[side] = {"pairs": len(got), "differing_share": differing, "max_margin_gap": margin_gap,
                     "mine_tol": tol, "margin_tol": MARGIN_TOL}
    return out


def bench_retrieval(n: int, dim: int, k: int, thread_counts: list[int], repeats: int, warmup: int, args) -> dict:
    x, y = vectors(n, dim)
    gold = np.arange(n)
    import faiss

    out = {"n": n, "dim": dim, "k_mining": k, "block": BLOCK, "sides": list(SIDES), "faiss_gpus": faiss.get_num_gpus(),
           "by_threads": {}}
    for t in thread_counts:
        with threads(t):
            search, search_peaks = {}, {}
            for s in SIDES:
                search[s], search_peaks[s] = with_memory(lambda s=s: side_knn(s)(x, y, 1)[1][:, 0])
            ids, search_summ = harness.side_by_side(search, repeats=repeats, warmup=warmup)
            same = check_knn(x, y, ids, args.tie_tol)
            mining, mining_peaks = {}, {}
            for s in SIDES:
                mining[s], mining_peaks[s] = with_memory(lambda s=s: mine(s, x, y, k))
            pairs, mining_summ = harness.side_by_side(mining, repeats=repeats, warmup=warmup)
            mined = check_mined(pairs, args.mine_tol)
        for s in SIDES:
            search_summ[s].update(threads=t, peak_rss_above_start_mb=_worst(search_peaks[s]))
            mining_summ[s].update(threads=t, peak_rss_above_start_mb=_worst(mining_peaks[s]))
        src, tgt, _ = pairs["faiss"]
        out["by_threads"][str(t)] = {
            "search_k1": {"sides": search_summ, "check": same, "acc_at_1": float(np.mean(ids["faiss"] == gold))},
            "margin_mining": {"sides": mining_summ, "check": mined, "pairs_mined": int(len(src)),
                              "correct_share": float(np.mean(src == tgt))}}
        print(f"retrieval n={n}, {t} thread(s): " + ", ".join(
            f"{s} search {search_summ[s]['median_s']:.3g} s / mining {mining_summ[s]['median_s']:.3g} s"
            for s in SIDES), flush=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = harness.parser(__doc__)
    ap.add_argument("--sentences", type=int, default=None, help="texts to embed (default 4000, quick 200)")
    ap.add_argument("--hidden", type=int, default=None, help="BERT hidden size (default 256, quick 64)")
    ap.add_argument("--layers", type=int, default=None, help="BERT layers (default 4, quick 2)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--atol", type=float, default=1e-4, help="largest allowed |xylent - loop| of a pooled vector")
    ap.add_argument("--n", type=int, default=None, help="vectors per side for retrieval / mining (default 20000, "
                    "quick 2000)")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--k", type=int, default=4, help="neighbours of the margin")
    ap.add_argument("--tie-tol", type=float, default=1e-5, help="cosine gap under which two neighbours tie")
    ap.add_argument("--mine-tol", type=float, default=1e-3, help="largest share of mined pairs that may differ")
    ap.add_argument("--threads", default="1,all", help="thread counts ('all': every core)")
    ap.add_argument("--one-shot-n", type=int, default=0, help="also one run per side at this n (all cores)")
    args = harness.finish_args(ap.parse_args(argv))
    q = args.quick
    args.sentences = args.sentences or (200 if q else 4000)
    args.hidden = args.hidden or (64 if q else 256)
    args.layers = args.layers or (2 if q else 4)
    args.n = args.n or (2000 if q else 20_000)
    cores = len(os.sched_getaffinity(0))
    args.thread_counts = sorted({cores if t.strip() == "all" else int(t) for t in args.threads.split(",")})
    payload = {"threads": args.thread_counts, "embedding": bench_embedding(args),
               "retrieval": bench_retrieval(args.n, args.dim, args.k, args.thread_counts, args.repeats, args.warmup,
                                            args)}
    if args.one_shot_n:
        payload["retrieval_one_shot"] = bench_retrieval(args.one_shot_n, args.dim, args.k, [cores], 1, 0, args)
    harness.write_result("evaluate", payload, args)
    return payload


# ---------------------------------------------------------------- markdown

def _ratio(a: dict, b: dict) -> str:
    return f"{b['median_s'] / a['median_s']:.2f}×"


def _embedding_md(e: dict) -> list[str]:
    rows, missed = [], []
    for t, r in e["by_threads"].items():
        ours, loop = r["sides"]["xylent"], r["sides"]["transformers loop"]
        ratio = loop["median_s"] / ours["median_s"]
        rows.append([t, f"{harness.num(ours['sentences_per_s_median'])} ({harness.num(ours['sentences_per_s_best'])})",
                     f"{harness.num(loop['sentences_per_s_median'])} ({harness.num(loop['sentences_per_s_best'])})",
                     f"**{ratio:.2f}×** ({'met' if ratio >= 1 else 'missed'})", f"{r['max_abs_diff']:.2g}"])
        if ratio < 1:
            missed.append(t)
    m = e["model"]
    out = [f"**Embedding throughput.** A {m['kind']} ({m['layers']} layers × {m['hidden']}, WordPiece over the "
           f"texts' characters), {harness.num(e['sentences'])} real UI messages "
           f"({harness.num(e['distinct_sentences'])} distinct) in {e['languages']} languages (median "
           f"{harness.num(e['chars_median'])} chars, max {e['chars_max']}), batch {e['batch']}, max length "
           f"{e['max_length']}, hidden-state index {e['layer']}, "
           f"xylent sorting within chunks of {e['chunk_batches']} batches; sentences/s of the median run (best in "
           "brackets), the same torch threads on both sides:", "",
           harness.table(["threads", "xylent", "transformers loop", "ratio (target ≥ 1.0×)",
                          "max abs difference"], rows), ""]
    out.append(f"The pooled vectors agree within the stated tolerance {e['atol']:g} at every thread count."
               + (" Target missed at " + ", ".join(f"{t} thread(s)" for t in missed) + "." if missed else
                  " The target is met at every thread count."))
    return out + [""]


def _retrieval_md(r: dict, title: str) -> list[str]:
    rows = []
    for t, by in r["by_threads"].items():
        for key, label in (("search_k1", "nearest neighbour, one direction"),
                           ("margin_mining", f"ratio-margin mining, k = {r['k_mining']}, both directions")):
            sides = by[key]["sides"]
            cells = [f"{harness.seconds(sides[s]['median_s'])} ({harness.seconds(sides[s]['best_s'])})"
                     for s in r["sides"]]
            peers = " / ".join(f"{s} {_ratio(sides['faiss'], sides[s])}" for s in r["sides"] if s != "faiss")
            mem = " / ".join(harness.num(sides[s].get("peak_rss_above_start_mb")) for s in r["sides"])
            rows.append([label, t, *cells, peers, mem])
    out = [title, "", harness.table(["", "threads", *(f"{s}, median (best)" for s in r["sides"]),
                                     "peer time / faiss time", "RSS growth during a run, MB (" + " / ".join(r["sides"])
                                     + ")"], rows), ""]
    notes = []
    for t, by in r["by_threads"].items():
        s, m = by["search_k1"], by["margin_mining"]
        faster = [p for p in r["sides"] if p != "faiss" and s["sides"][p]["median_s"] < s["sides"]["faiss"]["median_s"]]
        faster_m = [p for p in r["sides"] if p != "faiss"
                    and m["sides"][p]["median_s"] < m["sides"]["faiss"]["median_s"]]
        ids = ", ".join(f"{p} {c['different_ids']}" for p, c in s["check"].items() if p != "faiss")
        diff = ", ".join(f"{p} {c['differing_share'] * 100:.2f} %" for p, c in m["check"].items() if p != "faiss")
        notes.append(f"{t} thread(s): acc@1 {s['acc_at_1']:.3f}; nearest neighbours other than faiss's (all cosine "
                     f"ties): {ids}; mining keeps {harness.num(m['pairs_mined'])} pairs, "
                     f"{m['correct_share'] * 100:.1f} % of them the planted ones; pairs differing from faiss's: {diff}"
                     + (f"; faster than faiss on the search: {', '.join(faster)}" if faster else "")
                     + (f"; faster than faiss on mining: {', '.join(faster_m)}" if faster_m else ""))
    gpus = r.get("faiss_gpus")
    where = "" if gpus is None else (f" faiss saw {gpus} GPU(s) and searched on GPU 0." if gpus else
                                     " faiss saw no GPU: every side searched on the CPU.")
    return out + ["Checks: " + "; ".join(notes) + ".", "",
                  "RSS growth is the peak resident memory of a run above the process's memory at its start: a lower "
                  "bound of the run's working memory, since memory the process already holds is reused." + where, ""]


def markdown(result: dict) -> str:
    r = result["retrieval"]
    out = _embedding_md(result["embedding"])
    out += _retrieval_md(r, f"**Retrieval and mining, {harness.num(r['n'])} × {harness.num(r['n'])}** unit vectors "
                            f"in {r['dim']} dims, the \"translations\" y = x + 3·noise; faiss `IndexFlatIP` (exact) "
                            f"against NumPy (`q @ db.T`, `argpartition`) and torch (`mm`, `topk`), {r['block']} "
                            "query rows a block on every side; mining is `mine_pairs` with only its search swapped; "
                            "seconds of the median run (best in brackets):")
    one = result.get("retrieval_one_shot")
    if one:
        out += _retrieval_md(one, f"**One run per side at {harness.num(one['n'])} × {harness.num(one['n'])}** "
                                  "(a single run each, no warm-up, not best-of: indicative only):")
    else:
        out += ["No larger one-shot run in this result (`--one-shot-n N` adds one).", ""]
    return "\n".join(out)


if __name__ == "__main__":
    main()
