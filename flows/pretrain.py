"""pretrain flow: shards + sampling tables + tokenizer -> DeepSpeed ZeRO training
of the XY-LENT/XLM-E model (or the MLM/TLM ablation) -> exported ``model/``.

Checkpoints live outside the atomically published output, in
``<ws>/pretrain/_checkpoints/<fingerprint>/``, so a killed or failed run is
resumed by running the same command again; the fingerprint leaves out how the
run is launched (ranks, hostfile, ports, logging). A ZeRO 1-3 checkpoint resumes
on the world size that saved it (another is refused up front); ZeRO-0 on any.

The stage's code (torch, DeepSpeed) is imported inside the tasks and the body: a
cached pretrain needs only the flow.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.kit import StageContext, StageOutcome, stage_flow
from flows.progress import Progress
from flows.registry import STAGE_BY_NAME
from models.run_config import TrainConfig

_STEP = re.compile(r"xylent: step (\d+)/(\d+)")


@task(name="train-ranks", cache_policy=NO_CACHE)
def train_ranks(cmd: list[str], log_file: str, steps: int, checkpoints: str, local_ranks: int | None,
                stage: str = "pretrain"):
    from prefect import get_run_logger

    from models.trainer import complete_checkpoints
    from tasks.pretrain.launch import launch

    logger = get_run_logger()
    progress = Progress(f"{stage} steps", steps, unit="steps", key=f"{stage}-progress")
    seen = [0]

    def on_line(line: str) -> None:
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

    try:
        return launch(cmd, Path(log_file), on_line, hint, ranks=local_ranks)
    finally:
        progress.close()


def checkpoint_dir(ctx: StageContext) -> Path:
    """``<ws>/<stage>/_checkpoints/<fingerprint>/``: outside the published output, so a rerun resumes."""
    ckdir = ctx.ws.stage_dir(ctx.stage) / "_checkpoints" / ctx.fingerprint
    if ctx.force and ckdir.exists():  # --force means train again from scratch, not resume
        shutil.rmtree(ckdir)
    ckdir.mkdir(parents=True, exist_ok=True)
    return ckdir


def run_training(ctx: StageContext, cfg: TrainConfig, ckdir: Path):
    """Write train.json, launch the ranks (pretrain.ranks / hostfile) and wait for them."""
    from tasks.pretrain.config import check_resumable
    from tasks.pretrain.launch import deepspeed_command, world_size

    p = ctx.spec.pretrain
    cfg.save(ckdir / "train.json")
    hostfile = str(ctx.spec.resolve_path(p.hostfile)) if p.hostfile else None
    cmd = deepspeed_command(ckdir / "train.json", ranks=p.ranks, hostfile=hostfile, master_port=p.master_port)
    check_resumable(cfg, world_size(p.ranks, hostfile))  # after the command: it checks the hostfile exists
    return train_ranks.submit(cmd, str(ckdir / "train.log"), cfg.steps, cfg.checkpoint_dir,
                              None if hostfile else p.ranks, ctx.stage).result()


@stage_flow(STAGE_BY_NAME["pretrain"])
def pretrain(ctx: StageContext) -> StageOutcome:
    from tasks.pretrain import publish
    from tasks.pretrain.config import train_config
    from tasks.pretrain.init import REPORT_FILE, init_metrics, init_summary, prepare_init

    spec, p, tracker = ctx.spec, ctx.spec.pretrain, ctx.tracker
    ckdir = checkpoint_dir(ctx)
    cfg = train_config(spec, ctx.upstream, ckdir, ctx.run_id, tracker.uri,
                       shards_source=shards_source(ctx))
    init = prepare_init(spec, ctx.ws, cfg, ctx.upstream, ckdir) if p.init is not None else None  # before training
    result = run_training(ctx, cfg, ckdir)

    name = p.register_name or f"xylent-{spec.name}"
    rows, enc_state, enc_cfg, n_params = publish.export_run(cfg, ckdir, ctx.upstream, ctx.out, {
        "objective": p.objective, "steps": p.steps, "fingerprint": ctx.fingerprint, "registered_model": name,
        **({"init": init["source"]} if init else {})})
    if result.resumed_from_step:
        publish.backfill(tracker.client, ctx.run_id, rows, result.resumed_from_step)
    model_uri, version = publish.register_model(tracker, ctx.run_id, ctx.out / publish.MODEL_DIR, name, ckdir,
                                                step=p.steps)
    metrics = publish.summary_metrics(rows, n_params, sum(v.numel() for v in enc_state.values()))
    summary = publish.summary(metrics, p, cfg, enc_cfg, f"{name} v{version}", model_uri, result.resumed_from_step)
    if init:
        (ctx.out / REPORT_FILE).write_text(json.dumps(init, indent=1, ensure_ascii=False))
        tracker.log_artifact(ctx.run_id, ctx.out / REPORT_FILE)
        metrics.update(init_metrics(init))
        summary += "\n\n" + init_summary(init)
    (ctx.out / "report.md").write_text(summary)
    table = [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items()} for r in rows[-200:]]
    return StageOutcome(metrics=metrics, table=table, summary=summary,
                        manifest={"checkpoints": str(ckdir), "registered_model": name, "model_uri": model_uri,
                                  "registered_version": version, "resumed_from_step": result.resumed_from_step})


def shards_source(ctx: StageContext) -> str | None:
    """Ranks on other nodes read the shards from the bucket of an object-store workspace;
    on one node they memory-map this machine's copy."""
    return ctx.ws.url_of(ctx.upstream["shards"]) if ctx.spec.pretrain.hostfile else None
