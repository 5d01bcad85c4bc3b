"""The benchmarks a skeptic reruns: docs/benchmarks.md is what the committed JSON
says, and every script still runs (at its --quick smoke size) and renders.

Timings are never asserted here: speed targets are judged by the full runs
(`make bench`) on a quiet machine, and stated in the generated doc."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]

import render  # noqa: E402

# every smoke run: no untimed warm-up round (a smoke run's timings are never read)
SMOKE = ["--quick", "--warmup", "0"]
# extra flags of a smoke run: the audit's step overhead trains 2-rank DeepSpeed runs for minutes; fine-tuning
# at one torch thread count, not each of 1 and all cores
SMOKE_FLAGS = {"audit": ["--only", "best_response"], "finetune": ["--threads", "1"]}


def test_the_doc_is_what_the_committed_json_says():
    proc = subprocess.run([sys.executable, "benchmarks/render.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_doc_names_a_block_for_every_benchmark_and_every_script_exists():
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    for name in render.BENCHMARKS:
        assert f"<!-- bench:{name} -->" in text and f"<!-- /bench:{name} -->" in text
        assert (ROOT / "benchmarks" / f"{name}.py").exists()
        result = json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())
        assert result["benchmark"] == name and not result["quick"], name
        assert result["repeats"] >= 3, f"{name}: a committed result needs >= 3 repeats"
        env = result["environment"]
        assert env["machine"]["cpus"] and env["versions"]["numpy"] and env["git"]["commit"], name


def test_a_hand_typed_figure_inside_a_generated_block_is_caught(tmp_path):
    doc = tmp_path / "b.md"
    doc.write_text((ROOT / "docs" / "benchmarks.md").read_text().replace(
        "<!-- /bench:sampling -->", "| hand typed | 1.23 s |\n<!-- /bench:sampling -->", 1))
    proc = subprocess.run([sys.executable, "benchmarks/render.py", "--check", "--doc", str(doc)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "hand typed" in proc.stdout


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """Every benchmark at --quick into one scratch folder, two at a time: a smoke run checks that each
    script works and renders, not how fast (its timings are never read), so they may share the cores."""
    from concurrent.futures import ThreadPoolExecutor

    out = tmp_path_factory.mktemp("bench-quick")

    def run(name: str) -> str | None:
        cmd = [sys.executable, f"benchmarks/{name}.py", *SMOKE, "--out", str(out), *SMOKE_FLAGS.get(name, [])]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
        return None if proc.returncode == 0 else f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = [f for f in pool.map(run, render.BENCHMARKS) if f]
    assert not failed, "\n\n".join(failed)
    return out


@pytest.mark.slow  # every benchmark script in a subprocess: minutes of CPU, none of the guard's kinds
def test_every_benchmark_runs_at_its_smoke_size_and_renders(smoke, tmp_path):
    for name in render.BENCHMARKS:
        result = json.loads((smoke / f"{name}.json").read_text())
        assert result["quick"] is True and result["benchmark"] == name
        assert result["environment"]["machine"]["usable_cpus"] >= 1
    doc = tmp_path / "benchmarks.md"
    proc = subprocess.run([sys.executable, "benchmarks/render.py", "--results", str(smoke), "--template",
                           str(ROOT / "docs" / "benchmarks.md"), "--doc", str(doc)], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = doc.read_text()
    for name in render.BENCHMARKS:
        block = text.split(f"<!-- bench:{name} -->")[1].split(f"<!-- /bench:{name} -->")[0]
        assert "| " in block, f"{name}: no table rendered from its smoke result"
        assert "--quick smoke size" in block, f"{name}: a smoke result must say so"
