"""The bad-input zoo: hostile but realistic inputs and faults through the real
CLI (issue 19's findings, one test each).  Each ends in exit 2 with one message
that says what, where and what to do, no traceback, nothing published and
nothing written outside the workspace; and no case leaves a process behind.
They share the session's Prefect server and a loopback HTTP server; a full
disk and a read-only workspace are made in a user+mount namespace."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import write_spec

pytestmark = pytest.mark.demo_data  # reads the session demo only (pyproject.toml's markers)

DEMO = Path(__file__).resolve().parents[1] / "data_specs" / "demo.yaml"
ENTRIES = [{"msgid": "Hello", "msgstr": "Hallo"}, {"msgid": "World", "msgstr": "Welt"}]


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Every case here, failing or not, ends with no process of ours still running."""
    import time

    import psutil

    def alive(p) -> str | None:
        try:
            return None if p.status() == psutil.STATUS_ZOMBIE else " ".join(p.cmdline())[:100]
        except psutil.Error:
            return None

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    deadline = time.time() + 15
    while True:
        left = [cmd for p in me.children(recursive=True) if p.pid not in before and (cmd := alive(p)) is not None]
        if not left or time.time() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"processes left behind: {left}"


def _gettext_spec(tmp_path: Path, package: str, **source) -> Path:
    return write_spec(tmp_path / "spec.yaml", {
        "name": "hostile", "languages": ["en", "de"], "workspace": str(tmp_path / "ws"),
        "sources": [{"name": "cat", "kind": "gettext", "package": package, **source}]})


def test_a_locale_that_climbs_out_of_the_workspace_is_refused(tmp_path, catalog_package, run_cli):
    catalog_package("hostpkg", {"de": {"django.po": ENTRIES}})
    outside = tmp_path / "outside"
    climb = "../" * 12 + str(outside).lstrip("/")
    spec = _gettext_spec(tmp_path, "hostpkg", locales={"de": climb})
    rc, _, err = run_cli("run", "download", "--spec", spec)
    assert rc == 2 and "locales" in err and "Traceback" not in err, err
    assert not outside.exists(), "nothing may be written outside the workspace"


def test_a_url_without_a_file_name_is_refused_before_anything_is_fetched(tmp_path, http_corpus, run_cli):
    http_corpus.files["/data/x.txt"] = b"hello\n"
    for url in (f"{http_corpus.base}/data/x.txt/..", f"{http_corpus.base}/data/."):
        spec = write_spec(tmp_path / "spec.yaml", {
            "name": "hostile", "languages": ["en"], "workspace": str(tmp_path / "ws"),
            "sources": [{"name": "web", "kind": "url", "url": url, "format": "text", "lang": "en"}]})
        rc, _, err = run_cli("run", "download", "--spec", spec)
        assert rc == 2 and "outside its folder" in err and "source 'web'" in err and "Traceback" not in err, err
        assert not list((tmp_path / "ws").glob("download/*/_manifest.json")), "nothing published"
    assert not http_corpus.requests, "refused before any request"


@pytest.mark.parametrize("text,message", [
    (b"name: x\nlanguages: [en]\n\xff\xfe\n", "not UTF-8"),
    (b"name: x\nlanguages: [en]\nprepare: {min_chars: 5, min_chars: 1}\n", "appears twice"),
    (b"name: x\nlanguages: [en]\nprepare: {min_chars: 50, max_chars: 10}\n", "min_chars"),
])
def test_a_broken_spec_file_is_one_clear_message(tmp_path, run_cli, text, message):
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(text)
    rc, _, err = run_cli("run", "download", "--spec", spec, "--workspace", tmp_path / "ws")
    assert rc == 2 and message in err and "spec.yaml" in err and "Traceback" not in err, err


