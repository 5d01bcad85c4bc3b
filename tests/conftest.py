"""Shared fixtures: one Prefect test server per session, a loopback HTTP server
with fault injection (the only stand-in: for the internet), and builders for
real-format corpus files."""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

import cost_guard
from cost_guard import costs

# The suite never writes to a user's real servers or homes: every variable that
# changes where MLflow, Prefect or the Hugging Face hub put things is dropped
# before anything is imported (each test then names its own workspace and store).
ISOLATED = ("MLFLOW_", "PREFECT_", "HF_", "XYLENT_")
HARNESS = ("XYLENT_ACCEPTANCE_KEEP",)  # the test harness's own settings (tests/acceptance/claims.py): kept
for _name in [n for n in os.environ if n.startswith(ISOLATED) and n not in HARNESS]:
    del os.environ[_name]
os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is ever fetched from the hub
if os.environ.get("PYTEST_XDIST_WORKER"):
    # two lanes on two cores: one thread each for torch's and OpenMP's pools (and whatever a test starts:
    # the DeepSpeed launcher keeps a value it is given), unless the caller chose. With both lanes on every
    # core, idle OpenMP threads spin on cores the other lane needs (a whole run measured slower than one lane)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
@costs(servers=1, everywhere=True)
def prefect_server():
    """One ephemeral Prefect API for the whole session (starting one takes ~20 s)."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        os.environ["PREFECT_API_URL"] = PREFECT_API_URL.value()  # for CLI subprocesses
        yield PREFECT_API_URL.value()
        os.environ.pop("PREFECT_API_URL", None)


# -- loopback HTTP server ------------------------------------------------------


class Corpus:
    """What the loopback server serves, and the faults it injects."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.fail_first: dict[str, int] = {}  # path -> answer 500 this many times
        self.drop_after: dict[str, int] = {}  # path -> cut the connection after N body bytes, once
        self.requests: list[tuple[str, dict]] = []
        self.opus: dict[tuple[str, str], list[dict]] = {}  # (corpus, version) -> API listing
        self.redirects: dict[str, str] = {}  # path -> where a 302 sends it
        self.ignore_if_range: set[str] = set()  # paths answered with the range even after the file changed
        self.gzip: set[str] = set()  # paths sent with Content-Encoding: gzip whatever the client asked
        self.no_length: set[str] = set()  # paths sent without Content-Length, the body ended by closing
        self.ignore_ranges: set[str] = set()  # paths always answered 200 with the whole file
        self.slow: dict[str, int] = {}  # path -> trickle the body at this many bytes a second
        # path -> "answer": accept, never answer; "body": send the headers (with a length), never the body
        self.silent: dict[str, str] = {}
        self.released = threading.Event()  # set at teardown: a silent handler's thread ends
        self.lock = threading.Lock()

    def count(self, path: str) -> int:
        return sum(1 for p, _ in self.requests if p == path)


