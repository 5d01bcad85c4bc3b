"""pretrain flow: shards + sampling tables + tokenizer -> DeepSpeed ZeRO training
of the XY-LENT/XLM-E model (or the MLM/TLM ablation) -> exported ``model/``.

Checkpoints live outside the atomically published output, in
``<ws>/pretrain/_checkpoints/<fingerprint>/``, so a killed or failed run is
resumed by running the same command again; the fingerprint leaves out how the
run is launched (ranks, hostfile, ports, logging), so a restart may use more or
fewer ranks.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.stage import Invocation, StageOutcome, markdown_table, run_stage_flow
from models.config import preset
from models.run_config import TrainConfig
from tasks.pretrain.launch import REPO, deepspeed_command, launch
from tasks.pretrain.plots import loss_curves
from xylent.errors import XylentError
from xylent.progress import Progress
from xylent.spec import DEFAULT_CLIP, DEFAULT_LR, Spec

_STEP = re.compile(r"xylent: step (\d+)/(\d+)")


def encoder_config(spec: Spec, vocab_size: int, seq_len: int):
    base = preset(spec.model.size)
    over = spec.model.overrides()
    over.setdefault("max_position", max(base.max_position, seq_len))
    if over["max_position"] < seq_len:
        raise XylentError(f"model.max_position ({over['max_position']}) is shorter than shards.seq_len ({seq_len})",
                          where="spec field model.max_position", fix="raise it to at least shards.seq_len")
    return preset(spec.model.size, vocab_size=vocab_size, **over)


def train_config(spec: Spec, upstream: dict[str, Path], ckdir: Path, run_id: str, tracking_uri: str) -> TrainConfig:
    p = spec.pretrain
    index = json.loads((upstream["shards"] / "index.json").read_text())
    for t in p.tasks:
        if not any(g["rows"] for g in index.get(t, {}).values()):
            raise XylentError(f"pretrain.tasks has {t!r} but the shards hold no {t.upper()} data",
                              where=str(upstream["shards"]), fix=f"drop {t!r} from pretrain.tasks or add sources")
    import sentencepiece as spm

    vocab_size = spm.SentencePieceProcessor(model_file=str(upstream["vocab"] / "spm.model")).get_piece_size()
    enc = encoder_config(spec, vocab_size, index["seq_len"])
    ds_cfg = Path(p.deepspeed_config) if p.deepspeed_config else REPO / "infra" / "deepspeed" / f"zero{p.zero_stage}.json"
    if p.deepspeed_config and not ds_cfg.is_absolute():
        ds_cfg = Path(spec.resolve_path(p.deepspeed_config))
    if not ds_cfg.exists():
        raise XylentError("DeepSpeed config not found", where=str(ds_cfg),
                          fix="point pretrain.deepspeed_config at a JSON file, or leave it unset")
    return TrainConfig(
        shards_dir=str(upstream["shards"]), sampling_dir=str(upstream["sampling"]),
        checkpoint_dir=str(ckdir / "deepspeed"), metrics_file=str(ckdir / "metrics.jsonl"),
        deepspeed_config=str(ds_cfg), model=enc.to_dict(), objective=p.objective, tasks=list(p.tasks),
        task_schedule=p.task_schedule, trtd_ratio=p.trtd_ratio, steps=p.steps, batch_size=p.batch_size,
        trtd_max_tokens=p.trtd_max_tokens, grad_accum=p.grad_accum, lr=p.lr or DEFAULT_LR[spec.model.size],
        warmup_steps=p.warmup_steps, betas=tuple(p.betas), eps=p.eps, weight_decay=p.weight_decay,
        clip=p.clip or DEFAULT_CLIP[spec.model.size], disc_weight=p.disc_weight, mask_prob=p.mask_prob,
        zero_stage=p.zero_stage, precision=p.precision, checkpoint_every=p.checkpoint_every,
        keep_checkpoints=p.keep_checkpoints, seed=spec.seed, log_every=p.log_every,
        mlflow_tracking_uri=tracking_uri, mlflow_run_id=run_id, system_metrics=p.system_metrics,
        peak_tflops=p.peak_tflops)


@task(name="train-ranks", cache_policy=NO_CACHE)
def train_ranks(cmd: list[str], log_file: str, steps: int, checkpoints: str, local_ranks: int | None):
    from prefect import get_run_logger

    from models.trainer import complete_checkpoints

    logger = get_run_logger()
    progress = Progress("pretrain steps", steps, unit="steps", key="pretrain-progress")
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


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _summary_metrics(rows: list[dict], n_params: int, enc_params: int) -> dict[str, float]:
    out = {"steps": float(rows[-1]["step"]), "parameters": float(n_params), "encoder_parameters": float(enc_params),
           "tokens_total": float(sum(r["tokens"] for r in rows)),
           "tokens_per_second_median": float(np.median([r["tokens_per_second"] for r in rows]))}
    keys = sorted({k for r in rows for k in r if "/" in k})
    for k in keys:
        vals = [r[k] for r in rows if k in r]
        w = max(1, min(20, len(vals) // 5))
        out[f"first.{k}"] = float(np.mean(vals[:w]))
        out[f"final.{k}"] = float(np.mean(vals[-w:]))
    if any("mfu" in r for r in rows):
        out["mfu_median"] = float(np.median([r["mfu"] for r in rows if "mfu" in r]))
    return out


def register_model(tracker, run_id: str, model_dir: Path, name: str, scratch: Path) -> tuple[str, int]:
    """Log the exported model to the stage's MLflow run (a pyfunc: texts -> embeddings) and
    register it; returns (model URI, registered version).

    Everything goes through the tracker's client with the run id: MLflow's fluent API
    (set_tracking_uri, start_run, log_model) is process-global and would redirect every
    later run of this process to this store."""
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    from models.serving import EncoderPyfunc

    local = scratch / "mlflow-model"
    mlflow.pyfunc.save_model(path=str(local), python_model=EncoderPyfunc(), artifacts={"model": str(model_dir)},
                             code_paths=[str(REPO / "models")],
                             pip_requirements=["torch", "sentencepiece", "safetensors"])
    client = tracker.client
    client.log_artifacts(run_id, str(local), "model")
    shutil.rmtree(local, ignore_errors=True)
    try:
        client.create_registered_model(name, description="xylent encoders (embeddings + discriminator)")
    except MlflowException as exc:
        if "already exists" not in str(exc).lower() and "RESOURCE_ALREADY_EXISTS" not in str(exc):
            raise
    source = f"{client.get_run(run_id).info.artifact_uri}/model"
    version = client.create_model_version(name, source, run_id=run_id)
    return f"models:/{name}/{version.version}", int(version.version)


def _body(inv: Invocation, force: bool):
    spec, p = inv.spec, inv.spec.pretrain

    def body(tmp: Path, upstream: dict, run_id: str) -> StageOutcome:
        ckdir = inv.ws.stage_dir("pretrain") / "_checkpoints" / inv.fingerprints["pretrain"]
        if force and ckdir.exists():  # --force means train again from scratch, not resume
            shutil.rmtree(ckdir)
        ckdir.mkdir(parents=True, exist_ok=True)
        cfg = train_config(spec, upstream, ckdir, run_id, inv.tracker.uri)
        cfg.save(ckdir / "train.json")
        hostfile = str(spec.resolve_path(p.hostfile)) if p.hostfile else None
        cmd = deepspeed_command(ckdir / "train.json", ranks=p.ranks, hostfile=hostfile, master_port=p.master_port)
        result = train_ranks.submit(cmd, str(ckdir / "train.log"), p.steps, cfg.checkpoint_dir,
                                    None if hostfile else p.ranks).result()

        rows = read_metrics(Path(cfg.metrics_file))
        if result.resumed_from_step:  # the steps a killed run did: into this run too, so its charts are whole
            earlier = [_metric(k, v, r["step"]) for r in rows if r["step"] <= result.resumed_from_step
                       for k, v in r.items() if k != "step"]
            for i in range(0, len(earlier), 1000):  # MLflow's batch limit
                inv.tracker.client.log_batch(run_id, metrics=earlier[i: i + 1000])
        full, enc_state, enc_cfg, n_params = _consolidate(cfg)
        from models.pretrained import export

        name = p.register_name or f"xylent-{spec.name}"
        export(tmp / "model", full, enc_state, enc_cfg, upstream["vocab"], {
            "objective": p.objective, "steps": p.steps, "fingerprint": inv.fingerprints["pretrain"],
            "seq_len": json.loads((upstream["shards"] / "index.json").read_text())["seq_len"],
            "registered_model": name})
        for f in ("train.json", "metrics.jsonl", "train.log"):
            shutil.copy2(ckdir / f, tmp / f)
        loss_curves(rows, tmp / "loss_curves.png")
        model_uri, version = register_model(inv.tracker, run_id, tmp / "model", name, ckdir)
        metrics = _summary_metrics(rows, n_params, sum(v.numel() for v in enc_state.values()))
        summary = _summary(metrics, p, enc_cfg, f"{name} v{version}", model_uri, result.resumed_from_step)
        (tmp / "report.md").write_text(summary)
        table = [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items()} for r in rows[-200:]]
        return StageOutcome(metrics=metrics, table=table, summary=summary,
                            manifest={"checkpoints": str(ckdir), "registered_model": name, "model_uri": model_uri,
                                      "registered_version": version,
                                      "resumed_from_step": result.resumed_from_step})

    return body


def _metric(k, v, step):
    import time

    from mlflow.entities import Metric

    return Metric(k, float(v), int(time.time() * 1000), int(step))


def _consolidate(cfg: TrainConfig):
    from models.config import EncoderConfig
    from models.electra import build_model
    from models.pretrained import consolidate
    from models.trainer import complete_checkpoints

    last = complete_checkpoints(Path(cfg.checkpoint_dir))[-1]
    full = consolidate(Path(cfg.checkpoint_dir), last.name)
    enc_cfg = EncoderConfig(**cfg.model)
    model = build_model(cfg.objective, enc_cfg, cfg.disc_weight, cfg.mask_prob)
    model.load_state_dict(full, strict=True)  # proves the checkpoint is the whole model
    return full, model.encoder_state_dict(), enc_cfg, sum(v.numel() for v in full.values())


def _summary(m: dict, p, enc, name: str, uri: str, resumed: int) -> str:
    rows = []
    for t in ("mrtd", "trtd"):
        for k in ("generator_loss", "discriminator_loss", "generator_accuracy", "discriminator_precision",
                  "discriminator_recall"):
            if f"first.{t}/{k}" in m:
                rows.append({"task": t, "metric": k, "first steps": m[f"first.{t}/{k}"],
                             "last steps": m[f"final.{t}/{k}"]})
    lines = [f"**{p.objective}** on {', '.join(t.upper() for t in p.tasks)} ({p.task_schedule}), "
             f"{int(m['steps'])} steps, ZeRO-{p.zero_stage}, {p.ranks} local rank(s).",
             f"Model: {enc.layers}×{enc.hidden} (generator {enc.generator_layers} layers), vocab {enc.vocab_size:,}, "
             f"{int(m['parameters']):,} parameters ({int(m['encoder_parameters']):,} in the exported encoder).",
             f"Throughput: median {m['tokens_per_second_median']:,.0f} tokens/s" +
             (f", MFU {m['mfu_median']:.1%}" if "mfu_median" in m else "") + ".",
             f"Registered in MLflow as **{name}** ({uri})." + (f" Resumed at step {resumed}." if resumed else ""),
             "", markdown_table(rows)]
    return "\n".join(lines)


@flow(name="pretrain", log_prints=True)
def pretrain(spec_file: str, workspace: str | None = None, overrides: list[str] | None = None,
             force: bool = False, mlflow_parent_run_id: str | None = None):
    """ELECTRA (MRTD + TRTD) or MLM/TLM pretraining under DeepSpeed ZeRO; exports and registers the encoder."""
    inv = Invocation.open(spec_file, workspace, overrides, mlflow_parent_run_id, "pretrain")
    return run_stage_flow(inv, "pretrain", force, _body(inv, force))
