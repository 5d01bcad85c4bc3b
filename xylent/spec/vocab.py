"""The ``vocab`` section (VoCAP)."""

from __future__ import annotations

from pydantic import Field, field_validator

from xylent.spec.base import Strict


class VocabConfig(Strict):
    grid: list[int] = Field(default_factory=lambda: list(range(1000, 50001, 1000)), min_length=1,
                            description="per-language vocabulary sizes (the reference: 1k..50k step 1k)")
    budget: int = Field(default=500_000, gt=0, description="pieces in the union of the chosen vocabularies")
    alpha: float = Field(default=0.7, gt=0, le=1, description="q_i ∝ m_i^alpha over the languages' sentence counts")
    beta: float = Field(default=0.7, gt=0, description="language weights q_i^beta")
    character_coverage: float = Field(default=0.9995, gt=0, le=1)
    input_sentence_size: int = Field(default=1_000_000, gt=0, description="sentences sampled per model")
    held_sentences: int = Field(default=10_000, gt=0, description="held-out sentences for ALP (at most)")
    held_fraction: float = Field(default=0.1, gt=0, lt=1, description="... and at most this share of a language")
    byte_fallback: bool = True
    threads_per_model: int = Field(default=1, gt=0, description="SentencePiece trainer threads per model")
    joint_baseline: bool = True

    @field_validator("grid")
    @classmethod
    def _grid(cls, v):
        if sorted(set(v)) != v or v[0] <= 0:
            raise ValueError("vocab.grid must be strictly increasing positive sizes")
        return v
