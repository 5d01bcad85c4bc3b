"""No process outlives the `xylent` that started it, even after kill -9.

- The temporary Prefect server: Prefect starts one per process that has no
  ``PREFECT_API_URL`` and stops it at exit, which a kill -9 skips.  The CLI
  starts it itself (while it imports the rest), shares its URL with every
  worker it spawns (which would each start another), and leaves a watchdog
  process that stops the server when the CLI is gone.
- Process-pool workers (``runner.kind: processes``) watch their parent and exit
  when it is gone.
- Logs: a user error (or a full disk) is its message, without the traceback
  Prefect and MLflow would print, in the CLI and in every worker.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from xylent.errors import XylentError, environment_error

_WATCHDOG = """
import sys, time
import psutil
from xylent.process_identity import same_process  # that process, not one that got its number since
parent, parent_started, server, server_started = (int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]),
                                                  float(sys.argv[4]))

while same_process(parent, parent_started):
    time.sleep(0.5)
try:
    proc = psutil.Process(server)
    if same_process(server, server_started):  # still the server: not one that took its number
        proc.terminate()
        proc.wait(10)
except psutil.TimeoutExpired:
    proc.kill()
except (psutil.NoSuchProcess, psutil.AccessDenied):
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
    if Path(argv[0]).name not in ("xylent", "cli.py") or argv[1:2] == ["worker"]:
        return  # the worker is Prefect's own, its log a service's: INFO lines and all (and its runs' too)
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


def start_prefect_server() -> Callable[[], None]:
    """Start the temporary Prefect server when no API is configured, without waiting for it.

    The caller goes on with its own imports (seconds too) while the server starts, and
    calls the function returned before its first flow: it waits until the server answers
    and points this process's Prefect, and every process it spawns, at it.  (Prefect's
    client would start the same server, ``SubprocessASGIServer``, whose command this is,
    but only after importing Prefect's whole server into this process, and waiting.)
    A no-op function when an API is configured.

    Importing Prefect to read its settings takes a second of the server's start, so when
    Prefect is not imported yet the server starts on a guess read from the environment and
    the active profile (:func:`_no_api_configured`); Prefect's own settings decide when the
    function returned is called, and stop a server started on a wrong guess.
    """
    if "prefect" not in sys.modules and _no_api_configured():
        server = _TemporaryServer()
    else:
        server = None
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE

    def ready() -> None:
        if PREFECT_API_URL.value() or not PREFECT_SERVER_ALLOW_EPHEMERAL_MODE.value():
            if server is not None:
                server.stop()
            return
        (server or _TemporaryServer()).wait()

    return ready


_EPHEMERAL = ("PREFECT_SERVER_EPHEMERAL_ENABLED", "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE")  # the name, its old alias


def _no_api_configured() -> bool:
    """Whether this process's Prefect will need the temporary server, read without importing
    Prefect as Prefect reads it: no API URL in the environment or the active profile (the
    profiles Prefect ships, updated by the user's file), ephemeral mode on (its default is
    off; Prefect's own "ephemeral" profile turns it on), and no settings file in the working
    folder (prefect.toml, .env, pyproject.toml's [tool.prefect]) that only Prefect reads right."""
    env = os.environ
    if env.get("PREFECT_API_URL"):
        return False
    cwd = Path.cwd()
    if (cwd / "prefect.toml").exists() or (cwd / ".env").exists():
        return False
    with contextlib.suppress(OSError):
        if "[tool.prefect" in (cwd / "pyproject.toml").read_text(encoding="utf-8", errors="replace"):
            return False
    profiles = _profiles()
    if profiles is None:
        return False  # Prefect will say what is wrong with the file
    active = profiles["profiles"].get(env.get("PREFECT_PROFILE") or profiles["active"]) or {}
    if active.get("PREFECT_API_URL"):
        return False
    flag = next((v for v in [*(env.get(k) for k in _EPHEMERAL), *(active.get(k) for k in _EPHEMERAL)]
                 if v not in (None, "")), "false")
    return str(flag).strip().lower() in ("1", "true", "t", "yes", "y", "on")


def configured_api_url() -> tuple[str, str] | None:
    """The Prefect API this process's Prefect will use, as read without importing Prefect, and
    where it is set: ``$PREFECT_API_URL`` or the active profile's.  None when neither names one."""
    if url := os.environ.get("PREFECT_API_URL"):
        return url, "PREFECT_API_URL"
    profiles = _profiles()
    if profiles is None:
        return None
    name = os.environ.get("PREFECT_PROFILE") or profiles["active"]
    if url := (profiles["profiles"].get(name) or {}).get("PREFECT_API_URL"):
        return url, f"PREFECT_API_URL of the active Prefect profile {name!r}"
    return None