def test_a_password_or_a_signature_in_a_url_is_used_but_never_recorded(tmp_path, http_corpus, run_cli):
    http_corpus.files["/corpus/en.txt"] = "".join(f"line {i}\n" for i in range(50)).encode()
    secret = "s3cret-Pa55"  # with an "@" in the password: the userinfo is masked whole, up to its last "@"
    url = http_corpus.base.replace("http://", f"http://alice:{secret}@x@") + "/corpus/en.txt"
    spec = write_spec(tmp_path / "spec.yaml", {
        "name": "secret", "languages": ["en"], "workspace": str(tmp_path / "ws"),
        "sources": [{"name": "web", "kind": "url", "url": url, "format": "text", "lang": "en"}]})
    rc, out, err = run_cli("run", "download", "--spec", spec, "--json")
    assert rc == 0, err
    assert any(h.get("Authorization", "").startswith("Basic ") for _, h in http_corpus.requests), "credentials used"
    leaks = [p for p in (tmp_path / "ws").rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not leaks, f"the password is recorded in {leaks}"
    assert secret not in out + err
    records = next((tmp_path / "ws").glob("download/*/records.json")).read_text()
    assert "http://***@127.0.0.1" in records and "alice" not in records
    # a failing URL's error message masks it too
    bad = url.replace("en.txt", "missing.txt")
    spec = write_spec(tmp_path / "spec2.yaml", {
        "name": "secret2", "languages": ["en"], "workspace": str(tmp_path / "ws"),
        "sources": [{"name": "web", "kind": "url", "url": bad, "format": "text", "lang": "en"}]})
    rc, out, err = run_cli("run", "download", "--spec", spec)
    assert rc == 2 and "404" in err and secret not in err and "http://***@" in err, err
    # a presigned URL: the secret is in the query (S3's signature and session token, an Azure SAS sig)
    signed = (f"{http_corpus.base}/corpus/en.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA{secret}"
              f"&X-Amz-Security-Token=tok{secret}&X-Amz-Signature=sig{secret}&sig=sas{secret}&jwt=j{secret}"
              f"&pass=p{secret}&sessionid=s{secret}&lang=en")
    spec = write_spec(tmp_path / "spec3.yaml", {
        "name": "signed", "languages": ["en"], "workspace": str(tmp_path / "ws3"),
        "sources": [{"name": "web", "kind": "url", "url": signed, "format": "text", "lang": "en"}]})
    rc, out, err = run_cli("run", "download", "--spec", spec, "--json")
    assert rc == 0, err
    leaks = [p for p in (tmp_path / "ws3").rglob("*") if secret in p.name or (p.is_file() and secret.encode()
                                                                             in p.read_bytes())]
    assert not leaks and secret not in out + err, f"the signature is recorded in {leaks}"
    records = next((tmp_path / "ws3").glob("download/*/records.json")).read_text()
    # every query value masked but a short list of keys that name no secret (xylent.redact.PUBLIC_QUERY_KEYS)
    assert all(f"{k}=***" in records for k in ("X-Amz-Signature", "sig", "jwt", "pass", "sessionid")), records
    assert "lang=en" in records, records
    assert list((tmp_path / "ws3").glob("download/*/web/en.txt")), "the file is named by the URL's path alone"


class _Payload:
    """Unpickling this runs code: what a tampered checkpoint would carry."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_a_tampered_checkpoint_cannot_run_code_when_loaded(tmp_path):
    import torch

    from xylent.models.pretrained import consolidate_zero
    from xylent.errors import XylentError

    marker = tmp_path / "pwned"
    tag = tmp_path / "deepspeed" / "step-00000010"
    tag.mkdir(parents=True)
    torch.save({"module": {"w": torch.zeros(2)}, "extra": _Payload(str(marker))}, tag / "mp_rank_00_model_states.pt")
    with pytest.raises(XylentError, match="refusing to unpickle"):
        consolidate_zero(tmp_path / "deepspeed", "step-00000010")
    assert not marker.exists(), "loading the checkpoint ran code"
    # a plain one loads
    torch.save({"module": {"w": torch.ones(2)}, "ds_version": "0.x"}, tag / "mp_rank_00_model_states.pt")
    assert consolidate_zero(tmp_path / "deepspeed", "step-00000010")["w"].tolist() == [1.0, 1.0]


def test_the_suite_ignores_the_callers_tracking_and_prefect_settings():
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**__import__("os").environ, "MLFLOW_TRACKING_URI": "http://127.0.0.1:9/not-yours",
           "PREFECT_API_URL": "http://127.0.0.1:9/api", "MLFLOW_EXPERIMENT_NAME": "prod"}
    probe = ("import os, sys; sys.path.insert(0, 'tests'); import conftest; "
             "print(sorted(k for k in os.environ if k.startswith(('MLFLOW_', 'PREFECT_API'))))")
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=root, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]", out  # a user's real server is never written to by the tests


def _parquet_spec(tmp_path: Path, table, name: str = "bad.parquet") -> Path:
    import pyarrow.parquet as pq

    pq.write_table(table, tmp_path / name)
    return write_spec(tmp_path / "spec.yaml", {
        "name": "pq", "languages": ["en"], "workspace": str(tmp_path / "ws"),
        "sources": [{"name": "loc", "kind": "local", "path": str(tmp_path / name), "format": "parquet",
                     "lang": "en"}]})


@pytest.mark.parametrize("column", ["list", "ints", "bytes"])
def test_a_parquet_text_column_that_is_not_text_is_refused(tmp_path, run_cli, column):
    import pyarrow as pa

    values = {"list": pa.array([["a", "b"], ["c"]]), "ints": pa.array([1, 2]),
              "bytes": pa.array([b"ok", b"\xff\xfe"], pa.binary())}[column]
    spec = _parquet_spec(tmp_path, pa.table({"text": values}))
    rc, _, err = run_cli("run", "prepare", "--spec", spec)
    assert rc == 2 and "'text'" in err and "not text" in err and "bad.parquet" in err and "Traceback" not in err, err


def test_a_parquet_file_with_a_damaged_data_page_is_refused(tmp_path, run_cli):
    import pyarrow as pa

    texts = [f"sentence number {i} with some words" for i in range(5000)]
    spec = _parquet_spec(tmp_path, pa.table({"text": texts}))
    raw = bytearray((tmp_path / "bad.parquet").read_bytes())
    for i in range(64, len(raw) // 2, 97):  # scribble over the data pages, keep the footer intact
        raw[i] ^= 0x5A
    (tmp_path / "bad.parquet").write_bytes(bytes(raw))
    rc, _, err = run_cli("run", "prepare", "--spec", spec)
    assert rc == 2 and "bad.parquet" in err and "Traceback" not in err, err


def test_a_redirect_loop_or_to_a_non_http_scheme_is_one_clear_error(tmp_path, http_corpus, run_cli):
    http_corpus.redirects["/a"] = "/b"
    http_corpus.redirects["/b"] = "/a"
    spec = write_spec(tmp_path / "spec.yaml", {
        "name": "loop", "languages": ["en"], "workspace": str(tmp_path / "ws"),
        "sources": [{"name": "web", "kind": "url", "url": f"{http_corpus.base}/a", "format": "text", "lang": "en"}]})
    rc, _, err = run_cli("run", "download", "--spec", spec)
    assert rc == 2 and "redirects in a loop" in err and "/a" in err and "Traceback" not in err, err
    http_corpus.redirects["/ftp"] = "ftp://127.0.0.1/en.txt"  # a scheme requests has no adapter for
    spec = write_spec(tmp_path / "ftp.yaml", {
        "name": "ftp", "languages": ["en"], "workspace": str(tmp_path / "ws-ftp"),
        "sources": [{"name": "web", "kind": "url", "url": f"{http_corpus.base}/ftp", "format": "text", "lang": "en"}]})
    rc, _, err = run_cli("run", "download", "--spec", spec)
    assert rc == 2 and "cannot be fetched over HTTP(S)" in err and "ftp://" in err and "Traceback" not in err, err
    assert "attempts" not in err, "not retried: another try would be sent to the same place"


@pytest.mark.parametrize("inside", [False, True])
def test_a_workspace_that_is_a_file_is_one_clear_error(tmp_path, run_cli, inside):
    blocker = tmp_path / "ws.txt"
    blocker.write_text("not a folder\n")
    (tmp_path / "en.txt").write_text("hello\n")
    spec = write_spec(tmp_path / "spec.yaml", {"name": "x", "languages": ["en"], "sources": [
        {"name": "loc", "kind": "local", "path": str(tmp_path / "en.txt"), "format": "text", "lang": "en"}]})
    rc, _, err = run_cli("run", "download", "--spec", spec, "--workspace", blocker / "sub" if inside else blocker)
    assert rc == 2 and "ws.txt" in err and "is a file" in err and "Traceback" not in err, err
    assert blocker.read_text() == "not a folder\n"


def _prepared(tmp_path: Path, run_cli, lines: int) -> tuple[Path, str]:
    """A one-language spec of ``lines`` sentences from a file:// URL, prepared: (spec, the run's --json)."""
    (tmp_path / "en.txt").write_text("".join(f"sentence {i} of the corpus\n" for i in range(lines)))
    spec = write_spec(tmp_path / "spec.yaml", {"name": "v", "languages": ["en"], "workspace": str(tmp_path / "ws"),
                                               "sources": [{"name": "loc", "kind": "url", "format": "text",
                                                            "lang": "en", "url": (tmp_path / "en.txt").as_uri()}]})
    rc, out, err = run_cli("run", "prepare", "--spec", spec, "--json")
    assert rc == 0, err
    return spec, out


def test_a_manifest_replaced_by_something_else_is_never_an_output(tmp_path, run_cli):
    """A ``[]`` or ``{}`` where the manifest was made ``xylent verify`` say "ok (0 files)" and the next stage
    read the output: now verify names it and the stage is rebuilt."""
    import json

    spec, out = _prepared(tmp_path, run_cli, lines=50)
    manifest = Path(json.loads(out)["stages"]["prepare"]["output_dir"]) / "_manifest.json"
    for replaced_by in ("[]", "{}", '{"files": [{"path": 3}]}'):
        manifest.write_text(replaced_by)
        rc, out, err = run_cli("verify", "--spec", spec, "--json")
        assert rc == 2, (replaced_by, out, err)
        report = json.loads(out)["stages"]["prepare"]
        assert not report["published"] and "not a manifest" in report["problems"][0], report
        rc, out, err = run_cli("run", "prepare", "--spec", spec, "--json")
        assert rc == 0 and json.loads(out)["stages"]["prepare"]["cached"] is False, (replaced_by, out, err)
        assert json.loads(manifest.read_text())["files"] and run_cli("verify", "--spec", spec)[0] == 0


def test_a_published_output_changed_afterwards_is_never_a_cache_hit(tmp_path, run_cli):
    import json

    spec, out = _prepared(tmp_path, run_cli, lines=200)
    stages = json.loads(out)["stages"]
    part = next(Path(stages["prepare"]["output_dir"]).rglob("*.parquet"))
    part.write_bytes(part.read_bytes()[:-100])  # truncated after it was published
    rc, _, err = run_cli("run", "prepare", "--spec", spec)
    assert rc == 2 and "prepare output was changed" in err and part.name in err and "--force" in err, err
    rc, out, err = run_cli("verify", "--spec", spec, "--json")
    assert rc == 2 and "prepare" in err
    report = json.loads(out)["stages"]
    assert report["prepare"]["problems"] and not report["download"]["problems"]
    rc, _, err = run_cli("run", "prepare", "--spec", spec, "--force")
    assert rc == 0, err
    assert run_cli("verify", "--spec", spec)[0] == 0
    # a file added to a published output would be read by the stages after it (they read folders whole)
    added = part.parent / "injected.parquet"
    added.write_bytes(part.read_bytes())
    rc, _, err = run_cli("run", "prepare", "--spec", spec)
    assert rc == 2 and "injected.parquet: not in the manifest" in err, err
    rc, out, err = run_cli("verify", "--spec", spec, "--json")
    assert rc == 2 and any("injected.parquet" in x for x in json.loads(out)["stages"]["prepare"]["problems"])
    added.unlink()
    (part.parent / ".injected.parquet.swp").write_bytes(b"an editor's swap file")  # hidden: not a stage's
    assert run_cli("verify", "--spec", spec)[0] == 0
    # a downloaded file edited in place (one more line) must not flow into prepare
    fetched = next(p for p in Path(stages["download"]["output_dir"]).rglob("*.txt"))
    with open(fetched, "a") as f:
        f.write("a line nobody downloaded\n")
    rc, _, err = run_cli("run", "prepare", "--spec", spec, "--force")
    assert rc == 2 and "download output was changed" in err, err
    # ... or edited keeping its size: its modification time moved, so it is hashed and refused
    rc, _, err = run_cli("run", "download", "--spec", spec, "--force")
    assert rc == 0, err
    fetched = next(p for p in Path(stages["download"]["output_dir"]).rglob("*.txt"))
    body = fetched.read_bytes()
    fetched.write_bytes(body.replace(b"sentence 7 of", b"sentence 9 of"))
    assert fetched.stat().st_size == len(body)
    rc, _, err = run_cli("run", "prepare", "--spec", spec, "--force")
    assert rc == 2 and "download output was changed" in err and "content changed" in err, err


def test_runs_of_a_killed_invocation_are_marked_killed_by_the_next_run(tmp_path, run_cli):
    import subprocess
    import sys

    import psutil
    from mlflow import MlflowClient

    from xylent.tracking import Tracker, owner

    ws = (tmp_path / "ws").resolve()
    (tmp_path / "en.txt").write_text("hello\n")
    spec = write_spec(tmp_path / "spec.yaml", {"name": "k", "languages": ["en"], "workspace": str(ws),
                                               "tracking": {"experiment": "kill-test"},
                                               "sources": [{"name": "loc", "kind": "local", "format": "text",
                                                            "lang": "en", "path": str(tmp_path / "en.txt")}]})
    tracker = Tracker(f"sqlite:///{ws}/mlflow.db", "kill-test", artifact_root=ws / "mlartifacts", workspace=ws)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    start = psutil.Process(dead.pid).create_time()
    dead.wait()
    host = owner().rsplit(":", 2)[0]
    runs = {"dead": tracker.start_run("killed", tags={"xylent.owner": f"{host}:{dead.pid}:{start:.3f}"}),
            "elsewhere": tracker.start_run("other host", tags={"xylent.owner": f"not-{host}:1:1.000"}),
            "alive": tracker.start_run("this process")}
    rc, _, err = run_cli("run", "download", "--spec", spec)
    assert rc == 0, err
    client = MlflowClient(f"sqlite:///{ws}/mlflow.db")
    status = {k: client.get_run(r).info.status for k, r in runs.items()}
    assert status == {"dead": "KILLED", "elsewhere": "RUNNING", "alive": "RUNNING"}, status
    assert "found its process gone" in client.get_run(runs["dead"]).data.tags["xylent.ended_by"]


def test_a_tsv_bitext_without_tabs_is_an_error_not_zero_pairs(tmp_path, run_cli):
    (tmp_path / "de-en.tsv").write_text("".join(f"Satz {i} sentence {i}\n" for i in range(100)))
    spec = write_spec(tmp_path / "spec.yaml", {"name": "t", "languages": ["de", "en"], "workspace": str(tmp_path / "ws"),
                                               "sources": [{"name": "bt", "kind": "local", "format": "tsv",
                                                            "pair": "de-en", "path": str(tmp_path / "de-en.tsv")}]})
    rc, _, err = run_cli("run", "prepare", "--spec", spec)
    assert rc == 2 and "100 of 100 lines" in err and "de-en.tsv" in err and "max_malformed_rate" in err, err
    rc, _, err = run_cli("run", "prepare", "--spec", spec, "--set", "prepare.max_malformed_rate=1.0")
    assert rc == 0, err  # the user's explicit choice: keep what is well formed (here nothing)


def _in_own_mounts(tmp_path: Path, mount: str, *cli: str) -> tuple[int, str]:
    """Run the real CLI in a user and mount namespace where ``mount`` (a shell
    command) has been run first: a tmpfs that fills up, or a read-only bind
    mount, without root on the host or touching its file systems."""
    import shlex
    import subprocess
    import sys

    if subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True).returncode:
        pytest.fail("this machine refuses user namespaces (unshare --user --map-root-user --mount), so a full "
                    "disk cannot be made here; the test needs them")
    # the mounts vanish with the namespace: list what was published before leaving it
    command = (f"{mount} && {shlex.quote(sys.executable)} -m xylent.cli {' '.join(map(shlex.quote, cli))}; rc=$?; "
               f"echo published:; find {shlex.quote(str(tmp_path))} -name _manifest.json; exit $rc")
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", command],
                          cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    return proc.returncode, proc.stdout


