"""The acceptance tier (`make acceptance`): the claims that need full-size training.
Each test asserts its claim, then records its figures (tests/acceptance/claims.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conftest import ROOT, costs, run_pipeline
from tests.acceptance import claims

DEMO = ROOT / "data_specs" / "demo.yaml"


@pytest.fixture(scope="session", autouse=True)
def code_at_start():
    claims.snapshot()


@pytest.fixture(scope="session")
@costs(deepspeed=2)  # pretrain and audit, one rank each
def demo_full(tmp_path_factory, prefect_server):
    """``make demo`` as shipped (data_specs/demo.yaml unchanged): (its --json, workspace, seconds)."""
    ws = (claims.kept_folder("demo-full") or tmp_path_factory.mktemp("demo-full")) / "ws"
    start = time.monotonic()
    res = run_pipeline(DEMO, ws)
    return res, Path(ws), time.monotonic() - start
