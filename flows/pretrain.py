"""pretrain flow: shards + sampling tables + tokenizer -> DeepSpeed ZeRO training
of the XY-LENT/XLM-E model (or the MLM/TLM ablation) -> exported ``model/``.

Checkpoints live outside the atomically published output, in
``<ws>/pretrain/_checkpoints/<fingerprint>/``, so a killed or failed run is
resumed by running the same command again; the fingerprint leaves out how the
run is launched (ranks, hostfile, ports, logging). A ZeRO 1-3 checkpoint resumes
on the world size that saved it (another is refused up front); ZeRO-0 on any.

The stage's code (torch, DeepSpeed) is imported inside the body: a cached pretrain
needs only the flow.
"""

from __future__ import annotations

from xylent.flows.kit.stage import StageContext, StageOutcome, stage_flow
from xylent.flows.registry import STAGE_BY_NAME
from xylent.flows.kit.training import checkpoint_dir, run_training, shards_source


@stage_flow(STAGE_BY_NAME["pretrain"])
def pretrain(ctx: StageContext) -> StageOutcome:
    from xylent.tasks.pretrain import run

    ckdir = checkpoint_dir(ctx)
    cfg, init = run.configure(ctx.spec, ctx.ws, ctx.upstream, ckdir, ctx.run_id, ctx.tracker.uri, shards_source(ctx))
    result, set_aside = run_training(ctx, cfg, ckdir)
    outcome = run.publish(ctx.spec, cfg, init, result.resumed_from_step, ckdir, ctx.upstream, ctx.out, ctx.tracker,
                          ctx.run_id, ctx.fingerprint)
    outcome.warnings[:0] = set_aside
    return outcome
