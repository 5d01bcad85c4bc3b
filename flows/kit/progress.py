"""Progress for long work: a rich bar on an interactive terminal, and a Prefect
progress artifact (throttled) when running inside a flow, so the UI shows it too."""

from __future__ import annotations

import logging
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


class Progress:
    def __init__(self, title: str, total: float | None, *, unit: str = "B", key: str | None = None):
        self.title = title
        self.total = total
        self.done = 0.0
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
            if self._bar is not None:
                self._bar.update(self._task, completed=self.done)
            now = time.monotonic()
            if self._artifact_id is not None and self.total and now - self._last_ui > 1.0:
                self._last_ui = now
                self._push()

    def _push(self) -> None:
        try:
            from prefect.artifacts import update_progress_artifact

            update_progress_artifact(self._artifact_id, progress=min(100.0, 100.0 * self.done / self.total))
        except Exception as exc:
            log.debug("progress artifact update failed: %s", exc)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        if self._artifact_id is not None:  # finished: 100 %, also when the total was never known (no sizes)
            self.total = self.total or max(self.done, 1.0)
            self.done = self.total
            self._push()
