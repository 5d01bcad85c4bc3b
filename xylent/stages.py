"""The stage registry: order, dependencies, and what each stage's fingerprint covers.

A stage's fingerprint hashes its name, its code version, the slice of the spec
it reads, and its upstream stages' fingerprints.  Bump ``version`` whenever a
code change alters a stage's output, so old outputs stop being cache hits.
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from xylent.errors import XylentError
from xylent.spec import Spec
from xylent.workspace import fingerprint


def source_identity(spec: Spec, source) -> dict[str, Any]:
    """What makes a source's bytes what they are, beyond its spec fields.

    URL downloads are identified by URL (+ checksum when given); a local file by
    its size and mtime; a package's catalogs by the installed package version.
    """
    d = source.model_dump(mode="json")
    if source.kind == "local":
        path = spec.resolve_path(source.path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise XylentError(
                f"source {source.name!r}: local file not found: {path}",
                where="spec field sources[].path",
                fix="check the path (relative paths are resolved from the spec file's folder)",
            ) from None
        d["_stat"] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    elif source.kind == "gettext" or getattr(source, "format", None) == "gettext":
        pkg = getattr(source, "package", None)
        if pkg:
            try:
                d["_package_version"] = importlib.metadata.version(pkg)
            except importlib.metadata.PackageNotFoundError:
                raise XylentError(
                    f"source {source.name!r}: Python package {pkg!r} is not installed",
                    where="spec field sources[].package",
                    fix=f"install it (for the demo: pip install -e '.[demo]', which brings {pkg})",
                ) from None
    return d


def _download_slice(spec: Spec) -> dict:
    return {
        "languages": spec.languages,
        "sources": [
            {k: v for k, v in source_identity(spec, s).items() if k != "max_lines"} for s in spec.sources
        ],
    }


def _prepare_slice(spec: Spec) -> dict:
    return {
        "languages": spec.languages,
        "sources": [s.model_dump(mode="json") for s in spec.sources],
        "prepare": spec.prepare.model_dump(mode="json"),
    }


def _dedup_slice(spec: Spec) -> dict:
    return {"dedup": spec.dedup.model_dump(mode="json"), "languages": spec.languages}


def _vocab_slice(spec: Spec) -> dict:
    return {"vocab": spec.vocab.model_dump(mode="json"), "seed": spec.seed}


def _shards_slice(spec: Spec) -> dict:
    return {"shards": spec.shards.model_dump(mode="json")}


def _pretrain_slice(spec: Spec) -> dict:
    p = spec.pretrain.model_dump(mode="json", exclude=set(spec.pretrain.OPERATIONAL))
    return {"model": spec.model.model_dump(mode="json"), "pretrain": p, "seed": spec.seed}


def _sampling_slice(spec: Spec) -> dict:
    return {"sampling": spec.sampling.model_dump(mode="json")}


@dataclass(frozen=True)
class StageInfo:
    name: str
    description: str
    flow: str  # "module:function" of its Prefect flow
    version: str
    spec_slice: Callable[[Spec], dict]
    upstream: tuple[str, ...] = field(default_factory=tuple)


STAGES: list[StageInfo] = [
    StageInfo(
        "download",
        "fetch corpora (HTTP with resume, OPUS, CC-100, local files, package catalogs)",
        "flows.download:download",
        "1",
        _download_slice,
    ),
    StageInfo(
        "prepare",
        "decode, normalise and filter text into mono/ and bitext/ Parquet",
        "flows.prepare:prepare",
        "1",
        _prepare_slice,
        ("download",),
    ),
    StageInfo(
        "dedup",
        "exact and near-duplicate removal (MinHash LSH), bitext cleaning (copies, ratio, hubs, lang-id)",
        "flows.dedup:dedup",
        "1",
        _dedup_slice,
        ("prepare",),
    ),
    StageInfo(
        "vocab",
        "VoCAP vocabulary: per-language SentencePiece grids, ALP allocation, one merged unigram model",
        "flows.vocab:vocab",
        "1",
        _vocab_slice,
        ("dedup",),
    ),
    StageInfo(
        "sampling",
        "language and language-pair sampling tables (alpha-smoothing, M2M-100 LP, XY-LENT Sinkhorn)",
        "flows.sampling:sampling",
        "1",
        _sampling_slice,
        ("dedup",),
    ),
    StageInfo(
        "shards",
        "tokenised, packed Arrow shards for MRTD and TRTD (+ index.json for the loader)",
        "flows.shards:shards",
        "1",
        _shards_slice,
        ("dedup", "vocab"),
    ),
    StageInfo(
        "pretrain",
        "ELECTRA (MRTD + TRTD) pretraining under DeepSpeed ZeRO; exports and registers the encoder",
        "flows.pretrain:pretrain",
        "1",
        _pretrain_slice,
        ("vocab", "sampling", "shards"),
    ),
]

STAGE_NAMES = [s.name for s in STAGES]


def get_stage(name: str) -> StageInfo:
    for s in STAGES:
        if s.name == name:
            return s
    raise XylentError(
        f"unknown stage {name!r}",
        fix=f"choose one of: {', '.join(STAGE_NAMES)} (or 'pipeline'); `xylent stages` lists them",
    )


def stage_config(spec: Spec, stage: StageInfo) -> dict:
    return stage.spec_slice(spec)


def stage_fingerprints(spec: Spec) -> dict[str, str]:
    """Fingerprint of every stage, in order."""
    fps: dict[str, str] = {}
    for s in STAGES:
        fps[s.name] = fingerprint(
            {
                "stage": s.name,
                "version": s.version,
                "config": s.spec_slice(spec),
                "upstream": {u: fps[u] for u in s.upstream},
            }
        )
    return fps