def _big_text_source(tmp_path: Path, mb: float) -> Path:
    import random

    rng = random.Random(0)  # words that do not compress away: prepare's output is as big as its input
    text = tmp_path / "en.txt"
    text.write_text("".join(" ".join(f"{rng.getrandbits(32):x}" for _ in range(7)) + "\n"
                            for _ in range(int(mb * 1e6 / 63))))
    return write_spec(tmp_path / "spec.yaml", {"name": "full", "languages": ["en"], "sources": [
        {"name": "web", "kind": "url", "url": text.as_uri(), "format": "text", "lang": "en"}]})


@pytest.mark.costs(cli=1)
@pytest.mark.parametrize("size", ["1400k", "6m"])  # the download fills it / prepare does
def test_a_full_disk_is_one_clear_error_and_nothing_is_published(tmp_path, size):
    spec = _big_text_source(tmp_path, 4)
    ws = tmp_path / "ws"
    ws.mkdir()
    rc, out = _in_own_mounts(tmp_path, f"mount -t tmpfs -o size={size} tmpfs {ws} && touch {ws}/mounted",
                             "run", "prepare", "--spec", str(spec), "--workspace", str(ws),
                             "--set", "download.min_free_bytes=0")  # the disk itself, not the reserve (test_download)
    assert rc == 2 and "no space left" in out and "Traceback" not in out, out[-3000:]
    assert "what to do: free space" in out and "internal error" not in out
    published = out.split("published:")[-1]
    assert "/prepare/" not in published, "nothing of the failed stage is published"
    assert ("/download/" in published) == (size == "6m"), "6m holds the download, not prepare's output"
    assert not (ws / "mounted").exists(), "the tmpfs was the namespace's own"


