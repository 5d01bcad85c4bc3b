"""Fine-tuning on several ranks, launched as pretrain's are.

``finetune.launcher: deepspeed`` runs each seed's training as
``deepspeed --num_gpus N --module xylent.tasks.evaluate.finetune.distributed --config job.json``
(``xylent.launch``: on local CPU ranks started directly; the same log streaming,
death messages and orphan protection as pretrain).  Each rank takes its slice of every global batch;
DeepSpeed averages the gradients, clips at 1.0, steps AdamW (ZeRO stage
``finetune.zero_stage``, bf16 on GPUs) and saves resumable checkpoints
(``ds/``; the epoch position and every rank's RNG in its client state).  Rank 0
scores dev after each epoch and writes the selected weights to ``best.pt`` and
the training record to ``record.json``; the stage then predicts the test sets
in its own process with those weights, as the in-process path does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import torch

from xylent.models.training.rank import restore_rng, save_rng, watch_parent
from xylent.tasks.evaluate.finetune.train import LoopConfig, loop_config, optimiser, optimiser_steps
from xylent.atomic import write_json_atomic

RECORD = "record.json"
MODULE = "xylent.tasks.evaluate.finetune.distributed"


class DeepSpeedStepper:
    def __init__(self, model, cfg: LoopConfig, total: int, zero_stage: int, world: int):
        import deepspeed

        opt, sched = optimiser(model, cfg, total)
        config = {"train_batch_size": cfg.batch_size // world * world,
                  "train_micro_batch_size_per_gpu": cfg.batch_size // world, "gradient_accumulation_steps": 1,
                  "gradient_clipping": 1.0, "bf16": {"enabled": torch.cuda.is_available()},
                  "zero_optimization": {"stage": zero_stage}, "steps_per_print": 10**9}
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=config)
        self.model = model
        self.rank, self.world = self.engine.global_rank, self.engine.world_size

    def forward(self, batch: dict) -> torch.Tensor:
        return self.model.loss(self.engine(batch["ids"], batch["mask"]), batch)

    def step(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)
        self.engine.step()

    def save(self, ckdir: Path, progress: dict) -> None:
        tag = f"step{progress['step']}"
        save_rng(ckdir / f"rng-{tag}-rank{self.rank}.pt", torch.cuda.is_available())
        # DeepSpeed writes the tag's folder, then its `latest` pointer: a cut-short save is never loaded
        self.engine.save_checkpoint(str(ckdir / "ds"), tag=tag, client_state={"progress": json.dumps(progress),
                                                                            "world": self.world})
        # only the newest checkpoint is ever resumed from: older ones are dead weight (a base model's is GBs)
        for old in ckdir.glob(f"rng-step*-rank{self.rank}.pt"):
            if old.name != f"rng-{tag}-rank{self.rank}.pt":
                old.unlink(missing_ok=True)
        if self.rank == 0:
            for old in (ckdir / "ds").glob("step*"):
                if old.name != tag and old.is_dir():
                    shutil.rmtree(old, ignore_errors=True)

    def load(self, ckdir: Path) -> dict | None:
        if not (ckdir / "ds" / "latest").is_file():
            return None
        _, client = self.engine.load_checkpoint(str(ckdir / "ds"))
        if client.get("world") != self.world:
            raise RuntimeError(f"the checkpoint in {ckdir} was written by {client.get('world')} ranks, not "
                               f"{self.world}: fine-tune with the same finetune.ranks, or --force")
        progress = json.loads(client["progress"])
        restore_rng(ckdir / f"rng-step{progress['step']}-rank{self.rank}.pt", torch.cuda.is_available())
        print(f"xylent: resumed from {ckdir} at step {progress['step']}", flush=True)
        return progress


def job(task, data_dir: Path, model: dict, seed: int, ckdir: Path) -> Path:
    """Write what every rank needs to rebuild the same model and data -> job.json."""
    path = ckdir / "job.json"
    ckdir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"task": task.model_dump(mode="json"), "data_dir": str(data_dir), "model": model,
                             "seed": seed, "ckdir": str(ckdir)}, indent=2)
    return path


def train_on_ranks(task, data_dir: Path, model: dict, seed: int, ckdir: Path, log) -> dict:
    """Launch the ranks for one seed, wait, and return rank 0's training record."""
    from xylent.launch import deepspeed_command, launch

    ft = task.finetune
    cmd = deepspeed_command(job(task, data_dir, model, seed, ckdir), ranks=ft.ranks, master_port=ft.master_port,
                            module=MODULE)
    launch(cmd, ckdir / "train.log", on_line=lambda line: log(line.split("] ", 1)[-1]) if "epoch " in line else None,
           resume_hint=lambda: f"run it again: it resumes from the last checkpoint in {ckdir / 'ds'}",
           ranks=ft.ranks)
    return json.loads((ckdir / RECORD).read_text())


def main() -> None:
    import deepspeed

    from xylent.tasks.evaluate.encoders import load_ref
    from xylent.tasks.evaluate.finetune.encoders import task_model
    from xylent.tasks.evaluate.finetune.task import Runner, TaskData
    from xylent.tasks.evaluate.finetune.train import train
    from xylent.spec.evaluate import EvalTask

    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--local_rank", type=int, default=0)
    args = ap.parse_args()
    watch_parent()
    spec = json.loads(Path(args.config).read_text())
    cuda = torch.cuda.is_available()
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(args.local_rank)
    task = EvalTask(**spec["task"])
    ft, data = task.finetune, TaskData(task, Path(spec["data_dir"]))
    seed, ckdir = spec["seed"], Path(spec["ckdir"])
    model, tok = task_model(load_ref(spec["model"]), task.kind, max(1, len(data.labels)), seed)
    runner = Runner(data, tok)
    feats = runner.features(data.train, training=True)
    cfg = loop_config(ft, seed)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if ft.batch_size % world:
        raise SystemExit(f"finetune.batch_size {ft.batch_size} is not a multiple of the {world} ranks")
    stepper = DeepSpeedStepper(model, cfg, optimiser_steps(len(feats), cfg, world)[1], ft.zero_stage, world)

    record = train(model, feats, runner.dev_score, cfg, ckdir, tok.pad_id,
                   lambda msg: print(f"[rank{stepper.rank}] {msg}", flush=True) if stepper.rank == 0 else None,
                   stepper=stepper)
    if stepper.rank == 0:
        write_json_atomic(ckdir / RECORD, {**record, "train_features": len(feats), "world": stepper.world})


if __name__ == "__main__":
    main()
