"""A run's stop request, seen by every thread.

Ctrl-C and SIGTERM reach the main thread only (Prefect turns SIGTERM into an exception
there during a flow run), but a run's long loops run in worker threads: the task that
streams a DeepSpeed launch's output, a download's chunks.  Python cannot stop a thread
from outside, and the flow waits for its task threads before it ends -- so without this
a pretrain given SIGTERM trained on to its last step.  The stage wrapper
(``xylent.flows.kit.stage``) calls :func:`request` when the main thread is interrupted; those
loops call :func:`check`, which raises ``KeyboardInterrupt`` in their thread, and their
own cleanup runs (a launch's ranks are stopped, a half-written download is dropped).
"""

from __future__ import annotations

import threading

_STOP = threading.Event()


def request() -> None:
    _STOP.set()


def requested() -> bool:
    return _STOP.is_set()


def check() -> None:
    """Raise ``KeyboardInterrupt`` here when the run was asked to stop."""
    if _STOP.is_set():
        raise KeyboardInterrupt("the run was interrupted")


def clear() -> None:
    """A new run in the same process (tests, ``main`` called twice) starts unrequested."""
    _STOP.clear()
