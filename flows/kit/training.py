"""What every stage that trains on DeepSpeed ranks does around its ranks (pretrain and
the audit train, evaluate fine-tunes): its checkpoint folder outside the published
output, the launch as a Prefect task with a progress bar, and where remote ranks read
the shards.  The launch itself (processes, logs, death messages) is :mod:`xylent.launch`;
what the ranks run is :mod:`xylent.models.training.trainer` (and fine-tuning's rank program)."""

from __future__ import annotations

import re
import shutil
import threading
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from xylent.flows.kit.stage import StageContext
from xylent.flows.kit.progress import Progress
from xylent.models.training.run_config import TrainConfig
from xylent import interrupt

_STEP = re.compile(r"xylent: step (\d+)/(\d+)")


@task(name="train-ranks", cache_policy=NO_CACHE)
def train_ranks(cmd: list[str], log_file: str, steps: int, checkpoints: str, local_ranks: int | None,
                stage: str = "pretrain"):
    from prefect import get_run_logger

    from xylent.models.training.checkpoints import complete_checkpoints
    from xylent.launch import launch

    logger = get_run_logger()
    progress = Progress(f"{stage} steps", steps, unit="steps", key=f"{stage}-progress")
    seen = [0]

    def on_line(line: str) -> None:
        interrupt.check()  # the run was interrupted: raising here makes launch() stop the ranks
        if m := _STEP.search(line):
            n = int(m.group(1))
            progress.advance(n - seen[0])
            seen[0] = n
        if line.startswith("xylent:") or "Error" in line or "Traceback" in line:
            logger.info(line)

    def hint() -> str:
        done = complete_checkpoints(Path(checkpoints))
        at = f"from its checkpoint at step {int(done[-1].name.split('-')[1])}" if done else "from the start"
        return f"see the rank's traceback in the log; run the same command again to resume {at}"

    done = threading.Event()
    watcher = threading.Thread(target=_stop_ranks_when_asked, args=(done,), daemon=True)
    watcher.start()
    try:
        return launch(cmd, Path(log_file), on_line, hint, ranks=local_ranks)
    finally:
        done.set()
        progress.close()


def _stop_ranks_when_asked(done: threading.Event) -> None:
    """Between two output lines (a checkpoint save, a slow first batch) the thread reading a
    launch blocks; this one notices an interrupt within a second and stops the launches this
    process started (xylent.launch.stop_launched)."""
    from xylent.launch import stop_launched

    while not done.wait(1.0):
        if interrupt.requested():
            stop_launched()
            return


def checkpoint_dir(ctx: StageContext) -> Path:
    """``<ws>/<stage>/_checkpoints/<fingerprint>/``: outside the published output, so a rerun resumes."""
    ckdir = ctx.ws.stage_dir(ctx.stage) / "_checkpoints" / ctx.fingerprint
    if ctx.force and ckdir.exists():  # --force means train again from scratch, not resume
        shutil.rmtree(ckdir)
    ckdir.mkdir(parents=True, exist_ok=True)
    return ckdir


def run_training(ctx: StageContext, cfg: TrainConfig, ckdir: Path):
    """Write train.json, launch the ranks (pretrain.ranks / hostfile) and wait for them; (the launch's
    result, the damaged checkpoints set aside before it: the stage's warnings)."""
    from xylent.tasks.pretrain.train_json import check_resumable
    from xylent.launch import deepspeed_command, world_size

    p = ctx.spec.pretrain
    cfg.save(ckdir / "train.json")
    hostfile = str(ctx.spec.resolve_path(p.hostfile)) if p.hostfile else None
    cmd = deepspeed_command(ckdir / "train.json", ranks=p.ranks, hostfile=hostfile, master_port=p.master_port)
    # after the command: it checks the hostfile. What was set aside is the stage's warning (console, manifest, MLflow)
    set_aside = check_resumable(cfg, world_size(p.ranks, hostfile))
    return train_ranks.submit(cmd, str(ckdir / "train.log"), cfg.steps, cfg.checkpoint_dir,
                              None if hostfile else p.ranks, ctx.stage).result(), set_aside


def shards_source(ctx: StageContext) -> str | None:
    """Ranks on other nodes read the shards from the bucket of an object-store workspace;
    on one node they memory-map this machine's copy."""
    return ctx.ws.url_of(ctx.upstream["shards"]) if ctx.spec.pretrain.hostfile else None
