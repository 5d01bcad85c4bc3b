"""Object-storage workspaces (``s3://bucket/prefix``, any S3-compatible store).

The bucket is the workspace of record; this machine keeps a local copy of what
it built or read (``$XYLENT_CACHE``, default ``~/.cache/xylent/workspaces``), so
stages keep working on plain files.  The guarantees of a local workspace, on a
store that has no rename and no flock:

- **atomic publish**: an output's files are uploaded first and its
  ``_manifest.json`` last; a prefix without a manifest is never trusted, and a
  rebuild (``--force``) deletes the old manifest before its first upload.
- **cache**: an output is cached when the bucket has its manifest; a machine
  without a local copy downloads the listed files, checks every sha256, and
  only then moves them into its cache.
- **lock**: a lease object ``.xylent.lock`` created with a conditional write
  (``If-None-Match: *``), renewed by its holder (``If-Match`` on its ETag) and
  taken over only once it has expired (again ``If-Match``, so two takers cannot
  both win).  A run that loses its lease publishes nothing more.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

from xylent.errors import XylentError

MANIFEST = "_manifest.json"
LOCK = ".xylent.lock"
LEASE_S = float(os.environ.get("XYLENT_LOCK_LEASE_S", "60"))


def cache_root() -> Path:
    return Path(os.environ.get("XYLENT_CACHE") or Path.home() / ".cache" / "xylent" / "workspaces").expanduser()


def _precondition_failed(exc: BaseException) -> bool:
    """A conditional write lost (s3fs turns S3's 412 into FileExistsError)."""
    text = f"{type(exc).__name__} {exc}"
    return isinstance(exc, FileExistsError) or any(
        m in text for m in ("PreconditionFailed", "pre-conditions you specified", "ConditionalRequestConflict"))


class ObjectStore:
    """One workspace prefix in a bucket, and this machine's copy of it."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        if parts.scheme not in ("s3", "s3a"):
            raise XylentError(
                f"workspace {url!r}: {parts.scheme}:// is not supported; object-storage workspaces are s3:// "
                "(AWS S3 or any S3-compatible store: MinIO, Ceph, R2, GCS's S3 interface)",
                where="--workspace / spec field workspace",
                fix="use s3://bucket/prefix (endpoint from AWS_ENDPOINT_URL) or a local/network-mounted folder",
            )
        if not parts.netloc:
            raise XylentError(f"workspace {url!r} names no bucket", where="--workspace / spec field workspace",
                              fix="write it as s3://bucket/prefix")
        try:
            import s3fs
        except ImportError:
            raise XylentError("an s3:// workspace needs s3fs", where="--workspace",
                              fix="pip install 'xylent[s3]' (or s3fs)") from None
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self.url = f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self.fs = s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True)
        self.cache_dir = cache_root() / "s3" / self.bucket / (self.prefix or "_root")
        self._lease: dict[str, Any] | None = None
        self.lost_lock = False

    # -- names ---------------------------------------------------------------
    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def url_of(self, rel: str) -> str:
        return f"s3://{self.bucket}/{self.key(rel)}"

    def _fail(self, exc: Exception, doing: str) -> XylentError:
        return XylentError(
            f"object store: {doing} failed: {type(exc).__name__}: {exc}", where=self.url,
            fix="check the bucket exists and the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a "
                "profile) and endpoint (AWS_ENDPOINT_URL) can write it")

    def probe(self) -> None:
        """Prove the prefix takes an object (wrong bucket, credentials or endpoint fail here, at once)."""
        probe = self.key(f".xylent-probe-{secrets.token_hex(4)}")
        try:
            self.fs.call_s3("put_object", Bucket=self.bucket, Key=probe, Body=b"")
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=probe)
        except Exception as exc:
            raise self._fail(exc, "writing a probe object") from None

    # -- manifests and files -------------------------------------------------
    def read_manifest(self, rel_dir: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.fs.cat_file(self.url_of(f"{rel_dir}/{MANIFEST}")))
        except FileNotFoundError:
            return None
        except json.JSONDecodeError:
            return None  # never trusted: rebuilt like a missing one
        except Exception as exc:
            raise self._fail(exc, f"reading {rel_dir}/{MANIFEST}") from None

    def upload_dir(self, local: Path, rel_dir: str) -> None:
        """Files first, the manifest last; an older manifest goes before anything is replaced."""
        if self.lost_lock:
            raise XylentError("this run lost the workspace lock (its lease expired and another run took it): "
                              "its output is not published", where=self.url,
                              fix="rerun; keep runs on one workspace apart, or raise XYLENT_LOCK_LEASE_S")
        files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != MANIFEST)
        try:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(self.url_of(f"{rel_dir}/{MANIFEST}"))
            if files:
                self.fs.put([str(p) for p in files],
                            [self.url_of(f"{rel_dir}/{p.relative_to(local).as_posix()}") for p in files])
            self.fs.put_file(str(local / MANIFEST), self.url_of(f"{rel_dir}/{MANIFEST}"))
        except Exception as exc:
            raise self._fail(exc, f"uploading {rel_dir}") from None

    def download_dir(self, rel_dir: str, manifest: dict[str, Any], local: Path) -> None:
        """The manifest's files into ``local`` (a fresh folder), each checked against its sha256."""
        from xylent.workspace import sha256_file

        entries = manifest.get("files", [])
        targets = [local / e["path"] for e in entries]
        for t in targets:
            t.parent.mkdir(parents=True, exist_ok=True)
        try:
            if entries:
                self.fs.get([self.url_of(f"{rel_dir}/{e['path']}") for e in entries], [str(t) for t in targets])
        except FileNotFoundError as exc:
            raise XylentError(f"a file listed in {rel_dir}/{MANIFEST} is missing from the bucket: {exc}",
                              where=self.url_of(rel_dir),
                              fix="rebuild that stage with --force (its output was changed after publishing)") from None
        except Exception as exc:
            raise self._fail(exc, f"downloading {rel_dir}") from None
        for e, t in zip(entries, targets):
            if sha256_file(t) != e["sha256"]:
                raise XylentError(f"{e['path']}: its bytes in the bucket differ from the manifest's sha256",
                                  where=self.url_of(f"{rel_dir}/{e['path']}"),
                                  fix="rebuild that stage with --force (its output was changed after publishing)")
        (local / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))

    def open(self, rel: str):
        return self.fs.open(self.url_of(rel), "rb")

    # -- the lease lock ------------------------------------------------------
    def acquire(self) -> None:
        self.lost_lock = False
        body = {"owner": secrets.token_hex(8), "host": socket.gethostname(), "pid": os.getpid(),
                "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        key = self.key(LOCK)
        try:
            etag = self._put_lock(body, IfNoneMatch="*")
        except Exception as exc:
            if not _precondition_failed(exc):
                raise self._fail(exc, "creating the lock object") from None
            etag = self._take_over_if_expired(body, key)
        self._lease = {"body": body, "etag": etag, "stop": threading.Event()}
        self._lease["thread"] = threading.Thread(target=self._renew, args=(self._lease,), daemon=True,
                                                 name="xylent-lease")
        self._lease["thread"].start()

    def _put_lock(self, body: dict, **condition) -> str:
        body = {**body, "expires": time.time() + LEASE_S}
        out = self.fs.call_s3("put_object", Bucket=self.bucket, Key=self.key(LOCK),
                              Body=json.dumps(body).encode(), **condition)
        return out["ETag"]

    def _take_over_if_expired(self, body: dict, key: str) -> str:
        from fsspec.asyn import sync

        async def read() -> tuple[bytes, str]:  # body and ETag of one version (s3fs' client is async)
            got = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=key)
            async with got["Body"] as body:
                return await body.read(), got["ETag"]

        try:
            data, etag = sync(self.fs.loop, read)
            holder = json.loads(data)
        except Exception as exc:
            raise self._fail(exc, "reading the lock object") from None
        left = holder.get("expires", 0) - time.time()
        if left > 0:
            raise XylentError(
                f"the workspace is in use by another xylent run (host {holder.get('host')}, pid {holder.get('pid')}, "
                f"since {holder.get('since')}; its lease is renewed every {LEASE_S / 3:.0f} s)",
                where=self.url_of(LOCK),
                fix="wait for that run to finish, or give this one its own --workspace; a run that died frees "
                    f"the lock when its lease runs out (within {LEASE_S:.0f} s)")
        try:  # expired: whoever swaps it first (on the ETag just read) holds it
            return self._put_lock(body, IfMatch=etag)
        except Exception as exc:
            if _precondition_failed(exc):
                raise XylentError("the workspace was just taken by another xylent run", where=self.url_of(LOCK),
                                  fix="wait for that run to finish, or give this one its own --workspace") from None
            raise self._fail(exc, "taking over an expired lock") from None

    def _renew(self, lease: dict) -> None:
        while not lease["stop"].wait(LEASE_S / 3):
            try:
                lease["etag"] = self._put_lock(lease["body"], IfMatch=lease["etag"])
            except Exception as exc:
                if _precondition_failed(exc):
                    self.lost_lock = True
                    return
                # a transient error: the lease still has two thirds left; try again next time

    def release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is None:
            return
        lease["stop"].set()
        lease["thread"].join(30)  # a renewal in flight changes the ETag the delete is conditional on
        with contextlib.suppress(Exception):  # a lost lease is someone else's now: leave it
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key(LOCK), IfMatch=lease["etag"])


@contextlib.contextmanager
def fresh_folder(final: Path) -> Iterator[Path]:
    """A sibling temporary folder renamed onto ``final`` when the block succeeds."""
    tmp = final.parent / f"{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if final.exists():
            old = final.parent / f"{final.name}.tmp-old-{secrets.token_hex(4)}"
            final.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
