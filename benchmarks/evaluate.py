"""evaluate benchmarks, each side by side with its peer in one run:

1. embedding throughput: the stage's encoder wrapper (length-sorted chunks)
   against a plain ``transformers`` forward loop over the same model and texts
   (target >= 1.0x), outputs compared;
2. retrieval and margin mining for N x N sentences: faiss exact search
   (``tasks.evaluate.retrieval``) against a blocked NumPy matmul with
   argpartition top-k, results compared.

    .venv/bin/python benchmarks/evaluate.py                 # ~6 min on 2 cores
    .venv/bin/python benchmarks/evaluate.py --n 20000       # quick

Writes benchmarks/results/evaluate.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import best_of  # noqa: E402
from tasks.evaluate.data import package_pairs  # noqa: E402
from tasks.evaluate.encoders import HuggingFaceEncoder  # noqa: E402
from tasks.evaluate.retrieval import knn, mine_pairs  # noqa: E402


def real_sentences(n: int) -> list[str]:
    """Real UI messages in 16 languages (Django's and allauth's catalogs), cycled to n."""
    langs = ["de", "fr", "es", "ru", "ar", "ja", "zh", "ko", "th", "tr", "el", "he", "fa", "uk", "ca", "pt"]
    texts = [t for xx, en in package_pairs("allauth", langs).values() for t in xx + en]
    return [texts[i % len(texts)] for i in range(n)]


def tiny_bert(path: Path, texts: list[str], hidden: int, layers: int) -> Path:
    from transformers import BertConfig, BertModel, BertTokenizerFast

    chars = sorted({c for t in texts for c in t if not c.isspace()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars)]
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    BertTokenizerFast(vocab_file=str(path / "vocab.txt"), do_lower_case=False).save_pretrained(str(path))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, intermediate_size=4 * hidden,
                         max_position_embeddings=512)).eval().save_pretrained(str(path))
    return path


def plain_loop(path: Path, texts: list[str], layer: int, batch: int, max_length: int) -> np.ndarray:
    """What a user writes with transformers: batches in the given order, padding to the batch's longest."""
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(str(path)), AutoModel.from_pretrained(str(path)).eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            enc = tok(texts[i: i + batch], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            h = model(**enc, output_hidden_states=True).hidden_states[layer]
            m = enc["attention_mask"].unsqueeze(-1).float()
            out.append(((h * m).sum(1) / m.sum(1)).numpy())
    return np.concatenate(out)


def bench_embedding(n: int, hidden: int, layers: int, batch: int) -> dict:
    texts = real_sentences(n)
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_bert(Path(tmp) / "bert", texts, hidden, layers)
        layer = layers // 2 + 1
        enc = HuggingFaceEncoder("bench", path)
        ours, t_ours = best_of(lambda: np.concatenate([b[layer] for b in enc.embed_batches(
            texts, [layer], batch_size=batch, max_length=128)]), 2)
        peer, t_peer = best_of(lambda: plain_loop(path, texts, layer, batch, 128), 2)
    lengths = [len(t) for t in texts]
    return {"sentences": n, "model": f"BERT {layers}x{hidden} (random init)", "batch": batch, "layer": layer,
            "chars_median": float(np.median(lengths)), "chars_max": int(max(lengths)),
            "xylent_s": t_ours, "transformers_loop_s": t_peer,
            "xylent_sentences_per_s": n / t_ours, "transformers_sentences_per_s": n / t_peer,
            "speedup": t_peer / t_ours, "max_abs_diff": float(np.abs(ours - peer).max())}


def numpy_topk(q: np.ndarray, db: np.ndarray, k: int, block: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    scores = np.empty((len(q), k), np.float32)
    ids = np.empty((len(q), k), np.int64)
    for s in range(0, len(q), block):
        sim = q[s: s + block] @ db.T
        part = np.argpartition(-sim, k - 1, axis=1)[:, :k]
        val = np.take_along_axis(sim, part, 1)
        order = np.argsort(-val, axis=1)
        ids[s: s + block], scores[s: s + block] = np.take_along_axis(part, order, 1), np.take_along_axis(val, order, 1)
    return scores, ids


def numpy_margin_mine(x: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """Ratio margin with k neighbours, forward and backward best candidates (the peer of mine_pairs)."""
    sx, ix = numpy_topk(x, y, k)
    sy, iy = numpy_topk(y, x, k)
    mx, my = sx.mean(1), sy.mean(1)
    fwd = sx / ((mx[:, None] + my[ix]) / 2)
    bwd = sy / ((my[:, None] + mx[iy]) / 2)
    return np.concatenate([ix[np.arange(len(x)), fwd.argmax(1)], iy[np.arange(len(y)), bwd.argmax(1)]])


def bench_retrieval(n: int, dim: int) -> dict:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, dim), dtype=np.float32)
    y = x + 3.0 * rng.standard_normal((n, dim), dtype=np.float32)  # noisy translations: cosine ~0.3, acc@1 < 1
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    (_, fi), t_faiss = best_of(lambda: knn(x, y, 1), 1)
    (_, ni), t_numpy = best_of(lambda: numpy_topk(x, y, 1), 1)
    t0 = time.perf_counter()
    src, tgt, _ = mine_pairs(x, y, 4)
    t_mine = time.perf_counter() - t0
    t0 = time.perf_counter()
    peer_best = numpy_margin_mine(x, y, 4)
    t_mine_np = time.perf_counter() - t0
    return {"n": n, "dim": dim, "search_k1": {"faiss_s": t_faiss, "numpy_s": t_numpy, "speedup": t_numpy / t_faiss,
                                              "acc_at_1": float(np.mean(fi[:, 0] == np.arange(n))),
                                              "same_answers": float(np.mean(fi[:, 0] == ni[:, 0]))},
            "margin_mining_k4": {"faiss_s": t_mine, "numpy_s": t_mine_np, "speedup": t_mine_np / t_mine,
                                 "pairs_mined": int(len(src)),
                                 "correct_share": float(np.mean(np.asarray(src) == np.asarray(tgt))),
                                 "numpy_forward_correct_share": float(np.mean(peer_best[:n] == np.arange(n)))}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=4000)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--n", type=int, default=100_000, help="sentences per side for retrieval / mining")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "evaluate.json"))
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    result = {"machine": {"cpus": torch.get_num_threads(), "python": platform.python_version(),
                          "torch": torch.__version__},
              "embedding": bench_embedding(args.sentences, args.hidden, args.layers, args.batch)}
    print(json.dumps(result["embedding"], indent=2), flush=True)
    result["retrieval"] = bench_retrieval(args.n, args.dim)
    print(json.dumps(result["retrieval"], indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
