"""Start the training ranks through the ``deepspeed`` launcher and watch them.

The launcher runs as a child process (its own process group, and told to die
with us through PR_SET_PDEATHSIG, so a killed flow never leaves ranks running);
its output, every rank's included, is streamed line by line to ``train.log``
and to a callback.  When a rank dies the launcher kills the others and exits
non-zero; we turn that into an error naming the rank, its exit code, the end of
its traceback and the checkpoint a rerun will resume from.

Local CPU ranks (``--num_gpus N``, no hostfile, no GPU) are started directly,
each with the command line and environment the launcher would give it: the
launcher is two more Python processes (``deepspeed`` and
``deepspeed.launcher.launch``), each importing torch and DeepSpeed (and DeepSpeed
imports MLflow), seconds before the first rank even starts, and its watch loop
notices a rank's exit up to a second late.  What the launcher does for its ranks
is kept: their output goes through one pipe (lines of two ranks can interleave, as
under the launcher), and when one rank exits non-zero the others are stopped and the launch
fails naming that rank.  ``train.log`` still begins with the ``$ deepspeed ...``
line (the launch as given: run by hand, it trains the same), followed by the line
that says how the ranks were started.  ``XYLENT_DEEPSPEED_LAUNCHER=1`` starts
every launch through the launcher.
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
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil

from xylent.build_locks import clear_stale_build_locks
from xylent.errors import XylentError
from xylent.process_identity import mark
from xylent.rank_exit import DIVERGED, DIVERGED_MARK

TRAINER_MODULE = "xylent.models.training.trainer"
REPO = Path(__file__).resolve().parents[1]  # on every rank's PYTHONPATH, so the module resolves to this checkout
_DIED = re.compile(r"exits with return code = (-?\d+)")
_RANK_LINE = re.compile(r"^\[rank(\d+)\]:")
_SPAWNED = re.compile(r"--local_rank=(\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Whether rank 0's rendezvous could not listen on ``port`` (bound as torch's store binds it)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def deepspeed_command(config: Path, *, ranks: int, hostfile: str | None = None, master_port: int | None = None,
                      module: str = TRAINER_MODULE) -> list[str]:
    """The launcher's command line; ``module`` is the rank's entry point (pretrain's
    trainer, or fine-tuning's ``xylent.tasks.evaluate.finetune.distributed``)."""
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
        if master_port and port_in_use(master_port):  # else each rank dies with EADDRINUSE, said only in train.log
            raise XylentError(f"master port {master_port} is in use on this machine", where="spec field master_port",
                              fix="choose a free port, or leave master_port unset (a free one is picked)")
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


def direct_ranks(cmd: list[str]) -> list[tuple[list[str], dict[str, str]]] | None:
    """The ranks of ``deepspeed --num_gpus N --master_port P --module M ARGS`` on this machine's CPU, each as
    (its command, the variables the launcher adds to its environment): what ``deepspeed.launcher.runner``
    and ``deepspeed.launcher.launch`` would start; None for any other launch (a hostfile, a GPU, another
    launcher interpreter, or XYLENT_DEEPSPEED_LAUNCHER=1)."""
    if os.environ.get("XYLENT_DEEPSPEED_LAUNCHER", "") not in ("", "0"):
        return None
    if len(cmd) < 7 or cmd[1] != "--num_gpus" or not cmd[2].isdigit() or cmd[3] != "--master_port" \
            or cmd[5] != "--module":
        return None
    if Path(cmd[0]).parent != Path(sys.executable).parent or gpu_available():  # the launcher's python is ours
        return None
    n, port, module, args = int(cmd[2]), cmd[4], cmd[6], cmd[7:]
    if n < 1:
        return None
    shared = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(n))),  # the CPU accelerator's, as launch.py sets them
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(n), "CROSS_RANK": "0",
              "CROSS_SIZE": "1", "LOCAL_SIZE": str(n)}
    return [([sys.executable, "-u", "-m", module, f"--local_rank={r}", *args],
             {**shared, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(n)]


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


SHM_MIN_AGE_S = 120.0


def sweep_stale_shm_buffers(shm_dir: Path = SHM_DIR, min_age_s: float = SHM_MIN_AGE_S) -> list[Path]:
    """Remove this user's DeepSpeed all-reduce segments that no live process maps and that
    nobody has written for ``min_age_s``: what runs killed with -9 (their launcher never
    cleaned up) left behind.  The age matters: a rank creates its segment by writing all of
    it (66 MB) before it maps it, and its peers spin until they can open it, so a young
    unmapped segment is another launch starting on this machine, not litter."""
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
    now, stale = time.time(), []
    for path in sorted(ours - mapped):
        with contextlib.suppress(OSError):  # gone meanwhile: its launch cleaned up
            if now - path.stat().st_mtime >= min_age_s:
                path.unlink()
                stale.append(path)
    return stale


def stop_launched() -> int:
    """SIGTERM every process of the launches this process started: each descendant whose XYLENT_PARENT
    names this process (the launcher and its ranks inherit it); returns how many were signalled.  Each is
    signalled through the psutil.Process taken while it was found alive, which refuses a pid that a
    new process took meanwhile; a bare pid or process-group id could name a stranger.  A rerun resumes
    from their last checkpoint."""
    mine, signalled = mark(), 0
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.environ().get("XYLENT_PARENT") != mine:
                continue
            proc.send_signal(signal.SIGTERM)
            signalled += 1
        except (psutil.Error, OSError):
            continue  # gone already, or not ours to signal
    return signalled


def launch(cmd: list[str], log_file: Path, on_line: Callable[[str], None] | None = None,
           resume_hint: Callable[[], str] | None = None, ranks: int | None = None) -> LaunchResult:
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["XYLENT_PARENT"] = mark()  # local ranks die with us, even after a kill -9
    if not gpu_available():
        env["DS_ACCELERATOR"] = "cpu"  # CPU ranks talk over gloo
        env.setdefault("CUDA_VISIBLE_DEVICES", "")
        if ranks:  # each rank its share of the cores, not all of them (oversubscription halves throughput)
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks)))
    resumed, died, tracebacks, errors, stopped = 0, [], {}, [], None
    sweep_stale_shm_buffers()
    notes: list[str] = []
    clear_stale_build_locks(say=lambda line: (notes.append(line), print(line, file=sys.stderr, flush=True)))
    direct = direct_ranks(cmd)
    with open(log_file, "a", encoding="utf-8") as log:
        log.writelines(line + "\n" for line in notes)
        log.write("$ " + " ".join(cmd) + "\n")
        if direct is not None:
            log.write(f"xylent: {len(direct)} local CPU rank(s), started without the launcher's processes: "
                      + " ".join(f"{k}={v}" for k, v in direct[0][1].items()) + " " + " ".join(direct[0][0])
                      + (" (and so on per rank)" if len(direct) > 1 else "") + "\n")
        log.flush()
        procs, out = _start(cmd, direct, env)
        watched = _Watched(procs, stop_others_on_a_death=direct is not None)
        try:
            for line in out:
                log.write(line)
                log.flush()
                if m := re.search(r"xylent: resumed from .* at step (\d+)", line):
                    resumed = int(m.group(1))
                if DIVERGED_MARK in line:
                    stopped = line.split(DIVERGED_MARK, 1)[1].strip()
                if direct is None and (m := _DIED.search(line)):  # the launcher's report of a rank's death
                    rank = _SPAWNED.search(line)
                    died.append((int(rank.group(1)) if rank else None, int(m.group(1))))
                if m := _RANK_LINE.match(line):
                    tracebacks.setdefault(int(m.group(1)), []).append(line.rstrip())
                elif re.match(r"^\w*(Error|Exception): ", line):  # the launcher's own failure
                    errors.append(line.strip())
                if on_line is not None:
                    on_line(line.rstrip("\n"))
            watched.join()
            if direct is not None:
                # as the launcher: the code of the rank that failed first; the ones stopped after it come later
                died = [watched.death] if watched.death else []
                rc = watched.death[1] if watched.death else 0
            else:
                rc = procs[0].returncode
        finally:
            watched.stop()
            out.close()
            remove_shm_buffers(cmd)
    if stopped is not None and (rc == DIVERGED or any(code == DIVERGED for _, code in died)):
        raise XylentError(f"training diverged: {stopped}", where=str(log_file),
                          fix="lower pretrain.lr, lengthen pretrain.warmup_steps or lower pretrain.clip and run "
                              "again (new settings start a new run; the same ones would diverge again)")
    if rc != 0:
        raise XylentError(_death_message(rc, died, tracebacks, errors), where=str(log_file),
                          fix=(resume_hint() if resume_hint else "fix the cause and run it again"))
    return LaunchResult(resumed, log_file)