def _handler(corpus: Corpus):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            return None  # keep the test output quiet

        def do_GET(self):
            url = urlparse(self.path)
            with corpus.lock:
                corpus.requests.append((url.path, dict(self.headers)))
                fails = corpus.fail_first.get(url.path, 0)
                if fails:
                    corpus.fail_first[url.path] = fails - 1
            if fails:
                return self._send(500, b"boom")
            if corpus.silent.get(url.path) == "answer":
                corpus.released.wait(600)
                return None
            if url.path in corpus.redirects:
                return self._send(302, b"", extra={"Location": corpus.redirects[url.path]})
            if url.path == "/opusapi/":
                q = parse_qs(url.query)
                listing = corpus.opus.get((q["corpus"][0], q["version"][0]), [])
                return self._send(200, json.dumps({"corpora": listing}).encode(), ctype="application/json")
            body = corpus.files.get(url.path)
            if body is None:
                return self._send(404, b"not found")
            if url.path in corpus.gzip:
                import gzip

                body = gzip.compress(body, mtime=0)
            etag = '"' + hashlib.md5(body).hexdigest() + '"'
            start, status = 0, 200
            rng = None if url.path in corpus.ignore_ranges else self.headers.get("Range")
            if rng and (self.headers.get("If-Range") in (None, etag) or url.path in corpus.ignore_if_range):
                a, b = rng.removeprefix("bytes=").split("-")
                start = int(a)
                end = int(b) if b else len(body) - 1
                if start >= len(body):
                    return self._send(416, b"", extra={"Content-Range": f"bytes */{len(body)}"})
                chunk = body[start : end + 1]
                status = 206
                extra = {"Content-Range": f"bytes {start}-{start + len(chunk) - 1}/{len(body)}"}
            else:
                chunk, extra = body, {}
            drop = corpus.drop_after.pop(url.path, None)
            self.send_response(status)
            if url.path in corpus.no_length:
                self.send_header("Connection", "close")
                self.close_connection = True
            else:
                self.send_header("Content-Length", str(len(chunk)))
            self.send_header("ETag", etag)
            self.send_header("Accept-Ranges", "bytes")
            if url.path in corpus.gzip:
                self.send_header("Content-Encoding", "gzip")
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()
            if corpus.silent.get(url.path) == "body":
                self.wfile.flush()
                corpus.released.wait(600)
                return None
            if drop is not None:
                self.wfile.write(chunk[:drop])
                self.wfile.flush()
                self.close_connection = True
                return
            if url.path in corpus.slow:
                import time

                step = max(1, corpus.slow[url.path] // 20)
                for i in range(0, len(chunk), step):
                    self.wfile.write(chunk[i : i + step])
                    self.wfile.flush()
                    time.sleep(0.05)
                return
            self.wfile.write(chunk)

        def _send(self, status, body, ctype="text/plain", extra=None):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

    return Handler


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # a client that hangs up early (our own retry/resume tests do) is not a server bug;
        # socketserver would print its traceback into the CLI's captured stderr
        return None


@pytest.fixture()
def http_corpus():
    corpus = Corpus()
    server = _QuietServer(("127.0.0.1", 0), _handler(corpus))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    corpus.base = f"http://127.0.0.1:{server.server_address[1]}"
    yield corpus
    corpus.released.set()
    server.shutdown()
    server.server_close()


# -- real-format corpus files -------------------------------------------------


def cc100_xz(docs: list[list[str]], *, preset: int = 0) -> bytes:
    """CC-100 layout: one paragraph per line, documents separated by a blank line."""
    text = "".join("".join(line + "\n" for line in doc) + "\n" for doc in docs)
    return lzma.compress(text.encode("utf-8"), preset=preset)


def moses_zip(corpus: str, a: str, b: str, src: list[str], tgt: list[str], extra: dict | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{corpus}.{a}-{b}.{a}", "".join(s + "\n" for s in src))
        zf.writestr(f"{corpus}.{a}-{b}.{b}", "".join(s + "\n" for s in tgt))
        zf.writestr("README", f"{corpus} test fixture\n")
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return buf.getvalue()


def po_file(entries: list[dict]) -> str:
    """A gettext catalog; entries: {msgid, msgstr | msgstr_plural, msgid_plural?, msgctxt?, fuzzy?}."""
    out = ['msgid ""', 'msgstr ""', '"Content-Type: text/plain; charset=UTF-8\\n"', ""]
    for e in entries:
        if e.get("fuzzy"):
            out.append("#, fuzzy")
        if e.get("msgctxt"):
            out.append(f'msgctxt "{e["msgctxt"]}"')
        out.append(f'msgid "{e["msgid"]}"')
        if "msgid_plural" in e:
            out.append(f'msgid_plural "{e["msgid_plural"]}"')
            for i, s in enumerate(e["msgstr_plural"]):
                out.append(f'msgstr[{i}] "{s}"')
        else:
            out.append(f'msgstr "{e.get("msgstr", "")}"')
        out.append("")
    return "\n".join(out)


@pytest.fixture()
def catalog_package(tmp_path, monkeypatch):
    """An importable package shipping gettext catalogs, like Django does."""

    def make(name: str, catalogs: dict[str, dict[str, list[dict]]]) -> Path:
        root = tmp_path / "pkgs"
        pkg = root / name
        (pkg).mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text("")
        for locale, files in catalogs.items():
            for fname, entries in files.items():
                d = pkg / "locale" / locale / "LC_MESSAGES"
                d.mkdir(parents=True, exist_ok=True)
                (d / fname).write_text(po_file(entries), encoding="utf-8")
        monkeypatch.syspath_prepend(str(root))
        import importlib

        importlib.invalidate_caches()
        sys.modules.pop(name, None)
        return pkg

    return make


def write_spec(path: Path, spec: dict) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    return path


@pytest.fixture()
def run_cli(capsys):
    """Run the real CLI in-process; returns (exit code, stdout, stderr)."""
    from xylent.cli import main

    def run(*args: str):
        capsys.readouterr()
        rc = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return rc, out, err

    return run


ROOT = Path(__file__).resolve().parents[1]
DEMO_SHORT = ROOT / "tests" / "data" / "demo-short.yaml"  # the demo's data stages, shorter training


def run_pipeline(spec: Path, ws: Path, *args: str) -> dict:
    """``xylent run pipeline`` in-process (the session's Prefect server); its --json."""
    import contextlib
    import io

    from xylent.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["run", "pipeline", "--spec", str(spec), "--workspace", str(ws), "--json", *args])
    assert rc == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="session")
