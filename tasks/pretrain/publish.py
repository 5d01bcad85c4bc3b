"""After training: the pretrain stage's output (its layout: :mod:`xylent.tasks.pretrain.contract`), and
the MLflow model (a pyfunc: texts -> embeddings) registered under the spec's name."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from xylent.models.training.run_config import TrainConfig
from xylent.errors import XylentError
from xylent.markdown import markdown_table
from xylent.redact import redact_text

from xylent.tasks.pretrain.contract import HEALTH_FILE, MODEL_DIR, RUN_FILES, SNAPSHOTS_DIR, read_metrics
from xylent.tasks.pretrain.plots import loss_curves
from xylent.data.shards import read_index

if TYPE_CHECKING:
    from xylent.spec import Spec


def model_name(spec: Spec) -> str:
    """The MLflow registered model of the spec's pretrain output (the audit's: this + ``-audit``)."""
    return spec.pretrain.register_name or f"xylent-{spec.name}"


def summary_metrics(rows: list[dict], n_params: int, enc_params: int) -> dict[str, float]:
    out = {"steps": float(rows[-1]["step"]), "parameters": float(n_params), "encoder_parameters": float(enc_params),
           "tokens_total": float(sum(r["tokens"] for r in rows)),
           "tokens_per_second_median": float(np.median([r["tokens_per_second"] for r in rows]))}
    for k in sorted({k for r in rows for k in r if "/" in k}):
        vals = [r[k] for r in rows if k in r]
        w = max(1, min(20, len(vals) // 5))
        out[f"first.{k}"] = float(np.mean(vals[:w]))
        out[f"final.{k}"] = float(np.mean(vals[-w:]))
    if any("mfu" in r for r in rows):
        out["mfu_median"] = float(np.median([r["mfu"] for r in rows if "mfu" in r]))
    return out


def backfill(client, run_id: str, rows: list[dict], until_step: int) -> None:
    """Log the steps a killed run did into this run too, so its charts are whole."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    earlier = [Metric(k, float(v), now, int(r["step"])) for r in rows if r["step"] <= until_step
               for k, v in r.items() if k != "step"]
    for i in range(0, len(earlier), 1000):  # MLflow's batch limit
        client.log_batch(run_id, metrics=earlier[i: i + 1000])


def consolidated_model(cfg: TrainConfig, tag_dir: Path | None = None):
    """(every fp32 weight, the encoder's weights, its config, parameter count) of a checkpoint: the
    last one, or ``tag_dir`` (a snapshot's)."""
    from xylent.models.config import EncoderConfig
    from xylent.models.objectives import build_model
    from xylent.models.pretrained import consolidate_zero as fp32_weights
    from xylent.models.training.checkpoints import complete_checkpoints

    tag_dir = tag_dir or complete_checkpoints(Path(cfg.checkpoint_dir))[-1]
    full = fp32_weights(tag_dir.parent, tag_dir.name)
    enc_cfg = EncoderConfig(**cfg.model)
    model = build_model(cfg.objective, enc_cfg, cfg.disc_weight, cfg.mask_prob, cfg.objective_options)
    model.load_state_dict(full, strict=True)  # proves the checkpoint is the whole model
    return full, model.encoder_state_dict(), enc_cfg, sum(v.numel() for v in full.values())


def export_run(cfg: TrainConfig, ckdir: Path, upstream: dict[str, Path], out: Path, meta: dict) -> tuple:
    """Export ``model/`` and copy the run's files; returns (metrics rows, encoder state, config, parameters)."""
    from xylent.models.pretrained import export

    full, enc_state, enc_cfg, n_params = consolidated_model(cfg)
    export(out / MODEL_DIR, full, enc_state, enc_cfg, upstream["vocab"],
           {**meta, "seq_len": read_index(upstream["shards"])["seq_len"]})
    for f in RUN_FILES:
        shutil.copy2(ckdir / f, out / f)
    if (ckdir / HEALTH_FILE).exists():  # none under ZeRO-3 (xylent.models.training.trainer)
        shutil.copy2(ckdir / HEALTH_FILE, out / HEALTH_FILE)
    rows = read_metrics(Path(cfg.metrics_file))
    loss_curves(rows, out / "loss_curves.png")
    return rows, enc_state, enc_cfg, n_params


