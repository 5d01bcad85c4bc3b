"""evaluate flow: every encoder of ``evaluate.models`` on every task of
``evaluate.tasks``, side by side -> scores.json, scorecard.md, plots,
predictions in XTREME's submission layout; one nested MLflow run per model.

The stage's code (torch, faiss, scikit-learn) is imported inside the task and the
body: a cached evaluate needs only the flow."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from xylent.flows.kit.stage import StageContext, StageOutcome, stage_flow
from xylent.flows.kit.training import checkpoint_dir
from xylent.flows.kit.progress import Progress
from xylent.flows.registry import STAGE_BY_NAME


def _model_dir(model, spec, pipeline_dir: Path) -> tuple[str, Path]:
    if isinstance(model, str):
        return ("subwords" if model == "bag-of-subwords" else "xylent"), pipeline_dir
    return model.kind, spec.resolve_path(model.path)


def model_ref(model, name: str, spec, pipeline_dir: Path) -> dict:
    """The model as plain data: what this process and fine-tuning ranks in others load it from."""
    if model in ("random-init", "bag-of-subwords"):
        return {"kind": model, "name": name, "path": str(pipeline_dir), "seed": spec.evaluate.random_init_seed}
    if isinstance(model, str):
        return {"kind": "xylent", "name": name, "path": str(pipeline_dir)}
    return {"kind": model.kind, "name": name, "path": str(spec.resolve_path(model.path)),
            "trust_remote_code": model.trust_remote_code}


def load_encoder(model, spec, pipeline_dir: Path):
    from xylent.tasks.evaluate.run import load_ref

    name = model if isinstance(model, str) else model.name
    return load_ref(model_ref(model, name, spec, pipeline_dir))


@task(name="evaluate-model", task_run_name="evaluate {name}", cache_policy=NO_CACHE)
def evaluate_model_task(name: str, model, spec, pipeline_dir: Path, data_dirs: dict, preds: Path, progress,
                        finetune_data: dict, checkpoints: Path, labels: Path):
    from xylent.tasks.evaluate.run import FineTuning, evaluate_model

    enc = load_encoder(model, spec, pipeline_dir)
    cfg = spec.evaluate
    logger = get_run_logger()
    ft = FineTuning(load=lambda: load_encoder(model, spec, pipeline_dir), data=finetune_data,
                    checkpoints=checkpoints / name, labels=labels, log=logger.info,
                    model_ref=model_ref(model, name, spec, pipeline_dir))
    return evaluate_model(enc, cfg.tasks, data_dirs, preds, batch_size=cfg.batch_size, max_length=cfg.max_length,
                          on_batch=progress.advance, finetuning=ft)


@task(name="evaluate-snapshot", task_run_name="evaluate the snapshot at {tokens} tokens", cache_policy=NO_CACHE)
def evaluate_snapshot_task(tokens: int, path: Path, spec, data_dirs: dict, preds: Path):
    """A pretraining snapshot (xylent.tasks.evaluate.curve) on the retrieval tasks."""
    from xylent.tasks.evaluate.run import CURVE_KINDS, evaluate_model, load_ref

    cfg = spec.evaluate
    enc = load_ref({"kind": "xylent", "name": f"pipeline at {tokens} tokens", "path": str(path)})
    return evaluate_model(enc, [t for t in cfg.tasks if t.kind in CURVE_KINDS], data_dirs, preds,
                          batch_size=cfg.batch_size, max_length=cfg.max_length)


def _learning_curve(ctx: StageContext, scores: dict, data_dirs: dict) -> None:
    """scores["curve"] and its MLflow series, when pretraining left snapshots and a retrieval task reads them."""
    from xylent.tasks.evaluate import run

    snaps = run.snapshots(ctx.upstream["pretrain"])
    if not (snaps and "pipeline" in scores["models"] and any(t.kind in run.CURVE_KINDS
                                                             for t in ctx.spec.evaluate.tasks)):
        return
    points = [(info, evaluate_snapshot_task.submit(info["tokens"], path, ctx.spec, data_dirs,
                                                   ctx.out / "curve" / path.name).result()) for info, path in snaps]
    scores["curve"] = run.learning_curve(points, run.final_point(ctx.upstream["pretrain"]), scores["models"])
    for tokens, metrics in run.mlflow_series(scores["curve"]):
        ctx.tracker.log_metrics(ctx.run_id, metrics, step=tokens)


def _model_params(model) -> dict:
    if isinstance(model, str):
        return {"model": model, "kind": {"pipeline": "xylent"}.get(model, model)}
    return {"model": model.name, "kind": model.kind, "path": model.path}


def _tag_registered_version(ctx: StageContext, tags: dict[str, str]) -> list[str]:
    """The encoder's registered versions (pretrain's manifest names the first) carry its headline evaluation;
    a version this store cannot tag (deleted, another server) is a warning, not a lost evaluation."""
    from mlflow.exceptions import MlflowException

    pre = ctx.ws.manifest(ctx.upstream["pretrain"]) or {}
    if pre.get("registered_model") is None:
        return []
    name, version = pre["registered_model"], str(pre["registered_version"])
    try:
        tag_registrations(ctx.tracker.client, name, version, tags)
    except MlflowException as exc:
        return [f"the registered encoder {name} v{version} was not tagged with its evaluation: {exc.message}"]
    return []


def tag_registrations(client, name: str, version: str, tags: dict[str, str]) -> list[tuple[str, str]]:
    """Tag version ``version`` of ``name`` and every other registration of the same model (a cached
    pretrain registered again under a new pretrain.register_name: same run, same source); returns
    the (name, version)s tagged."""
    first = client.get_model_version(name, version)
    same = [(v.name, str(v.version)) for v in client.search_model_versions(f"run_id = '{first.run_id}'")
            if v.source == first.source and (v.name, str(v.version)) != (name, version)] if first.run_id else []
    for n, v in [(name, version), *same]:
        for key, value in tags.items():
            client.set_model_version_tag(n, v, key, value)
    return [(name, version), *same]


@stage_flow(STAGE_BY_NAME["evaluate"])
def evaluate(ctx: StageContext) -> StageOutcome:
    from xylent.tasks.evaluate import run
    from xylent.tasks.pretrain.contract import MODEL_DIR

    cfg, tracker = ctx.spec.evaluate, ctx.tracker
    cache = ctx.ws.stage_dir("evaluate") / "_cache"  # fetched archives outlive a failed run
    inputs = run.read_tasks(ctx.spec, ctx.upstream, ctx.out / "data", cache)
    warnings = list(inputs.warnings)
    checkpoints = checkpoint_dir(ctx) if inputs.finetune_data else ctx.out / "_unused"
    scores = run.new_scores(ctx.spec, inputs.data_dirs)
    pipeline_dir = ctx.upstream["pretrain"] / MODEL_DIR
    run.check_layers({n: _model_dir(m, ctx.spec, pipeline_dir) for m, n in zip(cfg.models, cfg.model_names())},
                     cfg.tasks)  # a bad path or layer stops the stage before the first model runs
    progress = Progress("evaluate: sentences embedded", inputs.sentences_per_model * len(cfg.models) or None,
                        unit="sentences", key="evaluate-progress")
    try:
        for model, name in zip(cfg.models, cfg.model_names()):
            run_id = tracker.start_run(f"evaluate: {name}", parent_run_id=ctx.run_id, params=_model_params(model),
                                       tags={"xylent.stage": "evaluate", "xylent.model": name})
            try:
                result = evaluate_model_task.submit(name, model, ctx.spec, pipeline_dir, inputs.data_dirs,
                                                    ctx.out / "predictions" / name, progress,
                                                    inputs.finetune_data, checkpoints, ctx.out / "labels").result()
            except BaseException:
                tracker.end_run(run_id, "FAILED")
                raise
            tracker.log_metrics(run_id, run.mlflow_metrics(result))
            tracker.end_run(run_id)
            scores["models"][name] = result
    finally:
        progress.close()
    _learning_curve(ctx, scores, inputs.data_dirs)
    results = run.write_results(ctx.out, scores)
    if "pipeline" in scores["models"]:
        warnings += _tag_registered_version(ctx, {**run.headline_tags(scores), "eval.output": ctx.fingerprint})
    return StageOutcome(metrics=results.metrics, table=results.table, summary=results.summary, warnings=warnings,
                        manifest={"models": cfg.model_names(), "tasks": list(scores["tasks"])})
