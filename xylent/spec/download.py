"""The ``download`` section."""

from __future__ import annotations

from pydantic import Field

from xylent.spec.base import Strict


class DownloadConfig(Strict):
    concurrency: int = Field(default=4, gt=0)
    retries: int = Field(default=5, ge=0)
    backoff_s: float = Field(default=0.5, ge=0)
    timeout_s: float = Field(default=60.0, gt=0, description="per connect and per read: a server silent this long "
                             "is a failed attempt (retried)")
    total_timeout_s: float | None = Field(default=None, gt=0, description="a whole file, all attempts together: "
                                          "a slower download stops with an error (its bytes are kept to resume)")
    chunk_bytes: int = Field(default=1 << 20, gt=0)