@costs(deepspeed=2)  # pretrain and audit, one rank each
def demo_run(tmp_path_factory, prefect_server, pytestconfig):
    """The whole pipeline on the embedded demo, once per test session, as tests/data/demo-short.yaml
    trains it (the demo's data stages, 150 pretraining steps): every stage's contract.  A test that
    reruns a stage on this workspace passes ``--spec DEMO_SHORT``; the full demo is acceptance's.

    Under xdist's loadgroup (`make test`) both workers share it: whichever asks first builds it in
    the run's common temporary folder under a file lock; the other waits on that lock and reads the
    record it leaves (its readers are queued last, so it seldom waits).  The record is written
    last, atomically: a build that failed half-way leaves none, and the next worker that asks runs
    the pipeline again on the same workspace, which keeps the stages already published."""
    from filelock import FileLock

    from xylent.atomic import write_text_atomic

    base = tmp_path_factory.getbasetemp()
    # without loadgroup the session-demo tests are spread over the workers: each builds its own, or
    # two would rerun stages on one workspace at once
    shared_by_workers = hasattr(pytestconfig, "workerinput") and pytestconfig.getvalue("loadgroup")
    shared = base.parent if shared_by_workers else base
    root, record = shared / "session-demo", shared / "session-demo" / "run.json"
    with FileLock(str(shared / "session-demo.lock")):
        if not record.exists():
            root.mkdir(exist_ok=True)
            write_text_atomic(record, json.dumps(run_pipeline(DEMO_SHORT, root / "ws")))
        return json.loads(record.read_text()), root / "ws"


# -- the acceptance tier (tests/acceptance/, `make acceptance`) ----------------


def pytest_configure(config):
    # a plugin, not this conftest's hooks: a session fixture's set-up is outside tests/ as pytest sees it
    config.pluginmanager.register(cost_guard, "xylent-cost-guard")


def _lane(item, root: Path) -> str:
    if "demo_run" in item.fixturenames and item.get_closest_marker("demo_data") is None:
        return "session-demo"
    return item.path.relative_to(root).as_posix()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """`make test` runs on two xdist workers (``-n 2 --dist loadgroup``), in lanes.  Every test
    that may run a stage on the session demo's workspace is one unit, queued first: its worker
    builds the demo, and the tests rerun stages on it one after another, under its lock.  Every
    other module is one unit for whichever worker is free (its module fixtures are built once);
    the modules whose tests only read the demo's files (marked ``demo_data``: its outputs, or
    links to its data stages in workspaces of their own) are queued last, when the demo is long
    built, so either worker takes them and the two finish together (the Makefile's
    ``--no-loadscope-reorder`` keeps this order: xdist would sort the units by size).  One pytest
    process (no ``-n``) runs them all in this order too."""
    lanes = [_lane(item, config.rootpath) for item in items]
    readers = {lane for item, lane in zip(items, lanes)
               if lane != "session-demo" and "demo_run" in item.fixturenames}
    for item, lane in zip(items, lanes):
        item.add_marker(pytest.mark.xdist_group(lane))
    order = {item.nodeid: 0 if lane == "session-demo" else 2 if lane in readers else 1
             for item, lane in zip(items, lanes)}
    items.sort(key=lambda item: order[item.nodeid])  # stable: each unit keeps its tests' order


