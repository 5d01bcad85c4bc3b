"""What keeps `make test` fast: every test or fixture that launches DeepSpeed ranks, runs the
CLI in a subprocess or starts a server says so, and the session fails on one that does not.

Declarations: ``@pytest.mark.costs(deepspeed=2, cli=1, servers=1)`` on a test;
``@costs(...)`` under ``@pytest.fixture`` on a fixture (what its own set-up starts; the
fixtures it requests declare theirs).  Counts are upper bounds.

Counting: the real ``subprocess.Popen.__init__`` is wrapped (and always called): a process
started with ``XYLENT_PARENT`` in its environment is a DeepSpeed rank launch (xylent/launch.py
sets it for the launcher and every local rank program; local CPU ranks started without the
launcher count once, by their rank 0), one running ``xylent.cli`` or
``xylent`` is a CLI process, one of the servers below is a server.  What happens inside a CLI
subprocess is that process's business.  A fixture's set-up is counted against the fixture, the
rest of a test's run against the test.  An item that declares or requests anything is
``slow``: ``pytest -m "not slow"`` is the inner loop.  The session ends with a summary that
names every undeclared start; ``--cost-guard=strict`` also fails the session on one (the
default, ``report``, only names them: not every test declares its costs yet, docs/testing.md).
Under xdist (``make test``'s two lanes) each worker counts its own tests and hands the counts
to the controller when it finishes, which prints the one summary.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

KINDS = ("deepspeed", "cli", "servers")
# a server: each of the emulators and services the tests start (Ray's GCS once per cluster)
SERVERS = ("moto_server", "moto.server", "fake-gcs-server", "azurite-blob", "gcs_server", "uvicorn")

_lock = threading.Lock()
_current: Counter = Counter()  # the open block's count: a process started now is counted there
_by_owner: dict[str, Counter] = {}  # every block's count, for the summary
_violations: list[str] = []
_real_init = subprocess.Popen.__init__
_started = time.monotonic()


def kind_of(args, env) -> str | None:
    argv = [str(a) for a in ([args] if isinstance(args, (str, bytes, os.PathLike)) else args)]
    if env and "XYLENT_PARENT" in env:  # a launch's ranks started directly: the launch is its rank 0
        return "deepspeed" if env.get("LOCAL_RANK", "0") == "0" else None
    names = [Path(a).name for a in argv[:3]]
    if any("xylent.cli" in a for a in argv) or "xylent" in argv[1:3] or (names and names[0] == "xylent"):  # -m, -c and sh -c forms too
        return "cli"
    if any(n in ("mlflow", "prefect", "ray") for n in names):  # their commands that start one
        return "servers" if {"server", "ui", "start"} & set(argv) else None
    if any(n in SERVERS for n in names) or {"mlflow-server", "prefect-server"} & set(argv):  # or our entrypoint's
        return "servers"
    return None


def _counting_init(self, args, *a, **kw):
    kind = kind_of(args, kw.get("env", a[9] if len(a) > 9 else None))
    if kind:
        with _lock:
            _current[kind] += 1
    _real_init(self, args, *a, **kw)


def costs(*, everywhere: bool = False, **counts: int):
    """Declare what a fixture's own set-up starts (under ``@pytest.fixture``).  ``everywhere``: a
    session fixture every test has (the Prefect server), which makes no test slow."""
    unknown = set(counts) - set(KINDS)
    assert not unknown, f"costs(): unknown kinds {unknown}; use {KINDS}"

    def mark(func):
        func.xylent_costs, func.xylent_everywhere = counts, everywhere
        return func

    return mark


def _declared(fixturedef) -> dict:
    return getattr(fixturedef.func, "xylent_costs", {})


class _Owning:
    """Count what starts inside the block against ``owner`` and hold it to ``allowed``."""

    def __init__(self, owner: str, allowed: dict):
        self.owner, self.allowed = owner, allowed

    def __enter__(self):
        global _current
        with _lock:
            self.outer, _current = _current, Counter()

    def __exit__(self, *exc):
        global _current
        with _lock:
            used, _current = _current, self.outer
        if not used:
            return
        _by_owner[self.owner] = _by_owner.get(self.owner, Counter()) + used
        over = [f"{k}: started {n}, declared {self.allowed.get(k, 0)}" for k, n in used.items()
                if n > self.allowed.get(k, 0)]
        if over:
            how = "@costs(...) under its @pytest.fixture" if self.owner.startswith("fixture ") else \
                "@pytest.mark.costs(...)"
            _violations.append(f"{self.owner}: {', '.join(over)}: declare it with {how} (tests/cost_guard.py)")


def pytest_configure(config):
    config.addinivalue_line("markers", "costs(deepspeed=0, cli=0, servers=0): what the test starts itself "
                            "(tests/cost_guard.py)")
    subprocess.Popen.__init__ = _counting_init


def pytest_unconfigure(config):
    subprocess.Popen.__init__ = _real_init


def pytest_collection_modifyitems(config, items):
    for item in items:
        defs = [d for ds in item._fixtureinfo.name2fixturedefs.values() for d in ds]
        if item.get_closest_marker("costs") or any(_declared(d) and not getattr(d.func, "xylent_everywhere", False)
                                                   for d in defs):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    with _Owning(f"fixture {fixturedef.argname} ({fixturedef.baseid or 'tests/conftest.py'})", _declared(fixturedef)):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    mark = item.get_closest_marker("costs")
    with _Owning(_owner(item.nodeid), mark.kwargs if mark else {}):
        return (yield)


def _mlflow_stores(config) -> int:
    base = config._tmp_path_factory.getbasetemp() if hasattr(config, "_tmp_path_factory") else None
    return sum(1 for _ in Path(base).rglob("mlflow.db")) if base and Path(base).exists() else 0


def _owner(nodeid: str) -> str:
    """The test's id without the ``@<group>`` that xdist's loadgroup appends (an ``@`` inside a
    parameter id, ``test[a@b]``, stays)."""
    return nodeid.rsplit("@", 1)[0] if re.search(r"::.*@[^\[\]]*$", nodeid) else nodeid


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workeroutput"):  # an xdist worker: its counts go to the controller
        session.config.workeroutput["xylent_costs"] = {
            "by_owner": {owner: dict(used) for owner, used in _by_owner.items()}, "violations": _violations}
        return
    if _violations and session.exitstatus == 0 and session.config.getoption("--cost-guard") == "strict":
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller: add a finished worker's counts to the session's."""
    got = getattr(node, "workeroutput", {}).get("xylent_costs")
    if got:
        with _lock:
            for owner, used in got["by_owner"].items():
                _by_owner[owner] = _by_owner.get(owner, Counter()) + Counter(used)
            _violations.extend(got["violations"])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workeroutput"):
        return
    total = Counter()
    for used in _by_owner.values():
        total += used
    tr = terminalreporter
    tr.section("what this session started (tests/cost_guard.py)")
    tr.write_line(f"DeepSpeed launches {total['deepspeed']}, CLI processes {total['cli']}, servers "
                  f"{total['servers']}, MLflow stores {_mlflow_stores(config)}, "
                  f"{time.monotonic() - _started:.0f} s in all")
    top = sorted(_by_owner.items(), key=lambda kv: -sum(kv[1].values()))[:10]
    for owner, used in top:
        tr.write_line(f"  {dict(used)}  {owner}")
    for v in _violations:
        tr.write_line(f"UNDECLARED: {v}", red=True)
