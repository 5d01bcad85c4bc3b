"""infra/: the Docker image, its entrypoint and the compose file (linted, checked,
the entrypoint run for real here and in test_team_tracking/test_deployments), and
infra/slurm/pretrain.sbatch run by bash as Slurm would, with stand-ins for
Slurm's `scontrol` and for the installed `xylent` (no cluster here): the hostfile
it writes, the GPU counts it reads, and what it refuses."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SBATCH = ROOT / "infra" / "slurm" / "pretrain.sbatch"


def _exe(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


@pytest.fixture()
def cluster(tmp_path):
    bin_dir, venv = tmp_path / "bin", tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    _exe(bin_dir / "scontrol", 'printf "node1\\nnode2\\n"\n')
    (venv / "bin" / "activate").write_text(f'export PATH="{venv}/bin:$PATH"\n')
    _exe(venv / "bin" / "xylent", f'printf "%s\\n" "$@" > "{tmp_path}/xylent-args"\n')

    def run(gpus: str | None, *, pdsh: bool = True, venv_dir: Path = venv):
        if pdsh:
            _exe(bin_dir / "pdsh", "exit 0\n")
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_SUBMIT_DIR": str(ROOT), "SLURM_JOB_ID": "4242",
               "SLURM_JOB_NODELIST": "node[1-2]", "XYLENT_VENV": str(venv_dir), "HOME": os.environ.get("HOME", "/")}
        if gpus is not None:
            env["SLURM_GPUS_PER_NODE"] = gpus
        return subprocess.run(["bash", str(SBATCH), "data_specs/demo.yaml", str(tmp_path / "ws")], env=env,
                              capture_output=True, text=True, timeout=60)

    return run, tmp_path


@pytest.mark.parametrize("gpus,slots", [("8", 8), ("a100:8", 8), ("gpu:a100:4(S:0-1)", 4), (None, 8)])
def test_the_hostfile_has_a_line_per_node_with_its_gpu_count(cluster, gpus, slots):
    run, tmp = cluster
    proc = run(gpus)
    assert proc.returncode == 0, proc.stderr
    assert (tmp / "ws" / "hostfile-4242").read_text() == f"node1 slots={slots}\nnode2 slots={slots}\n"
    args = (tmp / "xylent-args").read_text().splitlines()
    assert args[:2] == ["run", "pretrain"] and f"pretrain.hostfile={tmp}/ws/hostfile-4242" in args
    assert "pretrain.master_port=24242" in args, "a port that two jobs on one node do not share"
    assert "MLFLOW_TRACKING_URI is not set" in proc.stderr


@pytest.mark.parametrize("case,message", [("no-pdsh", "pdsh is not installed"),
                                          ("no-venv", "xylent is not installed"),
                                          ("bad-gpus", "cannot read a GPU count")])
def test_what_a_cluster_lacks_is_said_before_anything_starts(cluster, case, message):
    run, tmp = cluster
    proc = run("a100:zero" if case == "bad-gpus" else "8", pdsh=case != "no-pdsh",
               venv_dir=tmp / "nowhere" if case == "no-venv" else tmp / "venv")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp / "xylent-args").exists()


# -- the image and the compose file (infra/docker) ----------------------------------------
DOCKER = ROOT / "infra" / "docker"


def _venv_tool(name: str) -> str:
    tool = Path(sys.executable).with_name(name)
    assert tool.exists(), f"{name} comes with the dev extra (make install); not found at {tool}"
    return str(tool)


def test_dockerfile_and_shell_scripts_pass_their_linters():
    lint = subprocess.run([_venv_tool("hadolint"), str(DOCKER / "Dockerfile")], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    scripts = [DOCKER / "entrypoint.sh", SBATCH, ROOT / ".ci" / "run", ROOT / ".ci" / "install-check"]
    check = subprocess.run([_venv_tool("shellcheck"), *map(str, scripts)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_compose_runs_every_xylent_service_from_the_project_image_with_nothing_installed_at_start():
    compose = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "prefect", "mlflow", "worker", "deploy", "minio"} <= set(services)
    ours = {name: s for name, s in services.items() if s.get("image") == "xylent:latest"}
    assert {"prefect", "mlflow", "worker", "deploy", "cli"} <= set(ours), \
        "Prefect and MLflow servers run the client's own versions: the project image"
    for name, s in ours.items():
        assert s["build"] == {"context": "../..", "dockerfile": "infra/docker/Dockerfile",
                              "args": {"XYLENT_GIT_COMMIT": "${XYLENT_GIT_COMMIT:-unknown}"}}, name
    import re

    roles = set(re.findall(r"^    ([\w|-]+)\)$", (DOCKER / "entrypoint.sh").read_text(), re.M))
    roles = {r for alt in roles for r in alt.split("|")}
    for name, s in services.items():
        text = json.dumps(s)
        assert "pip install" not in text and "apt-get" not in text, f"{name} installs at container start"
        if name in ours and "command" in s:
            assert s["command"][0] in roles or name == "cli", f"{name}: entrypoint has no role {s['command'][0]!r}"
    mlflow_env = services["mlflow"]["environment"]
    assert {"MLFLOW_BACKEND_STORE_URI", "MLFLOW_ARTIFACTS_DESTINATION"} <= set(mlflow_env)
    assert mlflow_env["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql://")
    assert "psycopg2" in (ROOT / "pyproject.toml").read_text() and "server" in _dockerfile_extras()
    worker = services["worker"]
    assert worker["environment"]["PREFECT_API_URL"] == "http://prefect:4200/api"
    assert worker["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    home = worker["environment"]["XYLENT_HOME"]
    assert f"workspace:{home}/workspace" in worker["volumes"], "deployments' ./workspace is the shared volume"
    assert worker["depends_on"]["deploy"] == {"condition": "service_completed_successfully"}
    import re as _re

    text, example = (DOCKER / "docker-compose.yml").read_text(), (DOCKER / ".env.example").read_text()
    assert "xylent-secret" not in text and "POSTGRES_PASSWORD: xylent" not in text, "no credential in the file"
    wanted = set(_re.findall(r"\$\{(\w+)", text))
    assert wanted and wanted <= set(_re.findall(r"^#? ?(\w+)=", example, _re.M)), ".env.example names every variable"
    assert "infra/docker/.env" in (ROOT / ".gitignore").read_text() + (ROOT / ".dockerignore").read_text()
    for name in ("postgres", "minio", "prefect", "mlflow", "worker"):
        assert services[name].get("restart") == "unless-stopped", f"{name} does not come back after a crash or reboot"
    assert "--allowed-hosts" in (DOCKER / "entrypoint.sh").read_text() and "MLFLOW_ALLOWED_HOSTS" in mlflow_env
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert dockerfile.index("COPY pyproject.toml constraints.txt") < dockerfile.index("COPY . /opt/xylent"), \
        "the dependency layer is built before the source is copied: a source edit does not reinstall them"
    init = (DOCKER / "postgres-init.sql").read_text()
    assert "CREATE DATABASE mlflow" in init and mlflow_env["MLFLOW_BACKEND_STORE_URI"].endswith("/mlflow")


def test_the_gpu_override_reserves_the_hosts_gpus_for_the_worker():
    gpu = yaml.safe_load((DOCKER / "docker-compose.gpu.yml").read_text())
    devices = gpu["services"]["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "${XYLENT_GPUS:-all}", "capabilities": ["gpu"]}]
    assert "cu" in gpu["services"]["worker"]["build"]["args"]["TORCH_INDEX"], "a CUDA build of torch"
    assert "ARG TORCH_INDEX=" in (DOCKER / "Dockerfile").read_text(), "the build argument the override sets"


def _dockerfile_extras() -> set[str]:
    line = next(ln for ln in (DOCKER / "Dockerfile").read_text().splitlines() if ln.startswith("ARG EXTRAS="))
    return set(line.split("=", 1)[1].split(","))


def test_image_extras_exist_in_pyproject():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert _dockerfile_extras() <= set(extras)


@pytest.mark.parametrize("service,missing", [("mlflow-server", "MLFLOW_BACKEND_STORE_URI"),
                                             ("worker", "PREFECT_API_URL"), ("deploy", "PREFECT_API_URL")])
@pytest.mark.costs(servers=1)
def test_entrypoint_names_the_setting_a_service_lacks(service, missing):
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/")}
    done = subprocess.run([str(DOCKER / "entrypoint.sh"), service], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and f"{service} needs {missing} set" in done.stderr, done.stderr


def test_entrypoint_gives_up_on_a_server_that_never_answers(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path), "WAIT_TIMEOUT_S": "2",
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}
    done = subprocess.run([str(DOCKER / "entrypoint.sh"), "worker"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and f"127.0.0.1:{port}/api/health did not answer within 2 s" in done.stderr, \
        done.stderr


def test_image_builds_where_a_docker_daemon_runs():
    import shutil

    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.skip("no Docker daemon here: the image is linted (hadolint) and its entrypoint tested instead")
    done = subprocess.run(["docker", "build", "-f", str(DOCKER / "Dockerfile"), "-t", "xylent:test", str(ROOT)],
                          capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    version = subprocess.run(["docker", "run", "--rm", "xylent:test", "xylent", "--help"], capture_output=True,
                             text=True, timeout=300)
    assert version.returncode == 0 and "run" in version.stdout, version.stderr


def test_a_run_without_a_checkout_records_the_commit_the_image_was_built_from(tmp_path, monkeypatch, caplog):
    """.git stays out of the image; the commit comes in as a build argument (XYLENT_GIT_COMMIT)."""
    from xylent.flows.kit.run_record import source_tags

    spec = tmp_path / "s.yaml"
    spec.write_text("name: x\n")
    here = source_tags(str(spec))
    assert len(here["mlflow.source.git.commit"]) == 40, "in a checkout: git's own answer"
    monkeypatch.setenv("XYLENT_GIT_COMMIT", "0123abcd" * 5)
    away = source_tags(str(spec), repo=tmp_path)  # no .git there
    assert away["mlflow.source.git.commit"] == "0123abcd" * 5 and away["xylent.git_dirty"] == "unknown"
    monkeypatch.setenv("XYLENT_GIT_COMMIT", "unknown")
    with caplog.at_level(logging.WARNING, logger="xylent"):
        unknown = source_tags(str(spec), repo=tmp_path)
        source_tags(str(spec), repo=tmp_path)
    assert "mlflow.source.git.commit" not in unknown and unknown["xylent.code_version"] == "unknown"
    said = [r.getMessage() for r in caplog.records if "records no code version" in r.getMessage()]
    assert len(said) == 1 and "make compose-up" in said[0], "said once, with the command that fills it in"
    compose = (DOCKER / "docker-compose.yml").read_text()
    gpu = yaml.safe_load((DOCKER / "docker-compose.gpu.yml").read_text())
    assert "XYLENT_GIT_COMMIT" in str(gpu["services"]["worker"]["build"]["args"]), "the CUDA image records it too"
    assert gpu["services"]["worker"]["image"] == "xylent:cuda" and "image: xylent:latest" in compose, \
        "CPU and CUDA images tagged apart"
    make = (ROOT / "Makefile").read_text()
    assert "XYLENT_GIT_COMMIT=$$(git rev-parse HEAD)" in make.split("compose-up:")[1].split("\n\n")[0]