def export_snapshots(cfg: TrainConfig, upstream: dict[str, Path], out: Path, meta: dict) -> dict[str, dict]:
    """Each complete snapshot (``pretrain.snapshot_tokens``) as an encoder of its own under
    ``snapshots/<tag>/`` (model.safetensors, config.json with ``snapshot``: step and tokens, the
    tokenizer; no pretraining weights): tag -> its step and tokens."""
    from xylent.models.pretrained import export
    from xylent.models.training.snapshots import complete_snapshots, snapshot_info

    found = {}
    for tag_dir in complete_snapshots(Path(cfg.checkpoint_dir)):
        info = snapshot_info(tag_dir)
        _, enc_state, enc_cfg, _ = consolidated_model(cfg, tag_dir)
        export(out / SNAPSHOTS_DIR / tag_dir.name, None, enc_state, enc_cfg, upstream["vocab"],
               {**meta, "seq_len": read_index(upstream["shards"])["seq_len"], "snapshot": info})
        found[tag_dir.name] = info
    return found


def snapshot_line(asked: list[int], taken: dict[str, dict]) -> str:
    """The report's line on the snapshots: which counts were asked for and where each was taken."""
    at = ", ".join(f"{i['tokens']:,} tokens (step {i['step']})" for i in taken.values()) or "none"
    missed = [n for n in asked if not any(n in i["counts"] for i in taken.values())]
    return (f"Snapshots (pretrain.snapshot_tokens, for evaluate's learning curve): {at}"
            + (f"; not reached by the run's end: {', '.join(f'{n:,}' for n in missed)}" if missed else "") + ".")


@dataclass
class Published:
    """What :func:`export_and_register` leaves: the run's metric rows and summary figures, the
    encoder's config, and where the registry holds the model."""
    rows: list[dict]
    metrics: dict[str, float]
    encoder: object
    name: str
    model_uri: str
    version: int


def export_and_register(cfg: TrainConfig, ckdir: Path, upstream: dict[str, Path], out: Path, meta: dict, tracker,
                        run_id: str, resumed_from_step: int, step: int = 0, spec_yaml: str | None = None) -> Published:
    """Export ``model/`` and the run's files, backfill the steps a resumed run did not log, and
    register the model under ``meta["registered_model"]`` (pretrain and the audit's own model),
    with the spec it was trained from beside it (``spec_yaml``)."""
    rows, enc_state, enc_cfg, n_params = export_run(cfg, ckdir, upstream, out, meta)
    if resumed_from_step:
        backfill(tracker.client, run_id, rows, resumed_from_step)
    name = meta["registered_model"]
    model_uri, version = register_model(tracker, run_id, out / MODEL_DIR, name, ckdir, step=step, spec_yaml=spec_yaml)
    metrics = summary_metrics(rows, n_params, sum(v.numel() for v in enc_state.values()))
    return Published(rows, metrics, enc_cfg, name, model_uri, version)


def _pyfunc_code(scratch: Path) -> Path:
    """The code the logged model carries, laid out as installed: the xylent core with xylent.models inside
    (no stages, no flows), so it loads wherever torch, sentencepiece and safetensors are, xylent or not."""
    import xylent
    import xylent.models

    dest = scratch / "pyfunc-code" / "xylent"
    shutil.rmtree(dest, ignore_errors=True)
    skip = shutil.ignore_patterns("__pycache__", "flows", "tasks", "models")
    shutil.copytree(Path(xylent.__file__).parent, dest, ignore=skip)
    shutil.copytree(Path(xylent.models.__file__).parent, dest / "models", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def register_model(tracker, run_id: str, model_dir: Path, name: str, scratch: Path, step: int = 0,
                   spec_yaml: str | None = None) -> tuple[str, int]:
    """Log the exported model as an MLflow logged model (a pyfunc: texts -> embeddings) named by
    its recipe and fingerprint (``electra-3f9a1c2e``; ``electra-audit-…`` for the audit's), with the
    spec it was trained from (``spec.yaml``), the output of the stage's run (the Models column), and
    register it, the logged model linked to its version; returns (model URI, registered version).

    Everything goes through the tracker's client with the run id: MLflow's fluent API
    (set_tracking_uri, start_run, log_model) is process-global and would redirect every
    later run of this process to this store."""
    import mlflow.pyfunc

    local = scratch / "mlflow-model"
    shutil.rmtree(local, ignore_errors=True)  # a run stopped here (a full disk) left it: MLflow refuses a full folder
    mlflow.pyfunc.save_model(path=str(local), python_model=str(_pyfunc_code(scratch) / "models" / "pyfunc_entry.py"),
                             artifacts={"model": str(model_dir)},
                             code_paths=[str(scratch / "pyfunc-code" / "xylent")],
                             pip_requirements=["torch", "sentencepiece", "safetensors"])
    if spec_yaml is not None:  # the registered version's files: its source is this folder
        (local / "spec.yaml").write_text(spec_yaml)
    from mlflow.entities import LoggedModelOutput

    client = tracker.client
    facts = _export_meta(model_dir)
    logged_name = "-".join([str(facts.get("objective")), *(["audit"] if "audit" in facts else []),
                            str(facts.get("fingerprint"))[:8]])
    logged = client.create_logged_model(tracker.experiment_id, name=logged_name, source_run_id=run_id,
                                        model_type="xylent-encoder")
    client.log_model_artifacts(logged.model_id, str(local))
    client.finalize_logged_model(logged.model_id, "READY")
    client.log_outputs(run_id, models=[LoggedModelOutput(logged.model_id, step=step)])
    shutil.rmtree(local, ignore_errors=True)
    shutil.rmtree(scratch / "pyfunc-code", ignore_errors=True)
    _registered_model(client, name)
    # the logged model's own location: a models:/<id> source would be looked up in the process-global store.
    # MLflow's SQL registry keeps no model_id (the version reads model_id=None), so the link is a tag and a
    # line of the description, relative to the UI it is read in
    link = f"[{logged.model_id}](#/experiments/{tracker.experiment_id}/models/{logged.model_id})"
    version = client.create_model_version(name, logged.artifact_location, run_id=run_id, model_id=logged.model_id,
                                          description=f"{version_description(model_dir)}\n\nLogged model: {link}",
                                          tags={**version_tags(model_dir), "logged_model_id": logged.model_id})
    link_version(client, logged.model_id, name, version.version)
    return f"models:/{name}/{version.version}", int(version.version)


def link_version(client, model_id: str | None, name: str, version) -> None:
    """The logged model's page lists its registered versions from its ``mlflow.modelVersions`` tag,
    which MLflow's fluent register_model writes and the client's create_model_version does not
    (its page said "Not registered" for version 1 of the registered model)."""
    if not model_id:
        return
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    listed = json.loads(client.get_logged_model(model_id).tags.get(MLFLOW_MODEL_VERSIONS) or "[]")
    # a tracking server writes the entry itself, its version a number: compared as text, not listed twice
    if not any(e.get("name") == name and str(e.get("version")) == str(version) for e in listed):
        entry = {"name": name, "version": str(version)}
        client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps([*listed, entry])})


