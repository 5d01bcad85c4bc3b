"""The fine-tuning loop: AdamW, linear warmup then linear decay, gradient
clipping at 1.0 (XTREME's run_*.py), the model scored on the train language's
dev set after every epoch, the best (or last) weights kept.

Resumable exactly: every ``checkpoint_every`` steps and at each epoch's end,
``state.pt`` (weights, optimiser, schedule, position in the epoch, the RNG that
draws dropout) is written atomically; the epoch order is a function of (seed,
epoch), so a rerun after kill -9 continues the same run step for step.
Checkpoints are loaded with ``weights_only=True``: a tampered file cannot run code.
"""

from __future__ import annotations

import json
import math
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from xylent.models.heads import IGNORE, TaskModel
from xylent.tasks.evaluate.finetune.features import Feature
from xylent.atomic import write_atomic

STATE = "state.pt"


@dataclass
class LoopConfig:
    lr: float
    epochs: int
    batch_size: int
    warmup: float | None  # a fraction of the steps, or
    weight_decay: float
    selection: str
    checkpoint_every: int
    seed: int
    warmup_steps: int | None = None  # steps, capped at the run's (XY-LENT's XNLI: 12,500)

    def rising(self, total: int) -> int:
        """How many of ``total`` steps have a rising learning rate."""
        return min(self.warmup_steps, total) if self.warmup_steps is not None else int((self.warmup or 0.0) * total)


def collate(features: list[Feature], pad_id: int, device) -> dict:
    width = max(len(f.ids) for f in features)
    ids = torch.full((len(features), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(features), width), dtype=torch.long)
    for k, f in enumerate(features):
        ids[k, : len(f.ids)] = torch.tensor(f.ids)
        mask[k, : len(f.ids)] = 1
    batch = {"ids": ids, "mask": mask}
    keys = features[0].target.keys()
    if "labels" in keys:
        labels = torch.full((len(features), width), IGNORE, dtype=torch.long)
        for k, f in enumerate(features):
            labels[k, : len(f.ids)] = torch.tensor(f.target["labels"])
        batch["labels"] = labels
    for key in ("label", "start", "end"):
        if key in keys:
            batch[key] = torch.tensor([f.target[key] for f in features], dtype=torch.long)
    return {k: v.to(device) for k, v in batch.items()}


def _autocast(device: torch.device):
    # bf16 on GPUs as pretrain runs; CPUs stay in fp32 (bf16 there is slow and changes scores)
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


@torch.no_grad()
def logits_of(model: TaskModel, features: list[Feature], pad_id: int, batch_size: int = 64) -> list[np.ndarray]:
    """Per feature, its logits without padding: (labels,), (L, labels) or (L, 2)."""
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(features)), key=lambda i: len(features[i].ids))  # little padding
    out: list[np.ndarray | None] = [None] * len(features)
    for b in range(0, len(order), batch_size):
        idx = order[b: b + batch_size]
        batch = collate([features[i] for i in idx], pad_id, device)
        with _autocast(device):
            logits = model(batch["ids"], batch["mask"]).float().cpu().numpy()
        for row, i in enumerate(idx):
            out[i] = logits[row] if logits.ndim == 2 else logits[row, : len(features[i].ids)]
    return out


def schedule(step: int, total: int, warmup_steps: int) -> float:
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return max(0.0, (total - step) / max(1, total - warmup_steps))


def loop_config(ft, seed: int) -> LoopConfig:
    """A task's resolved ``finetune`` section as the loop's settings for one seed."""
    if isinstance(ft.lr, list) or isinstance(ft.epochs, list):
        raise ValueError(f"a grid (lr {ft.lr}, epochs {ft.epochs}) is searched point by point: give one point")
    return LoopConfig(lr=ft.lr, epochs=ft.epochs, batch_size=ft.batch_size, warmup=ft.warmup,
                      weight_decay=ft.weight_decay, selection=ft.selection, checkpoint_every=ft.checkpoint_every,
                      seed=seed, warmup_steps=ft.warmup_steps)


