"""Shared timing helper for the benchmark scripts."""

from __future__ import annotations

import time


def best_of(fn, n: int = 3):
    """(value, best wall time of n runs): the machine's noise, not the code, makes the spread."""
    times = []
    value = None
    for _ in range(n):
        t = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t)
    return value, min(times)
