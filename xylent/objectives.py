"""The pretraining objectives (``pretrain.objective``), declared once: what the spec offers
and checks, whether an objective has a section of knobs (``pretrain.<name>``, a class in
xylent/spec/pretrain.py), and the model class the trainer builds (a
xylent.models.objective.ObjectiveModel, imported only where it trains).  Adding an objective is an
entry here, its section if it has knobs, its module under models/ and a test:
docs/architecture.md, "How to add an objective".

Plain data, no pydantic or torch: the CLI checks a spec with it and every training rank
builds its model from it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Objective:
    name: str
    summary: str                        # one line for pretrain.objective's description
    model: str                          # "module:Class", an ObjectiveModel
    has_section: bool = False           # knobs of its own: the PretrainConfig field of its name
    needs_pairs: str | None = None      # what of it learns from translation pairs (TRTD rows); None: nothing
    no_zero3: str | None = None         # what of it ZeRO-3's partitioned parameters cannot serve; None: nothing
    no_relative_bias: str | None = None  # why it cannot take XLM-E's relative bias (model.relative_bias); None: it can
    family: str = "mlm"                 # whose retrieval layer its encoder is read at: "electra" (XLM-E) or "mlm" (XLM-R)


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("electra", "XLM-E generator + discriminator", "xylent.models.electra:ElectraModel", family="electra"),
    Objective("mlm", "the MLM/TLM ablation", "xylent.models.electra:MaskedLMModel"),
    Objective("infoxlm", "MMLM + TLM + XLCo contrast", "xylent.models.infoxlm:InfoXLMModel", has_section=True,
              needs_pairs="XLCo and TLM", no_zero3="keeps a momentum copy of the encoder"),
    Objective("veco", "MLM + cross-attention MLM (plug-in/plug-out)", "xylent.models.veco:VecoModel", has_section=True,
              needs_pairs="cross-attention MLM"),
    Objective("transformers-electra", "transformers' ELECTRA, the reference peer (model.relative_bias false)",
              "xylent.models.transformers_electra:TransformersElectraModel", family="electra",
              no_relative_bias="trains transformers' ELECTRA, whose attention has no relative position bias"),
)}


def with_section() -> tuple[str, ...]:
    """The objectives with knobs of their own: each is the name of a PretrainConfig field."""
    return tuple(o.name for o in OBJECTIVES.values() if o.has_section)
