"""Fine-tuning through pretrain's launch (``finetune.launcher: deepspeed``; ``xylent.launch``
starts local CPU ranks directly) on 2 CPU ranks over gloo: it learns, every rank takes its slice of
each batch, and a kill -9 of the driver mid-training stops the ranks and a
rerun resumes from DeepSpeed's checkpoint to the same result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]

DRIVER = """
import json, random, sys
from pathlib import Path
sys.path[:0] = [{tests!r}, {root!r}]
from finetune_fixtures import tiny_tokenizer, tiny_export, pair_examples, write_xnli
from xylent.tasks.evaluate.encoders import load_xylent
from xylent.tasks.evaluate.finetune.encoders import factory
from xylent.tasks.evaluate.finetune.run import finetune_task
from xylent.tasks.evaluate.finetune.task import TaskData
from xylent.spec.evaluate import EvalTask
out, shared = Path(sys.argv[1]), Path({shared!r})
model_dir, data = shared / "m" / "model", shared / "data"
if not model_dir.exists():
    sp = tiny_tokenizer()
    tiny_export(shared / "m", sp)
    rng = random.Random(0)
    data.mkdir(parents=True)
    for split, n in (("train", 320), ("dev", 60), ("test", 80)):
        for lang in (("en",) if split != "test" else ("en", "de")):
            write_xnli(data / f"{{split}}-{{lang}}.tsv", pair_examples(rng, n))
task = EvalTask(name="t", kind="classification", xtreme_task="xnli", path=str(data), languages=["en", "de"],
                finetune=dict(lr=1e-3, epochs=3, batch_size=16, max_length=64, checkpoint_every=5,
                              launcher="deepspeed", ranks=2))
res = finetune_task(TaskData(task, data), factory(lambda: load_xylent("tiny", model_dir), "classification"),
                    out / "ck", out / "preds", out / "labels", lambda m: print(m, flush=True),
                    {{"kind": "xylent", "name": "tiny", "path": str(model_dir)}})
(out / "result.json").write_text(json.dumps(res))
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds-finetune")
    script = root / "driver.py"
    script.write_text(DRIVER.format(tests=str(ROOT / "tests"), root=str(ROOT), shared=str(root / "shared")))

    def run(out: Path) -> dict:
        subprocess.run([sys.executable, str(script), str(out)], check=True, cwd=ROOT, timeout=600)
        return json.loads((out / "result.json").read_text())

    whole = run(root / "whole")
    return script, run, whole, root


def test_two_deepspeed_ranks_fine_tune_and_learn(driver):
    _, _, whole, root = driver
    en = whole["languages"]["en"]
    assert en["accuracy"] >= 85 and en["accuracy"] > en["majority_baseline"] + 30, whole
    seed = whole["per_seed"]["1"]
    assert seed["steps"] == 3 * 20 and len(seed["history"]) == 3  # 320 examples / 16 per global batch, 3 epochs
    log = (root / "whole" / "ck" / "seed-1" / "train.log").read_text()
    assert "--num_gpus 2" in log and "xylent.tasks.evaluate.finetune.distributed" in log
    left = sorted(p.name for p in (root / "whole" / "ck" / "seed-1").iterdir())
    assert "ds" not in left and not [n for n in left if n.startswith("rng-")], "a finished seed keeps no optimiser"


def _ranks_of(script: Path) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"])
            if "xylent.tasks.evaluate.finetune.distributed" in " ".join(p.info["cmdline"] or [])]


def test_kill_9_mid_fine_tuning_stops_the_ranks_and_a_rerun_resumes(driver):
    script, run, whole, root = driver
    out = root / "killed"
    proc = subprocess.Popen([sys.executable, str(script), str(out)], cwd=ROOT)
    ds = out / "ck" / "seed-1" / "ds" / "latest"
    deadline = time.time() + 300
    while not ds.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, "finished before a checkpoint was seen"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gone = time.time() + 30
    while _ranks_of(script) and time.time() < gone:  # the ranks die with their parent
        time.sleep(0.2)
    assert not _ranks_of(script), "ranks outlived a kill -9 of the stage"
    assert not (out / "result.json").exists()
    resumed = run(out)
    seed = resumed["per_seed"]["1"]
    assert seed["resumed_from"] > 0  # rank 0's record: where DeepSpeed's checkpoint put it back
    assert "xylent: resumed from" in (out / "ck" / "seed-1" / "train.log").read_text()
    assert seed["steps"] == whole["per_seed"]["1"]["steps"]
    for lang in ("en", "de"):  # the same run continued: the same scores up to float noise
        assert resumed["languages"][lang]["accuracy"] == pytest.approx(whole["languages"][lang]["accuracy"], abs=2.5)