@pytest.mark.costs(cli=2)
def test_a_read_only_workspace_is_one_clear_error_at_once(tmp_path, run_cli):
    import time

    spec = _big_text_source(tmp_path, 0.1)
    ws = tmp_path / "ws"
    rc, _, err = run_cli("run", "download", "--spec", spec, "--workspace", ws)
    assert rc == 0, err
    before = sorted((p.relative_to(ws), p.stat().st_mtime_ns) for p in ws.rglob("*"))
    for target in (ws, tmp_path / "empty"):  # a cached workspace and a new one
        target.mkdir(exist_ok=True)
        started = time.time()
        rc, out = _in_own_mounts(tmp_path, f"mount --bind {target} {target} && mount -o remount,bind,ro {target}",
                                 "run", "prepare", "--spec", str(spec), "--workspace", str(target))
        assert rc == 2 and "read-only file system" in out and str(target) in out and "Traceback" not in out, out
        assert time.time() - started < 60, "refused at once, not after MLflow's minutes of retries"
    assert sorted((p.relative_to(ws), p.stat().st_mtime_ns) for p in ws.rglob("*")) == before


def test_a_po_file_with_an_unterminated_string_is_refused_not_garbled(tmp_path, run_cli):
    from conftest import po_file

    po = tmp_path / "django.po"
    po.write_text(po_file(ENTRIES).replace('msgstr "Hallo"', 'msgstr "Hallo'))  # polib would read "Hall"
    spec = write_spec(tmp_path / "spec.yaml", {
        "name": "po", "languages": ["en", "de"], "workspace": str(tmp_path / "ws"),
        "sources": [{"name": "cat", "kind": "local", "format": "gettext", "lang": "de", "path": str(po)}]})
    rc, _, err = run_cli("run", "prepare", "--spec", spec)
    assert rc == 2 and "unterminated string" in err and "django.po:6" in err and "msgfmt" in err, err
    assert "Traceback" not in err and not list((tmp_path / "ws").glob("prepare/*/_manifest.json"))


def test_a_language_left_without_text_is_a_warning_in_the_summary_and_the_run(tmp_path, run_cli):
    import json

    from mlflow import MlflowClient

    (tmp_path / "en.txt").write_text("".join(f"an English sentence number {i}\n" for i in range(50)))
    (tmp_path / "de.txt").write_text("ja\nnein\n" * 20)  # every line shorter than min_chars (set below)
    spec = write_spec(tmp_path / "spec.yaml", {"name": "w", "languages": ["en", "de"], "workspace": str(tmp_path / "ws"),
                                               "prepare": {"min_chars": 5},
                                               "sources": [{"name": f"loc-{lang}", "kind": "local", "format": "text",
                                                            "lang": lang, "path": str(tmp_path / f"{lang}.txt")}
                                                           for lang in ("en", "de")]})
    rc, out, err = run_cli("run", "prepare", "--spec", spec)
    assert rc == 0, err
    assert "warning (prepare): no monolingual text survived cleaning for de" in " ".join(out.split()), out
    rc, out, err = run_cli("run", "prepare", "--spec", spec, "--json")  # cached: the warning stays with the output
    prepare = json.loads(out)["stages"]["prepare"]
    assert prepare["cached"] and len(prepare["warnings"]) == 1 and "for de" in prepare["warnings"][0]
    run = MlflowClient(f"sqlite:///{(tmp_path / 'ws').resolve()}/mlflow.db").get_run(prepare["mlflow_run_id"])
    assert "for de" in run.data.tags["xylent.warnings"]


def test_one_enormous_line_is_cut_while_streaming_not_held_whole(tmp_path, run_cli):
    import json

    import pyarrow.parquet as pq

    from xylent.tasks.prepare.readers import iter_line_blocks

    big = tmp_path / "en.txt"
    with open(big, "wb") as f:  # 40 MB without a newline between two ordinary lines
        f.write(b"a first line\n")
        for _ in range(40):
            f.write(b"x" * (1 << 20))
        f.write(b"\na last line\n")
    blocks = list(iter_line_blocks(big, "text", where=str(big), block_bytes=1 << 20, max_line_bytes=100_000))
    assert max(map(len, blocks)) <= (2 << 20) + 100_000, "memory stays a couple of blocks, not the line"
    lines = b"\n".join(blocks).split(b"\n")
    assert lines[0] == b"a first line" and lines[-1] == b"a last line" and len(lines) == 3
    assert lines[1] == b"x" * 100_000, "the long line stays one line, cut to the cap"
    # through the stage: the cut line is dropped as too long and counted, the others kept
    spec = write_spec(tmp_path / "spec.yaml", {"name": "long", "languages": ["en"], "workspace": str(tmp_path / "ws"),
                                               "sources": [{"name": "loc", "kind": "local", "format": "text",
                                                            "lang": "en", "path": str(big)}]})
    rc, out, err = run_cli("run", "prepare", "--spec", spec, "--json")
    assert rc == 0, err
    stats = pq.read_table(Path(json.loads(out)["stages"]["prepare"]["output_dir"]) / "stats.parquet").to_pylist()
    assert [(r["lines_in"], r["too_long"], r["rows_out"]) for r in stats] == [(3, 1, 2)], stats


@pytest.mark.parametrize("case", ["html-for-xz", "gopher", "file-folder"])
def test_urls_that_cannot_give_the_declared_file_are_named_clearly(tmp_path, http_corpus, run_cli, case):
    http_corpus.files["/cc100/en.txt.xz"] = b"<!DOCTYPE html><html><body>Please log in</body></html>\n"
    (tmp_path / "folder").mkdir()
    url, fmt, message = {
        "html-for-xz": (f"{http_corpus.base}/cc100/en.txt.xz", "text-xz", "got an HTML page where a text-xz file"),
        "gopher": ("gopher://example.org/0/en.txt", "text", "unsupported URL scheme 'gopher://'"),
        "file-folder": ((tmp_path / "folder").as_uri(), "text", "is a folder, not a file"),
    }[case]
    spec = write_spec(tmp_path / "spec.yaml", {"name": "u", "languages": ["en"], "workspace": str(tmp_path / "ws"),
                                               "sources": [{"name": "web", "kind": "url", "url": url, "format": fmt,
                                                            "lang": "en"}]})
    rc, _, err = run_cli("run", "download", "--spec", spec)
    assert rc == 2 and message in err and "Traceback" not in err and "attempts" not in err, err
    assert not list((tmp_path / "ws").rglob("_manifest.json")), "nothing published"


def test_a_download_whose_end_cannot_be_verified_is_a_warning(tmp_path, http_corpus, run_cli):
    import json

    http_corpus.files["/en.txt"] = "".join(f"line {i}\n" for i in range(100)).encode()
    http_corpus.no_length.add("/en.txt")
    http_corpus.ignore_ranges.add("/en.txt")
    spec = write_spec(tmp_path / "spec.yaml", {"name": "u", "languages": ["en"], "workspace": str(tmp_path / "ws"),
                                               "sources": [{"name": "web", "kind": "url", "format": "text",
                                                            "url": f"{http_corpus.base}/en.txt", "lang": "en"}]})
    rc, out, err = run_cli("run", "download", "--spec", spec, "--json")
    assert rc == 0, err
    (warning,) = json.loads(out)["stages"]["download"]["warnings"]
    assert "/en.txt: the server sent no length" in warning and "sha256" in warning


