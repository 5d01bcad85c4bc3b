"""Rank 0's per-step metrics, kept on the device until a logging interval ends.

A step adds its sums (xylent.models.stats) on the device and records them here; nothing is
read back until :meth:`Interval.lines`, called at every ``log_every`` boundary, before
a checkpoint and at the end: one copy to the host for the whole interval, instead of
several waits per micro-batch.  Every step still gets its own line, with the values
the per-step reads gave.  The timing fields (``step_seconds``, ``tokens_per_second``,
``mfu``) on a GPU are the interval's averages: the host runs ahead of the device and
waits on it once per interval, so one step's time is not known.  On the CPU every op
has finished when it returns, so each line keeps its own step's time.
"""

from __future__ import annotations

import math
import time

import torch

from xylent.models.stats import Stats


def summarise(sums: dict[str, list[float]]) -> dict[str, float]:
    """Per task: losses and accuracies from the all-reduced sums of a step."""
    out = {}
    names = Stats.fields()
    for task, v in sums.items():
        s = dict(zip(names, v))
        out[f"{task}/generator_loss"] = s["g_loss"] / max(s["g_count"], 1)
        out[f"{task}/generator_accuracy"] = s["g_correct"] / max(s["g_count"], 1)
        if s["d_count"]:
            d_count, pos = s["d_count"], s["d_pos"]
            out[f"{task}/discriminator_loss"] = s["d_loss"] / d_count
            out[f"{task}/discriminator_accuracy"] = s["d_correct"] / d_count
            out[f"{task}/discriminator_precision"] = s["d_true_pos"] / s["d_pred_pos"] if s["d_pred_pos"] else 0.0
            out[f"{task}/discriminator_recall"] = s["d_true_pos"] / pos if pos else 0.0
            out[f"{task}/replaced_fraction"] = pos / d_count
            # the loss of always answering the base rate: a discriminator at or above it has learned nothing
            q = min(max(pos / d_count, 1e-12), 1 - 1e-12)
            out[f"{task}/discriminator_base_loss"] = -(q * math.log(q) + (1 - q) * math.log(1 - q))
        if s["c_count"]:
            out[f"{task}/contrast_loss"] = s["c_loss"] / s["c_count"]
            out[f"{task}/contrast_accuracy"] = s["c_correct"] / s["c_count"]
    return out


class Interval:
    """The steps logged since the last read.  ``add`` takes device tensors (or numbers).
    ``averaged``: time the interval as a whole (a GPU), not each step (the CPU)."""

    def __init__(self, loss_weights: dict[str, float], flops_per_token: float, peak_flops: float | None,
                 averaged: bool):
        self.weights, self.fpt, self.peak, self.averaged = loss_weights, flops_per_token, peak_flops, averaged
        self.steps: list[dict] = []
        self.restart()

    def restart(self) -> None:
        """Time from now: what ran since the last step (writing the lines, a checkpoint) is no step's."""
        self.start = self.last = time.perf_counter()

    def add(self, step: int, sums: dict, unigram: dict, grad_norm, lr: float, host: dict[str, float]) -> None:
        """``sums``, ``unigram``: per task, the step's all-reduced Stats sums and (Σ −log q, tokens);
        ``grad_norm``: a tensor, a number or None; ``host``: values already on the host (the audit's, gauges)."""
        now = time.perf_counter()
        self.steps.append({"step": step, "sums": sums, "unigram": unigram, "grad_norm": grad_norm, "lr": lr,
                           "host": host, "seconds": now - self.last})
        self.last = now

    def lines(self, peak_memory_gb: float | None = None) -> list[tuple[int, dict[str, float]]]:
        """(step, metrics) of every step added since the last call.  The caller :meth:`restart`\ s the
        clock once it has written them."""
        tensors = [t for s in self.steps for t in (*s["sums"].values(), *s["unigram"].values(), s["grad_norm"])
                   if isinstance(t, torch.Tensor)]
        # float32 and float64 sums alike: float64 holds both exactly, as .tolist() and float() did
        flat = torch.cat([t.detach().reshape(-1).double() for t in tensors]).cpu().tolist() if tensors else []
        if self.averaged:  # the read above waited for the device: the interval's time, whole
            elapsed = time.perf_counter() - self.start
            for s in self.steps:
                s["seconds"] = elapsed / len(self.steps)
        at, out = 0, []

        def read(v):
            nonlocal at
            if not isinstance(v, torch.Tensor):
                return v
            n = v.numel()
            at += n
            return flat[at - n: at]

        for s in self.steps:
            sums = {t: read(v) for t, v in s["sums"].items()}
            unigram = {t: read(v) for t, v in s["unigram"].items()}
            gn = read(s["grad_norm"])
            gn = gn[0] if isinstance(gn, list) else gn
            metrics = {**summarise(sums), **s["host"]}
            metrics.update({f"{t}/generator_unigram_loss": v[0] / v[1] for t, v in unigram.items() if v[1]})
            tokens = sum(v[Stats.fields().index("tokens")] for v in sums.values())
            loss = sum(sum(w * metrics.get(f"{t}/{name}", 0) for name, w in self.weights.items()) for t in sums)
            metrics.update({"loss": loss / len(sums), "lr": s["lr"],
                            "grad_norm": float(gn) if gn is not None else float("nan"), "tokens": tokens})
            out.append((s["step"], metrics))
        total = sum(m["tokens"] for _, m in out)
        for s, (_, m) in zip(self.steps, out):
            tokens, seconds = (total / len(out), s["seconds"]) if self.averaged else (m["tokens"], s["seconds"])
            m["tokens_per_second"], m["step_seconds"] = tokens / seconds, seconds
            m["tokens"] = m.pop("tokens")  # the order of the lines before: the timings, then the tokens
            if peak_memory_gb is not None:
                m["peak_memory_gb"] = peak_memory_gb
            if self.peak:
                m["mfu"] = tokens * self.fpt / seconds / self.peak
        self.steps = []
        return out