def _registered_model(client, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, description="xylent encoders (embeddings + discriminator)")
    except MlflowException as exc:
        if "already exists" not in str(exc).lower() and "RESOURCE_ALREADY_EXISTS" not in str(exc):
            raise


def register_cached(tracker, manifest: dict, name: str) -> dict:
    """A cached output's model under the name asked for now: pretrain.register_name is operational,
    so a new name reuses the output and registers its model again, as a version of ``name`` with
    the first version's source, run, description and tags (once: a version of ``name`` with that
    source is reused).  Returns the stage result's registration fields ({} when the name is the
    one the output was registered under)."""
    from mlflow.exceptions import MlflowException

    first_name, first_version = manifest.get("registered_model"), manifest.get("registered_version")
    if first_name in (None, name):
        return {}
    client = tracker.client
    where = f"the MLflow registry at {redact_text(tracker.uri)}"
    try:
        first = client.get_model_version(first_name, str(first_version))
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise _registry_error(exc, name, where) from exc
        raise XylentError(f"the cached output's model was registered as {first_name} v{first_version}, which this "
                          "workspace's MLflow registry no longer has, so it cannot be registered again as "
                          f"{name}", where=where,
                          fix="rerun the stage with --force to export and register its model again") from exc
    try:
        again = next((v for v in client.search_model_versions(f"name='{name}'") if v.source == first.source), None)
        if again is None:
            _registered_model(client, name)
            tags = {**first.tags, "registered_first_as": f"{first_name} v{first_version}"}
            again = client.create_model_version(name, first.source, run_id=first.run_id,
                                                description=first.description, tags=tags)
            link_version(client, first.tags.get("logged_model_id"), name, again.version)
    except MlflowException as exc:
        raise _registry_error(exc, name, where) from exc
    return {"registered_model": name, "registered_version": int(again.version),
            "model_uri": f"models:/{name}/{again.version}"}


def _registry_error(exc, name: str, where: str) -> XylentError:
    """Any other answer of the registry (down, refused, no permission): the cached output is fine,
    so retraining (--force) is not the fix."""
    return XylentError(f"cannot register the cached model as {name}: the registry answered {exc.error_code} "
                       f"({redact_text(str(exc.message))[:300]})", where=where,
                       fix="check that the MLflow server is up and that this user may write to its registry, "
                       "then rerun: the stage's output stays cached")


def _export_meta(model_dir: Path) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())


