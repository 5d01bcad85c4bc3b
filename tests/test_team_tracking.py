"""A team's MLflow: a real `mlflow server --serve-artifacts` (started by the image's
entrypoint, infra/docker/entrypoint.sh, as compose starts it) on every address of this
machine, reached by this machine's host name as a team reaches theirs, and two pretrain
runs that differ by one upstream knob, compared as a user would in its UI ("show diff only")."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from conftest import linked_data
from cost_guard import costs

pytestmark = pytest.mark.demo_data  # reads the session demo only (pyproject.toml's markers)

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data_specs" / "demo.yaml"
TINY = ["--set", "pretrain.steps=10", "--set", "pretrain.checkpoint_every=10", "--set", "pretrain.batch_size=16",
        "--set", "pretrain.trtd_max_tokens=1024", "--set", "pretrain.warmup_steps=2", "--set", "pretrain.log_every=5",
        "--set", "pretrain.system_metrics=false"]


# this machine's name (MLflow's default --allowed-hosts has loopback and private addresses, no
# names) and its addresses outside loopback (192.0.2.2 here: no private range, so refused by default)
HOST_NAME = socket.gethostname()
OUTSIDE_ADDRESSES = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                     if a.family == socket.AF_INET and not a.address.startswith("127.")]


@pytest.fixture(scope="module")
@costs(servers=1)
def mlflow_server(tmp_path_factory):
    """A tracking server that proxies artifacts to its own store (as a team runs it)."""
    root = tmp_path_factory.mktemp("mlflow-server")
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        port = s.getsockname()[1]
    # started as the compose file starts it: the image's entrypoint, configured by environment, with
    # the names the team reaches it by added (as infra/docker/.env.example shows)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "MLFLOW_HOST": "0.0.0.0", "MLFLOW_PORT": str(port),
           "MLFLOW_ALLOWED_HOSTS": ",".join([HOST_NAME, *OUTSIDE_ADDRESSES]),
           "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{root}/store.db",
           "MLFLOW_ARTIFACTS_DESTINATION": str(root / "artifacts")}
    proc = subprocess.Popen([ROOT / "infra" / "docker" / "entrypoint.sh", "mlflow-server"], env=env,
                            stdout=subprocess.DEVNULL, stderr=(root / "server.log").open("w"))
    uri = f"http://{HOST_NAME}:{port}"  # the runs below reach it by name, not by loopback
    import requests

    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if requests.get(f"{uri}/health", timeout=2).ok:
                break
        except (requests.ConnectionError, requests.Timeout):  # not listening yet, or too busy starting to answer
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
    yield uri, root / "artifacts"
    proc.terminate()
    proc.wait(30)


@pytest.fixture(scope="module")
@costs(deepspeed=2)
def two_runs(mlflow_server, demo_run, tmp_path_factory):
    """pretrain twice on the demo's data, the second with sampling.temperature changed, then once more (cached)."""
    import contextlib
    import io

    from xylent.cli import main

    uri, _ = mlflow_server
    ws = linked_data(demo_run[1], tmp_path_factory.mktemp("team") / "ws",  # sampling is rebuilt here: it changes
                     ("download", "prepare", "dedup", "vocab", "shards"))

    def run(*extra):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(["run", "pretrain", "--spec", str(DEMO), "--workspace", str(ws), "--json", *TINY,
                       "--set", f"tracking.tracking_uri={uri}", "--set", "tracking.experiment=team", *extra])
        assert rc == 0
        return json.loads(buf.getvalue())  # stdout is ours: nothing of MLflow's may land in it

    return run(), run("--set", "sampling.temperature=2.0"), run("--set", "sampling.temperature=2.0"), ws


def _client(uri):
    from mlflow import MlflowClient

    return MlflowClient(uri)


def test_the_server_answers_the_names_a_team_adds_with_any_port_and_refuses_other_hosts(mlflow_server):
    """MLflow ≥ 3.5 answers 403 to a Host header outside --allowed-hosts, and its list replaces the
    default: the entrypoint adds MLFLOW_ALLOWED_HOSTS's bare names (each with any port, as the Host
    header carries it, and as the UI's Origin, which MLflow checks apart on every POST) to the compose
    name, loopback and private addresses."""
    import requests

    uri, _ = mlflow_server
    port = uri.rsplit(":", 1)[1]
    path = "/api/2.0/mlflow/experiments/search?max_results=1"
    for address in (HOST_NAME, *OUTSIDE_ADDRESSES, "127.0.0.1", "localhost"):  # reached through each
        got = requests.get(f"http://{address}:{port}{path}", timeout=10)
        assert got.status_code == 200, (address, got.status_code, got.text)
        # the UI's own state-changing call, from a page opened by that name
        got = requests.post(f"http://{address}:{port}/ajax-api/2.0/mlflow/runs/search", json={"experiment_ids": ["0"]},
                            headers={"Origin": f"http://{address}:{port}"}, timeout=10)
        assert got.status_code == 200, (address, got.status_code, got.text)
    for host in (f"mlflow:{port}", "mlflow", f"10.1.2.3:{port}"):  # the other containers; private addresses
        assert requests.get(f"http://127.0.0.1:{port}{path}", headers={"Host": host}, timeout=10).status_code == 200
    # another address of this machine, not on the list
    assert requests.get(f"http://127.0.0.2:{port}{path}", timeout=10).status_code == 403
    assert requests.get(f"http://127.0.0.1:{port}{path}", headers={"Host": f"rebind.example:{port}"},
                        timeout=10).status_code == 403


