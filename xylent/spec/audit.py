"""The ``audit`` section of the spec: the DRO bitext audit (XY-LENT §6.6).

Other tools read these names (``audit.steps``, ``resamples``, ``rho``,
``min_ratio``, ``ema``, ``top_n``, ``init``); keep them stable.  Defaults for ρ
and the floor are the reference code's (fairseq-dro-mnmt), K = 10 is the paper's.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from xylent.spec.base import Strict


class AuditConfig(Strict):
    """Train under a χ² DRO adversary over the TRTD language pairs and rank the
    pairs by how much it up-weights them (w = q/Q)."""

    OPERATIONAL: ClassVar[tuple[str, ...]] = ("top_n", "exclude_top_up")
    ADDED_LATER: ClassVar[tuple[str, ...]] = ("baseline_every", "baseline", "holdout", "language_every",
                                              "baseline_rows")

    init: Literal["scratch", "pretrain"] = Field(
        default="scratch", description="scratch: train a fresh model with the pretrain settings; pretrain: start "
        "from the pretrain stage's final weights (the audit then runs after pretrain)")
    steps: int | None = Field(default=None, gt=0, description="optimizer steps of the audit run; default pretrain.steps")
    resamples: int = Field(default=10, ge=1, description="K: best-response re-samplings spread evenly over the run")
    rho: float = Field(default=0.05, gt=0, allow_inf_nan=False,
                       description="χ² ball radius: ½ Σ Q (q/Q − 1)² ≤ rho")
    min_ratio: float = Field(default=0.2, ge=0, lt=1, allow_inf_nan=False,
                             description="floor on q/Q: no pair is sampled less than this share of its prior")
    ema: float = Field(default=0.003, gt=0, le=1, allow_inf_nan=False,
                       description="weight of the newest step in each pair's loss EMA (corrected for its start); "
                       "0.003 spans ~330 steps. docs/spec.md#audit")
    pair_loss: Literal["paper", "electra", "excess"] = Field(
        default="excess", description="each pair's loss for the adversary: paper (XY-LENT Eq. 3 as printed), electra "
        "(the trained objective) or excess (default: that loss minus audit.baseline). docs/spec.md#audit")
    baseline: Literal["larger", "sides", "language", "partner", "partner-larger", "heldout",
                      "heldout-larger"] = Field(
        default="partner-larger", description="pair_loss excess: what each pair's loss is measured against "
        "(sides, partner, language, held-out rows, or the -larger kinds raised by the pair's shortfall below its "
        "languages). docs/spec.md#audit and docs/stages/audit.md say what each reads and why the default")
    baseline_every: int | Literal["auto"] = Field(
        default="auto", description="pair_loss excess: measure the baseline every N steps (forward passes only); "
        "auto: the largest N whose EMAs still average audit.baseline_rows rows of the median pair. docs/spec.md#audit")
    baseline_rows: int = Field(default=3000, ge=1, description="baseline_every auto: the rows of the median pair "
                               "each baseline EMA averages at least (the planted claim holds at ~3 100). "
                               "docs/stages/audit.md")
    language_every: int = Field(default=1, ge=1, description="baseline language and the -larger kinds: measure "
                                "the monolingual sentences on every Nth baseline step only. docs/spec.md#audit")
    holdout: float = Field(default=0.02, ge=0, lt=0.5, allow_inf_nan=False,
                           description="audit.baseline heldout, heldout-larger: the share of each pair's rows "
                           "kept out of the audit's training and measured instead (a fixed split). docs/spec.md#audit")
    top_n: int = Field(default=10, ge=1, description="pairs shown in the report at each end of the ranking")
    exclude_top_up: int = Field(default=0, ge=0, description="list the N most up-weighted pairs as a ready-to-run "
                                "sampling.exclude_pairs override in the report (the audit never edits your spec)")

    def unread_fields(self) -> set[str]:
        """audit.holdout is read by the held-out baselines only, audit.language_every by the kinds that
        measure languages, audit.baseline_rows by baseline_every auto: elsewhere they move no fingerprint."""
        excess = self.pair_loss == "excess"
        return ({"baseline_rows"} if not (excess and self.baseline_every == "auto") else set()) | \
            ({"holdout"} if not (excess and self.baseline in ("heldout", "heldout-larger")) else set()) | \
            ({"language_every"} if not (excess and (self.baseline == "language" or self.baseline.endswith("larger")))
             else set())

    @field_validator("baseline_every", mode="before")
    @classmethod
    def _every(cls, v):
        if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            return v
        raise ValueError(f"write a whole number of steps ≥ 1, or auto, not {v!r}")

    @field_validator("pair_loss", mode="before")
    @classmethod
    def _renamed(cls, v):
        new = {"d_plus_lambda_g": "paper", "g_plus_lambda_d": "electra"}.get(v)
        if new:  # the names before 2026-11-27
            raise ValueError(f"pair_loss {v!r} is now called {new!r}: write pair_loss: {new}")
        return v
