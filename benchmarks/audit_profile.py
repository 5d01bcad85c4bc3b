"""Where an audit run's time goes: one rank, TRTD every step, under py-spy.

    .venv/bin/python benchmarks/audit_profile.py SCRATCH [--steps 200] [--plain]

Builds (or finds) the demo's shards with benchmarks/audit.py's helpers, writes the audit's
train.json as that benchmark does (``--plain``: the same without the audit), starts one rank
through ``xylent.launch`` under ``py-spy record --subprocesses --format raw``, then prints the
median step time and each audit piece's share of the training loop's samples.  Run it on an
idle machine; docs/records/benchmarks.md ("What the sweep says", "History") reads its output.  Not one
of render.py's benchmarks: it writes no JSON and needs py-spy
(``pip install --target /tmp/pyspy py-spy``; ``--py-spy`` names another binary).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # run as a script from anywhere, as the other benchmarks

import audit as bench  # noqa: E402  (benchmarks/audit.py)

PIECES = {  # a sample counts for a piece when (function, file) is on its stack
    "language baseline": ("sentence_rows", "audit/step.py"),
    "held-out passes": ("heldout_help", "audit/step.py"),
    "partner swap": ("partners_swapped", "audit/step.py"),
    "per-pair sums": ("pair_totals", "audit/step.py"),
    "sums over ranks": ("summed_over_ranks", "audit/step.py"),
    "EMA update": ("observe", "audit/adversary.py"),
    "re-sampling": ("resample", "audit/adversary.py"),
    "model forward": ("forward", "electra.py"),
    "backward": ("backward", "engine.py"),
    "optimizer step": ("step", "engine.py"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scratch", type=Path)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--py-spy", default="/tmp/pyspy/bin/py-spy")
    a = ap.parse_args()
    upstream = bench.build_upstream(a.scratch / "ws")
    kind = "plain" if a.plain else "audit"
    config = bench.write_config(bench.load_bench_spec(), upstream, a.scratch / kind, steps=a.steps, tasks=["trtd"],
                                audit=not a.plain)
    raw = a.scratch / f"{kind}.raw"
    code = ("from pathlib import Path; from xylent.launch import deepspeed_command, launch; "
            f"c = Path({str(config)!r}); launch(deepspeed_command(c, ranks=1), c.parent / 'train.log', ranks=1)")
    subprocess.run([a.py_spy, "record", "--subprocesses", "--format", "raw", "--rate", "50", "-o", str(raw), "--",
                    sys.executable, "-c", code], check=True, cwd=ROOT)
    rows = [json.loads(x) for x in (config.parent / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r["step_seconds"] for r in rows if r["step"] > 10]
    counts, total = Counter(), 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        # methods show as Class.method; the path is relative to its package root
        frames = {(f.split(" (")[0].strip().rsplit(".", 1)[-1], f.split(" (")[-1].split(":")[0])
                  for f in stack.split(";") if " (" in f}
        if ("train", "models/training/trainer.py") not in frames or any(fn in ("initialize", "__init__") and "deepspeed" in path
                                                             for fn, path in frames):
            continue  # the launching process, the imports and DeepSpeed's set-up: only the training loop counts
        total += int(n)
        for piece, (func, file) in PIECES.items():
            if any(fn == func and path.endswith(file) for fn, path in frames):
                counts[piece] += int(n)
    print(f"{kind}: median step {1e3 * statistics.median(steps):.1f} ms over {len(steps)} steps; "
          f"{total} samples in the training loop")
    for piece, n in counts.most_common():
        print(f"  {piece:18s} {100 * n / max(total, 1):5.1f} %")


if __name__ == "__main__":
    main()