@pytest.hookimpl(trylast=True)  # after xdist has suffixed each test id with its group
def pytest_collection_finish(session):
    if hasattr(session.config, "workerinput") and session.config.getvalue("loadgroup"):
        lost = [item.nodeid for item in session.items if "@" not in item.nodeid]
        if lost:  # pytest 9.2 ignores xdist's suffix (pytest-dev/pytest-xdist#1386): the demo would build twice
            pytest.exit(f"xdist's loadgroup lost the lanes ({lost[0]} has no @group): this pytest "
                        "ignores xdist_group; install the pytest pyproject.toml pins (pytest<9.2)", returncode=4)


def pytest_addoption(parser):
    parser.addoption("--acceptance", action="store_true",
                     help="also collect tests/acceptance/: the claims that need full-size training (make acceptance)")
    parser.addoption("--cost-guard", choices=("report", "strict"), default="report",
                     help="strict: fail the session on a DeepSpeed launch, CLI process or server a test or fixture "
                          "did not declare (tests/cost_guard.py); report: name them in the summary")


def pytest_ignore_collect(collection_path, config):
    if config.getoption("--acceptance"):
        return None
    try:
        inside = collection_path.relative_to(config.rootpath).parts[:2] == ("tests", "acceptance")
    except ValueError:
        return None
    return True if inside else None


DATA_STAGES = ("download", "prepare", "dedup", "vocab", "sampling", "shards")


def linked_data(demo_ws: Path | str, ws: Path, stages: tuple[str, ...] = DATA_STAGES) -> Path:
    """A new workspace ``ws`` whose data stages are the session demo's (links to its stage folders,
    which a run on ``ws`` reads and never writes into): a stage test runs its own stage on them
    without rebuilding the demo's data."""
    ws.mkdir(parents=True)
    for stage in stages:
        (ws / stage).symlink_to(Path(demo_ws) / stage, target_is_directory=True)
    return ws


def stopped_after(ref_ws: Path, ws: Path, stage: str, step: int) -> Path:
    """``ws`` holding ``stage``'s checkpoints of the run in ``ref_ws`` up to ``step``, and its next one cut
    short, as a run SIGKILLed just after that checkpoint leaves them (what it logged beyond is trimmed
    on resume). The run must have kept them (``pretrain.keep_checkpoints``; 2 by default). How the
    kill itself leaves processes and files: tests/test_pretrain.py's kill tests."""
    import shutil

    (ws / stage).mkdir()
    shutil.copytree(ref_ws / stage / "_checkpoints", ws / stage / "_checkpoints", symlinks=True)
    kept = list(ws.glob(f"{stage}/_checkpoints/*/deepspeed/step-{step:08d}/COMPLETE"))
    assert kept, f"the run in {ref_ws} kept no complete checkpoint at step {step}: run it with a larger " \
                 "pretrain.keep_checkpoints"
    later = sorted(p for p in ws.glob(f"{stage}/_checkpoints/*/deepspeed/step-*") if int(p.name[5:]) > step)
    for p in later[1:]:
        shutil.rmtree(p)
    (later[0] / "COMPLETE").unlink()  # the next checkpoint, cut short: never trusted
    return ws


def kill_9_when(stage: str, spec, ws, ready, timeout: float = 120.0) -> None:
    """Run ``xylent run STAGE`` in a child process and SIGKILL it as soon as
    ``ready()`` is true (i.e. mid-stage); fails if the stage ends or never gets there."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "xylent.cli", "run", stage, "--spec", str(spec), "--workspace", str(ws)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ.copy())
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            if ready():
                return
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.02)
        pytest.fail(f"{stage} never reached the point to kill it")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
