"""The pretraining objectives by name (``pretrain.objective``): one place that
builds a model from a train.json, for the trainer and for the export."""

from __future__ import annotations

from torch import nn

from models.config import EncoderConfig

OBJECTIVES = ("electra", "mlm", "infoxlm", "veco")


def build_model(objective: str, cfg: EncoderConfig, disc_weight: float = 50.0, mask_prob: float = 0.15,
                options: dict | None = None) -> nn.Module:
    """``options``: the objective's own section of the spec (``pretrain.<objective>``), whole: a
    train.json's ``objective_options`` (infoxlm and veco need it)."""
    from models.electra import ElectraModel, MaskedLMModel

    if objective in ("infoxlm", "veco") and not options:
        raise ValueError(f"objective {objective} needs its options (train.json's objective_options, the spec's "
                         f"pretrain.{objective} section whole)")
    if objective == "electra":
        return ElectraModel(cfg, disc_weight, mask_prob)
    if objective == "mlm":
        return MaskedLMModel(cfg, mask_prob)
    if objective == "infoxlm":
        from models.infoxlm import InfoXLMModel, XLCoConfig

        return InfoXLMModel(cfg, mask_prob, xlco=XLCoConfig(**options))
    if objective == "veco":
        from models.veco import VecoOptions, VecoModel

        return VecoModel(cfg, mask_prob, VecoOptions(**options))
    raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