def test_a_local_source_that_is_not_a_regular_file_is_one_clear_message(tmp_path, run_cli):
    """A symlink loop, a folder and a FIFO, as a local source or a file:// URL, and /dev/zero: each
    is named for what it is (a FIFO would hang the reader, /dev/zero fill the disk, a loop was a
    traceback), before anything is read."""
    import os

    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")
    for name, what in (("loop", "cannot be opened"), ("folder", "is a folder, not a file"),
                       ("fifo", "not a regular file")):
        spec = write_spec(tmp_path / f"{name}.yaml", {"name": name, "languages": ["en"], "sources": [
            {"name": "loc", "kind": "local", "format": "text", "lang": "en", "path": str(tmp_path / name)}]})
        rc, _, err = run_cli("run", "download", "--spec", spec, "--workspace", tmp_path / f"ws-{name}")
        assert rc == 2 and what in err and str(tmp_path / name) in err, err
        assert "Traceback" not in err
    # the same through a file:// URL, and /dev/zero, which would fill the disk
    for path, what in ((tmp_path / "fifo", "not a regular file"), (Path("/dev/zero"), "not a regular file")):
        spec = write_spec(tmp_path / "url.yaml", {"name": "u", "languages": ["en"], "sources": [
            {"name": "web", "kind": "url", "format": "text", "lang": "en", "url": path.as_uri()}]})
        rc, _, err = run_cli("run", "download", "--spec", spec, "--workspace", tmp_path / "ws-url")
        assert rc == 2 and what in err and str(path) in err and "Traceback" not in err, err


@pytest.mark.costs(deepspeed=1)  # a stand-in launch: a child with the launch mark, as the guard counts launches
def test_stopping_a_launch_signals_its_launcher_and_ranks_by_identity_and_no_other_process():
    """xylent.launch.stop_launched (SIGTERM, Ctrl-C) finds the launcher and its ranks by the
    pid:start-time mark they inherit, and signals each through the process object found alive."""
    import os
    import subprocess
    import sys

    from xylent.launch import stop_launched
    from xylent.process_identity import mark

    rank = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "print('up', flush=True); time.sleep(60)"
    launched = subprocess.Popen([sys.executable, "-c", rank], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "XYLENT_PARENT": mark()})
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],  # ours, not a launch
                             env={k: v for k, v in os.environ.items() if k != "XYLENT_PARENT"})
    try:
        assert launched.stdout.readline().strip() == "up"
        import psutil

        ranks = psutil.Process(launched.pid).children()
        assert len(ranks) == 1
        seen = {p.pid: p.environ().get("XYLENT_PARENT") for p in psutil.Process().children(recursive=True)}
        assert stop_launched() == 2, f"the launcher and its rank (this process {mark()}; marks: {seen})"
        assert launched.wait(timeout=10) == -15 and psutil.wait_procs(ranks, timeout=10)[1] == []
        assert other.poll() is None, "a process this one started but did not launch is left alone"
    finally:
        for p in (launched, other):
            p.kill()
            p.wait()