def version_description(model_dir: Path) -> str:
    """What a registered version is, as the registry's page shows it."""
    meta = _export_meta(model_dir)
    enc = meta["encoder"]
    return (f"{meta.get('objective', '?')} encoder, {enc['layers']} layers x {enc['hidden']} wide, vocabulary "
            f"{enc['vocab_size']}, {meta.get('steps', '?')} steps; pretrain output {meta.get('fingerprint', '?')}. "
            "Load with xylent.models.load_pretrained(<model dir>) or mlflow.pyfunc.load_model(<this version>).")


def version_tags(model_dir: Path) -> dict[str, str]:
    """The version's searchable facts (tags.objective = 'veco', ...)."""
    meta = _export_meta(model_dir)
    enc = meta["encoder"]
    return {"objective": str(meta.get("objective")), "steps": str(meta.get("steps")),
            "fingerprint": str(meta.get("fingerprint")), "layers": str(enc["layers"]), "hidden": str(enc["hidden"]),
            "vocab_size": str(enc["vocab_size"]), "gate": str(enc.get("gate", "wavlm"))}


def summary(m: dict, p, cfg: TrainConfig, enc, name: str, uri: str, resumed: int) -> str:
    rows = []
    for t in ("mrtd", "trtd"):
        for k in ("generator_loss", "generator_unigram_loss", "discriminator_loss", "discriminator_base_loss",
                  "generator_accuracy", "discriminator_precision", "discriminator_recall"):
            if f"first.{t}/{k}" in m:
                rows.append({"task": t, "metric": k, "first steps": m[f"first.{t}/{k}"],
                             "last steps": m[f"final.{t}/{k}"]})
    lines = [f"**{p.objective}** on {', '.join(t.upper() for t in p.batch_kinds)} ({p.batch_schedule}), "
             f"{int(m['steps'])} steps, ZeRO-{cfg.zero_stage}, {p.ranks} local rank(s).",
             f"Model: {enc.layers}×{enc.hidden} (generator {enc.generator_layers} layers), vocab {enc.vocab_size:,}, "
             f"{int(m['parameters']):,} parameters ({int(m['encoder_parameters']):,} in the exported encoder).",
             f"Throughput: median {m['tokens_per_second_median']:,.0f} tokens/s" +
             (f", MFU {m['mfu_median']:.1%}" if "mfu_median" in m else "") + ".",
             f"Registered in MLflow as **{name}** ({uri})." + (f" Resumed at step {resumed}." if resumed else ""),
             "", markdown_table(rows), "", *verdicts(m)]
    return "\n".join(lines)


def health_lines(records: list[dict]) -> tuple[dict[str, float], list[str]]:
    """(metrics, report lines) from embedding_health.jsonl: the token embeddings at random init (step 0)
    beside the last checkpoint's (xylent.models.embedding_health says what each number shows)."""
    if len(records) < 2 or records[0]["step"] != 0:
        return {}, []
    first, last = records[0], records[-1]
    metrics = {f"{when}.embeddings/{k}": float(v) for when, r in (("init", first), ("final", last))
               for k, v in r.items() if k != "step"}
    line = (f"Token embeddings, random init → step {last['step']}: the top principal component holds "
            f"{first['top_pc_share']:.1%} → {last['top_pc_share']:.1%} of their variance")
    if last.get("unseen_rows"):
        line += (f"; rows never input ({int(first['unseen_rows']):,} → {int(last['unseen_rows']):,}) have mean norm "
                 f"{first.get('unseen_mean_norm', float('nan')):.3f} → {last['unseen_mean_norm']:.3f} (rows input: "
                 f"{last['seen_mean_norm']:.3f}) and cosine {first.get('unseen_cos_to_mean', float('nan')):.2f} → "
                 f"{last['unseen_cos_to_mean']:.2f} to their mean direction")
    return metrics, [line + " (a collapse raises all three; embedding_health.jsonl, per checkpoint)."]


def verdicts(m: dict) -> list[str]:
    """Each final loss against its trivial peer, in words: a falling loss is not yet learning."""
    out = []
    for t in ("mrtd", "trtd"):
        for key, peer, what in (("discriminator_loss", "discriminator_base_loss", "the base rate (always 'original')"),
                                ("generator_loss", "generator_unigram_loss", "a unigram model")):
            if f"final.{t}/{key}" in m and f"final.{t}/{peer}" in m:
                ratio = m[f"final.{t}/{key}"] / m[f"final.{t}/{peer}"]
                side = "below" if ratio < 0.97 else "not below"
                out.append(f"- {t.upper()} {key.split('_')[0]}: final loss {m[f'final.{t}/{key}']:.3f} is {side} "
                           f"{what} ({m[f'final.{t}/{peer}']:.3f}; ratio {ratio:.2f}).")
    return out
