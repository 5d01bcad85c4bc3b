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
    max_file_bytes: int | None = Field(default=1 << 38, gt=0, description="a file larger than this stops with an "
                                       "error (256 GiB: CC-100's largest file is 82 GB); null: no cap")
    min_free_bytes: int = Field(default=1 << 30, ge=0, description="a download stops with an error before the "
                                "disk's free space drops below this (1 GiB), its bytes kept to resume; 0: no check")
    chunk_bytes: int = Field(default=1 << 20, gt=0)