def _start(cmd: list[str], direct: list | None, env: dict[str, str]) -> tuple[list[subprocess.Popen], object]:
    """The launcher, or each local rank, in its own process group and dying with us; -> (the processes, one text
    stream of all their output).  The ranks share one pipe, as they share the launcher's stdout: lines of two
    ranks can interleave there as they do under the launcher."""
    read_fd, write_fd = os.pipe()
    procs: list[subprocess.Popen] = []
    try:
        for rank_cmd, rank_env in direct or [(cmd, {})]:
            procs.append(subprocess.Popen(rank_cmd, stdout=write_fd, stderr=subprocess.STDOUT,
                                          env={**env, **rank_env}, preexec_fn=_die_with_parent))
    except BaseException:
        for p in procs:  # a rank that cannot start: the ones started would wait for it forever
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # unreaped: its group is still its own
            p.wait()
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)  # the stream ends when the last process holding it exits
    return procs, open(read_fd, encoding="utf-8", errors="replace")


class _Watched:
    """The processes of one launch (the launcher, or each directly started rank), each watched by a thread of its
    own that sees it exit before reaping it: while a process is unreaped its pid, and so its process group, cannot
    name another process, so what is left of its group (a child still holding the output pipe) is killed then.
    Started directly, the first rank to exit non-zero is the launch's death and the other ranks' groups are
    stopped, as ``deepspeed.launcher.launch`` stops them (a rank waiting in a collective for a dead peer would
    wait forever)."""

    def __init__(self, procs: list[subprocess.Popen], stop_others_on_a_death: bool):
        self.procs, self.stop_others = procs, stop_others_on_a_death
        self.death: tuple[int, int] | None = None
        self._lock, self._reaped = threading.Lock(), set()
        self._threads = [threading.Thread(target=self._watch, args=(r,), daemon=True) for r in range(len(procs))]
        for t in self._threads:
            t.start()

    def _watch(self, rank: int) -> None:
        p = self.procs[rank]
        try:
            info = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # exited, still unreaped
            code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            with self._lock:
                if self.stop_others and code != 0 and self.death is None:
                    self.death = (rank, code)
                    self._signal_unreaped(signal.SIGTERM)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)  # its own leftovers: nothing of it may outlive it
                p.wait()
                self._reaped.add(rank)
        except BaseException:
            with self._lock:  # a watch that fails must not leave the other ranks waiting for this one forever
                self._signal_unreaped(signal.SIGKILL)
            raise

    def _signal_unreaped(self, sig: int) -> None:
        for rank, p in enumerate(self.procs):
            if rank not in self._reaped:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, sig)

    def join(self, timeout: float | None = None) -> None:
        for t in self._threads:
            t.join(timeout)

    def stop(self, grace_s: float = 30.0) -> None:
        """Every process still running: SIGTERM, then SIGKILL after ``grace_s`` (what a launch stopped early or
        failing leaves); each is reaped by its watch."""
        with self._lock:
            self._signal_unreaped(signal.SIGTERM)
        self.join(grace_s)
        with self._lock:
            self._signal_unreaped(signal.SIGKILL)
        self.join()


def _death_message(rc: int, died: list[tuple[int | None, int]], tracebacks: dict[int, list[str]],
                   errors: list[str]) -> str:
    if died:
        rank, code = died[0]
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        who = rank if rank is not None else "?"
        what = f"training rank (local) {who} died ({how}); the others were stopped"
    else:
        what = f"the deepspeed launcher failed (exit code {rc})" + (f": {errors[-1]}" if errors else "")
    for r in sorted(tracebacks)[:1]:  # the first rank that printed a traceback: usually the cause
        last = [ln.split(":", 1)[1].strip() for ln in tracebacks[r] if ln.split(":", 1)[1].strip()][-3:]
        what += "".join(f"\n  rank {r}: {ln}" for ln in last)
    return what
