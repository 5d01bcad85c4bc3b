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

from flows.kit.stage import StageContext, StageOutcome, stage_flow
from flows.registry import STAGE_BY_NAME
from flows.kit.training import checkpoint_dir, run_training, shards_source


@stage_flow(STAGE_BY_NAME["pretrain"])
def pretrain(ctx: StageContext) -> StageOutcome:
    from tasks.pretrain import publish
    from tasks.pretrain.train_json import train_config
    from tasks.pretrain.init_source import REPORT_FILE, init_metrics, init_summary, prepare_init

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
