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
                       description="weight of the newest step in each pair's loss EMA (corrected for its start: "
                       "early on, a running mean). 0.003 spans ~330 steps: a pair's help is a loss difference "
                       "whose row-to-row spread is ~40 times its size on the planted corpus, so it needs ~1 000 "
                       "rows of the pair (docs/stages/audit.md)")
    pair_loss: Literal["paper", "electra", "excess"] = Field(
        default="excess", description="each pair's loss for the adversary, λ = pretrain.disc_weight: "
        "paper is XY-LENT's Eq. 3 as printed (L_D + λ·L_G); electra is the objective the model trains "
        "(XLM-E's L_G + λ·L_D); excess (default) is that loss minus audit.baseline: what "
        "neither the language's difficulty nor the translation explains (docs/stages/audit.md)")
    baseline: Literal["larger", "sides", "language", "partner", "partner-larger", "heldout",
                      "heldout-larger"] = Field(
        default="partner-larger", description="pair_loss excess: what each pair's loss is measured against. sides: the "
        "same loss of the pair's own two sentences run alone (the translation's help; a hub's memorised target "
        "reads as noisy); partner: the same tokens under the same masks, each sentence beside another row's "
        "translation of the same pair (the translation's help, paired token by token); language: the mean of "
        "its two languages' losses on their monolingual text (trivial pairs fall far below it, but it is too "
        "coarse to tell a noisy pair from a clean one); larger and partner-larger: sides (or partner) raised "
        "by how far the pair's loss sits below its languages' beyond the median pair's (hubs and copies go "
        "down by it); heldout and heldout-larger: partner and partner-larger measured on rows held out "
        "of the audit's training (audit.holdout), so a pairing the model memorised is not read as the "
        "translation's help. Default partner-larger: a row alone of its pair and direction in its micro-batch "
        "borrows the last such sentence seen. Left unset with pretrain.objective infoxlm, larger (a second pass "
        "over pairs would feed XLCo's key queue)")
    baseline_every: int | Literal["auto"] = Field(
        default="auto", description="pair_loss excess: every N steps, forward passes (no backward) for the "
        "baseline: each TRTD micro-batch's two sides alone (sides, larger) or its rows with swapped partners "
        "(partner, partner-larger), a batch of held-out rows as they are and swapped (heldout, heldout-larger), "
        "and a batch of monolingual sentences (language, larger, the -larger kinds). auto (default): the largest "
        "N whose baseline EMAs still average audit.baseline_rows rows of the median pair (1 on the demo and the "
        "planted corpus; large where a batch holds many rows of each pair); written resolved in train.json")
    baseline_rows: int = Field(default=3000, ge=1, description="baseline_every auto: the rows of the median pair "
                               "(under the sampling table) each baseline EMA averages at least (its effective "
                               "sample, (2 − a)/a measurements at rate a): the planted claim holds on 3 seeds "
                               "at ~3 100 (N = 1, 4.7 rows of its median pair a step) and was not measured below; "
                               "a pair's help spreads by ~13 from row to row on the tiny model: ±0.24 at 3 000")
    language_every: int = Field(default=1, ge=1, description="baseline language and the -larger kinds: the "
                                "monolingual sentences are measured on every Nth baseline step only (every N × "
                                "baseline_every steps); their EMA moves as far per measurement as audit.ema moves "
                                "in the TRTD steps between, so it spans as much of the run. Fewer samples cost less "
                                "and rank less surely: N = 4 broke the planted bar (docs/stages/audit.md)")
    holdout: float = Field(default=0.02, ge=0, lt=0.5, allow_inf_nan=False,
                           description="audit.baseline heldout, heldout-larger: the share of each pair's rows kept "
                           "out of the audit's training and measured instead (2 rows at least; a pair too small to "
                           "hold 2 out, with as many left, is not measured and keeps q = Q); a fixed split, the "
                           "same on every seed")
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
