"""The whole spec: every section, and the checks that span sections."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from xylent.languages import check_language
from xylent.spec.audit import AuditConfig
from xylent.spec.base import Strict
from xylent.spec.dedup import DedupConfig
from xylent.spec.download import DownloadConfig
from xylent.spec.evaluate import EvaluateConfig
from xylent.spec.prepare import PrepareConfig
from xylent.objectives import OBJECTIVES
from xylent.spec.pretrain import ModelConfig, PretrainConfig, registrable
from xylent.spec.runtime import RunnerConfig, TrackingConfig
from xylent.spec.sampling import SamplingConfig
from xylent.spec.shards import ShardsConfig
from xylent.spec.sources import Source
from xylent.spec.vocab import VocabConfig


class Spec(Strict):
    name: str = "xylent"
    seed: int = Field(default=0, ge=0, lt=2**32, description="every random choice derives from it (SentencePiece "
                      "takes 32 bits)")
    workspace: str | None = Field(default=None, description="default workspace; --workspace overrides")
    languages: list[str] = Field(min_length=1)
    sources: list[Source] = Field(min_length=1)
    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    download: DownloadConfig = Field(default_factory=DownloadConfig)
    prepare: PrepareConfig = Field(default_factory=PrepareConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    vocab: VocabConfig = Field(default_factory=VocabConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    shards: ShardsConfig = Field(default_factory=ShardsConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)

    # where relative paths in the spec are resolved (the spec file's folder)
    base_dir: str = Field(default=".", exclude=True)

    @field_validator("languages")
    @classmethod
    def _langs(cls, v):
        for code in v:
            check_language(code, where="spec field 'languages'")
        if len(set(v)) != len(v):
            raise ValueError("'languages' lists a language twice")
        return v

    @model_validator(mode="after")
    def _registered_name(self):
        if self.pretrain.register_name is None:  # the default, xylent-<name>: the name must make a valid one
            registrable(f"xylent-{self.name}", "the spec's name (registered as xylent-<name>; or set "
                                               "pretrain.register_name)")
        return self

    @model_validator(mode="after")
    def _attention(self):
        why = OBJECTIVES[self.pretrain.objective].no_relative_bias
        if why and self.model.relative_bias is not False:
            raise ValueError(f"objective {self.pretrain.objective} {why}: set model.relative_bias: false")
        if self.model.generator_output == "untied" and self.pretrain.objective != "electra":
            raise ValueError(f"model.generator_output: untied is ELECTRA's generator (objective electra); objective "
                             f"{self.pretrain.objective} has none to untie: remove it")
        return self

    @model_validator(mode="after")
    def _sources(self):
        names = [s.name for s in self.sources]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"source names must be unique; repeated: {sorted(dup)}")
        known = set(self.languages)
        for s in self.sources:
            declared = list(getattr(s, "languages", None) or [])
            if getattr(s, "lang", None):
                declared.append(s.lang)
            for p in ([s.pair] if getattr(s, "pair", None) else []) + list(getattr(s, "pairs", None) or []):
                declared.extend(p.split("-"))
            for code in declared:
                check_language(code, where=f"source {s.name!r}")
                if code not in known:
                    raise ValueError(
                        f"source {s.name!r} uses language {code!r}, which is not in the spec's 'languages'; "
                        "add it there or remove it from the source"
                    )
        return self

    @model_validator(mode="after")
    def _evaluate(self):
        known = set(self.languages)
        holdouts = {s.name for s in self.sources if getattr(s, "holdout", None)}
        for t in self.evaluate.tasks:
            for code in t.languages:
                if code not in known:
                    raise ValueError(f"evaluate task {t.name!r} uses language {code!r}, which is not in the spec's "
                                     "'languages'")
            if t.format == "holdout" and t.source not in holdouts:
                raise ValueError(f"evaluate task {t.name!r} reads the holdout of source {t.source!r}, but no gettext "
                                 f"source of that name reserves one; sources with a holdout: {sorted(holdouts)}")
        return self

    @model_validator(mode="after")
    def _audit_baseline(self):
        # the partner default runs a second pass over the pairs, which under InfoXLM would feed XLCo's key queue:
        # left unset there, the audit measures `larger`; set, so a dumped spec reloads to the same run
        # (only for the excess pair loss: the others read no baseline, and an unread value moves no fingerprint)
        if ("baseline" not in self.audit.model_fields_set and self.pretrain.objective == "infoxlm"
                and self.audit.pair_loss == "excess"):
            self.audit.baseline = "larger"
        return self

    def source_languages(self, source) -> list[str]:
        return list(getattr(source, "languages", None) or self.languages)

    def resolve_path(self, p: str) -> Path:
        path = Path(p).expanduser()
        return path if path.is_absolute() else (Path(self.base_dir) / path).resolve()

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        """The effective spec as YAML, every section and default, a URL's password or token masked
        (what a registered model carries beside it)."""
        import yaml

        from xylent.redact import redact

        return yaml.safe_dump(redact(self.dump()), sort_keys=False, allow_unicode=True)
