"""How a spec runs, not what it computes: the task runner and the MLflow store."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from xylent.spec.base import Strict


class RunnerConfig(Strict):
    kind: Literal["threads", "processes", "dask", "ray"] = "threads"
    max_workers: int | None = Field(default=None, gt=0)
    address: str | None = Field(default=None, description="Dask scheduler / Ray cluster address")


class TrackingConfig(Strict):
    experiment: str = Field(default="xylent", min_length=1, pattern=r"\S", description="the MLflow experiment")
    tracking_uri: str | None = Field(
        default=None, description="default: $MLFLOW_TRACKING_URI, else sqlite:///<workspace>/mlflow.db"
    )