def _profiles() -> dict | None:
    """Prefect's shipped profiles with the user's file over them (``active`` and
    ``profiles``); None when the user's file cannot be read as TOML."""
    import importlib.util
    import tomllib

    shipped = Path(importlib.util.find_spec("prefect").origin).parent / "settings" / "profiles.toml"
    out = tomllib.loads(shipped.read_text(encoding="utf-8"))
    out.setdefault("profiles", {})
    home = Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()
    path = Path(os.environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()
    try:
        user = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return out
    except (OSError, ValueError):
        return None
    for name, values in (user.get("profiles") or {}).items():
        out["profiles"][name] = {**out["profiles"].get(name, {}), **(values or {})}
    out["active"] = user.get("active", out.get("active"))
    return out


class _TemporaryServer:
    """Prefect's temporary server (no UI, ephemeral services), stopped when this process
    exits; a watchdog stops it after a kill -9.

    Its stderr goes to an unnamed file, not the user's terminal: stopping it cancels its
    background services mid-query, and the tracebacks they print then would follow a command
    that succeeded.  The file's tail is in the error when the server fails on its own."""

    def __init__(self):
        import importlib.util

        package = Path(importlib.util.find_spec("prefect").origin).parent
        self._args = [sys.executable, "-m", "uvicorn", "--app-dir", str(package.parent), "--factory",
                      "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--log-level", "error",
                      "--lifespan", "on"]
        self._env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
                     "PREFECT__SERVER_FINAL": "1"}
        if "prefect" in sys.modules:  # settings this process changed (a profile, temporary settings) hold there too
            from prefect.settings import get_current_settings

            self._env.update(get_current_settings().to_environment_variables(exclude_unset=True))
        self._spawn()
        atexit.register(self.stop)

    def _spawn(self) -> None:
        import tempfile

        self.port = _free_port()
        self.log = tempfile.TemporaryFile()  # unnamed: nothing is left behind, even after a kill -9
        self.process = subprocess.Popen([*self._args, "--port", str(self.port)], env=self._env, stderr=self.log)
        import psutil

        from xylent.process_identity import started

        try:
            server_started = started(self.process.pid)
        except psutil.NoSuchProcess:  # it exited at once (its port taken): wait() starts another
            return
        subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()), repr(started(os.getpid())),
                          str(self.process.pid), repr(server_started)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)  # not in our process group: a Ctrl-C reaches us, not it

    def wait(self) -> None:
        import urllib.error
        import urllib.request

        from prefect.context import refresh_global_settings_context
        from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, PREFECT_UI_URL

        ui_unset = PREFECT_UI_URL.value() is None  # it would follow the API URL: a link to a server gone at exit
        deadline = time.monotonic() + PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
        while True:
            if self.process.poll() == 3:  # startup failed (its port taken meanwhile; or, under load, another
                self._spawn()             # CLI's server migrating the shared database): another, with its own time
                deadline = time.monotonic() + PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
            elif self.process.poll() is not None:
                raise RuntimeError(f"the temporary Prefect server exited with code {self.process.returncode}; "
                                   f"it said:\n{self.said()}")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out while waiting for the temporary Prefect server at {self.api_url}; "
                                   f"it said:\n{self.said()}")
            time.sleep(0.05)
        os.environ["PREFECT_API_URL"] = self.api_url  # inherited by pool workers: one server, not one each
        if ui_unset:
            os.environ["PREFECT_UI_URL"] = ""
        refresh_global_settings_context()  # Prefect read the environment when it was imported

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def said(self, limit: int = 4000) -> str:
        """The tail of what the server wrote to stderr (read without moving the file's offset,
        which the server shares)."""
        size = os.fstat(self.log.fileno()).st_size
        start = max(0, size - limit)
        return os.pread(self.log.fileno(), size - start, start).decode("utf-8", "replace").strip() or "(nothing)"

    def stop(self) -> None:
        if self.log.closed:  # stopped already (a wrong guess, then at exit)
            return
        if self.process.poll() not in (None, 0, 3):  # it failed on its own, after it answered: say why
            print(f"the temporary Prefect server had stopped with code {self.process.returncode}; it said:\n"
                  f"{self.said()}", file=sys.stderr)
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def _free_port() -> int:
    """A free port in 8000-8999, as Prefect picks its temporary server's."""
    for _ in range(10):
        port = random.randrange(8000, 9000)
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            try:
                sock.bind(("127.0.0.1", port))
                return port
            except OSError:
                time.sleep(random.uniform(0.1, 0.5))
    raise RuntimeError("no free port in 8000-8999 for the temporary Prefect server")


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(1)  # the parent is gone (kill -9): nobody waits for this worker's results


def worker_init(parent: int) -> None:
    """Initializer of each process-pool worker."""
    quiet_user_errors()
    threading.Thread(target=_exit_with_parent, args=(parent,), name="exit-with-parent", daemon=True).start()
