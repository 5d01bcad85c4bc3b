"""The ``dedup`` section."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from xylent.spec.base import Strict


class DedupConfig(Strict):
    # monolingual, exact
    exact: bool = True
    exact_level: Literal["line", "document"] = Field(
        default="line", description="line: paragraphs seen before anywhere in the language are dropped (CCNet)")
    normalize: Literal["ccnet", "lower", "none"] = Field(
        default="ccnet", description="ccnet: lowercase, strip punctuation/symbols/digits, collapse spaces")
    # monolingual, near-duplicates (MinHash LSH)
    near: bool = True
    near_level: Literal["line", "document"] = "document"
    num_perm: int = Field(default=112, gt=0)
    bands: int = Field(default=14, gt=0)
    rows: int = Field(default=8, gt=0)
    threshold: float = Field(default=0.8, gt=0, le=1)
    ngram: int = Field(default=5, gt=0, description="word n-gram size of shingles")
    char_ngram: int = Field(default=5, gt=0, description="character n-gram size for char_languages")
    char_languages: list[str] = Field(
        default_factory=lambda: ["zh", "zh_Hant", "yue", "wuu", "ja", "th", "lo", "km", "my", "my_zaw", "bo", "dz"],
        description="languages written without spaces: character n-gram shingles")
    seed: int = 0
    buckets: int = Field(default=16, gt=0, description="hash partitions resolved independently")
    # bitext rules
    bitext_exact: bool = True
    copies: bool = True
    copy_threshold: float = Field(default=0.9, gt=0, le=1, description="character similarity of the two sides")
    length_ratio: bool = True
    max_length_ratio: float = Field(default=3.0, gt=1)
    length_unit: Literal["auto", "chars", "words"] = Field(
        default="auto", description="auto: characters for char_languages, words otherwise (as OpusFilter)")
    hubs: bool = True
    hub_min_partners: int = Field(default=5, gt=1, description="a sentence aligned to this many distinct others is a hub")
    langid: bool = Field(default=False, description="per-side language identification (lingua); needs the langid extra")
    langid_min_chars: int = Field(default=20, ge=0, description="shorter sides are not judged (too ambiguous)")
    langid_max_confidence: float = Field(
        default=0.05, gt=0, lt=1, description="a side is a mismatch when the detector gives its declared language "
        "less than this confidence (among the spec's languages)")
    samples_per_reason: int = Field(default=20, ge=0)

    @model_validator(mode="after")
    def _bands(self):
        if self.bands * self.rows > self.num_perm:
            raise ValueError(f"dedup: {self.bands} bands x {self.rows} rows needs num_perm >= {self.bands * self.rows}")
        return self