def test_the_server_starts_no_job_runner_by_default(mlflow_server):
    """MLflow's job runner (GenAI scorers, prompt optimisation, GenAI evaluation: nothing xylent submits)
    would start seven worker processes beside the server, each importing MLflow: the entrypoint leaves
    it off (MLFLOW_SERVER_ENABLE_JOB_EXECUTION, unset here)."""
    uri, _ = mlflow_server
    port = uri.rsplit(":", 1)[1]
    server = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and "server" in p.info["cmdline"]
              and "--port" in p.info["cmdline"] and port in p.info["cmdline"]
              and any(Path(a).name == "mlflow" for a in p.info["cmdline"][:2])]
    assert len(server) == 1, [p.info["cmdline"][:4] for p in server]
    tree = []
    for child in server[0].children(recursive=True):
        with contextlib.suppress(psutil.Error):  # gone meanwhile
            tree.append(" ".join(child.cmdline()))
    assert any("uvicorn" in c for c in tree), tree  # the server's own worker: this is its tree
    assert not [c for c in tree if "mlflow.server.jobs" in c or "huey" in c], tree


def test_a_host_name_the_server_refuses_is_one_line_naming_the_setting_before_any_stage(mlflow_server, run_cli,
                                                                                        tmp_path):
    uri, _ = mlflow_server
    refused = f"http://127.0.0.2:{uri.rsplit(':', 1)[1]}"
    started = time.monotonic()
    rc, out, err = run_cli("run", "download", "--spec", DEMO, "--workspace", tmp_path / "ws",
                           "--set", f"tracking.tracking_uri={refused}")
    assert rc == 2 and time.monotonic() - started < 10, err
    said = [line for line in err.splitlines() if "refuses" in line]
    assert len(said) == 1 and f"refuses the host name '127.0.0.2:{refused.rsplit(':', 1)[1]}'" in said[0], err
    assert "tracking.tracking_uri" in err and "MLFLOW_ALLOWED_HOSTS=127.0.0.2" in err and "--allowed-hosts" in err
    assert "Traceback" not in err and not (tmp_path / "ws" / "download").exists(), err


def test_artifacts_and_the_registered_model_live_on_the_server(mlflow_server, two_runs, tmp_path):
    import mlflow.pyfunc

    uri, store = mlflow_server
    first, _, _, ws = two_runs
    client = _client(uri)
    exp = client.get_experiment_by_name("team")
    assert exp.artifact_location.startswith("mlflow-artifacts:"), exp.artifact_location
    assert exp.tags.get("mlflow.experimentKind") == "custom_model_development", "not the GenAI view"
    assert not (ws / "mlartifacts").exists(), "nothing goes to a local artifact root when the store is a server"
    run_id = first["stages"]["pretrain"]["mlflow_run_id"]
    names = {a.path for a in client.list_artifacts(run_id)}
    assert {"_manifest.json", "loss_curves.png"} <= names, names
    got = Path(client.download_artifacts(run_id, "_manifest.json", str(tmp_path)))
    local = Path(first["stages"]["pretrain"]["output_dir"]) / "_manifest.json"
    assert got.read_bytes() == local.read_bytes()
    assert list(store.rglob("_manifest.json")), "the server's own artifact store holds them"
    # the encoder: a logged model (the Models column) and a registered version, served from the server
    models = client.search_logged_models([exp.experiment_id])
    mine = [m for m in models if m.source_run_id == run_id]
    fp = first["stages"]["pretrain"]["fingerprint"]
    assert len(mine) == 1 and str(mine[0].status).endswith("READY") and mine[0].name == f"electra-{fp[:8]}", \
        "a logged model is named by its recipe and fingerprint, not 'encoder' like every other"
    assert [o.model_id for o in client.get_run(run_id).outputs.model_outputs] == [mine[0].model_id]
    version = next(v for v in client.search_model_versions("name='xylent-demo'") if v.run_id == run_id)
    listed = [(e["name"], str(e["version"])) for e in json.loads(mine[0].tags["mlflow.modelVersions"])]
    assert listed == [("xylent-demo", str(version.version))], "the logged model's page links the version it is, once"
    (tmp_path / "m").mkdir()
    mlflow.set_tracking_uri(uri)
    try:
        served = mlflow.pyfunc.load_model(f"models:/xylent-demo/{version.version}", dst_path=str(tmp_path / "m"))
        emb = served.predict(["Hello world", "Hallo Welt"])
    finally:
        mlflow.set_tracking_uri(None)
    assert len(emb) == 2 and len(emb[0]) == 64
    spec = yaml.safe_load((tmp_path / "m" / "spec.yaml").read_text())  # the spec the version was trained from
    assert spec["name"] == "demo" and spec["pretrain"]["steps"] == 10, "the effective spec, overrides applied"


