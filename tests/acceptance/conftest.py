"""The acceptance tier (`make acceptance`): the claims that need full-size training.
Each test asserts its claim, then records its figures (tests/acceptance/claims.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conftest import ROOT, run_pipeline

DEMO = ROOT / "data_specs" / "demo.yaml"


@pytest.fixture(scope="session")
def demo_full(tmp_path_factory, prefect_server):
    """``make demo`` as shipped (data_specs/demo.yaml unchanged): (its --json, workspace, seconds)."""
    ws = tmp_path_factory.mktemp("demo-full") / "ws"
    start = time.monotonic()
    res = run_pipeline(DEMO, ws)
    return res, Path(ws), time.monotonic() - start
