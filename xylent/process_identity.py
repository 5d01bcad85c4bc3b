"""Which process a pid names: the pid and when that process started, as a string another process
can check.  PIDs wrap within minutes on a busy machine, so every "is it still that process?"
question (the ranks' parent watch, the server watchdog, the tracking lock, stopping a launch)
asks it here.

The start time is counted from boot (Linux: ``/proc/<pid>/stat``), not psutil's
``create_time()``: that adds the boot time, which the kernel derives from the wall clock, so a
clock step (NTP at boot, a VM resumed or migrated) moves every process's start by the step and
a live process would read as gone.  Elsewhere it falls back to ``create_time()``.
"""

from __future__ import annotations

import os
import sys

import psutil

_LINUX = sys.platform.startswith("linux")  # /proc/<pid>/stat as Linux lays it out (Solaris has a /proc too)
_TICKS = os.sysconf("SC_CLK_TCK") if _LINUX else 100


def started(pid: int) -> float:
    """When ``pid`` started, in seconds (since boot on Linux); psutil.NoSuchProcess once it is gone,
    psutil.AccessDenied where its record cannot be read (``/proc`` mounted with hidepid)."""
    if not _LINUX:
        return psutil.Process(pid).create_time()
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError) as e:
        raise psutil.NoSuchProcess(pid) from e
    except OSError as e:
        raise psutil.AccessDenied(pid) from e
    # the name in parentheses may hold spaces and ')': the fields start after the last one
    return int(data[data.rfind(b")") + 2:].split()[19]) / _TICKS


def mark(pid: int | None = None) -> str:
    """``pid:start`` of ``pid`` (this process when None)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{started(pid)!r}"


def same_process(pid: int, start: float) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` (not gone, not a zombie, not
    another process that took its number)."""
    try:
        return started(pid) == start and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def is_alive(marked: str) -> bool:
    """Whether the process a ``mark()`` names is still running; a malformed mark names none."""
    try:
        pid, start = marked.rsplit(":", 1)
        return same_process(int(pid), float(start))
    except ValueError:
        return False
