"""The run specification: pydantic models loaded from YAML, one module per section.

Every field can be overridden from the CLI with ``--set dotted.path=value``
(the value is parsed as YAML, so ``--set sources.0.max_lines=1000`` and
``--set languages=[en,de]`` both work).  Unknown keys are errors.

``base`` (``Strict``), ``sources``, ``runtime`` (runner, tracking), one module per
stage section (``download`` ... ``evaluate``), ``root`` (``Spec``, the checks that span
sections) and ``loading`` (YAML, ``extends:``, ``--set``, errors).  Everything is
importable from here: ``from xylent.spec import Spec, load_spec``.
"""

from __future__ import annotations

from xylent.spec.audit import AuditConfig
from xylent.spec.base import Strict
from xylent.spec.dedup import DedupConfig
from xylent.spec.download import DownloadConfig
from xylent.spec.evaluate import (
    FINETUNED,
    FORMATS,
    HPARAMS_FILE,
    RETRIEVAL,
    XTREME_TASKS,
    EvalModel,
    EvalTask,
    EvaluateConfig,
    FineTune,
    ModelRef,
    hparams_table,
)
from xylent.spec.loading import apply_override, load_spec, spec_from_dict
from xylent.spec.prepare import PrepareConfig
from xylent.spec.pretrain import (
    DEFAULT_CLIP,
    DEFAULT_LR,
    REGISTRY_URI,
    InfoXLMConfig,
    InitConfig,
    ModelConfig,
    PretrainConfig,
    VecoConfig,
)
from xylent.spec.root import Spec
from xylent.spec.runtime import RunnerConfig, TrackingConfig
from xylent.spec.sampling import SamplingConfig
from xylent.spec.shards import ShardsConfig
from xylent.spec.sources import (
    Cc100Source,
    FileFormat,
    GettextSource,
    HoldoutConfig,
    LocalSource,
    OpusSource,
    Source,
    SourceBase,
    SourceName,
    UrlSource,
)
from xylent.spec.vocab import VocabConfig

__all__ = [
    "Strict", "SourceName", "FileFormat", "SourceBase", "Cc100Source", "OpusSource", "UrlSource", "LocalSource",
    "HoldoutConfig", "GettextSource", "Source", "RunnerConfig", "TrackingConfig", "DownloadConfig", "PrepareConfig",
    "DedupConfig", "VocabConfig", "SamplingConfig", "ShardsConfig", "ModelConfig", "DEFAULT_LR", "DEFAULT_CLIP",
    "InfoXLMConfig", "REGISTRY_URI", "InitConfig", "VecoConfig", "PretrainConfig", "AuditConfig", "ModelRef",
    "EvalModel", "RETRIEVAL", "FINETUNED", "FORMATS", "XTREME_TASKS", "HPARAMS_FILE", "hparams_table", "FineTune",
    "EvalTask", "EvaluateConfig", "Spec", "apply_override", "spec_from_dict", "load_spec",
]
