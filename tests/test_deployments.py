"""prefect.yaml deploys for real against the test Prefect server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client

from xylent.flows.registry import STAGE_NAMES

ROOT = Path(__file__).resolve().parents[1]


ENTRYPOINT = ROOT / "infra" / "docker" / "entrypoint.sh"
BIN_PATH = f"{Path(sys.executable).parent}:{os.environ['PATH']}"


@pytest.fixture(scope="module")
def deployed(prefect_server):
    # as compose's one-shot `deploy` service does it: the image's entrypoint creates the pool and deploys
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "XYLENT_HOME": str(ROOT), "PATH": BIN_PATH}
    done = subprocess.run([ENTRYPOINT, "deploy"], cwd="/", env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return prefect_server


def test_prefect_yaml_declares_every_stage_and_deploys(deployed):
    decl = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    entry = {d["entrypoint"].split(":")[1] for d in decl["deployments"]}
    assert entry == set(STAGE_NAMES) | {"pipeline"}

    import asyncio

    async def read():
        async with get_client() as client:
            deployments = await client.read_deployments()
            flows = {d.flow_id: (await client.read_flow(d.flow_id)).name for d in deployments}
            return deployments, flows

    found, flow_names = asyncio.run(read())
    deployments = {d.name: d for d in found}
    assert {"pipeline-demo", "data-refresh-demo", "evaluate-weekly-demo", *STAGE_NAMES} <= set(deployments)
    for want in decl["deployments"]:
        got = deployments[want["name"]]
        function = want["entrypoint"].split(":")[1]
        assert got.entrypoint == want["entrypoint"] and flow_names[got.flow_id] == function, want["name"]
        assert got.work_pool_name == "xylent" and sorted(got.tags) == sorted(want["tags"])
        assert got.parameters == want["parameters"]
        flow_params = set(got.parameter_openapi_schema["properties"])
        assert {"spec_file", "workspace", "overrides", "force"} <= flow_params, "the UI's form is the flow's signature"
        assert not {p for p in flow_params if "mlflow" in p}, "no internal parameter on the run form"
        assert got.pull_steps == [{"xylent.flows.kit.deployment_steps.enter_xylent_home": {}}], \
            "nothing of the deploying machine is stored: the worker's XYLENT_HOME is read when a run starts"
    assert "gpu" in deployments["pretrain"].tags
    crons = {name: [(s.schedule.cron, s.schedule.timezone, s.active) for s in d.schedules]
             for name, d in deployments.items() if d.schedules}
    assert crons == {"data-refresh-demo": [("0 3 * * *", "UTC", False)],
                     "evaluate-weekly-demo": [("0 6 * * 0", "UTC", False)]}, "declared off: enabled from the UI"
    assert deployments["data-refresh-demo"].parameters["until"] == "shards"


def test_a_worker_elsewhere_runs_deployments_and_two_runs_on_one_workspace_queue(deployed, http_corpus, tmp_path):
    """The worker starts in an unrelated folder with its own XYLENT_HOME; two runs of
    the download deployment on one workspace overlap in time, and both complete."""
    import asyncio

    from prefect.deployments import run_deployment

    from conftest import write_spec

    http_corpus.files["/slow/en.txt"] = "".join(f"line {i} of a slow corpus\n" for i in range(1500)).encode()
    # ~16 s: the second run arrives while the first holds the workspace, even when a loaded machine starts the
    # two flow runs seconds apart (at ~5 s, CI once saw the later run begin after the first had let go)
    http_corpus.slow["/slow/en.txt"] = 2500
    ws = tmp_path / "shared-ws"
    runs = []
    for n in (1, 2):
        spec = write_spec(tmp_path / f"spec{n}.yaml", {"name": f"queue{n}", "languages": ["en"], "sources": [
            {"name": f"web{n}", "kind": "url", "format": "text", "lang": "en", "url": f"{http_corpus.base}/slow/en.txt"}]})
        runs.append(run_deployment("download/download", parameters={"spec_file": str(spec), "workspace": str(ws)},
                                   timeout=0))
    # a workspace the worker cannot make: the run fails with the error in one line, no traceback
    bad = run_deployment("download/download", parameters={"spec_file": str(spec), "workspace": "/proc/forbidden"},
                         timeout=0)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PREFECT_API_URL": deployed, "XYLENT_HOME": str(ROOT), "PATH": BIN_PATH,
           "PREFECT_LOGGING_LEVEL": "INFO"}  # the runs' info lines reach the API (the session's level is WARNING)
    worker = subprocess.Popen([ENTRYPOINT, "worker", "--limit", "2"], cwd=elsewhere,  # as compose's worker starts
                              env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "worker.log").open("w"))
    try:
        async def states():
            async with get_client() as client:
                return [await client.read_flow_run(r.id) for r in (*runs, bad)]

        deadline = time.time() + 400
        while time.time() < deadline:
            done = asyncio.run(states())
            if all(r.state.is_final() for r in done):
                break
            time.sleep(2)
        # the engine may log after a run's final state: let the runs' processes end before the log is read
        _wait_for_children_to_end(worker.pid, 60)
    finally:
        worker.terminate()
        worker.wait(30)
    log = (tmp_path / "worker.log").read_text()
    *done, refused = done
    assert [r.state.type.value for r in done] == ["COMPLETED", "COMPLETED"], log[-4000:]
    assert refused.state.type.value == "FAILED", log[-4000:]
    message = refused.state.message
    assert "the workspace cannot be made or written here" in message and "/proc/forbidden" in message, message
    assert "\n" not in message and "Traceback" not in message, message
    assert "Traceback" not in log and "ERROR" not in log.replace("ERROR   | Flow run", ""), \
        "the worker's log has the refused run's error, once, and nothing else at ERROR: " + log[-4000:]
    told = [line for line in log.splitlines() if "the workspace cannot be made or written here" in line]
    assert len(told) == 2 and "| ERROR   |" in told[0] and "Finished in state Failed(" in told[1], \
        "the error once at ERROR, then as the run's final state: " + log[-4000:]
    first, second = sorted(done, key=lambda r: r.start_time)
    assert second.start_time < first.end_time, "they overlapped, so the second had to wait for the workspace"
    assert len(list(ws.glob("download/*/_manifest.json"))) == 2, "each run's output published"

    async def messages(run_id):
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

        async with get_client() as client:
            return " ".join(x.message for x in await client.read_logs(LogFilter(
                flow_run_id=LogFilterFlowRunId(any_=[run_id]))))

    # the run that waited is the one that lost the race for the slot, not always the one Prefect started second
    said = [asyncio.run(messages(r.id)) for r in done]
    waited = [text for text in said if "another run holds it" in text]
    assert len(waited) == 1, f"one run waited and said so; a free workspace is taken without a word: {said}"
    assert "got the workspace" in waited[0], waited
    assert sum("got the workspace" in text for text in said) == 1, f"the run with a free slot waited for none: {said}"


@pytest.mark.costs(cli=4)
def test_xylent_worker_says_in_one_line_what_is_missing_then_is_prefects_worker(prefect_server, tmp_path):
    """`prefect worker start` without PREFECT_API_URL prints a traceback; `xylent worker` says so in
    one line, names a server that does not answer, and otherwise becomes Prefect's worker. (In
    subprocesses: this process's Prefect settings hold the test server, and the worker execs.)"""
    bare = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    bare.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PATH=BIN_PATH)  # no profile names a server

    def worker(*args, **env):
        return subprocess.run([sys.executable, "-m", "xylent.cli", "worker", *args], cwd=tmp_path,
                              env={**bare, **env}, capture_output=True, text=True, timeout=180)

    done = worker()
    assert done.returncode == 2 and "PREFECT_API_URL is not set" in done.stderr and "Traceback" not in done.stderr
    done = worker(PREFECT_API_URL="http://127.0.0.1:1/api")
    assert done.returncode == 2 and "does not answer" in done.stderr and "http://127.0.0.1:1/api" in done.stderr
    done = worker("--pool", "xylent-once", "--run-once", PREFECT_API_URL=prefect_server)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "xylent-once" in done.stdout + done.stderr, "Prefect's worker ran on the pool it was given"

    # started as a script's background job is (`xylent worker &`: SIGINT ignored), it stops on SIGTERM in
    # seconds: Prefect's worker stops by sending itself SIGINT, and kept running for minutes
    log = tmp_path / "background.log"
    proc = subprocess.Popen([sys.executable, "-m", "xylent.cli", "worker", "--pool", "xylent-stop"], cwd=tmp_path,
                            env={**bare, "PREFECT_API_URL": prefect_server}, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 120
        while "started!" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "started!" in log.read_text(), log.read_text()[-2000:]
        asked = time.monotonic()
        proc.terminate()
        proc.wait(60)
        assert time.monotonic() - asked < 10, f"stopped {time.monotonic() - asked:.0f} s after SIGTERM"
    finally:
        proc.kill()
    assert "stopped!" in log.read_text(), log.read_text()[-2000:]


def _wait_for_children_to_end(pid: int, timeout: float) -> None:
    import psutil

    def running(p: psutil.Process) -> bool:
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.time() + timeout
    while time.time() < deadline and any(running(p) for p in psutil.Process(pid).children(recursive=True)):
        time.sleep(0.5)
