"""The ``download`` section."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from xylent.spec.base import Strict


class DownloadConfig(Strict):
    # how to fetch, never what: a file's identity is its URL and checksum (tasks/download/identity.py)
    OPERATIONAL: ClassVar[tuple[str, ...]] = ("concurrency", "retries", "backoff_s", "timeout_s", "silent_attempts",
                                              "total_timeout_s", "max_file_bytes", "min_free_bytes", "chunk_bytes")

    concurrency: int = Field(default=4, gt=0)
    retries: int = Field(default=5, ge=0, le=1000)
    backoff_s: float = Field(default=0.5, ge=0, le=3600)
    timeout_s: float = Field(default=15.0, gt=0, le=86400, description="per connect and per read: a server silent "
                             "this long is a failed attempt (retried)")
    silent_attempts: int = Field(default=2, gt=0, description="attempts in a row in which the server sent no byte of "
                                 "the file before the download is abandoned (a server that accepts and never answers "
                                 "costs this many timeouts, not retries + 1)")
    total_timeout_s: float | None = Field(default=None, gt=0, le=1e9, description="a whole file, all attempts together: "
                                          "a slower download stops with an error (its bytes are kept to resume)")
    max_file_bytes: int | None = Field(default=1 << 38, gt=0, description="a file larger than this stops with an "
                                       "error (256 GiB: CC-100's largest file is 82 GB); null: no cap")
    min_free_bytes: int = Field(default=1 << 30, ge=0, description="a download stops with an error before the "
                                "disk's free space drops below this (1 GiB), its bytes kept to resume; 0: no check")
    chunk_bytes: int = Field(default=1 << 20, gt=0)