def optimiser(model, cfg: LoopConfig, total: int):
    """AdamW without decay on biases and LayerNorms (as XTREME's run_*.py), and its
    linear warmup-then-decay schedule over ``total`` steps."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, eps=1e-8,
                            fused=True)  # one kernel per step, as pretraining (models/training/optim.py), HF Trainer
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: schedule(s, total, cfg.rising(total)))


class Stepper:
    """One process's optimiser steps and resumable state (the in-process path);
    :class:`xylent.tasks.evaluate.finetune.distributed.DeepSpeedStepper` is the same for ranks."""

    rank, world = 0, 1

    def __init__(self, model: TaskModel, cfg: LoopConfig, total: int):
        self.model = model
        self.opt, self.sched = optimiser(model, cfg, total)

    def forward(self, batch: dict) -> torch.Tensor:
        with _autocast(next(self.model.parameters()).device):
            logits = self.model(batch["ids"], batch["mask"])
        return self.model.loss(logits, batch)

    def step(self, loss: torch.Tensor) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.sched.step()

    def save(self, ckdir: Path, progress: dict) -> None:
        _save({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                      "scheduler": self.sched.state_dict(), "rng": torch.get_rng_state(),
                      # dropout on a GPU draws from CUDA's generators, not the CPU's
                      "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                      "progress": json.dumps(progress)}, ckdir / STATE)

    def load(self, ckdir: Path) -> dict | None:
        if not (ckdir / STATE).is_file():
            return None
        saved = torch.load(ckdir / STATE, map_location="cpu", weights_only=True)
        self.model.load_state_dict(saved["model"])
        self.opt.load_state_dict(saved["optimizer"])
        self.sched.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["rng"])
        if saved.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(saved["cuda_rng"])
        return json.loads(saved["progress"])


def optimiser_steps(n_features: int, cfg: LoopConfig, world: int = 1) -> tuple[int, int]:
    """(steps per epoch, steps in all).  On several ranks a last batch too small
    to give every rank an example is left out (another one each epoch: the order
    is reshuffled), since every rank must take part in each step."""
    per_epoch = math.ceil(n_features / cfg.batch_size)
    if world > 1 and 0 < n_features % cfg.batch_size < world:
        per_epoch -= 1
    return per_epoch, per_epoch * cfg.epochs


def train(model: TaskModel, features: list[Feature], dev_score: Callable[[TaskModel], float], cfg: LoopConfig,
          ckdir: Path, pad_id: int, log: Callable[[str], None] = lambda s: None,
          stepper: Stepper | None = None) -> dict:
    """Fine-tune ``model`` in place and leave it holding the selected weights.
    With several ranks (``stepper.world``), each step's batch is the same global
    batch split across them; rank 0 scores dev and writes the selected weights.
    -> {"history": [{epoch, loss, dev}], "selected_epoch", "dev", "steps", "resumed_from"}."""
    ckdir.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    per_epoch, total = optimiser_steps(len(features), cfg, stepper.world if stepper else 1)
    torch.manual_seed(cfg.seed + 7919 * (stepper.rank if stepper else 0))  # each rank its own dropout stream
    stepper = stepper or Stepper(model, cfg, total)
    state = {"epoch": 0, "step_in_epoch": 0, "step": 0, "history": [], "best": None, "best_epoch": None,
             "epoch_loss": 0.0}
    resumed_from = None
    if (saved := stepper.load(ckdir)) is not None:
        state = saved
        resumed_from = state["step"]
        log(f"resumed at step {state['step']} of {total}")

    while state["epoch"] < cfg.epochs:
        model.train()
        order = torch.randperm(len(features), generator=torch.Generator().manual_seed(
            cfg.seed * 100_003 + state["epoch"])).tolist()
        for b in range(state["step_in_epoch"], per_epoch):
            batch = order[b * cfg.batch_size: (b + 1) * cfg.batch_size]
            mine = batch[stepper.rank::stepper.world]
            loss = stepper.forward(collate([features[i] for i in mine], pad_id, device))
            stepper.step(loss * batch_share(features, mine, batch, stepper.world))
            state["epoch_loss"] += loss.item()
            state["step"] += 1
            state["step_in_epoch"] = b + 1
            if state["step"] % cfg.checkpoint_every == 0 and b + 1 < per_epoch:
                stepper.save(ckdir, state)
        dev = dev_score(model) if stepper.rank == 0 else 0.0
        state["history"].append({"epoch": state["epoch"] + 1, "loss": state["epoch_loss"] / per_epoch, "dev": dev})
        log(f"epoch {state['epoch'] + 1}/{cfg.epochs}: loss {state['epoch_loss'] / per_epoch:.4f}, dev {dev:.2f}")
        before = state.get("best_file")
        if cfg.selection == "last" or state["best"] is None or dev > state["best"]:
            # named by epoch and recorded in the state saved next: a best file written by a run killed
            # before that save is never mistaken for the selected weights
            state["best"], state["best_epoch"] = dev, state["epoch"] + 1
            state["best_file"] = best_file(state["best_epoch"])
            if stepper.rank == 0:
                _save(model.state_dict(), ckdir / state["best_file"])
        state.update(epoch=state["epoch"] + 1, step_in_epoch=0, epoch_loss=0.0)
        stepper.save(ckdir, state)
        if stepper.rank == 0 and before and before != state["best_file"]:
            (ckdir / before).unlink(missing_ok=True)
    if stepper.rank == 0:
        model.load_state_dict(torch.load(ckdir / state["best_file"], map_location="cpu", weights_only=True))
    return {"history": state["history"], "selected_epoch": state["best_epoch"], "dev": state["best"],
            "steps": state["step"], "resumed_from": resumed_from, "best_file": state["best_file"]}


def best_file(epoch: int) -> str:
    return f"best-epoch{epoch}.pt"


def batch_share(features: list[Feature], mine: list[int], batch: list[int], world: int) -> float:
    """This rank's weight in a step: DeepSpeed averages the ranks' losses equally,
    so a rank's mean loss is scaled by its share of the step's examples (tagging:
    of its labelled tokens) times the ranks; the sum then is the global batch's mean."""
    if world == 1:
        return 1.0

    def units(idx: list[int]) -> int:
        return sum(sum(t != IGNORE for t in features[i].target["labels"]) if "labels" in features[i].target
                   else 1 for i in idx)
    total = units(batch)
    return units(mine) * world / total if total else 0.0


def _save(obj, path: Path) -> None:
    write_atomic(path, lambda tmp: torch.save(obj, tmp))
