"""prefect.yaml deploys for real against the test Prefect server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from prefect.client.orchestration import get_client

from flows.registry import STAGE_NAMES

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
            deployments = await client.read_deployments()
            flows = {d.flow_id: (await client.read_flow(d.flow_id)).name for d in deployments}
            return deployments, flows

    found, flow_names = asyncio.run(read())
    deployments = {d.name: d for d in found}
    assert {"pipeline-demo", *STAGE_NAMES} <= set(deployments)
    for want in decl["deployments"]:
        got = deployments[want["name"]]
        function = want["entrypoint"].split(":")[1]
        assert got.entrypoint == want["entrypoint"] and flow_names[got.flow_id] == function, want["name"]
        assert got.work_pool_name == "xylent" and sorted(got.tags) == sorted(want["tags"])
        assert got.parameters == {"spec_file": "data_specs/demo.yaml", "workspace": "workspace"}
        flow_params = set(got.parameter_openapi_schema["properties"])
        assert {"spec_file", "workspace", "overrides", "force"} <= flow_params, "the UI's form is the flow's signature"
        assert got.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}], \
            "a worker runs the flows from the repository (XYLENT_HOME)"
    assert "gpu" in deployments["pretrain"].tags
    pipe = deployments["pipeline-demo"]
    (schedule,) = pipe.schedules
    assert schedule.schedule.cron == "0 3 * * *" and schedule.schedule.timezone == "UTC"
    assert schedule.active is False, "declared off: enabled from the UI"
    assert all(not deployments[name].schedules for name in STAGE_NAMES)
