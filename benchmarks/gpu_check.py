"""The one-shot GPU evidence (issue 37), run where a GPU is lent, in one command:

    benchmarks/gpu_check.sh OUT            # installs the bundle's wheels, then runs this

It needs the bundle ``make gpu-bundle`` builds here (``.gpu-bundle/``: wheels the GPU image
lacks, the shards / sampling tables / tokenizer of ``data_specs/gpu-check.yaml``, that spec),
and writes everything it measures into OUT (at most 8 files of at most 16 MiB each come back
from the lent machine, so the model travels as a tar cut into parts):

1. ``environment``: the device, its driver, torch / CUDA / DeepSpeed versions, bf16 support;
2. ``benchmark``: the pretrain benchmark's GPU rows into OUT/pretrain.json: first the flex
   self-test (flex forward and backward against the materialised bias; a flex path that
   differs is not timed), then at base size, bf16, both steps for xylent (flex, compiled),
   xylent (materialised, eager), xylent without the bias and transformers' ELECTRA, the whole
   step again at V = 250 002, and the trainer's engine at ZeRO 0/1/2: tokens/s, MFU, peak memory;
3. ``learning``: the real trainer under the DeepSpeed launcher (NCCL and bf16 on a GPU, gloo
   and fp32 on CPU) on the bundle's corpus, stopped at ``--minutes``; the last complete
   checkpoint is exported (OUT/model.tar.part-*), with the losses against their trivial peers;
4. ``faiss``: whether a GPU faiss is there (it is not in the GPU image; nothing is faked).

Every figure is what ran; a part that could not run says why.  ``--toy`` is the CPU dry
run of ``make test`` (tests/test_gpu_check.py): the same code at a size that takes seconds.

Back here, ``benchmarks/gpu_results.py`` unpacks the model and evaluates it against
random-init and bag-of-subwords on the held-out split.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO)]

PART_BYTES = 15 << 20  # under the lent machine's 16 MiB per returned file
MAX_FILES = 8  # the most files the device tool brings back from OUT
DATA_STAGES = ("vocab", "sampling", "shards")
RESULT = "gpu_check.json"
STARTUP_S = 300  # the most the launch may take to its first step before the time box starts anyway
TOY = ["pretrain.steps=4", "pretrain.checkpoint_every=2", "pretrain.warmup_steps=1", "pretrain.log_every=1",
       "pretrain.batch_size=8", "pretrain.trtd_max_tokens=1024", "model.layers=2", "model.hidden=64", "model.heads=2",
       "model.ffn=128", "model.generator_layers=1"]


def environment() -> dict:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cuda_available": torch.cuda.is_available(), "host_cpus": os.cpu_count()}
    try:
        import deepspeed

        env["deepspeed"] = deepspeed.__version__
    except Exception as exc:  # the bundle's wheel did not install: say so, the rest still runs
        env["deepspeed"] = f"not importable: {exc}"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(device=torch.cuda.get_device_name(0), memory_gib=round(props.total_memory / 2**30, 1),
                   multiprocessors=props.multi_processor_count, bf16=torch.cuda.is_bf16_supported())
        smi = shutil.which("nvidia-smi")
        if smi:
            env["nvidia_smi"] = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total",
                                                "--format=csv,noheader"], capture_output=True, text=True,
                                               timeout=30).stdout.strip()
    else:
        env["device"] = f"cpu ({platform.processor() or platform.machine()})"
    return env


def benchmark(out: Path, toy: bool, timeout_s: float) -> dict:
    """The pretrain benchmark's GPU rows (its CPU rows are the CPU machine's job)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cmd = [sys.executable, str(HERE / "pretrain.py"), "--device", device, "--gpu-only", "--zero-stages", "0,1,2",
           "--out", str(out / "bench")]
    if toy:
        cmd.append("--quick")
    started = time.monotonic()
    # its own session: on a timeout the ZeRO rows' child processes go too, not only pretrain.py
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        rc, tail = proc.returncode, output[-6000:]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        rc, tail = None, f"stopped after {timeout_s:.0f} s: {output[-6000:]}"  # the rows it printed so far
    result = {"command": " ".join(cmd[1:]), "device": device, "returncode": rc,
              "seconds": round(time.monotonic() - started, 1)}
    written = out / "bench" / ("quick" if toy else "") / "pretrain.json"
    written = written if written.is_file() else next((out / "bench").rglob("pretrain.json"), None)
    if written is not None and written.is_file():
        shutil.copy2(written, out / "pretrain.json")
        result["rows"] = json.loads(written.read_text()).get("gpu")
    else:
        result["output_tail"] = tail
    shutil.rmtree(out / "bench", ignore_errors=True)  # its markdown and json are in pretrain.json
    return result


