"""The ``sampling`` section: language and pair sampling tables."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from xylent.errors import XylentError
from xylent.languages import check_language, pair_name, parse_pair
from xylent.spec.base import Strict


class SamplingConfig(Strict):
    ADDED_LATER: ClassVar[tuple[str, ...]] = ("exclude_pairs", "pivot")

    alpha: float = Field(default=0.7, gt=0, le=1, allow_inf_nan=False,
                         description="monolingual smoothing: p_j ∝ m_j^alpha")
    temperature: float = Field(default=5.0, gt=0, allow_inf_nan=False,
                               description="pair tables: target marginal a = p^(1/T)")
    pair_method: Literal["sinkhorn", "m2m", "smoothed"] = Field(
        default="sinkhorn", description="which pair table the data loader follows (column p): sinkhorn (XY-LENT "
        "Eq. 2) and m2m (M2M-100's LP) target a = p^(1/temperature); smoothed is p_pair ∝ n_pair^pair_alpha")
    pair_alpha: float = Field(default=0.7, gt=0, le=1, allow_inf_nan=False,
                              description="smoothed method: p_pair ∝ n_pair^pair_alpha")
    eps: float = Field(default=0.0, ge=0, allow_inf_nan=False,
                       description="0: empty pairs are structural zeros; > 0: the paper's -log(Q + eps)")
    bitext_budget: int = Field(default=1_000_000, gt=0,
                               description="sentence pairs drawn over training, for epochs and wastage")
    max_iter: int = Field(default=100_000, gt=0)
    exclude_pairs: list[str] = Field(
        default_factory=list, description="pairs given no probability (e.g. the audit's most up-weighted): "
        "the tables are built as if they had no data")
    pivot: str | None = Field(default=None, description="keep only the pairs with this language (e.g. en: the EN-X "
                              "only ablation of XY-LENT's X-Y bitexts); the others get probability 0")

    @field_validator("pair_method", mode="before")
    @classmethod
    def _renamed(cls, v):
        if v == "temperature":  # its old name: it never read sampling.temperature
            raise ValueError("pair_method 'temperature' is now called 'smoothed' (p_pair ∝ n_pair^pair_alpha; "
                             "it never read sampling.temperature): write pair_method: smoothed")
        return v

    @field_validator("pivot")
    @classmethod
    def _pivot(cls, v):
        if v is not None:
            try:
                check_language(v, where="spec field sampling.pivot")
            except XylentError as exc:  # reported with the field's path, like every spec error
                raise ValueError(f"{exc.what}; {exc.fix}") from None
        return v

    @field_validator("exclude_pairs")
    @classmethod
    def _pairs(cls, v):
        out = []
        for p in v:
            try:
                a, b = parse_pair(p, where="spec field sampling.exclude_pairs")
            except XylentError as exc:  # reported with the field's path, like every spec error
                raise ValueError(f"{exc.what}; {exc.fix}") from None
            out.append(pair_name(a, b))
        if len(set(out)) != len(out):
            raise ValueError("sampling.exclude_pairs lists a pair twice")
        return out
