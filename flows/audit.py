"""audit flow: train under a χ² DRO adversary over the TRTD language pairs
(XY-LENT §6.6, iterated best response), rank the pairs by how the adversary
re-weights them (w = q/Q) and hand over the evidence for the flagged ones.

Like pretrain, checkpoints live outside the published output
(``<ws>/audit/_checkpoints/<fingerprint>/``): a killed run resumes, with the
same q trajectory, when the same command runs again.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from xylent.flows.kit.stage import StageContext, StageOutcome, stage_flow
from xylent.flows.kit.training import checkpoint_dir, run_training, shards_source
from xylent.flows.registry import STAGE_BY_NAME


@task(name="audit-evidence", cache_policy=NO_CACHE)
def evidence_task(dedup_dir, pairs, spec):
    from xylent.tasks.audit import run

    return run.evidence(spec, dedup_dir, pairs)


@stage_flow(STAGE_BY_NAME["audit"])
def audit(ctx: StageContext) -> StageOutcome:
    from xylent.tasks.audit import run

    ckdir = checkpoint_dir(ctx)
    cfg = run.configure(ctx.spec, ctx.upstream, ckdir, ctx.run_id, ctx.tracker.uri, shards_source(ctx))
    result, set_aside = run_training(ctx, cfg, ckdir)
    resumed = result.resumed_from_step
    state, done = run.export(ctx.spec, cfg, resumed, ckdir, ctx.upstream, ctx.out, ctx.tracker, ctx.run_id,
                             ctx.fingerprint)
    evidence = evidence_task.submit(ctx.upstream["dedup"], state["pairs"], ctx.spec).result()
    outcome = run.assemble(state, evidence, done, ctx.spec, resumed, ckdir, ctx.upstream, ctx.out)
    outcome.warnings[:0] = set_aside
    return outcome
