"""What a training micro-batch needs besides its token ids, made on the host in the
loader's prefetch thread (``TrainingLoader.batches(prepare=...)``) while the device
runs the previous steps: the tensors (pinned when the step runs on a GPU, so their
copies do not wait), the masking noise (``row_noise``: a numpy draw per row), the
counts of positions the step gathers (``ElectraModel.host_counts``) and the unigram
baseline's tokens and their counts.  None of it depends on the model's state.
"""

from __future__ import annotations

import numpy as np
import torch

from xylent.models.masking import row_noise
from xylent.models.training.run_config import TrainConfig, task_plan


def micro_batches(cfg: TrainConfig, task: str, a: int, b: int) -> list[tuple[int, int]]:
    """(step, micro-batch index) of each batch of ``task`` that steps a..b-1 train, in order."""
    return [(s, micro) for s in range(a, b) for micro, t in enumerate(task_plan(cfg, s)) if t == task]


class StepInputs:
    """``prepare`` for one task's ``batches(len(positions))``: the k-th batch is trained at
    ``positions[k]`` (:func:`micro_batches`)."""

    def __init__(self, positions: list[tuple[int, int]], seed: int, rank: int, world: int, pad: int,
                 special_ids: tuple[int, ...], vocab_size: int, host_counts=None, pin: bool = False):
        self.positions, self.seed, self.rank, self.world, self.pad = positions, seed, rank, world, pad
        self.special, self.vocab_size, self.host_counts, self.pin = special_ids, vocab_size, host_counts, pin

    def __call__(self, k: int, batch: dict) -> dict:
        step, micro = self.positions[k]
        ids, seg = batch["input_ids"], batch.get("segment_ids")
        real = ids != self.pad
        rows = [self.rank + self.world * i for i in range(ids.shape[0])]
        # the unigram baseline's tokens in row-major order (its sum adds them in that order, as before)
        tokens = ids[real & ~np.isin(ids, self.special)].astype(np.int64)
        out = {"ids": torch.from_numpy(ids).long(),
               "noise": row_noise(self.seed, step, micro, rows, real.sum(1).tolist(), ids.shape[1]),
               "unigram_tokens": torch.from_numpy(tokens),
               "unigram_seen": torch.from_numpy(np.bincount(tokens, minlength=self.vocab_size).astype(np.float64))}
        if seg is not None:
            out["segments"] = torch.from_numpy(seg)
        if self.pin:
            out = {name: t.pin_memory() for name, t in out.items()}
        if self.host_counts is not None:
            out["host_counts"] = self.host_counts(ids, seg, real)
        return {**batch, **out}


def on_device(batch: dict, name: str, device: torch.device) -> torch.Tensor | None:
    """A prepared tensor on the step's device, copied without waiting where it is pinned."""
    t = batch.get(name)
    return None if t is None else t.to(device, non_blocking=True)
