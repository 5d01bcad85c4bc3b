"""The encoder again at fixed token counts (``pretrain.snapshot_tokens``), so that evaluate can draw
held-out retrieval against tokens trained on (issue 63, item 4): one run, one curve.

Every rank adds the step's all-reduced token count (the same number everywhere) on the device, and
reads it at logging boundaries only -- one host read per boundary, where the metrics already wait for
the device -- so a snapshot is taken at the first boundary at or past its count, and records the count
it was actually taken at.  A snapshot is a DeepSpeed checkpoint (the fp32 weights of any ZeRO stage,
read back by the same consolidation as the final model) under ``<checkpoints>/snapshots/tokens-N/``,
complete when rank 0 has written its marker; the pretrain stage exports each (xylent.tasks.pretrain.
publish).  With no counts there is no counter: a run without snapshots computes the same bits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from xylent.models.stats import Stats
from xylent.models.training.checkpoints import COMPLETE  # a snapshot's: {"step", "tokens", "counts"}, by rank 0

DIR = "snapshots"      # under the run's DeepSpeed checkpoint folder, beside its step-* tags
STATE = "snapshot_tokens_seen"  # the count so far, in each checkpoint's client state (a resumed run goes on from it)


def complete_snapshots(checkpoint_dir: Path) -> list[Path]:
    root = Path(checkpoint_dir) / DIR
    return sorted(p for p in root.glob("tokens-*") if (p / COMPLETE).is_file()) if root.is_dir() else []


def snapshot_info(tag_dir: Path) -> dict:
    return json.loads((tag_dir / COMPLETE).read_text())


class Snapshots:
    def __init__(self, counts: list[int], checkpoint_dir: Path, device: torch.device):
        self.todo, self.root = list(counts), Path(checkpoint_dir) / DIR
        self.seen = torch.zeros((), dtype=torch.float64, device=device)
        self.index = Stats.fields().index("tokens")

    def add(self, reduced: torch.Tensor) -> None:
        """``reduced``: a micro-step's all-reduced Stats (sums, then counts)."""
        self.seen += reduced[self.index].double()

    def state(self) -> dict:
        return {STATE: float(self.seen)}

    def restore(self, client: dict) -> None:
        self.seen.fill_(float(client.get(STATE, 0.0)))
        self.todo = [n for n in self.todo if n > float(self.seen)]

    def take_if_due(self, engine, step: int, rank: int) -> None:
        """At a logging boundary, on every rank: save a snapshot when the count passed the next one."""
        if not self.todo:
            return
        seen = int(self.seen.item())
        passed = [n for n in self.todo if n <= seen]
        if not passed:
            return
        self.todo = [n for n in self.todo if n > seen]
        tag = f"tokens-{seen:015d}"
        if rank == 0:  # a snapshot a killed run left half-written is written again, never trusted
            shutil.rmtree(self.root / tag, ignore_errors=True)
        dist.barrier()
        engine.save_checkpoint(str(self.root), tag=tag, client_state={"step": step, "tokens": seen},
                               save_latest=False)
        dist.barrier()
        if rank == 0:
            (self.root / tag / COMPLETE).write_text(json.dumps({"step": step, "tokens": seen, "counts": passed}))
            print(f"xylent: snapshot at {seen} tokens (step {step}) {self.root / tag}", flush=True)
        dist.barrier()
