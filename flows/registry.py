"""The stages, declared, in pipeline order.

A declaration (:class:`~xylent.stage.StageDef`) is what a stage is: its name,
the spec fields it reads, the stages it reads, its code version.  That is all
``xylent stages``, ``xylent status`` and the fingerprints need, so this module
imports neither Prefect nor anything a stage computes with (torch, faiss ...).
A stage's body and Prefect flow are ``flows/<name>.py:<name>``, made by
:func:`xylent.flows.kit.stage_flow` from the declaration and imported only when the
stage runs (:func:`stage_flow_of`).  A new stage is a declaration here, after
the stages it reads (checked at import).

``STAGE_FLOWS`` (every stage's flow, in order) imports them all, on first use.
"""

from __future__ import annotations

import importlib

from xylent.tasks import versions
from xylent.spec import Spec
from xylent.stage import StageContext, StageDef, StageOutcome, order_stages
from xylent.workspace import Workspace


def stage_flow_of(name: str):
    """The Prefect flow of a declared stage (``flows/<name>.py:<name>``), imported now."""
    return getattr(importlib.import_module(f"xylent.flows.{name}"), name)


class _Body:
    """A declared stage's body: its flow's, imported on the first call."""

    def __init__(self, stage: str):
        self.stage = stage

    def __call__(self, ctx: StageContext) -> StageOutcome:
        return stage_flow_of(self.stage).body(ctx)

    def __repr__(self) -> str:
        return f"<body of flows/{self.stage}.py>"


def _download_slice(spec: Spec) -> dict:
    from xylent.tasks.download.identity import spec_slice

    return spec_slice(spec)


def _pretrain_identity(spec: Spec, ws: Workspace) -> dict:
    from xylent.tasks.pretrain.model_shape import check_model

    check_model(spec)  # a run with an impossible model shape stops here, before the data stages
    if spec.pretrain.init is None:
        return {}  # the source model's identity only with pretrain.init (and torch only then)
    from xylent.tasks.pretrain.init_source import source_identity

    return source_identity(spec, ws)


def _audit_identity(spec: Spec, ws: Workspace) -> dict:
    from xylent.tasks.pretrain.model_shape import check_model

    check_model(spec)
    return {}  # nothing beyond the spec: the fingerprint is the spec's alone


def _register_pretrain(spec: Spec, manifest: dict, tracker) -> dict:
    from xylent.tasks.pretrain.publish import model_name, register_cached

    return register_cached(tracker, manifest, model_name(spec))


def _register_audit(spec: Spec, manifest: dict, tracker) -> dict:
    from xylent.tasks.audit.run import audit_model_name
    from xylent.tasks.pretrain.publish import register_cached

    return register_cached(tracker, manifest, audit_model_name(spec))


def _declare(name: str, **fields) -> StageDef:
    return StageDef(name=name, body=_Body(name), **fields)


STAGES = order_stages([
    _declare("download", description="fetch corpora (HTTP with resume, OPUS, CC-100, local files, package catalogs)",
             version=versions.DOWNLOAD, reads=("languages", "sources"), config=_download_slice),
    _declare("prepare", description="decode, normalise and filter text into mono/ and bitext/ Parquet",
             version=versions.PREPARE, reads=("languages", "sources", "prepare"), upstream=("download",)),
    _declare("dedup", description="exact and near-duplicate removal (MinHash LSH), bitext cleaning "
             "(copies, ratio, hubs, lang-id)", version=versions.DEDUP, reads=("dedup", "languages"),
             upstream=("prepare",)),
    _declare("vocab", description="VoCAP vocabulary: per-language SentencePiece grids, ALP allocation, one merged "
             "unigram model", version=versions.VOCAB, reads=("vocab", "seed"), upstream=("dedup",)),
    _declare("sampling", description="language and language-pair sampling tables (alpha-smoothing, M2M-100 LP, "
             "XY-LENT Sinkhorn)", version=versions.SAMPLING, reads=("sampling",), upstream=("dedup",)),
    _declare("shards", description="tokenised, packed Arrow shards for MRTD and TRTD (+ index.json for the loader)",
             version=versions.SHARDS, reads=("shards",), upstream=("dedup", "vocab")),
    _declare("pretrain", description="ELECTRA (MRTD + TRTD) pretraining under DeepSpeed ZeRO; exports and registers "
             "the encoder", version=versions.PRETRAIN, reads=("model", "pretrain", "seed"),
             upstream=("vocab", "sampling", "shards"),
             identity=_pretrain_identity, on_cached=_register_pretrain),
    _declare("audit", description="DRO bitext audit (XY-LENT §6.6): train under a χ² adversary over language pairs, "
             "rank pairs by w = q/Q, evidence for the flagged ones", version=versions.AUDIT,
             reads=("model", "pretrain", "audit", "seed", "dedup"),
             upstream=("dedup", "vocab", "sampling", "shards", "pretrain"),
             conditions=(("pretrain", lambda spec: spec.audit.init == "pretrain"),), identity=_audit_identity,
             on_cached=_register_audit),
    _declare("evaluate", description="scorecard: Tatoeba/BUCC retrieval and zero-shot probes for each encoder "
             "side by side (XTREME conventions), with a random-init baseline", version=versions.EVALUATE,
             reads=("evaluate", "sources"), upstream=("download", "dedup", "pretrain")),
])
STAGE_NAMES = [s.name for s in STAGES]
STAGE_BY_NAME = {s.name: s for s in STAGES}


def __getattr__(name: str):
    if name == "STAGE_FLOWS":  # every stage's flow: imports every stage's code
        return [stage_flow_of(n) for n in STAGE_NAMES]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
