"""vocab: grid parallelism, ALP throughput, VoCAP vs joint sequence lengths.

1. Wall time of the vocab stage on the demo (`--force`, everything upstream
   cached) with 1 and 2 workers, threads and processes.
2. ALP sentences/s: `tasks.vocab.average_log_probability` (batch encode in C++,
   numpy counting) vs a plain Python loop over `EncodeAsIds` with a Counter.
3. The VoCAP-vs-joint tokens-per-sentence table of the demo languages.

    PYTHONPATH=. python benchmarks/vocab.py [--workspace /tmp/xylent-vocab-bench]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import polars as pl
import sentencepiece as spm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from timing import best_of  # noqa: E402
DEMO = ROOT / "data_specs" / "demo.yaml"


def run_vocab(ws: Path) -> dict:
    cmd = [str(Path(sys.executable).with_name("xylent")), "run", "vocab", "--spec", str(DEMO), "--workspace",
           str(ws), "--json"]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def python_loop_alp(model: str, sentences: list[str]) -> float:
    sp = spm.SentencePieceProcessor(model_file=model)
    segs = [sp.EncodeAsIds(s) for s in sentences]
    freq = Counter(t for seg in segs for t in seg)
    total = sum(freq.values())
    return sum(sum(math.log(freq[t] / total) for t in seg) for seg in segs) / len(segs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workspace", default="/tmp/xylent-vocab-bench")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vocab.json"))
    args = ap.parse_args()
    ws = Path(args.workspace)
    res = run_vocab(ws)  # builds (or reuses) everything upstream once
    walls = []
    for kind in ("threads", "processes"):
        for workers in (1, 2):
            t = time.perf_counter()
            cmd = [str(Path(sys.executable).with_name("xylent")), "run", "vocab", "--spec", str(DEMO),
                   "--workspace", str(ws), "--force", "--json", "--set", f"runner.kind={kind}",
                   "--set", f"runner.max_workers={workers}"]
            r = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
            wall = time.perf_counter() - t
            m = json.loads((Path(r["stages"]["vocab"]["output_dir"]) / "_manifest.json").read_text())
            walls.append({"runner": kind, "workers": workers, "stage_seconds": m["seconds"],
                          "command_seconds": round(wall, 1)})
            print(json.dumps(walls[-1]), flush=True)
    vdir = Path(res["stages"]["vocab"]["output_dir"])
    cmp = pl.read_parquet(vdir / "comparison.parquet").sort("examples", descending=True)
    dedup_dir = Path(json.loads(subprocess.run(
        [str(Path(sys.executable).with_name("xylent")), "status", "--spec", str(DEMO), "--workspace", str(ws),
         "--json"], capture_output=True, text=True, check=True).stdout)["stages"]["dedup"]["output_dir"])
    sents = pl.read_parquet(dedup_dir / "mono" / "lang=de" / "*.parquet")["text"].to_list() * 40
    model = str(vdir / "spm.model")
    from tasks.vocab import average_log_probability


    ours_1, ours_1s = best_of(lambda: average_log_probability(model, sents, num_threads=1), 5)
    ours, ours_s = best_of(lambda: average_log_probability(model, sents), 5)  # 2 threads
    theirs, theirs_s = best_of(lambda: python_loop_alp(model, sents), 5)
    alp = {"sentences": len(sents), "xylent_sentences_per_s": round(len(sents) / ours_s),
           "xylent_one_thread_sentences_per_s": round(len(sents) / ours_1s),
           "speedup_one_thread": round(theirs_s / ours_1s, 2),
           "python_loop_sentences_per_s": round(len(sents) / theirs_s), "speedup": round(theirs_s / ours_s, 2),
           "same_value": math.isclose(ours, theirs, rel_tol=1e-9) and math.isclose(ours_1, theirs, rel_tol=1e-9)}
    print(json.dumps(alp), flush=True)
    table = cmp.select("lang", "examples", "tokens_per_sentence_vocap", "tokens_per_sentence_joint",
                       "chars_per_token_vocap", "chars_per_token_joint").to_dicts()
    report = {"benchmark": "vocab", "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "stage_wall_time": walls, "alp": alp, "tokens_per_sentence": table,
              "pass": alp["speedup"] >= 3 and alp["same_value"]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps({"pass": report["pass"]}))


if __name__ == "__main__":
    main()
