"""Build locks that a killed op build left behind (torch's JIT extensions, which DeepSpeed's
CPU ranks build on their first run: ``deepspeed_shm_comm``).

torch takes ``<build dir>/lock`` (``torch.utils.file_baton.FileBaton``) while it compiles an
op and removes it when done; a build killed half-way leaves it, and every later rank then
polls for it to go, forever and silently, inside ``deepspeed.init_distributed`` (2026-12-02: a
restarted ``make acceptance`` sat 34 min there until the file was removed by hand).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil

MIN_AGE_S = 600.0  # a build of the shm op takes about a minute on 2 cores; a CUDA op can go minutes between writes


def extension_roots() -> list[Path]:
    """Where torch builds its JIT ops for this user (``torch.utils.cpp_extension``'s rule)."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return [Path(os.environ["TORCH_EXTENSIONS_DIR"])]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return [Path(cache) / "torch_extensions"]


def build_locks(roots: list[Path]) -> list[Path]:
    """Every op's build lock under ``roots`` (``<root>/<op>/lock`` or ``<root>/py311_cpu/<op>/lock``)."""
    return sorted({p for root in roots if root.is_dir() for p in [*root.glob("*/lock"), *root.glob("*/*/lock")]})


def building(build_dir: Path) -> bool:
    """Whether a process on this machine works in ``build_dir`` (torch runs ninja and the compilers
    there).  A process whose directory this user cannot read is not one of this user's builds."""
    build_dir = build_dir.resolve()
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if Path(proc.cwd()).resolve() == build_dir:
                return True
    return False


def last_written(build_dir: Path) -> float:
    """The newest file time in an op's build folder (its lock, ninja's objects as they are written)."""
    times = [build_dir.stat().st_mtime]
    for path in build_dir.rglob("*"):
        with contextlib.suppress(OSError):
            times.append(path.stat().st_mtime)
    return max(times)


def clear_stale_build_locks(roots: list[Path] | None = None, min_age_s: float = MIN_AGE_S, poll_s: float = 5.0,
                            say: Callable[[str], None] = print) -> list[Path]:
    """Remove each build lock that no build on this machine holds once nothing in its build folder
    was written for ``min_age_s``, waiting at most that long for a younger one to go or to age.  A
    folder written to during the wait has a live build somewhere (another machine sharing the cache,
    another user): its lock is left, and said, never removed.  A lock or folder this user cannot
    read or remove is left, and said.  Returns the locks removed."""
    try:
        locks = build_locks(extension_roots() if roots is None else roots)
    except OSError as exc:
        say(f"xylent: cannot look for stale op build locks ({exc}); if the ranks hang while they start, look for a "
            "`lock` file under the torch extensions folder (TORCH_EXTENSIONS_DIR) and remove it by hand")
        return []
    removed = []
    for lock in locks:
        deadline, said = time.monotonic() + min_age_s, False  # the local clock bounds the wait, not file times
        while True:
            try:
                if not lock.exists():
                    break  # its build finished
                if building(lock.parent):
                    break  # torch waits for a live build itself
                idle = time.time() - last_written(lock.parent)
                if idle >= min_age_s:
                    lock.unlink()
                    removed.append(lock)
                    say(f"xylent: removed {lock}, a build lock that no build holds, its folder untouched for "
                        f"{idle / 60:.0f} min (a build killed half-way leaves it, and every rank would wait on it "
                        "forever)")
                    break
                if time.monotonic() >= deadline:
                    say(f"xylent: left the build lock {lock}: its folder was written {idle:.0f} s ago, so a build "
                        "elsewhere may hold it; if the ranks hang while they start and no build runs, remove it "
                        "by hand")
                    break
            except FileNotFoundError:
                break
            except OSError as exc:
                say(f"xylent: cannot clear the build lock {lock} ({exc}); if a rank waits on it, remove it by hand")
                break
            if not said:
                say(f"xylent: waiting up to {min(min_age_s - idle, deadline - time.monotonic()):.0f} s for the build "
                    f"lock {lock} (no build on this machine holds it: one untouched for {min_age_s / 60:.0f} min is "
                    "removed)")
                said = True
            time.sleep(poll_s)
    return removed
