"""The GPU check's CPU dry run (issue 37): the bundle builds from a workspace's data stages and
the one-command check runs end to end on CPU at a toy size, through the same code a lent GPU
machine runs (the real trainer under the DeepSpeed launcher, stopped by its time box, the last
checkpoint exported and cut into parts the device tool can bring back)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.demo_data  # reads the session demo only (pyproject.toml's markers)

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data_specs" / "demo.yaml"


@pytest.mark.costs(cli=2)  # the bundle's pipeline check and the check's training run, in their own processes
def test_the_bundle_builds_and_the_check_runs_end_to_end_on_cpu(demo_run, tmp_path):
    from conftest import linked_data

    _, demo_ws = demo_run
    ws = linked_data(demo_ws, tmp_path / "ws")  # the demo's data stages, read through links
    bundle, out = tmp_path / "bundle", tmp_path / "out"
    build = [sys.executable, str(ROOT / "benchmarks" / "gpu_bundle.py"), "--spec", str(DEMO), "--workspace",
             str(ws), "--no-wheels"]
    too_big = subprocess.run([*build, "--out", str(tmp_path / "small"), "--limit-mib", "1"], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert too_big.returncode != 0 and "over the 1 MiB the device tool carries" in too_big.stderr, too_big.stderr
    assert not (tmp_path / "small").exists() and not (tmp_path / "small.building").exists(), "nothing half-built"
    done = subprocess.run([*build, "--out", str(bundle)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads((bundle / "bundle.json").read_text())
    assert set(info["fingerprints"]) == {"vocab", "sampling", "shards"} and info["bytes"] < 60 * 2**20
    assert (bundle / "data" / "shards" / "index.json").is_file() and (bundle / "spec.yaml").is_file()

    env = {**os.environ, "PYTHON": sys.executable, "XYLENT_GPU_BUNDLE": str(bundle)}
    run = subprocess.run([str(ROOT / "benchmarks" / "gpu_check.sh"), str(out), "--toy", "--minutes", "0.3",
                          "--set", "pretrain.steps=100000", "--set", "pretrain.snapshot_tokens=[1]"], cwd=tmp_path,
                         env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = json.loads((out / "gpu_check.json").read_text())
    assert result["environment"]["device"].startswith("cpu") and result["environment"]["deepspeed"]
    assert result["benchmark"]["returncode"] == 0 and "skipped" in result["benchmark"]["rows"], \
        "on CPU the benchmark's GPU rows say why they did not run"
    learn = result["learning"]
    assert learn["stopped_by_deadline"] and learn["failure"] is None and learn["checkpoint_step"] >= 2, learn
    assert learn["precision"] == "fp32" and learn["metrics"]["steps"] == learn["checkpoint_step"]
    assert "final.trtd/discriminator_base_loss" in learn["metrics"], "the losses beside their trivial peers"
    assert result["faiss"]["present"] is False and "gpus" in result["faiss"]
    parts = sorted(out.glob("model.tar.part-*"))
    assert [p.name for p in parts] == learn["exported"] and all(p.stat().st_size <= 15 << 20 for p in parts)
    assert len(list(out.iterdir())) <= 8, "the device tool brings back at most 8 files"
    joined = tmp_path / "model.tar"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(joined) as t:
        names = set(t.getnames())
    assert {"model/config.json", "model/model.safetensors", "model/spm.model"} <= names
    (tag, info), = learn["snapshots"].items()  # the snapshot at the first logging boundary: the curve's first point
    assert info["step"] == 1 and info["counts"] == [1] and learn["snapshots_left_behind"] == []
    assert {f"snapshots/{tag}/model.safetensors", f"snapshots/{tag}/config.json"} <= names
    with tarfile.open(joined) as t:
        t.extract(f"snapshots/{tag}/model.safetensors", tmp_path / "x", filter="data")
    from safetensors.torch import load_file

    import torch

    assert {v.dtype for v in load_file(tmp_path / "x" / "snapshots" / tag / "model.safetensors").values()} == \
        {torch.bfloat16}, "the snapshots travel in bf16"
    assert "model/pretraining.safetensors" not in names, "the encoder only: half the bytes"
    scratch = re.search(r"(/\S*xylent-gpu-check-[^/\s]+)/", (out / "learn.log").read_text()).group(1)
    assert not Path(scratch).exists(), "its checkpoints' scratch folder is removed"
