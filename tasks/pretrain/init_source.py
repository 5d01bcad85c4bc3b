"""``pretrain.init``: the pretrain stage's model starts from an existing encoder
(MetaXLM's second phase starts from the first phase's model).

- :func:`resolve_source` -- the source dir: a local path (resolved from the spec
  file's folder) or a registered model ``models:/<name>/<version|latest>`` (or
  ``@<alias>``) in the workspace's MLflow store, resolved to the pretrain output
  that registered it (the run's ``xylent.output_dir`` tag, ``model/`` in it);
- :func:`source_identity` -- what the stage's fingerprint hashes beyond the spec:
  the resolved dir, the registered version, each identifying file's size and mtime
  (weights, tokenizer, config; the dictionary too).  Computed before anything
  runs, so a missing dir, a dir that is not an encoder or a body of another shape
  fails there;
- :func:`prepare_init` -- matches the vocabularies (:mod:`xylent.models.vocab_transfer`),
  builds every weight of the new model (:mod:`xylent.models.init_from`) into
  ``<checkpoints>/init.safetensors`` and points ``train.json``'s ``init_from`` at it;
  the report goes to ``init_report.json``.  A rerun of the same fingerprint reuses
  both (and a resumed run's checkpoint overrides the init anyway).

Per language: the vocab stage keeps no per-language piece lists (its grid
models are deleted once merged; ``allocation.parquet`` has only each language's
chosen size), so a piece belongs to the languages whose MRTD shards -- the new
vocabulary's tokenisation of each language's training text -- use it (at most
``USAGE_MAX_TOKENS`` tokens read per language).  A piece used by several
languages counts in each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xylent.models.init_from import check_body, file_identity, inspect_source
from xylent.models.training.run_config import TrainConfig
from xylent.models.vocab_transfer import RULES
from xylent.tasks.pretrain.contract import MODEL_DIR
from xylent.data.shards import read_index
from xylent.tasks.vocab.contract import tokenizer_path
from xylent.atomic import write_atomic, write_json_atomic
from xylent.errors import XylentError
from xylent.markdown import markdown_table
from xylent.spec import Spec
from xylent.tracking import tracking_uri_for
from xylent.workspace import Workspace

INIT_WEIGHTS = "init.safetensors"
REPORT_FILE = "init_report.json"
USAGE_MAX_TOKENS = 20_000_000
WHERE = "spec field pretrain.init.from"


@dataclass(frozen=True)
class Resolved:
    uri: str                 # as the spec says it
    path: Path               # the model dir
    registry: dict | None    # name, version, run_id of a models:/ source


def _registered(spec: Spec, ws: Workspace, reg: dict) -> tuple[Path, dict]:
    import logging

    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    name, uri = reg["name"], tracking_uri_for(ws.root, spec.tracking.tracking_uri)
    first = (f"run the stage that registers it first, in this workspace (e.g. xylent run pretrain --spec "
             f"<phase-1 spec> --workspace {ws.location}), or give pretrain.init.from as a dir")
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise XylentError(f"pretrain.init.from is the registered model {spec.pretrain.init.from_!r}, but the "
                          "workspace has no MLflow store yet", where=f"{WHERE} (store: {uri})", fix=first)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    client = MlflowClient(tracking_uri=uri)
    try:
        if reg["alias"]:
            mv = client.get_model_version_by_alias(name, reg["alias"])
        elif reg["version"] == "latest":
            versions = client.search_model_versions(f"name = '{name}'")
            if not versions:
                raise MlflowException(f"no version of {name!r}")
            mv = max(versions, key=lambda v: int(v.version))
        else:
            mv = client.get_model_version(name, reg["version"])
        run = client.get_run(mv.run_id)
    except MlflowException as exc:
        try:
            known = sorted(m.name for m in client.search_registered_models())
        except MlflowException:
            known = []
        raise XylentError(f"the registered model {spec.pretrain.init.from_!r} is not in the workspace's MLflow "
                          f"store ({str(exc).splitlines()[0][:200]}); registered models: {known or 'none'}",
                          where=f"{WHERE} (store: {uri})", fix=first) from None
    out = run.data.tags.get("xylent.output_dir")
    if not out:
        raise XylentError(f"{name} version {mv.version} was not registered by an xylent stage (its run has no "
                          "xylent.output_dir tag)", where=f"{WHERE} (run {mv.run_id})",
                          fix="give pretrain.init.from as the model's dir")
    path = Path(out) / MODEL_DIR
    if not path.is_dir():
        raise XylentError(f"{name} version {mv.version} was registered by a pretrain output that is gone",
                          where=str(path), fix=f"rerun the stage that registers it, in this workspace (e.g. xylent "
                          f"run pretrain --spec <phase-1 spec> --workspace {ws.location}): it registers a new version")
    return path, {"name": name, "version": int(mv.version), "run_id": mv.run_id}


def resolve_source(spec: Spec, ws: Workspace) -> Resolved | None:
    """The source model's dir (None: no ``pretrain.init``)."""
    init = spec.pretrain.init
    if init is None:
        return None
    reg = init.registry()
    if reg is None:
        return Resolved(init.from_, spec.resolve_path(init.from_), None)
    path, info = _registered(spec, ws, reg)
    return Resolved(init.from_, path, info)


