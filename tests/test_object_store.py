"""s3:// workspaces against a real S3-compatible server on 127.0.0.1 (moto's server
mode): the demo's data stages give the same shards as on disk, a second machine
(an empty local cache) reuses them, the training loader reads shards from the
bucket, and publish, cache and lock keep their guarantees on object storage."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from xylent.errors import XylentError

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data_specs" / "demo.yaml"
BUCKET = "xylent-test"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """An S3 API on 127.0.0.1 with one bucket; the AWS settings every client reads."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("moto") / "server.log"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))
    endpoint = f"http://127.0.0.1:{port}"
    settings = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "xylent", "AWS_SECRET_ACCESS_KEY": "xylent",
                "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        import boto3

        client = boto3.client("s3")
        deadline = time.time() + 60
        while True:
            try:
                client.create_bucket(Bucket=BUCKET)
                break
            except Exception:
                if time.time() > deadline:
                    pytest.fail(f"moto server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.3)
        yield client
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        proc.wait(30)


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """This test's machine: its own local copy of object-store workspaces."""
    monkeypatch.setenv("XYLENT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _run(*args) -> dict:
    from flows.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main([str(a) for a in args] + ["--json"])
    assert rc == 0
    return json.loads(out.getvalue())


def _files(output_dir: str | Path) -> list[tuple[str, str]]:
    manifest = json.loads((Path(output_dir) / "_manifest.json").read_text())
    return sorted((f["path"], f["sha256"]) for f in manifest["files"])


def test_demo_data_stages_on_s3_match_disk_and_another_machine_reuses_them(s3, demo_run, tmp_path, monkeypatch):
    disk, _ = demo_run
    url = f"s3://{BUCKET}/demo"
    monkeypatch.setenv("XYLENT_CACHE", str(tmp_path / "machine-a"))
    first = _run("run", "pipeline", "--until", "shards", "--spec", DEMO, "--workspace", url)
    stages = ["download", "prepare", "dedup", "vocab", "sampling", "shards"]
    assert [s for s in stages if first["stages"][s]["cached"]] == []
    for stage in ("dedup", "vocab", "sampling", "shards"):
        assert first["stages"][stage]["fingerprint"] == disk["stages"][stage]["fingerprint"]
        assert _files(first["stages"][stage]["output_dir"]) == _files(disk["stages"][stage]["output_dir"]), stage
    shards_fp = first["stages"]["shards"]["fingerprint"]
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"demo/shards/{shards_fp}/")["Contents"]
    keys = {o["Key"].removeprefix(f"demo/shards/{shards_fp}/") for o in listed}
    assert keys == {p for p, _ in _files(first["stages"]["shards"]["output_dir"])} | {"_manifest.json"}

    # another machine: nothing local; every stage is a cache hit, downloaded and checked
    monkeypatch.setenv("XYLENT_CACHE", str(tmp_path / "machine-b"))
    second = _run("run", "pipeline", "--until", "shards", "--spec", DEMO, "--workspace", url)
    assert all(second["stages"][s]["cached"] for s in stages), {s: second["stages"][s]["cached"] for s in stages}
    out_b = Path(second["stages"]["shards"]["output_dir"])
    assert str(out_b).startswith(str(tmp_path / "machine-b"))
    assert _files(out_b) == _files(disk["stages"]["shards"]["output_dir"])
    from xylent.workspace import sha256_file

    assert all(sha256_file(out_b / p) == h for p, h in _files(out_b)), "the local copy is the published bytes"

    # `xylent status` asks the bucket, downloading nothing
    monkeypatch.setenv("XYLENT_CACHE", str(tmp_path / "machine-c"))
    status = _run("status", "--spec", DEMO, "--workspace", url)
    assert all(status["stages"][s]["cached"] for s in stages)
    assert not list((tmp_path / "machine-c").rglob("*.arrow")), "status fetched no output"

    # the training loader reads shards straight from the bucket: the same batches as from disk
    from tasks.shards.loader import TrainingLoader

    sampling = disk["stages"]["sampling"]["output_dir"]
    for task in ("mrtd", "trtd"):
        local = TrainingLoader(disk["stages"]["shards"]["output_dir"], sampling, task=task, batch_size=4)
        remote = TrainingLoader(f"{url}/shards/{shards_fp}", sampling, task=task, batch_size=4)
        for a, b in zip(local.batches(3), remote.batches(3)):
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), task


def _workspace(name: str):
    from xylent.workspace import Workspace

    return Workspace(f"s3://{BUCKET}/{name}")


