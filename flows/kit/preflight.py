"""What a run needs of its environment, checked in seconds before anything starts.

Each of these once failed late, slowly or under the wrong name (issue 64): a read-only
``HOME`` or a ``PREFECT_HOME`` that is a file stalled the temporary Prefect server's start for
five minutes; a dead ``PREFECT_API_URL`` ended in "internal error (a bug)"; a dead MLflow
server was retried for four minutes; ``sqlite:////sys/mlflow.db`` failed after two minutes
blaming the workspace; a Dask address nobody listens on took 30 s and a bare ``OSError``.
Every check names the setting, its value and what to do, and none waits longer than
:data:`PROBE_S` on the network.
"""

from __future__ import annotations

import os
import socket
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from xylent.errors import XylentError
from xylent.redact import redact_text
from xylent.tracking import scheme_of

PROBE_S = 3.0  # a server on a healthy network answers in milliseconds; a dead one costs this, once


def check_run_environment(store: str, store_where: str | None) -> None:
    """Everything ``xylent run`` needs outside the workspace: a temporary folder, Prefect (its
    home when it starts a server of its own, else the server named), and the MLflow store
    ``store`` (named by ``store_where``: a spec field or an environment variable; None for the
    workspace's own, which the workspace's checks cover)."""
    if "TMPDIR" in os.environ:
        writable_folder(os.environ["TMPDIR"], "TMPDIR", create=False,
                        fix="point TMPDIR at a folder you can write, or unset it")
    from xylent.flows.kit.processes import configured_api_url

    api = configured_api_url()
    if api is None:
        _check_prefect_home()
    else:
        url, where = api
        answers(f"{url.rstrip('/')}/health", setting=where, value=url,
                fix="start that server (prefect server start), correct the URL, or unset it: xylent then starts a "
                    "temporary server of its own for the run")
    if store_where is not None:
        check_store(store, store_where)


def _check_prefect_home() -> None:
    """Prefect's temporary server keeps its database under PREFECT_HOME (default ~/.prefect)."""
    fix = "point PREFECT_HOME at a folder you can write (e.g. export PREFECT_HOME=$PWD/.prefect)"
    if os.environ.get("PREFECT_HOME"):
        writable_folder(os.environ["PREFECT_HOME"], "PREFECT_HOME", create=True, fix=fix)
        return
    home = os.environ.get("HOME") or str(Path.home())
    fix = f"{fix}, or set HOME to your home folder"
    if not Path(home).is_dir():
        raise XylentError(f"HOME = {home} is {'a file' if Path(home).exists() else 'missing'}, not a folder: Prefect "
                          "keeps its database in ~/.prefect", where="HOME", fix=fix)
    writable_folder(str(Path(home) / ".prefect"), "HOME", create=True, fix=fix, shown=f"{home} (~/.prefect in it)")


def writable_folder(value: str, setting: str, *, create: bool, fix: str, shown: str | None = None) -> Path:
    """``value`` as a folder this process can write: made if ``create`` (and missing), then proven
    by writing a file there (``os.access`` says yes to root on a read-only mount's folders)."""
    path = Path(value).expanduser()
    said = f"{setting} = {shown or value}"
    if path.exists() and not path.is_dir():
        raise XylentError(f"{said} is a file, not a folder", where=setting, fix=fix)
    if not path.exists():
        if not create:
            raise XylentError(f"{said} does not exist", where=setting, fix=fix)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise XylentError(f"{said}: the folder cannot be made ({exc.strerror})", where=setting, fix=fix) from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise XylentError(f"{said}: the folder cannot be written ({exc.strerror})", where=setting, fix=fix) from None
    return path


def answers(url: str, *, setting: str, value: str, fix: str) -> None:
    """``url`` answers at all within :data:`PROBE_S` (any HTTP status: a server is there)."""
    try:
        with urllib.request.urlopen(url, timeout=PROBE_S):
            return
    except urllib.error.HTTPError:
        return  # it answered, if not with 200: its own errors say what is wrong later
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise XylentError(f"{setting} = {redact_text(value)} does not answer ({reason}; waited at most "
                          f"{PROBE_S:g} s)", where=setting, fix=fix) from None