def learning(bundle: Path, out: Path, minutes: float, toy: bool, overrides: list[str]) -> dict:
    """The real trainer, time-boxed; the last complete checkpoint exported into OUT."""
    import torch

    from xylent.models.training.checkpoints import complete_checkpoints
    from xylent.tasks.pretrain import contract, publish
    from xylent.tasks.pretrain.train_json import train_config
    from xylent.errors import XylentError
    from xylent.launch import deepspeed_command, launch, stop_launched
    from xylent.spec import load_spec

    spec = load_spec(bundle / "spec.yaml", [*(TOY if toy else []), *overrides])
    upstream = {s: bundle / "data" / s for s in DATA_STAGES}
    scratch = Path(tempfile.mkdtemp(prefix="xylent-gpu-check-"))
    ckdir = scratch / "run"
    ckdir.mkdir()
    cfg = train_config(spec, upstream, ckdir, None, None)
    cfg.save(ckdir / "train.json")
    cmd = deepspeed_command(ckdir / "train.json", ranks=1)
    stopped, finished, training = threading.Event(), threading.Event(), threading.Event()

    def deadline() -> None:
        # the time box counts from the first trained step (start-up is not training), within a cap
        training.wait(STARTUP_S)
        if not finished.wait(minutes * 60):
            stopped.set()
            stop_launched()  # the ranks stop; their last complete checkpoint stays

    def on_line(line: str) -> None:
        if line.startswith("xylent: step "):
            training.set()

    threading.Thread(target=deadline, daemon=True).start()
    started = time.monotonic()
    failure = None
    try:
        launch(cmd, ckdir / "train.log", on_line, ranks=1)
    except XylentError as exc:
        failure = None if stopped.is_set() else exc.render()
    finally:
        finished.set()
    seconds = time.monotonic() - started
    (out / "learn.log").write_text((ckdir / "train.log").read_text(errors="replace")[-PART_BYTES // 2:])
    result = {"spec": spec.name, "model": cfg.model, "objective": cfg.objective, "batch_size": cfg.batch_size,
              "seq_len": json.loads((upstream["shards"] / "index.json").read_text()).get("seq_len"),
              "precision": "bf16" if torch.cuda.is_available() and cfg.precision in ("auto", "bf16") else "fp32",
              "planned_steps": cfg.steps, "minutes_allowed": minutes, "seconds": round(seconds, 1),
              "stopped_by_deadline": stopped.is_set(), "failure": failure}
    kept = complete_checkpoints(Path(cfg.checkpoint_dir))
    if not kept:
        result["exported"] = None
        shutil.rmtree(scratch, ignore_errors=True)
        return result
    result["checkpoint_step"] = int(kept[-1].name.split("-")[1])
    export_dir = scratch / "export"
    rows, enc_state, _, n_params = publish.export_run(cfg, ckdir, upstream, export_dir, {
        "objective": cfg.objective, "steps": result["checkpoint_step"], "fingerprint": "gpu-check",
        "registered_model": None})
    rows = [r for r in rows if r["step"] <= result["checkpoint_step"]]
    result["metrics"] = publish.summary_metrics(rows, n_params, sum(v.numel() for v in enc_state.values()))
    # the encoder at pretrain.snapshot_tokens, for the curve of retrieval against tokens (issue 63, item 4)
    taken = publish.export_snapshots(cfg, upstream, export_dir, {
        "objective": cfg.objective, "fingerprint": "gpu-check", "registered_model": None})
    result["exported"] = pack(export_dir, out)
    result["snapshots"] = {t: i for t, i in taken.items() if (export_dir / "snapshots" / t).is_dir()}
    result["snapshots_left_behind"] = sorted(set(taken) - set(result["snapshots"]))  # no room to bring them back
    shutil.rmtree(scratch, ignore_errors=True)
    return result


def pack(export_dir: Path, out: Path) -> list[str]:
    """model/ and snapshots/ as model.tar cut into parts the lent machine can return (cat model.tar.part-* |
    tar x).  The encoders only: the generator's and heads' weights (pretraining.safetensors) would double it,
    and evaluation reads the encoder; the snapshots' weights in bf16 (half the bytes, the precision they
    trained in), and as many of them as fit the files that come back (the latest left out first: the final
    model is nearest to it)."""
    from safetensors.torch import load_file, save_file

    snapshots = sorted((export_dir / "snapshots").glob("tokens-*"))
    for d in snapshots:
        save_file({k: v.bfloat16() for k, v in load_file(d / "model.safetensors").items()},
                  str(d / "model.safetensors"), metadata={"format": "xylent-encoder/1", "travelled": "bf16"})
    room = MAX_FILES - sum(1 for _ in out.iterdir()) - 1  # gpu_check.json is rewritten, not added; faiss none
    while True:
        data = _tar(export_dir, snapshots)
        if len(range(0, len(data), PART_BYTES)) <= room or not snapshots:
            break
        shutil.rmtree(snapshots.pop())
    parts = []
    for k in range(0, len(data), PART_BYTES):
        part = out / f"model.tar.part-{k // PART_BYTES:02d}"
        part.write_bytes(data[k:k + PART_BYTES])
        parts.append(part.name)
    return parts


def _tar(export_dir: Path, snapshots: list[Path]) -> bytes:
    import io

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(export_dir / "model", arcname="model",
              filter=lambda m: None if m.name.endswith("/pretraining.safetensors") else m)
        for d in snapshots:
            t.add(d, arcname=f"snapshots/{d.name}")
    return buf.getvalue()


def faiss_gpu() -> dict:
    try:
        import faiss
    except ImportError as exc:
        return {"present": False, "why": f"faiss is not installed on this machine ({exc}); the GPU image has none"}
    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    return {"present": gpus > 0, "version": getattr(faiss, "__version__", None), "gpus": gpus}


def part(fn, *args) -> dict:
    """One part of the check; its failure is recorded, and the parts after it still run."""
    try:
        return fn(*args)
    except (Exception, SystemExit) as exc:  # a lent GPU's minutes: report everything, stop nothing
        import traceback

        return {"failed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="folder for everything measured (created)")
    ap.add_argument("--bundle", default=str(REPO / ".gpu-bundle"), help="what make gpu-bundle built")
    # within the 9 minutes one device call may take (issue 61): the speed rows with their compiles, then a short
    # learning run; a lent machine's start-up counts against the same 15 minutes
    ap.add_argument("--minutes", type=float, default=1.5, help="the learning run's time box")
    ap.add_argument("--bench-timeout", type=float, default=330.0, help="seconds for the benchmark's GPU rows")
    ap.add_argument("--toy", action="store_true", help="the CPU dry run: tiny sizes, seconds")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a spec override for the learning run (after --toy's)")
    args = ap.parse_args(argv)
    out, bundle = Path(args.out), Path(args.bundle)
    if not (bundle / "spec.yaml").is_file() or not all((bundle / "data" / s).is_dir() for s in DATA_STAGES):
        sys.exit(f"gpu_check: {bundle} is not a bundle (no spec.yaml or data/{{{','.join(DATA_STAGES)}}}): "
                 "run make gpu-bundle here first and carry it")
    out.mkdir(parents=True, exist_ok=True)
    result = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "toy": args.toy,
              "environment": environment(), "argv": sys.argv[1:],
              "bundle": json.loads(info.read_text()) if (info := bundle / "bundle.json").is_file() else None}
    (out / RESULT).write_text(json.dumps(result, indent=1))  # something comes back even if a part hangs
    result["benchmark"] = None if args.skip_bench else part(benchmark, out, args.toy, args.bench_timeout)
    (out / RESULT).write_text(json.dumps(result, indent=1))
    result["learning"] = part(learning, bundle, out, args.minutes, args.toy, args.overrides)
    result["faiss"] = part(faiss_gpu)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (out / RESULT).write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: result[k] for k in ("environment", "faiss")}, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
