"""prepare throughput vs the decompression floor (`xz -dc FILE > /dev/null`).

Generates CC-100-like `.txt.xz` files (paragraph lines, blank-line documents,
a multilingual word mix so NFC and the non-ASCII path are exercised), then for
each size runs, in fresh processes:
  - the floor: `xz -dc FILE > /dev/null`
  - prepare: the stage's unit of work (`tasks.prepare.prepare_unit`: stream,
    decode, clean, normalise, filter, write Parquet)
and reports MB/s of decompressed text, the ratio floor_time / prepare_time,
and peak RSS of the prepare process.  Targets: ratio >= 0.5, RSS < 1 GB and
flat across sizes.

    python benchmarks/prepare_throughput.py [--sizes-mb 125 500] [--out benchmarks/results/prepare_throughput.json]
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

ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import json, sys, time
from pathlib import Path
from tasks.prepare import prepare_unit
from xylent.spec import PrepareConfig
from xylent.workspace import Workspace, sha256_file
path, ws = Path(sys.argv[1]), Workspace(sys.argv[2])
st = path.stat()
rec = {"source": "bench", "format": "text-xz", "filename": path.name, "path": str(path), "file": None,
       "url": None, "lang": "xx", "pair": None, "catalog": None, "unit": "bench", "sha256": "-",
       "bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "truncated": False}
t = time.perf_counter()
manifest, _ = prepare_unit([rec], ws, PrepareConfig(), {})
secs = time.perf_counter() - t
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"seconds": secs, "stats": manifest["stats"][0], "vm_hwm_kb": hwm}))
"""


def make_vocab(rng: np.random.Generator, n: int = 60_000) -> list[bytes]:
    """Random 'words' over a mix of scripts: mostly Latin, some Cyrillic, Greek,
    accented Latin (so NFC has work), CJK."""
    alphabets = [
        (0.6, "abcdefghijklmnopqrstuvwxyz"),
        (0.15, "абвгдежзийклмнопрстуфхцчшщыэюя"),
        (0.1, "αβγδεζηθικλμνξοπρστυφχψω"),
        (0.1, "aeiouçñüößéèàù"),
        (0.05, "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年"),
    ]
    probs = np.array([p for p, _ in alphabets])
    words = []
    for _ in range(n):
        _, alpha = alphabets[rng.choice(len(alphabets), p=probs)]
        length = int(rng.integers(2, 11))
        words.append("".join(rng.choice(list(alpha), size=length)).encode())
    return words


def generate(path: Path, text_mb: int, seed: int = 0) -> int:
    """Write about ``text_mb`` MB of text, xz-compressed; returns text bytes written."""
    rng = np.random.default_rng(seed)
    vocab = np.array(make_vocab(rng), dtype=object)
    zipf = 1.0 / np.arange(1, len(vocab) + 1) ** 1.05
    zipf /= zipf.sum()
    cdf = np.cumsum(zipf)
    blocks = []
    for _ in range(24):  # distinct 4 MB blocks; xz -0's 256 KiB window cannot see repeats
        n_lines = 60_000
        lengths = rng.integers(8, 60, size=n_lines)
        words = vocab[np.minimum(np.searchsorted(cdf, rng.random(lengths.sum())), len(vocab) - 1)]
        ends = np.cumsum(lengths)
        boundary = rng.random(n_lines) < 0.15
        out = []
        for i, end in enumerate(ends):
            line = b" ".join(words[end - lengths[i]:end]) + b".\n"
            out.append(line + b"\n" if boundary[i] else line)
        blocks.append(b"".join(out))
    written = 0
    xz = subprocess.Popen(["xz", "-0", "-T2", "-c"], stdin=subprocess.PIPE, stdout=open(path, "wb"))
    while written < text_mb * 1_000_000:
        b = blocks[int(rng.integers(len(blocks)))]
        xz.stdin.write(b)
        written += len(b)
    xz.stdin.close()
    if xz.wait() != 0:
        raise SystemExit("xz failed")
    return written


def timed(cmd: list[str], **kw) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (bytes) of the child, and its stdout."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, **kw)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    secs = time.perf_counter() - t
    if status != 0:
        raise SystemExit(f"{cmd[:3]} failed with status {status}")
    return secs, usage.ru_maxrss * 1024, out.decode()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[400, 1600],
                    help="decompressed text sizes; 1600 MB of this text is a >= 500 MB .xz file")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "prepare_throughput.json"))
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="xylent-bench-"))
    results = []
    try:
        for mb in args.sizes_mb:
            f = tmp / f"xx-{mb}.txt.xz"
            text_bytes = generate(f, mb)
            xz_s, xz_rss, _ = timed(["sh", "-c", f"xz -dc {f} > /dev/null"])
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            ws = tmp / f"ws-{mb}"
            p_s, p_rss, out = timed([sys.executable, "-c", WORKER, str(f), str(ws)], env=env)
            res = json.loads(out)
            stats = res["stats"]
            p_rss = res["vm_hwm_kb"] * 1024  # the child's own peak (ru_maxrss would include the parent)
            row = {
                "text_mb": round(text_bytes / 1e6, 1),
                "xz_mb": round(f.stat().st_size / 1e6, 1),
                "lines": stats["lines_in"], "rows_out": stats["rows_out"], "docs": stats["docs"],
                "xz_dc_seconds": round(xz_s, 2), "xz_dc_mb_s": round(text_bytes / 1e6 / xz_s, 1),
                "prepare_seconds": round(p_s, 2), "prepare_mb_s": round(text_bytes / 1e6 / p_s, 1),
                "ratio_to_xz": round(xz_s / p_s, 3),
                "prepare_peak_rss_mb": round(p_rss / 1e6, 1),
            }
            print(json.dumps(row), flush=True)
            results.append(row)
            shutil.rmtree(ws, ignore_errors=True)
            f.unlink()
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    rss = [r["prepare_peak_rss_mb"] for r in results]
    report = {
        "benchmark": "prepare_throughput",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "peer": "xz -dc FILE > /dev/null (decompression floor)",
        "targets": {"ratio_to_xz": ">= 0.5", "peak_rss_mb": "< 1000, flat across sizes"},
        "results": results,
        "rss_growth": round(max(rss) / min(rss), 3) if rss else None,
        "pass": all(r["ratio_to_xz"] >= 0.5 and r["prepare_peak_rss_mb"] < 1000 for r in results),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps({k: report[k] for k in ("rss_growth", "pass")}))


if __name__ == "__main__":
    main()
