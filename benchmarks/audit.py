"""audit: time of the χ² DRO best response (tasks.audit.chi2_best_response).

1. Best response: random seeded losses and Dirichlet priors at 100, 1 000 and
   10 000 groups, once with a radius the closed form reaches (no floor binds)
   and once with floors binding; one warm-up call, then best and median of
   `repeats` calls.  Target: < 50 ms at 10 000 groups.

The report keeps one key per section, so a second one (e.g. the audit's per-step
overhead against plain pretrain steps) can sit beside "best_response".

    PYTHONPATH=. python benchmarks/audit.py [--quick] [--out benchmarks/results/audit.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from tasks.audit import chi2_best_response, chi2_divergence

ROOT = Path(__file__).resolve().parents[1]
TARGET_MS_AT_10K = 50.0

# (case, rho, min_ratio): ρ = 0.01 keeps every ratio of normal losses above 0.2
# up to z ≈ −5.7 (no floor binds at these sizes); ρ = 0.1 (the reference's upper
# value) clamps the groups below z ≈ −1.8, a few percent of them.
CASES = (("no_floor", 0.01, 0.2), ("floor_binds", 0.1, 0.2))


def _times(fn, repeats: int) -> list[float]:
    fn()  # warm-up: first-call allocations and imports are not the steady state
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def best_response_benchmark(sizes=(100, 1000, 10000), repeats: int = 5) -> dict:
    """Wall time of chi2_best_response per size and case, in milliseconds."""
    rows = []
    for n in sizes:
        rng = np.random.default_rng(n)
        losses = 3.0 + 0.3 * rng.normal(size=n)  # per-pair loss EMAs around a common level
        prior = rng.dirichlet(np.full(n, 0.5))  # skewed, like real pair sampling tables
        for case, rho, min_ratio in CASES:
            times = _times(lambda: chi2_best_response(losses, prior, rho, min_ratio=min_ratio), repeats)
            q = chi2_best_response(losses, prior, rho, min_ratio=min_ratio)
            rows.append({
                "groups": n, "case": case, "rho": rho, "min_ratio": min_ratio, "repeats": repeats,
                "best_ms": round(1e3 * min(times), 4), "median_ms": round(1e3 * statistics.median(times), 4),
                "groups_at_floor": int(np.sum(q <= min_ratio * prior * (1 + 1e-12))),
                "divergence_rel_error": abs(chi2_divergence(q, prior) / rho - 1.0),
            })
            print(json.dumps(rows[-1]), flush=True)
    at_target = [r["median_ms"] for r in rows if r["groups"] == 10000]
    return {
        "target_ms_at_10000_groups": TARGET_MS_AT_10K,
        "results": rows,
        "pass": all(ms < TARGET_MS_AT_10K for ms in at_target) if at_target else None,
    }


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "audit.json"))
    args = ap.parse_args()
    report = {"benchmark": "audit", "machine": machine()}
    report["best_response"] = best_response_benchmark(repeats=2 if args.quick else 5)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps({"pass": report["best_response"]["pass"], "out": args.out}))


if __name__ == "__main__":
    main()
