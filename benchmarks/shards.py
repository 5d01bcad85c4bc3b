"""shards: tokenisation throughput vs plain SentencePiece, loader tokens/s and RSS.

1. Tokenisation: the shards stage's per-part task (`tokenize_part`: read
   Parquet, batch-encode, save the ids) and the whole per-language path
   (`pack_language`: also pack and write Arrow) on one worker vs plain
   `sentencepiece` batch encode of the same text in one process (ratio; target >= 0.8).
2. Loader: MRTD batches (8 x 512) on one core, tokens/s (target >= 1M) and peak
   RSS, over shards much larger than one batch.

Uses the demo's tokenizer (run `make demo` first, or pass --workspace) on
generated text in the demo's scripts.

    PYTHONPATH=. python benchmarks/shards.py [--workspace workspace] [--mb 100]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import sentencepiece as spm

ROOT = Path(__file__).resolve().parents[1]

LOADER = r"""
import json, sys, time
from tasks.shards import TrainingLoader
shards, sampling, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
loader = TrainingLoader(shards, sampling, task="mrtd", batch_size=8, prefetch=4, verify=False)
t = time.perf_counter()
tokens = 0
for batch in loader.batches(steps):
    tokens += int(batch["attention_mask"].sum())
secs = time.perf_counter() - t
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"tokens": tokens, "seconds": secs, "peak_rss_mb": hwm / 1e3}))
"""


def stage_dir(ws: Path, stage: str) -> Path:
    out = subprocess.run([str(Path(sys.executable).with_name("xylent")), "status", "--spec",
                          str(ROOT / "data_specs" / "demo.yaml"), "--workspace", str(ws), "--json"],
                         capture_output=True, text=True, check=True).stdout
    return Path(json.loads(out)["stages"][stage]["output_dir"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workspace", default=str(ROOT / "workspace"))
    ap.add_argument("--mb", type=int, default=100, help="text to tokenise")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "shards.json"))
    args = ap.parse_args()
    from tasks.shards.build import pack_language, tokenize_part
    from tasks.vocab.specials import special_ids

    ws = Path(args.workspace)
    model = stage_dir(ws, "vocab") / "spm.model"
    texts = pl.read_parquet(stage_dir(ws, "dedup") / "mono" / "**" / "*.parquet")["text"].to_list()
    rng = np.random.default_rng(0)
    tmp = Path(tempfile.mkdtemp(prefix="xylent-shards-bench-"))
    try:
        rows, size = [], 0
        while size < args.mb * 1_000_000:  # documents of 1-4 paragraphs drawn from the demo's real text
            para = [texts[i] for i in rng.integers(0, len(texts), size=4)]
            rows.append(" ".join(para))
            size += len(rows[-1].encode())
        df = pl.DataFrame({"doc_id": [f"d{i // 3}" for i in range(len(rows))], "text": rows,
                           "source": ["bench"] * len(rows)})
        part = tmp / "part-00000.parquet"
        df.write_parquet(part)
        sp = spm.SentencePieceProcessor(model_file=str(model))
        t = time.perf_counter()
        ids = sp.encode(rows, num_threads=1)  # one worker against one worker
        plain_s = time.perf_counter() - t
        n_tokens = sum(map(len, ids))
        del ids
        t = time.perf_counter()
        tokenize_part(part, sp, tmp / "tok.npz")  # the stage's per-part task
        part_s = time.perf_counter() - t
        t = time.perf_counter()
        stats = pack_language([part], sp, tmp / "mrtd" / "lang=xx", 512, 256 << 20)
        shard_list = stats.pop("shards").finish(tmp)
        ours_s = time.perf_counter() - t
        tok = {"text_mb": round(size / 1e6, 1), "tokens": n_tokens,
               "plain_sentencepiece_tokens_per_s": round(n_tokens / plain_s),
               "tokenize_part_tokens_per_s": round(n_tokens / part_s), "ratio": round(plain_s / part_s, 3),
               "tokenize_and_pack_tokens_per_s": round(n_tokens / ours_s),
               "ratio_with_packing": round(plain_s / ours_s, 3)}
        print(json.dumps(tok), flush=True)
        index = {"seq_len": 512, "specials": special_ids(sp),
                 "mrtd": {"xx": {"rows": sum(s["rows"] for s in shard_list), "shards": shard_list}}, "trtd": {}}
        (tmp / "index.json").write_text(json.dumps(index))
        samp = tmp / "sampling"
        samp.mkdir()
        pl.DataFrame({"lang": ["xx"], "examples": [1], "tokens": [None], "p_raw": [1.0], "p": [1.0]},
                     schema_overrides={"tokens": pl.Int64}).write_parquet(samp / "mono_sampling.parquet")
        out = subprocess.run([sys.executable, "-c", LOADER, str(tmp), str(samp), "3000"], capture_output=True,
                             text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
        load = json.loads(out)
        loader = {"batches": 3000, "batch": "8 x 512", "tokens_per_s": round(load["tokens"] / load["seconds"]),
                  "peak_rss_mb": round(load["peak_rss_mb"], 1),
                  "shard_mb": round(sum((tmp / s["path"]).stat().st_size for s in shard_list) / 1e6, 1)}
        print(json.dumps(loader), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report = {"benchmark": "shards", "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "peer": "plain sentencepiece batch encode of the same text, one process",
              "targets": {"ratio": ">= 0.8", "loader_tokens_per_s": ">= 1e6"},
              "tokenisation": tok, "loader": loader,
              "pass": tok["ratio"] >= 0.8 and loader["tokens_per_s"] >= 1e6}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps({"pass": report["pass"]}))


if __name__ == "__main__":
    main()
