"""audit flow: train under a χ² DRO adversary over the TRTD language pairs
(XY-LENT §6.6, iterated best response), rank the pairs by how the adversary
re-weights them (w = q/Q) and hand over the evidence for the flagged ones.

Like pretrain, checkpoints live outside the published output
(``<ws>/audit/_checkpoints/<fingerprint>/``): a killed run resumes, with the
same q trajectory, when the same command runs again.
"""

from __future__ import annotations

import json
import shutil

from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.kit.stage import StageContext, StageOutcome, stage_flow
from flows.kit.training import checkpoint_dir, run_training, shards_source
from flows.registry import STAGE_BY_NAME


@task(name="audit-evidence", cache_policy=NO_CACHE)
def evidence_task(dedup_dir, pairs, spec):
    from tasks.audit.evidence import pair_evidence

    return pair_evidence(dedup_dir, pairs, hub_min_sources=spec.dedup.hub_min_partners,
                         max_length_ratio=spec.dedup.max_length_ratio)


@stage_flow(STAGE_BY_NAME["audit"])
def audit(ctx: StageContext) -> StageOutcome:
    from models.adversary import STATE_FILE
    from tasks.audit.report import write_output
    from tasks.pretrain import publish
    from tasks.audit.train_config import audit_train_config

    spec, p, tracker = ctx.spec, ctx.spec.pretrain, ctx.tracker
    ckdir = checkpoint_dir(ctx)
    cfg = audit_train_config(spec, ctx.upstream, ckdir, ctx.run_id, tracker.uri,
                             shards_source=shards_source(ctx))
    result = run_training(ctx, cfg, ckdir)

    name = f"{p.register_name or f'xylent-{spec.name}'}-audit"
    rows, enc_state, enc_cfg, n_params = publish.export_run(cfg, ckdir, ctx.upstream, ctx.out, {
        "objective": p.objective, "steps": cfg.steps, "fingerprint": ctx.fingerprint, "registered_model": name,
        "audit": spec.audit.model_dump(mode="json")})
    if result.resumed_from_step:
        publish.backfill(tracker.client, ctx.run_id, rows, result.resumed_from_step)
    model_uri, version = publish.register_model(tracker, ctx.run_id, ctx.out / publish.MODEL_DIR, name, ckdir)
    state = json.loads((ckdir / STATE_FILE).read_text())
    shutil.copy2(ckdir / STATE_FILE, ctx.out / STATE_FILE)
    evidence = evidence_task.submit(ctx.upstream["dedup"], state["pairs"], spec).result()
    train_metrics = publish.summary_metrics(rows, n_params, sum(v.numel() for v in enc_state.values()))
    outcome = write_output(state, evidence, ctx.upstream["dedup"], spec, train_metrics, ctx.out)
    outcome.manifest.update({"checkpoints": str(ckdir), "registered_model": name, "model_uri": model_uri,
                             "registered_version": version, "resumed_from_step": result.resumed_from_step})
    return outcome
