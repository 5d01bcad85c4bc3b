"""Start the training ranks through the ``deepspeed`` launcher and watch them.

The launcher runs as a child process (its own process group, and told to die
with us through PR_SET_PDEATHSIG, so a killed flow never leaves ranks running);
its output, every rank's included, is streamed line by line to ``train.log``
and to a callback.  When a rank dies the launcher kills the others and exits
non-zero; we turn that into an error naming the rank, its exit code, the end of
its traceback and the checkpoint a rerun will resume from.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil

from xylent.errors import XylentError

TRAINER_MODULE = "models.trainer"
REPO = Path(__file__).resolve().parents[2]  # on every rank's PYTHONPATH, so the module resolves to this checkout
_DIED = re.compile(r"exits with return code = (-?\d+)")
_RANK_LINE = re.compile(r"^\[rank(\d+)\]:")
_SPAWNED = re.compile(r"--local_rank=(\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def deepspeed_command(config: Path, *, ranks: int, hostfile: str | None = None, master_port: int | None = None,
                      module: str = TRAINER_MODULE) -> list[str]:
    """The launcher's command line; ``module`` is the rank's entry point (pretrain's
    trainer, or fine-tuning's ``tasks.finetune.distributed``)."""
    exe = shutil.which("deepspeed", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    if exe is None:
        raise XylentError("the deepspeed launcher is not installed", where=sys.executable,
                          fix="pip install deepspeed (it is a dependency of xylent: pip install -e .)")
    cmd = [exe]
    if hostfile:
        if not Path(hostfile).exists():
            raise XylentError("the DeepSpeed hostfile does not exist", where=hostfile,
                              fix="write one 'host slots=N' line per node, or drop pretrain.hostfile")
        cmd += ["--hostfile", str(hostfile)]
    else:
        cmd += ["--num_gpus", str(ranks)]
    cmd += ["--master_port", str(master_port or free_port()), "--module", module, "--config", str(config)]
    return cmd


def world_size(ranks: int, hostfile: str | None) -> int:
    """Ranks a launch will start: ``ranks`` locally, or the slots of a DeepSpeed hostfile."""
    if not hostfile:
        return ranks
    slots = re.findall(r"slots\s*=\s*(\d+)", Path(hostfile).read_text())
    return sum(int(n) for n in slots) or 1


def _die_with_parent() -> None:
    os.setsid()
    # not Linux (no libc.so.6): the process group is still ours to kill in launch()'s finally
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class LaunchResult:
    resumed_from_step: int
    log_file: Path


SHM_DIR = Path("/dev/shm")


def shm_buffers(cmd: list[str], shm_dir: Path = SHM_DIR) -> list[Path]:
    """DeepSpeed's CPU all-reduce segments of this launch on this machine
    (``deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>``, 66 MB each)."""
    if "--master_port" not in cmd or not shm_dir.is_dir():
        return []
    port = cmd[cmd.index("--master_port") + 1]
    return sorted(shm_dir.glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"))


def remove_shm_buffers(cmd: list[str], shm_dir: Path = SHM_DIR) -> None:
    # DeepSpeed never unlinks them: every CPU run would leave 66 MB per rank in /dev/shm until it is full
    for path in shm_buffers(cmd, shm_dir):
        with contextlib.suppress(OSError):
            path.unlink()


def sweep_stale_shm_buffers(shm_dir: Path = SHM_DIR) -> list[Path]:
    """Remove this user's DeepSpeed all-reduce segments that no live process maps:
    what runs killed with -9 (their launcher never cleaned up) left behind."""
    if not shm_dir.is_dir():
        return []
    ours = set(shm_dir.glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*"))
    if not ours:
        return []
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        with contextlib.suppress(OSError):
            mapped.update(Path(ln.split()[-1]) for ln in maps.read_text().splitlines()
                          if "deepspeed_allreduce_buffer" in ln)
    stale = sorted(ours - mapped)
    for path in stale:
        with contextlib.suppress(OSError):
            path.unlink()
    return stale


def launch(cmd: list[str], log_file: Path, on_line: Callable[[str], None] | None = None,
           resume_hint: Callable[[], str] | None = None, ranks: int | None = None) -> LaunchResult:
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    me = psutil.Process()
    env["XYLENT_PARENT"] = f"{me.pid}:{me.create_time()}"  # local ranks die with us, even after a kill -9
    if not gpu_available():
        env["DS_ACCELERATOR"] = "cpu"  # CPU ranks talk over gloo
        env.setdefault("CUDA_VISIBLE_DEVICES", "")
        if ranks:  # each rank its share of the cores, not all of them (oversubscription halves throughput)
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks)))
    resumed, died, tracebacks, errors = 0, [], {}, []
    sweep_stale_shm_buffers()
    with open(log_file, "a", encoding="utf-8") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                errors="replace", bufsize=1, preexec_fn=_die_with_parent)
        try:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if m := re.search(r"xylent: resumed from .* at step (\d+)", line):
                    resumed = int(m.group(1))
                if m := _DIED.search(line):
                    rank = _SPAWNED.search(line)
                    died.append((int(rank.group(1)) if rank else None, int(m.group(1))))
                if m := _RANK_LINE.match(line):
                    tracebacks.setdefault(int(m.group(1)), []).append(line.rstrip())
                elif re.match(r"^\w*(Error|Exception): ", line):  # the launcher's own failure
                    errors.append(line.strip())
                if on_line is not None:
                    on_line(line.rstrip("\n"))
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()
            remove_shm_buffers(cmd)
    if rc != 0:
        raise XylentError(_death_message(rc, died, tracebacks, errors), where=str(log_file),
                          fix=(resume_hint() if resume_hint else "fix the cause and run it again"))
    return LaunchResult(resumed, log_file)


def _death_message(rc: int, died: list[tuple[int | None, int]], tracebacks: dict[int, list[str]],
                   errors: list[str]) -> str:
    if died:
        rank, code = died[0]
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        who = rank if rank is not None else "?"
        what = f"training rank (local) {who} died ({how}); the launcher stopped the others"
    else:
        what = f"the deepspeed launcher failed (exit code {rc})" + (f": {errors[-1]}" if errors else "")
    for r in sorted(tracebacks)[:1]:  # the first rank that printed a traceback: usually the cause
        last = [ln.split(":", 1)[1].strip() for ln in tracebacks[r] if ln.split(":", 1)[1].strip()][-3:]
        what += "".join(f"\n  rank {r}: {ln}" for ln in last)
    return what