def test_two_runs_differ_by_the_changed_upstream_knob_and_nothing_else(mlflow_server, two_runs):
    uri, _ = mlflow_server
    first, second, _, _ = two_runs
    client = _client(uri)

    def diff(a: str, b: str) -> dict:
        pa, pb = client.get_run(a).data.params, client.get_run(b).data.params
        return {k: (pa.get(k), pb.get(k)) for k in set(pa) | set(pb) if pa.get(k) != pb.get(k)}

    runs = [{s: r["mlflow_run_id"] for s, r in inv["stages"].items()} for inv in (first, second)]
    d = diff(runs[0]["pretrain"], runs[1]["pretrain"])
    assert d["sampling.temperature"][1] == "2.0", d
    assert "upstream.sampling" in d and "fingerprint" in d
    assert not {k for k in d if not k.startswith(("sampling.", "upstream.sampling", "fingerprint"))}, d
    d = diff(runs[0]["sampling"], runs[1]["sampling"])
    assert "sampling.temperature" in d, "the stage run of the changed stage shows it too"
    pretrain = client.get_run(runs[1]["pretrain"])
    assert pretrain.data.params["model.hidden"] == "64" and pretrain.data.params["model.layers"] == "2"
    assert pretrain.info.run_name == f"pretrain {second['stages']['pretrain']['fingerprint'][:8]} demo", \
        "what it built and its fingerprint first: what a truncated run table keeps"
    assert pretrain.data.tags.get("mlflow.source.git.commit") and pretrain.data.tags["mlflow.source.name"] \
        .endswith("demo.yaml")
    inputs = {d.dataset.name: d.dataset.digest for d in pretrain.inputs.dataset_inputs}
    assert set(inputs) == {"vocab", "sampling", "shards"}
    assert inputs["sampling"] == second["stages"]["sampling"]["fingerprint"][:36]
    parent = client.get_run(second["mlflow_parent_run_id"])
    assert parent.info.run_name.startswith(f"pretrain {second['stages']['pretrain']['fingerprint'][:8]} demo ["), \
        parent.info.run_name  # then the overrides, cut at 80 characters: the tags below hold them whole
    assert "sampling.temperature=2.0" in parent.data.params["overrides"]
    assert parent.data.tags["xylent.set.sampling.temperature"] == "2.0" and parent.data.tags["xylent.force"] == "false"
    found = client.search_runs([parent.info.experiment_id], "tags.`xylent.set.sampling.temperature` = '2.0'")
    assert {r.info.run_id for r in found} >= {second["mlflow_parent_run_id"]}, "runs are found by what they changed"
    assert any(k.startswith("pretrain.final.") and k.endswith("discriminator_loss") for k in parent.data.metrics)


def test_a_cached_rerun_is_one_run_that_names_the_runs_that_built_it(mlflow_server, two_runs):
    uri, _ = mlflow_server
    _, second, third, _ = two_runs
    client = _client(uri)
    cached = third["stages"]["pretrain"]
    assert cached["cached"] and cached["mlflow_run_id"] == second["stages"]["pretrain"]["mlflow_run_id"]
    children = client.search_runs([client.get_experiment_by_name("team").experiment_id],
                                  f"tags.mlflow.parentRunId = '{third['mlflow_parent_run_id']}'")
    assert not children, "a fully cached rerun is one run, not a tree of (cached) copies"
    parent = client.get_run(third["mlflow_parent_run_id"])
    assert parent.data.tags["xylent.cached.pretrain"] == cached["mlflow_run_id"], "it names the run that built it"
    assert parent.info.run_name.startswith("cached pretrain ") and parent.data.tags["xylent.cached"] == "true"
    assert not client.get_run(second["mlflow_parent_run_id"]).info.run_name.startswith("cached"), "a build reads apart"
    assert parent.data.metrics, "the parent still shows the headlines"
