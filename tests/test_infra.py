"""infra/slurm/pretrain.sbatch run by bash as Slurm would, with stand-ins for
Slurm's `scontrol` and for the installed `xylent` (no cluster here): the hostfile
it writes, the GPU counts it reads, and what it refuses."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

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
