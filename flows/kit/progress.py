"""Progress for long work: a rich bar on an interactive terminal, and a Prefect
progress artifact (throttled) when running inside a flow, so the UI shows it too;
and, for the CLI's console, a line as each stage starts and ends and a heartbeat
line during long work when nothing else moves (piped into a CI log or `tee`, a
run once printed nothing for minutes)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from contextvars import ContextVar

log = logging.getLogger("xylent")

# the workspace of the invocation running (its slug): every checkout on a machine shares one Prefect
# database, and a key's versions must be one workspace's history, not a mix
KEY_PREFIX: ContextVar[str] = ContextVar("xylent_artifact_key_prefix", default="")


def artifact_key(*parts: str) -> str:
    """``ws-3f9a1c-prepare-summary``: a Prefect artifact key of this workspace's."""
    return "-".join(p for p in (KEY_PREFIX.get(), *parts) if p)


class _Console:
    """The CLI's stderr while it runs flows in this process (off for a worker's runs: their lines
    go to the run's log, and the UI has the progress artifacts)."""

    def __init__(self):
        self.on = False
        self.last = 0.0  # when the console last got a line or a bar moved
        self.active: list[Progress] = []  # the bars now counting, newest last


CONSOLE = _Console()


def heartbeat_s() -> float:
    """Seconds of silence before a heartbeat line (``XYLENT_HEARTBEAT_S``, default 10)."""
    try:
        return max(0.1, float(os.environ.get("XYLENT_HEARTBEAT_S", "10")))
    except ValueError:
        return 10.0


def say(text: str) -> None:
    """One line on the CLI's console (``xylent: prepare 3f9a1c2e: done in 4.1 s``)."""
    if CONSOLE.on:  # not print(): a flow's log_prints makes that an INFO line, kept off the console
        sys.stderr.write(f"xylent: {text}\n")
        sys.stderr.flush()
        CONSOLE.last = time.monotonic()


@contextlib.contextmanager
def console():
    """The CLI's run: stage lines and heartbeats go to its stderr meanwhile."""
    CONSOLE.on, CONSOLE.last = True, time.monotonic()
    try:
        yield
    finally:
        CONSOLE.on = False


@contextlib.contextmanager
def heartbeat(what: str):
    """While ``what`` (a stage) works: after :func:`heartbeat_s` seconds without a line or a bar
    that moves on the screen, a line saying how long it has run and what the newest bar counts."""
    if not CONSOLE.on:
        yield
        return
    started, stop = time.monotonic(), threading.Event()

    def beat():
        every = heartbeat_s()
        while not stop.wait(min(1.0, every / 4)):
            if time.monotonic() - CONSOLE.last < every:
                continue  # a line, or a bar that moved on a terminal, said it lately
            newest = CONSOLE.active[-1:]  # one read: another thread may close the bar meanwhile
            status = f", {newest[0].status()}" if newest else ""
            say(f"{what}: working, {time.monotonic() - started:.0f} s{status}")

    thread = threading.Thread(target=beat, name=f"xylent-heartbeat-{what}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class Progress:
    def __init__(self, title: str, total: float | None, *, unit: str = "B", key: str | None = None):
        self.title = title
        self.unit = unit
        self.total = total
        self.done = 0.0
        CONSOLE.active.append(self)
        self._lock = threading.Lock()
        self._last_ui = 0.0
        self._bar = None
        self._artifact_id = None
        if sys.stderr.isatty():
            from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            cols = [TextColumn("{task.description}"), BarColumn()]
            count = "{task.completed:.0f}/{task.total:.0f}" if total else "{task.completed:.0f} " + unit
            cols += [DownloadColumn()] if unit == "B" else [TextColumn(count)]
            self._bar = RichProgress(*cols, TimeRemainingColumn(), transient=True)
            self._task = self._bar.add_task(title, total=total)
            self._bar.start()
        try:
            from prefect.artifacts import create_progress_artifact
            from prefect.context import FlowRunContext

            if FlowRunContext.get() is not None:
                self._artifact_id = create_progress_artifact(progress=0.0, key=key and artifact_key(key),
                                                             description=title)
        except Exception as exc:  # the UI's progress is a nicety; never fail a stage for it
            log.debug("no Prefect progress artifact: %s", exc)

    def advance(self, n: float) -> None:
        with self._lock:
            self.done += n
            now = time.monotonic()
            if self._bar is not None:
                self._bar.update(self._task, completed=self.done)
                CONSOLE.last = now  # it moved on the terminal: no heartbeat line needed
            if self._artifact_id is not None and self.total and now - self._last_ui > 1.0:
                self._last_ui = now
                self._push()

    def _push(self) -> None:
        try:
            from prefect.artifacts import update_progress_artifact

            update_progress_artifact(self._artifact_id, progress=min(100.0, 100.0 * self.done / self.total))
        except Exception as exc:
            log.debug("progress artifact update failed: %s", exc)

    def status(self) -> str:
        """``prepare 3/10 tasks`` (bytes in MB)."""
        scale, unit = (1e6, "MB") if self.unit == "B" else (1, self.unit)
        done = f"{self.done / scale:.0f}"
        return f"{self.title} {done}/{self.total / scale:.0f} {unit}" if self.total else f"{self.title} {done} {unit}"

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            CONSOLE.active.remove(self)
        if self._bar is not None:
            self._bar.stop()
        if self._artifact_id is not None:  # finished: 100 %, also when the total was never known (no sizes)
            self.total = self.total or max(self.done, 1.0)
            self.done = self.total
            self._push()
