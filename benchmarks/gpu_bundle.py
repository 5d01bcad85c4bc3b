"""``make gpu-bundle``: everything the GPU check (benchmarks/gpu_check.py) needs on a lent GPU
machine that the machine cannot get itself: it has no network, torch 2.11 on Python 3.12,
pyarrow, sentencepiece and transformers, and no DeepSpeed or pydantic.

    .gpu-bundle/
      wheels/       DeepSpeed built as a pure-Python wheel (DS_BUILD_OPS=0: no op is compiled
                    here; on the GPU its fused ops are not needed, torch's AdamW runs), and the
                    packages DeepSpeed and the spec need that the GPU image lacks (pydantic, ...)
      data/         the vocab, sampling and shards outputs of ``--spec`` (built here first,
                    through the pipeline, if the workspace does not hold them)
      spec.yaml     that spec, resolved (its ``extends:`` applied)
      bundle.json   what is inside, with sizes and versions

The device tool carries at most 64 MiB of working tree: the bundle is refused over
``--limit-mib`` (60), naming what is largest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

import harness  # noqa: E402

STAGES = ("vocab", "sampling", "shards")
# the GPU image's Python (KINDS.md): wheels must be for it
TARGET = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:",
          *[x for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
            for x in ("--platform", p)]]
# what DeepSpeed and the spec import that the image does not have (its package list: KINDS.md)
MISSING_THERE = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "hjson")


def fail(what: str, fix: str) -> None:
    sys.exit(f"gpu-bundle: {what}\n  what to do: {fix}")


def build_data(spec_file: Path, workspace: str | None, out: Path) -> dict:
    """The data stages up to shards through the CLI (cached ones are only checked), copied in."""
    cmd = [sys.executable, "-m", "xylent.cli", "run", "pipeline", "--until", "shards", "--spec", str(spec_file),
           "--json", *(["--workspace", workspace] if workspace else [])]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"building the data stages failed (exit {done.returncode}):\n{done.stderr[-3000:]}",
             f"run {' '.join(cmd[2:])} yourself and fix what it says")
    stages = json.loads(done.stdout)["stages"]
    for stage in STAGES:
        src = Path(stages[stage]["output_dir"])
        shutil.copytree(src, out / "data" / stage, symlinks=False)
    return {s: stages[s]["fingerprint"] for s in STAGES}


def _pip(*args: str, env: dict | None = None) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if done.returncode != 0:
        fail(f"pip {' '.join(args[:3])} ... failed:\n{done.stderr[-2000:]}",
             "this needs the package registry; or build with --no-wheels to bring the data only")


def build_wheels(out: Path) -> dict:
    from importlib.metadata import version

    wheels = out / "wheels"
    wheels.mkdir()
    pinned = {name: version(name) for name in ("deepspeed", *MISSING_THERE)}
    with tempfile.TemporaryDirectory() as tmp:  # the sdist, built against this torch, without its ops
        _pip("download", "--no-deps", "--no-binary=:all:", "-d", tmp, f"deepspeed=={pinned['deepspeed']}")
        sdist = next(Path(tmp).iterdir())
        _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(sdist),
             env={"DS_BUILD_OPS": "0", "DS_BUILD_AIO": "0", "DS_BUILD_GDS": "0"})
    _pip("download", "--no-deps", *TARGET, "-d", str(wheels),
         *[f"{n}=={v}" for n, v in pinned.items() if n != "deepspeed"])
    return pinned


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=str(REPO / "data_specs" / "gpu-check.yaml"))
    ap.add_argument("--workspace", default=None, help="where the data stages are (or get) built: default the spec's")
    ap.add_argument("--out", default=str(REPO / ".gpu-bundle"))
    ap.add_argument("--no-wheels", action="store_true", help="data and spec only (the CPU dry run: DeepSpeed is here)")
    ap.add_argument("--limit-mib", type=float, default=60.0)
    args = ap.parse_args(argv)

    from xylent.spec import load_spec

    spec_file, out = Path(args.spec).resolve(), Path(args.out)
    spec = load_spec(spec_file)
    tmp = out.with_name(out.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    info = {"spec": str(spec_file.relative_to(REPO) if spec_file.is_relative_to(REPO) else spec_file),
            "fingerprints": build_data(spec_file, args.workspace, tmp),
            # the device tool copies the working tree without .git: the commit travels here, into the check's result
            "git": harness.git_state()}
    (tmp / "spec.yaml").write_text(yaml.safe_dump(spec.dump(), sort_keys=False, allow_unicode=True))
    info["wheels"] = None if args.no_wheels else build_wheels(tmp)
    sizes = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
    info["bytes"] = sum(sizes.values())
    info["largest"] = dict(sorted(sizes.items(), key=lambda kv: -kv[1])[:8])
    if info["bytes"] > args.limit_mib * 2**20:
        shutil.rmtree(tmp)
        fail(f"the bundle would be {info['bytes'] / 2**20:.1f} MiB, over the {args.limit_mib:.0f} MiB the device "
             f"tool carries with the working tree; largest: "
             + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in list(info["largest"].items())[:4]),
             "shrink the corpus (fewer languages, shards.seq_len) or drop wheels the GPU image has")
    (tmp / "bundle.json").write_text(json.dumps(info, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"gpu-bundle: {out} ({info['bytes'] / 2**20:.1f} MiB)")
    return out


if __name__ == "__main__":
    main()