def _dictionary(spec: Spec) -> Path | None:
    init = spec.pretrain.init
    if init is None or init.dictionary is None:
        return None
    path = spec.resolve_path(init.dictionary)
    if not path.is_file():
        raise XylentError("the bilingual dictionary does not exist", where=f"spec field pretrain.init.dictionary "
                          f"({path})", fix="point it at a file of 'new-word<TAB>old-word' lines (relative paths are "
                          "resolved from the spec file's folder), or drop it")
    return path


def target_body(spec: Spec) -> dict:
    """The new model's shape as the spec sets it (vocabulary and positions come later)."""
    from xylent.models.config import preset

    return preset(spec.model.size, **spec.model.overrides()).to_dict()


def source_identity(spec: Spec, ws: Workspace) -> dict:
    """The pretrain stage's fingerprint beyond the spec: which model, which files ({} without init)."""
    r = resolve_source(spec, ws)
    if r is None:
        return {}
    info = inspect_source(r.path)
    check_body(info, target_body(spec))
    ident = {"init": {"source": str(r.path), "kind": info.kind, "files": file_identity(info.files)}}
    if r.registry:
        ident["init"]["registry"] = r.registry
    if (d := _dictionary(spec)) is not None:
        ident["init"]["dictionary"] = file_identity([d])
    return ident