@pytest.mark.costs(deepspeed=2)  # two stand-in launches of two local ranks each, started directly (no torch)
def test_directly_started_ranks_stop_together_name_the_first_death_and_leave_nothing_behind(tmp_path, monkeypatch):
    """What DeepSpeed's launcher does for its ranks, done without it (xylent.launch): when one rank exits
    non-zero the others are stopped and the error names that rank; a rank's leftover child, which holds the
    output pipe, does not keep a finished launch waiting."""
    import os
    import time

    import psutil

    from xylent.errors import XylentError
    from xylent.launch import deepspeed_command, launch

    (tmp_path / "standin.py").write_text(
        "import os, subprocess, sys, time\n"
        "rank = int(os.environ['RANK'])\n"
        "print(f'rank {rank} up', flush=True)\n"
        "if sys.argv[-1] == 'die':\n"
        "    sys.exit(3) if rank == 1 else time.sleep(120)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])  # a leftover on the pipe\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    start = time.monotonic()
    with pytest.raises(XylentError, match=r"training rank \(local\) 1 died \(exit code 3\)"):
        launch([*deepspeed_command(tmp_path / "die", ranks=2, module="standin"), "die"], tmp_path / "a.log")
    done = launch(deepspeed_command(tmp_path / "exit", ranks=2, module="standin"), tmp_path / "b.log")
    assert time.monotonic() - start < 60, "rank 0 was stopped and the leftovers killed, not waited for"
    log = done.log_file.read_text()
    assert "rank 0 up" in log and "rank 1 up" in log and "2 local CPU rank(s)" in log
    left = [p for p in psutil.process_iter(["cmdline"]) if "standin" in " ".join(p.info["cmdline"] or [])
            or "time.sleep(120)" in " ".join(p.info["cmdline"] or [])]
    assert not left, [p.info["cmdline"] for p in left]


@pytest.mark.costs(deepspeed=1)
def test_a_run_whose_loss_goes_non_finite_stops_before_its_checkpoint_with_one_clear_error(tmp_path, monkeypatch,
                                                                                          capsys):
    """Issue 64, item 0: the trainer stops at the first logged step whose loss is not finite, before the
    checkpoint that would keep NaN weights (so nothing is published), and the launch turns its exit into one
    error naming the step and the settings, not "a rank died, run it again"."""
    import os
    import types

    from xylent.models.training.trainer import stop_if_diverged
    from xylent.errors import XylentError
    from xylent.launch import deepspeed_command, launch
    from xylent.rank_exit import DIVERGED

    cfg = types.SimpleNamespace(lr=1e3, warmup_steps=0, clip=2.0, precision="fp32")
    stop_if_diverged([(4, {"loss": 7.5}), (5, {"loss": 7.1})], cfg)  # finite: nothing happens
    with pytest.raises(SystemExit) as stop:
        stop_if_diverged([(4, {"loss": 7.5}), (5, {"loss": float("nan")}), (6, {"loss": float("inf")})], cfg)
    assert stop.value.code == DIVERGED
    said = capsys.readouterr().out
    assert "the loss is nan at step 5" in said and "pretrain.lr 1000.0" in said
    (tmp_path / "diverges.py").write_text(
        "import os, sys, time\n"
        "from xylent.models.training.trainer import stop_if_diverged\n"
        "import types\n"
        "cfg = types.SimpleNamespace(lr=1e3, warmup_steps=0, clip=2.0, precision='fp32')\n"
        "if os.environ['RANK'] == '0':\n"
        "    stop_if_diverged([(3, {'loss': float('nan')})], cfg)\n"
        "time.sleep(120)\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    with pytest.raises(XylentError) as err:
        launch(deepspeed_command(tmp_path / "x", ranks=2, module="diverges"), tmp_path / "a.log")
    text = err.value.render()
    assert "training diverged: the loss is nan at step 3" in text and "lower pretrain.lr" in text
    assert "run the same command again" not in text


def test_the_server_watchdog_stops_only_the_server_it_was_given_never_a_process_that_took_its_number():
    """PIDs wrap within minutes on a busy machine: the watchdog knows its CLI and its server by
    PID and start time, so a reused number, for the parent or the server, is not them."""
    import subprocess
    import sys
    import time

    from xylent.flows.kit.processes import _WATCHDOG
    from xylent.process_identity import started

    def watchdog(parent: int, parent_started: float, server: int, server_started: float) -> None:
        subprocess.run([sys.executable, "-c", _WATCHDOG, str(parent), repr(parent_started), str(server),
                        repr(server_started)], timeout=60, check=True)

    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone_started = started(gone.pid)
        gone.wait()  # the CLI is gone: the watchdog goes on at once
        # the server's number, now another process's
        watchdog(gone.pid, gone_started, stand_in.pid, started(stand_in.pid) - 5.0)
        assert stand_in.poll() is None, "a process that took the server's number was stopped"
        alive_parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
        t0 = time.time()
        # the real server, once its CLI ends
        watchdog(alive_parent.pid, started(alive_parent.pid), stand_in.pid, started(stand_in.pid))
        assert time.time() - t0 >= 1.0, "it waited for its CLI"
        assert stand_in.wait(timeout=10) is not None, "the server itself is stopped"
    finally:
        stand_in.kill()
        stand_in.wait()


@pytest.mark.costs(cli=1)
def test_kill_9_of_the_cli_under_the_processes_runner_leaves_no_process_behind(tmp_path):
    """Its own Prefect server (no PREFECT_API_URL, as on a user's machine), pool workers, their helpers."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    text = tmp_path / "en.txt"
    text.write_text("".join(f"sentence {i} of a corpus big enough to keep prepare busy\n" for i in range(600_000)))
    spec = write_spec(tmp_path / "spec.yaml", {
        "name": "k9", "languages": ["en"], "runner": {"kind": "processes", "max_workers": 2},
        "sources": [{"name": "loc", "kind": "local", "format": "text", "lang": "en", "path": str(text)}]})
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    cli = subprocess.Popen([sys.executable, "-m", "xylent.cli", "run", "prepare", "--spec", str(spec),
                            "--workspace", str(tmp_path / "ws")], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[1])
    def cmd(p) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:  # gone, or a zombie in between
            return ""

    try:
        deadline, family = time.time() + 120, []
        while time.time() < deadline and cli.poll() is None:
            family = psutil.Process(cli.pid).children(recursive=True)
            if any("spawn_main" in cmd(p) for p in family):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the pool workers never started")
        watchdogs = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"]
                     and len(p.info["cmdline"]) >= 6 and p.info["cmdline"][1] == "-c"
                     and p.info["cmdline"][3] == str(cli.pid)]  # python -c CODE parent server its-start-time
        servers = [p for p in family if "uvicorn" in cmd(p)]
    finally:
        cli.send_signal(signal.SIGKILL)
        cli.wait()
    assert servers, "the CLI started its own Prefect server"
    assert watchdogs, "a watchdog waits for the CLI"
    left = family + watchdogs
    deadline = time.time() + 30
    while time.time() < deadline:
        left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not left:
            break
        time.sleep(0.2)
    assert not left, [cmd(p)[:120] for p in left]


def test_a_failed_run_leaves_no_pickled_exception_outside_the_workspace(run_cli, tmp_path):
    """Prefect writes every failed flow's exception into its result storage (~/.prefect/storage):
    a CLI run points that at a folder that ends with the run, and removes those of runs killed
    with -9 (issue 64)."""
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

    import os
    import subprocess
    import sys
    import tempfile

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its number names no process now
    killed = Path(tempfile.mkdtemp(prefix=f"xylent-prefect-results-{gone.pid}-"))  # a run's after a kill -9
    (killed / "exception.pickle").write_bytes(b"x")
    alive = Path(tempfile.mkdtemp(prefix=f"xylent-prefect-results-{os.getppid()}-"))  # a run still going
    storage = tmp_path / "prefect-storage"  # where Prefect's default would have put it
    spec = write_spec(tmp_path / "spec.yaml", {"name": "pickle", "languages": ["en"], "sources": [
        {"name": "loc", "kind": "local", "format": "text", "lang": "en", "path": str(tmp_path / "missing.txt")}]})
    with temporary_settings({PREFECT_LOCAL_STORAGE_PATH: storage}):
        rc, _, err = run_cli("run", "download", "--spec", spec, "--workspace", tmp_path / "ws")
    assert rc == 2 and "local file not found" in err
    assert not storage.exists() or not any(storage.iterdir()), sorted(storage.iterdir())
    assert not killed.exists(), "the next run removes the result folder a killed run left"
    assert alive.exists(), "never a running one's"
    alive.rmdir()


@pytest.mark.costs(cli=1)
def test_sigterm_ends_a_slow_download_within_seconds_and_keeps_its_bytes(http_corpus, tmp_path):
    """A Slurm or CI cancel in the middle of a trickling download (it once ignored SIGTERM and
    Ctrl-C for 80 s): the run ends within seconds, publishes nothing, keeps the partial file for a
    resume and reads KILLED in MLflow."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from mlflow.tracking import MlflowClient

    http_corpus.files["/slow/en.txt"] = "".join(f"line {i} of a slow corpus\n" for i in range(20_000)).encode()
    http_corpus.slow["/slow/en.txt"] = 4000  # minutes for the whole file
    spec = write_spec(tmp_path / "spec.yaml", {"name": "cancel", "languages": ["en"], "sources": [
        {"name": "web", "kind": "url", "format": "text", "lang": "en", "url": f"{http_corpus.base}/slow/en.txt"}]})
    ws = tmp_path / "ws"
    cli = subprocess.Popen([sys.executable, "-m", "xylent.cli", "run", "download", "--spec", str(spec),
                            "--workspace", str(ws)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           env=os.environ.copy(), cwd=Path(__file__).resolve().parents[1])
    deadline = time.time() + 120
    while not [p for p in ws.glob("download/_partial/*.part") if p.stat().st_size > 0]:
        assert cli.poll() is None and time.time() < deadline, cli.communicate()[1][-3000:]
        time.sleep(0.05)
    cli.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    try:
        cli.wait(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
    waited, err = time.monotonic() - signalled, cli.communicate()[1]
    assert cli.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM, 130), err[-2000:]
    assert waited < 10, f"the download stopped {waited:.1f} s after SIGTERM"
    assert [p.name for p in (ws / "download").iterdir() if not p.name.startswith("_")] == [], "nothing published"
    assert [p.stat().st_size for p in ws.glob("download/_partial/*.part")][0] > 0, "the bytes stay for a resume"
    client = MlflowClient(f"sqlite:///{ws}/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.`xylent.stage` = 'download'")
    assert [r.info.status for r in runs] == ["KILLED"], "a stopped run reads KILLED in MLflow, not FAILED"


@pytest.mark.costs(cli=3)  # the pretrain CLI launches its DeepSpeed rank inside its own process tree
def test_three_clis_side_by_side_each_keep_their_own_server_and_all_finish(demo_run, tmp_path):
    """As on a team's worker host: three commands at once, each with the temporary Prefect server
    it starts itself (no PREFECT_API_URL), on its own workspace over the demo's data; one trains
    (a DeepSpeed rank). Each sees only its own server, all finish, and every server stops with
    its CLI: none stops another's (issue 35's lost server)."""
    import contextlib
    import os
    import subprocess
    import sys
    import time

    import psutil

    from conftest import linked_data

    _, demo_ws = demo_run
    short = ["--set", "pretrain.steps=4", "--set", "pretrain.checkpoint_every=2", "--set", "pretrain.warmup_steps=1",
             "--set", "pretrain.log_every=2"]
    upto_vocab = ("download", "prepare", "dedup", "vocab")
    commands = [["run", "pretrain", *short, "--workspace", linked_data(demo_ws, tmp_path / "train")],
                ["run", "sampling", "--set", "sampling.alpha=0.6",
                 "--workspace", linked_data(demo_ws, tmp_path / "a", upto_vocab)],
                ["run", "sampling", "--set", "sampling.alpha=0.4",
                 "--workspace", linked_data(demo_ws, tmp_path / "b", upto_vocab)]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    logs = [tmp_path / f"cli-{i}.err" for i in range(len(commands))]  # files: a full pipe would stall a CLI
    clis = [subprocess.Popen([sys.executable, "-m", "xylent.cli", *map(str, c), "--spec", str(DEMO)], env=env,
                             stdout=subprocess.DEVNULL, stderr=log.open("w"),
                             cwd=Path(__file__).resolve().parents[1]) for c, log in zip(commands, logs)]
    servers: dict[int, set] = {c.pid: set() for c in clis}
    seen: dict[int, psutil.Process] = {}
    deadline = time.time() + 600
    while any(c.poll() is None for c in clis) and time.time() < deadline:
        for c in clis:
            with contextlib.suppress(psutil.Error):  # it ended meanwhile
                for child in psutil.Process(c.pid).children(recursive=True):
                    if "uvicorn" in " ".join(child.cmdline()):
                        servers[c.pid].add(child.pid)
                        seen[child.pid] = child
        time.sleep(0.2)
    for c in clis:
        c.wait(timeout=60)
    errs = [log.read_text() for log in logs]
    assert [c.returncode for c in clis] == [0, 0, 0], [e[-2000:] for e in errs]
    assert all(servers.values()), f"each CLI started a server of its own: {servers}"
    assert len(set().union(*servers.values())) == sum(map(len, servers.values())), "none shared with another CLI"
    assert not any("Crashed" in e or "Traceback" in e for e in errs), [e[-2000:] for e in errs]
    end = time.time() + 30
    while time.time() < end and any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in seen.values()):
        time.sleep(0.2)
    assert not [p.pid for p in seen.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], \
        "every server stopped with its own CLI"


def test_a_copied_workspace_logs_into_its_own_artifact_store_not_the_originals(tmp_path, run_cli):
    import json
    import shutil
    import sqlite3

    (tmp_path / "en.txt").write_text("".join(f"sentence {i}\n" for i in range(100)))
    spec = write_spec(tmp_path / "spec.yaml", {"name": "c", "languages": ["en"], "sources": [
        {"name": "loc", "kind": "url", "format": "text", "lang": "en", "url": (tmp_path / "en.txt").as_uri()}]})
    first, copy = (tmp_path / "first_ws").resolve(), (tmp_path / "copy_ws").resolve()
    assert run_cli("run", "download", "--spec", spec, "--workspace", first)[0] == 0
    shutil.copytree(first, copy)
    before = sorted(p for p in (first / "mlartifacts").rglob("*"))
    rc, out, err = run_cli("run", "download", "--spec", spec, "--workspace", copy, "--force", "--json")
    assert rc == 0, err
    assert sorted(p for p in (first / "mlartifacts").rglob("*")) == before, "the original workspace is untouched"
    run_id = json.loads(out)["stages"]["download"]["mlflow_run_id"]
    assert list((copy / "mlartifacts").rglob(f"{run_id}/artifacts/_manifest.json")), "the copy's run logs here"
    with sqlite3.connect(copy / "mlflow.db") as con:
        locations = [r[0] for r in con.execute("SELECT artifact_uri FROM runs")]
        locations += [r[0] for r in con.execute("SELECT artifact_location FROM experiments WHERE name = 'xylent'")]
    assert locations and all(loc.startswith(copy.as_uri() + "/mlartifacts/") for loc in locations), locations


@pytest.mark.costs(cli=1)
def test_a_user_error_in_a_pool_worker_is_one_message(tmp_path):
    import subprocess
    import sys

    (tmp_path / "de-en.tsv").write_text("".join(f"Satz {i} sentence {i}\n" for i in range(100)))
    spec = write_spec(tmp_path / "spec.yaml", {"name": "p", "languages": ["de", "en"],
                                               "runner": {"kind": "processes", "max_workers": 2},
                                               "sources": [{"name": "bt", "kind": "local", "format": "tsv",
                                                            "pair": "de-en", "path": str(tmp_path / "de-en.tsv")}]})
    proc = subprocess.run([sys.executable, "-m", "xylent.cli", "run", "prepare", "--spec", str(spec), "--workspace",
                           str(tmp_path / "ws")], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                          text=True, timeout=300)  # the workers write to the same stderr, which capsys cannot see
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert "xylent: error: 100 of 100 lines" in proc.stderr and "Starting temporary server" not in proc.stderr


def test_a_zip_member_expanding_past_the_cap_is_refused_before_it_is_read(tmp_path, run_cli):
    from conftest import moses_zip

    src = ["a" * 1000] * 5000  # 5 MB of one repeated line: a few kB zipped
    (tmp_path / "de-en.zip").write_bytes(moses_zip("Bomb", "de", "en", src, src))
    assert (tmp_path / "de-en.zip").stat().st_size < 100_000
    spec = write_spec(tmp_path / "spec.yaml", {"name": "z", "languages": ["de", "en"], "workspace": str(tmp_path / "ws"),
                                               "prepare": {"max_member_bytes": 1_000_000},
                                               "sources": [{"name": "bomb", "kind": "local", "format": "moses-zip",
                                                            "pair": "de-en", "path": str(tmp_path / "de-en.zip")}]})
    rc, _, err = run_cli("run", "prepare", "--spec", spec)
    assert rc == 2 and "Bomb.de-en.de expands to 5,005,000 bytes" in err and "max_member_bytes" in err, err
    assert "Traceback" not in err and not list((tmp_path / "ws").glob("prepare/*/_manifest.json"))


def test_a_model_shape_no_encoder_can_have_stops_the_run_before_any_stage(tmp_path, run_cli):
    rc, _, err = run_cli("run", "pipeline", "--spec", DEMO, "--workspace", tmp_path / "ws", "--set", "model.heads=3")
    assert rc == 2 and "hidden (64) must be a multiple of heads (3)" in err and "model.heads" in err, err
    assert "Traceback" not in err and not (tmp_path / "ws" / "download").exists(), "no stage ran"


def test_an_error_reads_as_lines_where_prefect_logs_it_and_survives_pickling():
    import pickle

    from xylent.errors import XylentError

    err = XylentError("the spec is wrong", where="spec.yaml:3", fix="fix line 3")
    assert repr(err) == "XylentError: the spec is wrong\n  where: spec.yaml:3\n  what to do: fix line 3"
    assert "\\n" not in f"{err!r}", "real line breaks, not an escaped string"
    back = pickle.loads(pickle.dumps(err))
    assert (back.what, back.where, back.fix) == (err.what, err.where, err.fix)


def test_a_master_port_in_use_is_refused_before_any_rank_starts(tmp_path):
    """Each rank died with EADDRINUSE, said only in train.log, and the advice was to run it again."""
    import socket

    from xylent.errors import XylentError
    from xylent.launch import deepspeed_command, free_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(XylentError, match=f"master port {taken.getsockname()[1]} is in use"):
            deepspeed_command(tmp_path / "train.json", ranks=2, master_port=taken.getsockname()[1])
    port = free_port()
    assert deepspeed_command(tmp_path / "train.json", ranks=2, master_port=port)[3:5] == ["--master_port", str(port)]


def test_a_lock_file_that_is_a_folder_is_one_clear_error(tmp_path):
    """IsADirectoryError with a traceback ("a bug") before."""
    from xylent.errors import XylentError
    from xylent.workspace import Workspace

    (tmp_path / "ws" / ".xylent.lock").mkdir(parents=True)
    with pytest.raises(XylentError, match="lock file is a folder") as err:
        with Workspace(tmp_path / "ws").lock():
            pass
    assert "remove that folder" in err.value.render()


def test_a_url_whose_file_name_is_too_long_for_the_file_system_is_saved_under_a_short_one(tmp_path, http_corpus,
                                                                                         run_cli):
    """Issue 64, item 3: a 300-byte file name in the URL was `OSError: File name too long` (exit 1, a bug); the
    file is saved under its name's start, a hash of the whole name and its suffixes, and read as any other."""
    name = "corpus-" + "a" * 300 + ".txt"
    http_corpus.files[f"/long/{name}"] = "".join(f"line {i}\n" for i in range(20)).encode()
    spec = write_spec(tmp_path / "spec.yaml", {
        "name": "long", "languages": ["en"], "workspace": str(tmp_path / "ws"),
        "sources": [{"name": "web", "kind": "url", "url": f"{http_corpus.base}/long/{name}", "format": "text",
                     "lang": "en"}]})
    rc, out, err = run_cli("run", "prepare", "--spec", spec, "--json")
    assert rc == 0, err[-3000:]
    saved = [p for p in (tmp_path / "ws").glob("download/*/web/*") if not p.name.startswith(".")]
    assert len(saved) == 1 and saved[0].name.startswith("corpus-aaa") and saved[0].name.endswith(".txt")
    assert len(saved[0].name.encode()) <= 200 and saved[0].read_bytes() == http_corpus.files[f"/long/{name}"]


def _environment_mistakes(tmp: Path) -> list[tuple[str, dict, str]]:
    """(what, environment changes, the setting the error must name): each variable a run reads from
    its environment, set to what goes wrong on real machines.  (Root writes through a folder's mode
    bits, so "read-only" is a read-only file system: /sys.)"""
    a_file = tmp / "a-file"
    a_file.write_text("not a folder\n")
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens there
    return [
        ("HOME missing", {"HOME": str(tmp / "missing")}, "HOME"),
        ("HOME a file", {"HOME": str(a_file)}, "HOME"),
        ("HOME read-only", {"HOME": "/sys"}, "HOME"),
        ("PREFECT_HOME a file", {"PREFECT_HOME": str(a_file)}, "PREFECT_HOME"),
        ("PREFECT_HOME read-only", {"PREFECT_HOME": "/sys/xylent-prefect"}, "PREFECT_HOME"),
        ("PREFECT_HOME under a file", {"PREFECT_HOME": str(a_file / "prefect")}, "PREFECT_HOME"),
        ("PREFECT_API_URL unreachable", {"PREFECT_API_URL": f"{dead}/api"}, "PREFECT_API_URL"),
        ("PREFECT_API_URL bad scheme", {"PREFECT_API_URL": "prefect.example:4200/api"}, "PREFECT_API_URL"),
        ("MLFLOW_TRACKING_URI unreachable", {"MLFLOW_TRACKING_URI": dead}, "MLFLOW_TRACKING_URI"),
        ("MLFLOW_TRACKING_URI bad scheme", {"MLFLOW_TRACKING_URI": "mlflow://host"}, "MLFLOW_TRACKING_URI"),
        ("MLFLOW_TRACKING_URI read-only", {"MLFLOW_TRACKING_URI": "sqlite:////sys/mlflow.db"}, "MLFLOW_TRACKING_URI"),
        ("MLFLOW_TRACKING_URI under a file", {"MLFLOW_TRACKING_URI": f"sqlite:///{a_file}/mlflow.db"},
         "MLFLOW_TRACKING_URI"),
        ("MLFLOW_TRACKING_URI a file store", {"MLFLOW_TRACKING_URI": str(tmp / "mlruns")}, "MLFLOW_TRACKING_URI"),
        ("TMPDIR missing", {"TMPDIR": str(tmp / "missing")}, "TMPDIR"),
        ("TMPDIR a file", {"TMPDIR": str(a_file)}, "TMPDIR"),
        ("TMPDIR read-only", {"TMPDIR": "/sys"}, "TMPDIR"),
    ]


def test_every_environment_mistake_is_exit_2_naming_the_setting_within_seconds(tmp_path, run_cli, monkeypatch):
    """Issue 64, item 4: the class, not the instance.  Every row exits 2 before any stage runs,
    names the variable in the error, and takes seconds (a read-only HOME once stalled the run
    for 300 s; a dead MLflow server was retried for 258 s).  The real CLI in this process, with
    the row's variables set in this process's environment."""
    import os
    import time

    for key in [k for k in os.environ if k.startswith(("PREFECT_API", "MLFLOW_TRACKING"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))  # the test's own, unless a row says otherwise
    monkeypatch.chdir(tmp_path)
    wrong = []
    for what, changes, setting in _environment_mistakes(tmp_path):
        with monkeypatch.context() as row:
            if "HOME" in changes:
                row.delenv("PREFECT_HOME")  # ~/.prefect is what HOME decides
            for key, value in changes.items():
                row.setenv(key, value)
            ws = tmp_path / "ws" / what.replace(" ", "-")
            started = time.monotonic()
            rc, _, err = run_cli("run", "download", "--spec", DEMO, "--workspace", ws)
            took = time.monotonic() - started
        if rc != 2 or setting not in err or "Traceback" in err or took > 10:
            wrong.append(f"{what}: exit {rc} after {took:.1f} s: {err.strip().splitlines()[-6:]}")
        elif (ws / "download").exists():
            wrong.append(f"{what}: a stage ran before the mistake was found")
    assert not wrong, "\n".join(wrong)


def test_a_dask_address_nobody_listens_on_is_named_within_seconds():
    """Issue 64: a Dask address nobody listens on took 30 s and ended in a bare OSError.  (Ray's own
    join already names its address: "cannot join the Ray cluster at ...", tests/test_dedup_stage.py.)"""
    import time

    from xylent.errors import XylentError
    from xylent.flows.kit.runners import shared_cluster
    from xylent.spec.runtime import RunnerConfig

    started = time.monotonic()
    with pytest.raises(XylentError, match="no Dask scheduler answers at 127.0.0.1:9") as err:
        with shared_cluster(RunnerConfig(kind="dask", address="127.0.0.1:9")):
            pass
    assert time.monotonic() - started < 5 and "runner.address" in err.value.render()


def _workspace_damage(ws: Path) -> list[tuple[str, Path]]:
    """(what, the entry named) for each top-level workspace entry made into what it must not be: a
    folder's place taken by a file or a link to nothing, a file's by a folder or a link to nothing,
    the MLflow database by other bytes."""
    from xylent.flows.registry import STAGE_NAMES

    rows = []
    for name in (*STAGE_NAMES, "logs", "mlartifacts", ".xylent.lock", "mlflow.db"):
        folder = name in (*STAGE_NAMES, "logs", "mlartifacts")
        for damage in ("a file" if folder else "a folder", "a link to nothing"):
            rows.append((f"{name} {damage}", ws / f"{name}--{damage.replace(' ', '-')}", name, damage))
    rows.append(("mlflow.db not a database", ws / "mlflow.db--junk", "mlflow.db", "junk"))
    out = []
    for what, root, name, damage in rows:
        root.mkdir(parents=True)
        path = root / name
        if damage == "a file":
            path.write_text("junk\n")
        elif damage == "a folder":
            path.mkdir()
        elif damage == "junk":
            path.write_bytes(b"<html>not a database</html>\n")
        else:
            path.symlink_to(root / "gone" / name)
        out.append((what, path))
    return out


def test_every_damaged_workspace_entry_is_exit_2_naming_it_within_seconds(tmp_path, run_cli):
    """Issue 64, item 4, its second table: each top-level entry of a workspace replaced by a file, a
    folder or a link to nothing (a stage's folder a file was FileExistsError, "internal error"; a
    damaged mlflow.db a bug; a dangling one two minutes and "read-only file system")."""
    import time

    wrong = []
    for what, path in _workspace_damage(tmp_path / "ws"):
        started = time.monotonic()
        rc, _, err = run_cli("run", "download", "--spec", DEMO, "--workspace", path.parent)
        took = time.monotonic() - started
        if rc != 2 or str(path) not in err or "move it away" not in err or took > 10:
            wrong.append(f"{what}: exit {rc} after {took:.1f} s: {err.strip().splitlines()[-4:]}")
    assert not wrong, "\n".join(wrong)
