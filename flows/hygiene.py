"""No process outlives the `xylent` that started it, even after kill -9.

- The temporary Prefect server: Prefect starts one per process that has no
  ``PREFECT_API_URL`` and stops it at exit, which a kill -9 skips.  The CLI
  starts it itself, shares its URL with every worker it spawns (which would
  each start another), and leaves a watchdog process that stops the server
  when the CLI is gone.
- Process-pool workers (``runner.kind: processes``) watch their parent and exit
  when it is gone.
- Logs: a user error (or a full disk) is its message, without the traceback
  Prefect and MLflow would print, in the CLI and in every worker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

from xylent.errors import XylentError, environment_error

_WATCHDOG = """
import os, signal, sys, time
import psutil
parent, server = int(sys.argv[1]), int(sys.argv[2])
while psutil.pid_exists(parent) and psutil.Process(parent).status() != psutil.STATUS_ZOMBIE:
    time.sleep(0.5)
try:
    proc = psutil.Process(server)
    proc.terminate()
    proc.wait(10)
except psutil.TimeoutExpired:
    proc.kill()
except psutil.NoSuchProcess:
    pass
"""


class _UserErrorsWithoutTraceback(logging.Filter):
    """Prefect logs a failed task's traceback; for a user error the message is enough."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, XylentError) or (exc is not None and environment_error(exc) is not None):
            record.exc_info = None
            record.exc_text = None
        return True


def quiet_user_errors() -> None:
    filt = _UserErrorsWithoutTraceback()
    # MLflow's SQL store logs the database error with its traceback before raising it
    for name in ("prefect.task_runs", "prefect.flow_runs", "prefect", "mlflow.store.db.utils"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _UserErrorsWithoutTraceback) for f in logger.filters):
            logger.addFilter(filt)


def quiet_console(argv: list[str]) -> None:
    """Prefect prints an INFO line per task on the console, which breaks the
    progress bars: keep warnings and errors there (the INFO lines still reach
    the Prefect API and UI) unless ``--verbose``.  A level the user set wins,
    except over ``--verbose``.  Only for the ``xylent`` command itself: a
    program that imports the CLI module keeps its own logging."""
    if Path(argv[0]).name not in ("xylent", "cli.py"):
        return
    if "--verbose" in argv or "-v" in argv:
        os.environ["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] = "NOTSET"
        os.environ["MLFLOW_LOGGING_LEVEL"] = "INFO"
    else:
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # "Creating initial MLflow database tables..."


@contextlib.contextmanager
def run_log(root: Path, target: str) -> Iterator[Path | None]:
    """Prefect's log lines of this invocation (one per task, the ones the console no
    longer shows) also go to ``<workspace>/logs/<time>-<target>-<pid>.log``; None
    when the workspace cannot take it (the stage then says why, clearly)."""
    path = root / "logs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{target}-{os.getpid()}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8", delay=True)
    except OSError:
        yield None
        return
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)-7s | %(name)s - %(message)s"))
    prefect = logging.getLogger("prefect")  # flow and task run loggers propagate to it
    prefect.addHandler(handler)
    try:
        yield path
    finally:
        prefect.removeHandler(handler)
        handler.close()


def own_prefect_server() -> None:
    """Start the temporary Prefect server now, when no API is configured."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE

    if PREFECT_API_URL.value() or not PREFECT_SERVER_ALLOW_EPHEMERAL_MODE.value():
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the instance Prefect's own client would start and use
    server.start()
    os.environ["PREFECT_API_URL"] = server.api_url  # inherited by pool workers: one server, not one each
    subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(server.server_process.pid)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)  # not in our process group: a Ctrl-C reaches us, not it


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(1)  # the parent is gone (kill -9): nobody waits for this worker's results


def worker_init(parent: int) -> None:
    """Initializer of each process-pool worker."""
    quiet_user_errors()
    threading.Thread(target=_exit_with_parent, args=(parent,), name="exit-with-parent", daemon=True).start()
