"""Back here after the GPU check (benchmarks/gpu_check.py): unpack the model it returned and
evaluate it with the held-out tasks of ``data_specs/gpu-check.yaml``, beside random-init and
bag-of-subwords of the same architecture and tokenizer.

    .venv/bin/python benchmarks/gpu_results.py OUT      # OUT: what the device tool brought back

The peers need the pipeline's pretrain output (its architecture and tokenizer), so this
machine trains the same spec for one step, which is random-init up to one update; the
GPU-trained encoder is evaluated as a model on disk (``evaluate.models``' path form), never
passed off as this machine's pretrain.  Writes benchmarks/results/gpu_check.json: the check's
own record (its device named) and the scores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

import harness  # noqa: E402

SPEC = REPO / "data_specs" / "gpu-check.yaml"


def unpack(out: Path, dest: Path) -> Path:
    """model.tar.part-* -> dest/model (the parts are one tar cut for the device tool's file size limit)."""
    parts = sorted(out.glob("model.tar.part-*"))
    if not parts:
        sys.exit(f"gpu_results: {out} holds no model.tar.part-*: the check exported no model (see gpu_check.json)")
    dest.mkdir(parents=True, exist_ok=True)
    tar = dest / "model.tar"
    with open(tar, "wb") as f:
        for p in parts:
            f.write(p.read_bytes())
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="data")
    tar.unlink()
    return dest / "model"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the folder the GPU check wrote (as brought back)")
    ap.add_argument("--spec", default=str(SPEC))
    ap.add_argument("--workspace", default=None, help="default: the spec's")
    ap.add_argument("--results", default=str(harness.RESULTS))
    args = ap.parse_args(argv)
    out = Path(args.out)
    check = json.loads((out / "gpu_check.json").read_text())
    model = unpack(out, REPO / "workspace-gpu-check" / "returned" / check["started"].replace(":", ""))
    models = json.dumps([{"name": "gpu-trained", "kind": "xylent", "path": str(model)}, "random-init",
                         "bag-of-subwords"])
    cmd = [sys.executable, "-m", "flows.kit.cli", "run", "evaluate", "--spec", args.spec, "--json",
           "--set", "pretrain.steps=1", "--set", "pretrain.checkpoint_every=1", "--set", "pretrain.warmup_steps=0",
           "--set", f"evaluate.models={models}", *(["--workspace", args.workspace] if args.workspace else [])]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"gpu_results: evaluate failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    evaluate_dir = Path(json.loads(done.stdout)["stages"]["evaluate"]["output_dir"])
    scores = json.loads((evaluate_dir / "scores.json").read_text())
    result = {"check": check, "evaluate": {"output_dir": str(evaluate_dir), "command": " ".join(cmd[2:]),
                                           "averages": {m: {t: r["avg"] for t, r in tasks.items()}
                                                        for m, tasks in scores["models"].items()}}}
    path = Path(args.results) / "gpu_check.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["evaluate"]["averages"], indent=1))
    return result


if __name__ == "__main__":
    main()
