"""prefect.yaml deploys for real against the test Prefect server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from prefect.client.orchestration import get_client

from xylent.stages import STAGE_NAMES

ROOT = Path(__file__).resolve().parents[1]


def test_prefect_yaml_declares_every_stage_and_deploys(prefect_server):
    decl = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    entry = {d["entrypoint"].split(":")[1] for d in decl["deployments"]}
    assert entry == set(STAGE_NAMES) | {"pipeline"}
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "XYLENT_HOME": str(ROOT)}
    prefect = Path(sys.executable).with_name("prefect")
    subprocess.run([prefect, "work-pool", "create", "xylent", "--type", "process"], cwd=ROOT, env=env,
                   check=False, capture_output=True)
    done = subprocess.run([prefect, "--no-prompt", "deploy", "--all"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    import asyncio

    async def read():
        async with get_client() as client:
            return await client.read_deployments()

    deployments = {d.name: d for d in asyncio.run(read())}
    assert {"pipeline-demo", *STAGE_NAMES} <= set(deployments)
    pipe = deployments["pipeline-demo"]
    assert pipe.parameters["spec_file"] == "data_specs/demo.yaml"
    assert pipe.schedules and pipe.schedules[0].schedule.cron == "0 3 * * *"
