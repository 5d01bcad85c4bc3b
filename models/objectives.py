"""The pretraining objectives by name (``pretrain.objective``): one place that builds a model
from a train.json, for the trainer and for the export.  Which objectives exist, and which class
each trains, is declared in xylent.objectives; the classes keep xylent.models.objective's contract."""

from __future__ import annotations

import importlib

from xylent.models.config import EncoderConfig
from xylent.models.objective import ObjectiveModel
from xylent.objectives import OBJECTIVES


def model_class(objective: str) -> type[ObjectiveModel]:
    declared = OBJECTIVES.get(objective)
    if declared is None:
        raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    module, _, name = declared.model.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if not issubclass(cls, ObjectiveModel):
        raise TypeError(f"objective {objective}'s model {declared.model} is not a xylent.models.objective.ObjectiveModel")
    return cls


def build_model(objective: str, cfg: EncoderConfig, disc_weight: float = 50.0, mask_prob: float = 0.15,
                options: dict | None = None) -> ObjectiveModel:
    """``options``: the objective's own section of the spec (``pretrain.<objective>``), whole: a
    train.json's ``objective_options``; required of an objective that has a section."""
    cls = model_class(objective)
    if OBJECTIVES[objective].has_section and not options:
        raise ValueError(f"objective {objective} needs its options (train.json's objective_options, the spec's "
                         f"pretrain.{objective} section whole)")
    return cls.from_options(cfg, disc_weight, mask_prob, options or {})