def test_an_output_without_its_manifest_is_never_trusted_and_changed_bytes_are_refused(s3, cache, tmp_path,
                                                                                       monkeypatch):
    ws = _workspace("publish")
    out = ws.output_dir("stage", "fp1")
    with ws.lock(), ws.building(out) as tmp:
        (tmp / "data.txt").write_text("published\n")
        ws.publish(tmp, out, {"stage": "stage"})
    assert ws.manifest(out)["files"][0]["path"] == "data.txt"

    # a writer killed between its files and its manifest: files in the bucket, no manifest
    s3.put_object(Bucket=BUCKET, Key="publish/stage/fp2/data.txt", Body=b"half")
    assert ws.manifest(ws.output_dir("stage", "fp2")) is None

    # bytes changed in the bucket after publishing: a fresh machine refuses them
    s3.put_object(Bucket=BUCKET, Key="publish/stage/fp1/data.txt", Body=b"tampered!\n")
    monkeypatch.setenv("XYLENT_CACHE", str(tmp_path / "other-machine"))
    fresh = _workspace("publish")
    with pytest.raises(XylentError, match="differ from the manifest's sha256") as err:
        fresh.manifest(fresh.output_dir("stage", "fp1"))
    assert "--force" in err.value.fix
    assert not fresh.output_dir("stage", "fp1").exists(), "nothing half-checked lands in the cache"


def test_the_lease_lock_refuses_a_second_run_and_frees_a_dead_ones(s3, cache, monkeypatch):
    import xylent.remote

    ws, other = _workspace("locked"), _workspace("locked")
    with ws.lock():
        with pytest.raises(XylentError, match="in use by another xylent run") as err:
            other.remote.acquire()
        assert f"pid {os.getpid()}" in str(err.value)
    other.remote.acquire()  # released: free again
    other.remote.release()

    # a run killed with -9 leaves its lock object behind; once its lease is over, it is taken
    s3.put_object(Bucket=BUCKET, Key="locked/.xylent.lock",
                  Body=json.dumps({"host": "gone", "pid": 1, "expires": time.time() - 1}).encode())
    with ws.lock():
        body = json.loads(s3.get_object(Bucket=BUCKET, Key="locked/.xylent.lock")["Body"].read())
        assert body["pid"] == os.getpid()
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket=BUCKET, Key="locked/.xylent.lock")

    # a holder whose lease was taken over (it stalled past the lease) publishes nothing more,
    # through any Workspace object of the process (each stage subflow opens its own)
    monkeypatch.setattr(xylent.remote, "LEASE_S", 0.6)
    out = ws.output_dir("stage", "fp")
    with ws.lock():
        s3.put_object(Bucket=BUCKET, Key="locked/.xylent.lock", Body=b'{"host": "thief", "expires": 0}')
        time.sleep(0.5)  # a renewal (every LEASE_S / 3) finds the object changed
        stage_ws = _workspace("locked")
        with stage_ws.building(out) as tmp, pytest.raises(XylentError, match="lease was taken by another run"):
            (tmp / "x").write_text("x")
            stage_ws.publish(tmp, out, {})
    assert ws.manifest(out) is None and ws.verified(out, "stage") is None
    assert not out.exists(), "the bucket first: nothing local to take as cached later"


def test_unusable_object_store_workspaces_fail_clearly(s3, cache):
    from xylent.workspace import Workspace

    with pytest.raises(XylentError, match="gs:// is not supported"):
        Workspace("gs://bucket/ws")
    with pytest.raises(XylentError, match="names no bucket"):
        Workspace("s3:///ws")
    missing = Workspace("s3://no-such-bucket/ws")
    with pytest.raises(XylentError, match="writing a probe object failed") as err:
        missing.ensure_writable()
    assert "AWS_ENDPOINT_URL" in err.value.fix


def test_a_lease_is_ours_after_a_retried_write_and_lapses_without_renewals(s3, cache):
    from xylent.remote import ObjectStore

    store = _workspace("adopt").remote
    store.acquire()
    try:
        lease = ObjectStore._leases[store.url]
        # our conditional write went through but its answer was lost; the retry was refused:
        # the lock names us as owner, so it is adopted, not reported as another run's
        assert store._take_over_if_expired(lease["body"]) == lease["etag"]
        assert store.lease_problem() is None
        lease["valid_until"] = time.time() - 1  # renewals failed (store unreachable) for a whole lease
        assert "could not be renewed" in store.lease_problem()
    finally:
        store.release()
    assert store.lease_problem() is None and store.url not in ObjectStore._leases
