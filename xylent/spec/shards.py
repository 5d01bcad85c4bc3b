"""The ``shards`` section."""

from __future__ import annotations

from pydantic import Field

from xylent.spec.base import Strict


class ShardsConfig(Strict):
    seq_len: int = Field(default=512, ge=8, description="tokens per MRTD sequence and TRTD pair, specials included")
    shard_mb: int = Field(default=256, gt=0, description="maximum size of one Arrow shard")