def language_usage(shards_dir: Path, vocab_size: int, max_tokens: int = USAGE_MAX_TOKENS) -> dict[str, np.ndarray]:
    """language -> occurrences of each token id in its MRTD shards (the first ``max_tokens``)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    index = read_index(shards_dir)
    out = {}
    for lang, group in index["mrtd"].items():
        counts, seen = np.zeros(vocab_size, dtype=np.int64), 0
        for sh in group["shards"]:
            if seen >= max_tokens:
                break
            table = ipc.open_file(pa.memory_map(str(Path(shards_dir) / sh["path"]))).read_all()
            for chunk in table.column("input_ids").chunks:
                ids = chunk.flatten().to_numpy()[: max_tokens - seen]
                counts += np.bincount(ids, minlength=vocab_size)[:vocab_size]
                seen += len(ids)
                if seen >= max_tokens:
                    break
        out[lang] = counts
    return out


def prepare_init(spec: Spec, ws: Workspace, cfg: TrainConfig, upstream: dict[str, Path], ckdir: Path) -> dict:
    """Build the init weights and the report into ``ckdir`` and set ``cfg.init_from``; returns the report."""
    weights, report_file = ckdir / INIT_WEIGHTS, ckdir / REPORT_FILE
    if weights.is_file() and report_file.is_file():  # built by an earlier attempt of this fingerprint
        cfg.init_from = str(weights)
        return json.loads(report_file.read_text())

    import torch
    from safetensors.torch import save_file

    from xylent.models.config import EncoderConfig
    from xylent.models.init_from import build_init_state, load_source
    from xylent.models.objectives import build_model
    from xylent.models.vocab_transfer import (
        from_sentencepiece,
        match_vocabularies,
        read_dictionary,
        transfer_report,
    )

    init = spec.pretrain.init
    r = resolve_source(spec, ws)
    info = inspect_source(r.path)
    enc = EncoderConfig(**cfg.model)
    notes = check_body(info, enc.to_dict())
    source = load_source(info)
    new_vocab = from_sentencepiece(tokenizer_path(upstream["vocab"]), enc.specials)
    dict_path = _dictionary(spec)
    dictionary = read_dictionary(dict_path) if dict_path else None
    match = match_vocabularies(new_vocab, source.vocab, dictionary, init.dictionary_first)
    report = transfer_report(match, new_vocab, source.vocab, language_usage(upstream["shards"], len(new_vocab)))

    torch.manual_seed(cfg.seed)  # as the trainer does: what is not copied is the run's own random init
    model = build_model(cfg.objective, enc, cfg.disc_weight, cfg.mask_prob, cfg.objective_options)
    state, copied = build_init_state(model, source, match.old_ids, init.generator, init.heads)
    report = {"source": {"from": r.uri, "path": str(r.path), "kind": info.kind, "registry": r.registry,
                         "files": file_identity(info.files), "objective": info.meta.get("objective"),
                         "shape": info.describe()},
              "dictionary": {"path": str(dict_path), "entries": len(dictionary)} if dictionary else None,
              "languages_from": f"MRTD shards (pieces each language's text uses; first {USAGE_MAX_TOKENS:,} tokens)",
              **report, "copied": copied, "notes": notes}
    write_atomic(weights, lambda p: save_file(state, str(p), metadata={"format": "xylent-init/1"}))
    write_json_atomic(report_file, report, indent=1, ensure_ascii=False)
    cfg.init_from = str(weights)
    return report


def init_metrics(report: dict) -> dict[str, float]:
    """``init/<rule>`` counts, ``init/matched_fraction``; per language ``init/<lang>/matched_fraction`` and
    ``init/<lang>/tokens_matched``."""
    out = {f"init/{rule}": float(n) for rule, n in report["counts"].items()}
    out["init/matched"] = float(report["matched"])
    out["init/matched_fraction"] = float(report["matched_fraction"])
    for lang, r in report.get("languages", {}).items():
        out[f"init/{lang}/matched_fraction"] = float(r["matched_fraction"])
        out[f"init/{lang}/tokens_matched"] = float(r["tokens_matched"])
    return out


def init_summary(report: dict) -> str:
    """The report's section: where the weights came from and how the vocabulary matched."""
    src, c = report["source"], report["counts"]
    reg = src.get("registry")
    lines = ["### Initialised from an existing encoder (`pretrain.init`)", "",
             f"Source: `{src['from']}`" + (f" = {reg['name']} v{reg['version']}" if reg else "") +
             f" ({src['kind']}, {src['shape']}) at `{src['path']}`.",
             f"Body: {report['copied']['body']} weights copied, {report['copied']['positions']} position rows; "
             f"generator: {report['copied']['generator']}; heads copied: {len(report['copied']['heads'])}.",
             f"Vocabulary: {report['matched']:,} of {report['new_vocab_size']:,} pieces matched "
             f"({report['matched_fraction']:.1%}) in the source's {report['old_vocab_size']:,}: " +
             ", ".join(f"{rule} {c[rule]:,}" for rule in RULES) + "."]
    if report.get("notes"):
        lines += ["", *[f"- **note:** {n}" for n in report["notes"]]]
    rows = [{"lang": lang, "pieces": r["pieces"], **{rule: r["counts"][rule] for rule in RULES if rule != "special"},
             "matched": r["matched_fraction"], "tokens matched": r["tokens_matched"]}
            for lang, r in report.get("languages", {}).items()]
    if rows:
        lines += ["", markdown_table(rows)]
    return "\n".join(lines)


__all__ = ["INIT_WEIGHTS", "REPORT_FILE", "init_metrics", "init_summary", "language_usage", "prepare_init",
           "resolve_source", "source_identity"]
