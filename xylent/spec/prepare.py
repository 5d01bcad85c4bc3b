"""The ``prepare`` section."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from xylent.spec.base import Strict


class PrepareConfig(Strict):
    normalization: Literal["NFC", "NFKC", "none"] = "NFC"
    strip_control: bool = True
    min_chars: int = Field(default=1, ge=0, description="drop segments shorter than this (after cleaning)")
    max_chars: int = Field(default=20000, gt=0, description="drop segments longer than this")
    part_rows: int = Field(default=500_000, gt=0, description="rows per output Parquet part")
    max_malformed_rate: float = Field(default=0.5, ge=0, le=1, description="tsv bitext: a file with a larger "
                                      "share of lines that are not 'src<TAB>tgt' is an error, not a silent drop")
    max_member_bytes: int | None = Field(default=None, gt=0, description="moses zip: a member that expands past "
                                         "this many bytes is refused before it is read (a zip bomb's guard)")

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("max_malformed_rate", "max_member_bytes")

    @model_validator(mode="after")
    def _bounds(self):
        if self.min_chars > self.max_chars:
            raise ValueError(f"prepare.min_chars ({self.min_chars}) is above prepare.max_chars ({self.max_chars}): "
                             "every segment would be dropped")
        return self
