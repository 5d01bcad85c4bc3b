"""``xylent worker``: Prefect's process worker for the deployments, with the checks that
turn its two common start-up failures into one line each.

Started bare, ``prefect worker start`` without ``PREFECT_API_URL`` prints a long traceback
ending in "`PREFECT_API_URL` must be set", and a worker pointed at a server that is not up
retries quietly.  This one says which, and then replaces itself with Prefect's worker, so
signals, logs and exit codes are Prefect's own.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

from xylent.errors import XylentError

CHECKOUT = Path(__file__).resolve().parents[2]  # the deployments' entrypoints live here (prefect.yaml)


def check_server(api_url: str | None) -> str:
    """The API URL of a Prefect server that answers, or a user error saying what is missing."""
    if not api_url:
        raise XylentError("a worker takes its runs from a Prefect server, and PREFECT_API_URL is not set",
                          where="the environment and the active Prefect profile",
                          fix="start one (prefect server start, or the compose stack) and export "
                          "PREFECT_API_URL=http://<host>:4200/api (or prefect config set PREFECT_API_URL=...)")
    url = api_url.rstrip("/")
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            if r.status == 200:
                return url
            problem = f"answered HTTP {r.status}"
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):  # it answers, and wants the API key the worker will send (Prefect Cloud)
            return url
        problem = f"answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        problem = f"does not answer ({getattr(exc, 'reason', exc)})"
    raise XylentError(f"the Prefect server at PREFECT_API_URL {problem}", where=url,
                      fix="start it, or point PREFECT_API_URL at the server's /api URL")


def start_worker(pool: str, prefect_args: list[str]) -> None:
    """Check the server, then exec ``prefect worker start --pool POOL ...`` with XYLENT_HOME set."""
    from prefect.settings import PREFECT_API_URL

    check_server(PREFECT_API_URL.value())  # the environment's, else the active Prefect profile's
    os.environ.setdefault("XYLENT_HOME", str(CHECKOUT))
    prefect = shutil.which("prefect", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                            os.environ.get("PATH", "")]))
    if prefect is None:
        raise XylentError("the prefect command is not installed next to this Python", where=sys.executable,
                          fix="make install")
    sys.stdout.flush()
    sys.stderr.flush()
    # Prefect's worker stops on SIGTERM by sending itself SIGINT; a process started with `&` from a
    # script (or by nohup) inherits SIGINT ignored, and then kept running for minutes after a stop
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.execv(prefect, [prefect, "worker", "start", "--pool", pool, *prefect_args])