def check_store(uri: str, where: str) -> None:
    """A configured MLflow store is there: a tracking server answers; a SQLite file's folder can be
    written (``sqlite:////sys/mlflow.db`` once failed after two minutes, blaming the workspace)."""
    scheme = scheme_of(uri)
    if scheme in ("http", "https"):
        answers(f"{uri.rstrip('/')}/health", setting=where, value=uri,
                fix="start the tracking server (mlflow server ...), correct the URI, or unset it to use the "
                    "workspace's own store")
        accepts_host(uri, where)
    elif scheme == "sqlite":
        path = uri.split(":///", 1)[1] if ":///" in uri else ""
        if path and path != ":memory:":
            writable_folder(str(Path(path).parent), where, create=True, shown=f"{uri} (its folder)",
                            fix="point it at a database file in a folder you can write, or unset it to use the "
                                "workspace's own store")


def accepts_host(uri: str, where: str) -> None:
    """The tracking server answers the name ``uri`` reaches it by.  MLflow ≥ 3.5 refuses any Host
    header outside its ``--allowed-hosts`` with 403 (against DNS rebinding), but not on ``/health``:
    a team's ``http://mlflow-team:5000`` passed the probe above, then failed every call of the run,
    twice, with advice that never named the setting."""
    host = urlparse(uri).netloc.rsplit("@", 1)[-1]
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/search?max_results=1",
                                    timeout=PROBE_S):
            return
    except urllib.error.HTTPError as exc:
        if exc.code != 403 or b"Invalid Host header" not in exc.read(4096):
            return  # authentication and the like: MLflow's own error says it on the first call
    except (urllib.error.URLError, OSError, ValueError):
        return  # it answered /health a moment ago: a flaky network is the run's retries' to ride out
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    raise XylentError(f"the MLflow server at {redact_text(uri)} refuses the host name {host!r} (403 Invalid "
                      "Host header: it is not in the server's --allowed-hosts)", where=where,
                      fix=f"start the server with the name allowed: MLFLOW_ALLOWED_HOSTS={name} in "
                          f"infra/docker/.env for the compose stack, or `mlflow server ... --allowed-hosts "
                          f"'{name},{name}:*,localhost,localhost:*'` (docs/tracking.md); or reach it by an "
                          "address it allows")


def check_address(address: str, what: str) -> None:
    """Something listens at a cluster's ``host:port`` (``tcp://``, ``ray://`` or bare), within :data:`PROBE_S`."""
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    if not parsed.hostname or parsed.port is None:
        return  # "auto" and the like: the cluster's client resolves them
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=PROBE_S):
            return
    except OSError as exc:
        raise XylentError(f"no {what} answers at {address} ({exc.strerror or exc}; waited at most {PROBE_S:g} s)",
                          where="spec field runner.address",
                          fix=f"start the {what} (or check the address it printed and that this machine reaches "
                              "it), or leave runner.address unset: xylent then starts a cluster of its own") from None


def check_workspace(root: Path, stages: tuple[str, ...], *, own_store: bool) -> None:
    """The workspace's top-level entries are what they must be before a run touches them: a stage's
    folder, ``logs`` and ``mlartifacts`` folders (a file there, or a link to nothing, ended in
    "internal error (a bug)"), ``.xylent.lock`` a file, ``mlflow.db`` (when the store is the
    workspace's own) an SQLite database (a damaged one read as a bug, a link to nothing stalled two
    minutes and blamed a read-only disk).  A link to a folder elsewhere is fine: that is how a stage
    lives on a bigger disk."""
    folders = (*stages, "logs", "mlartifacts")
    files = (".xylent.lock", *(("mlflow.db",) if own_store else ()))
    for name in (*folders, *files):
        path = root / name
        if not os.path.lexists(path):
            continue
        away = f"move it away (mv {path} {path}.broken) and run again"
        if path.is_symlink() and not path.exists():
            raise XylentError(f"the workspace's {name} is a link to {os.readlink(path)}, which does not exist",
                              where=str(path), fix=f"mount or restore what it points at, or {away}: xylent makes "
                                                   "a new one")
        if name in folders and not path.is_dir():
            raise XylentError(f"the workspace's {name} is a file where a folder belongs", where=str(path),
                              fix=f"{away}: xylent makes the folder" + (" and builds the stage again"
                                                                        if name in stages else ""))
        if name in files and path.is_dir():
            raise XylentError(f"the workspace's {name} is a folder where a file belongs", where=str(path),
                              fix=f"{away}: xylent makes the file")
        if name == "mlflow.db":
            with open(path, "rb") as f:
                head = f.read(16)
            if head and head != b"SQLite format 3\x00":
                raise XylentError(f"the workspace's {name} is not an SQLite database (it starts with {head[:8]!r})",
                                  where=str(path), fix=f"restore it from a backup, or {away}: xylent starts a new "
                                                       "MLflow store (the runs the old one held are not in it)")
