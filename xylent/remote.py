"""Object-storage workspaces (``s3://``, ``gs://``, ``az://`` bucket/prefix; xylent/stores.py).

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
  (S3/Azure ``If-None-Match: *``, GCS ``ifGenerationMatch=0``), renewed by its
  holder (conditional on the version it wrote) and taken over only once it has
  expired (again conditional, so two takers cannot both win).  A run that loses its lease publishes nothing more.
"""

from __future__ import annotations

import contextlib
import hashlib
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
from xylent.manifest import MANIFEST, well_formed

LOCK = ".xylent.lock"
LEASE_S = float(os.environ.get("XYLENT_LOCK_LEASE_S", "60"))


def cache_root() -> Path:
    return Path(os.environ.get("XYLENT_CACHE") or Path.home() / ".cache" / "xylent" / "workspaces").expanduser()


class ObjectStore:
    """One workspace prefix in a bucket, and this machine's copy of it."""

    def __init__(self, url: str):
        from xylent.stores import open_store, store_class

        parts = urlsplit(url)
        kind = store_class(parts.scheme, url)
        if not parts.netloc:
            raise XylentError(f"workspace {url!r} names no bucket", where="--workspace / spec field workspace",
                              fix=f"write it as {parts.scheme}://bucket/prefix")
        # abfs://container@account.dfs.core.windows.net/...: here the account is a setting
        if "@" in parts.netloc and kind.scheme == "az":
            container, _, host = parts.netloc.partition("@")
            raise XylentError(f"workspace {url!r} names its storage account in the address",
                              where="--workspace / spec field workspace",
                              fix=f"write it as {parts.scheme}://{container}{parts.path} and set "
                                  f"AZURE_STORAGE_ACCOUNT_NAME={host.split('.')[0]} (with its key, SAS token or a "
                                  "service principal)")
        self.store = open_store(kind, parts.netloc)
        self.fs = self.store.fs
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self.url = self.store.url(self.prefix).rstrip("/")
        self.cache_dir = cache_root() / self.store.scheme / self.bucket / (self.prefix or "_root")

    # -- names ---------------------------------------------------------------
    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def url_of(self, rel: str) -> str:
        return self.store.url(self.key(rel))

    def _fail(self, exc: Exception, doing: str) -> XylentError:
        return XylentError(
            f"object store: {doing} failed: {type(exc).__name__}: {exc}", where=self.url,
            fix=f"check the bucket exists and {self.store.credentials} can write it")

    def probe(self) -> None:
        """Prove the prefix takes an object (wrong bucket, credentials or endpoint fail here,
        at once) and that the store honours conditional writes, which the lock rests on."""
        from xylent.stores import Conflict

        probe = self.key(f".xylent-probe-{secrets.token_hex(4)}")
        try:
            tag = self.store.create(probe, b"")
        except Exception as exc:
            raise self._fail(exc, "writing a probe object") from None
        try:
            tag = self.store.create(probe, b"")
            honoured = False
        except Conflict:
            honoured = True
        except Exception as exc:  # a timeout or throttling says nothing about conditional writes
            with contextlib.suppress(Exception):
                self.store.delete(probe, tag)
            raise self._fail(exc, "writing a probe object a second time") from None
        with contextlib.suppress(Exception):
            self.store.delete(probe, tag)
        if not honoured:
            raise XylentError("this object store ignores conditional writes (create-if-absent), so two runs could "
                              "both take the workspace lock", where=self.url,
                              fix="use a store with conditional writes (AWS S3, MinIO >= 2024-11, R2, GCS, Azure "
                                  "Blob), or a local/network folder as --workspace")

    # -- manifests and files -------------------------------------------------
    def read_manifest(self, rel_dir: str) -> dict[str, Any] | None:
        try:
            return well_formed(json.loads(self.fs.cat_file(self.url_of(f"{rel_dir}/{MANIFEST}"))))
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None  # never trusted: rebuilt like a missing one
        except Exception as exc:
            raise self._fail(exc, f"reading {rel_dir}/{MANIFEST}") from None

    def upload_dir(self, local: Path, rel_dir: str) -> None:
        """Files first, the manifest last; an older manifest goes before anything is replaced."""
        self._check_lease()
        files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != MANIFEST)
        try:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(self.url_of(f"{rel_dir}/{MANIFEST}"))
            if files:
                self.fs.put([str(p) for p in files],
                            [self.url_of(f"{rel_dir}/{p.relative_to(local).as_posix()}") for p in files])
            self._check_lease()  # again: an upload can outlast a lease
            self.fs.put_file(str(local / MANIFEST), self.url_of(f"{rel_dir}/{MANIFEST}"))
        except XylentError:
            raise
        except Exception as exc:
            raise self._fail(exc, f"uploading {rel_dir}") from None

    def _check_lease(self) -> None:
        if (why := self.lease_problem()) is not None:
            raise XylentError(f"this run lost the workspace lock ({why}): its output is not published",
                              where=self.url, fix="rerun; keep runs on one workspace apart, or raise "
                              "XYLENT_LOCK_LEASE_S (seconds, default 60) if the store is slow to answer")

    def download_dir(self, rel_dir: str, manifest: dict[str, Any], local: Path) -> None:
        """The manifest's files into ``local`` (a fresh folder), each checked against its sha256."""
        from xylent.errors import environment_error

        entries = manifest.get("files", [])
        bad = [e["path"] for e in entries if e["path"].startswith("/") or ".." in Path(e["path"]).parts]
        if bad:
            raise XylentError(f"{rel_dir}/{MANIFEST} lists paths outside its folder: {bad[:3]}",
                              where=self.url_of(rel_dir), fix="rebuild that stage with --force")
        targets = [local / e["path"] for e in entries]
        try:
            for t in targets:
                t.parent.mkdir(parents=True, exist_ok=True)
            if entries:
                self.fs.get([self.url_of(f"{rel_dir}/{e['path']}") for e in entries], [str(t) for t in targets])
        except FileNotFoundError as exc:
            raise XylentError(f"a file listed in {rel_dir}/{MANIFEST} is missing from the bucket: {exc}",
                              where=self.url_of(rel_dir),
                              fix="rebuild that stage with --force (its output was changed after publishing)") from None
        except OSError as exc:
            if (env := environment_error(exc, str(local))) is not None:
                raise env from None  # this machine's disk, not the bucket
            raise self._fail(exc, f"downloading {rel_dir}") from None
        except Exception as exc:
            raise self._fail(exc, f"downloading {rel_dir}") from None
        for e, t in zip(entries, targets):
            with open(t, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            if digest != e["sha256"]:
                raise XylentError(f"{e['path']}: its bytes in the bucket differ from the manifest's sha256",
                                  where=self.url_of(f"{rel_dir}/{e['path']}"),
                                  fix="rebuild that stage with --force (its output was changed after publishing)")
            if e.get("mtime_ns") is not None:  # checked just now: the local copy is the published file
                os.utime(t, ns=(e["mtime_ns"], e["mtime_ns"]))
        (local / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))

    def open(self, rel: str):
        return self.fs.open(self.url_of(rel), "rb")

    # -- the lease lock ------------------------------------------------------
    # One lease per workspace URL and process: every Workspace object of an invocation
    # (its stage subflows open their own) sees whether the lease still holds.
    _leases: dict[str, dict[str, Any]] = {}

    def lease_problem(self) -> str | None:
        """Why this process may not publish to the workspace now (None: it holds the lease)."""
        lease = ObjectStore._leases.get(self.url)
        if lease is None:
            return None  # a worker task: its invocation holds the lease
        if lease["lost"]:
            return "its lease was taken by another run"
        if time.time() >= lease["valid_until"]:
            return "its lease could not be renewed before it ran out"
        return None

    def acquire(self) -> None:
        body = {"owner": secrets.token_hex(8), "host": socket.gethostname(), "pid": os.getpid(),
                "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        for attempt in range(5):  # a lock released between our two requests: create it again
            if (tag := self._create_lock(body)) is not None:
                break
            try:  # held by another run: ours only once its lease ran out
                tag = self._take_over_if_expired(body)
                break
            except FileNotFoundError:
                time.sleep(0.2 * (attempt + 1))
        else:
            raise XylentError("the workspace lock kept changing hands", where=self.url_of(LOCK),
                              fix="another xylent run is starting on this workspace: wait, or use another one")
        lease = {"body": body, "etag": tag, "stop": threading.Event(), "lost": False,
                 "valid_until": time.time() + LEASE_S}
        lease["thread"] = threading.Thread(target=self._renew, args=(lease,), daemon=True, name="xylent-lease")
        ObjectStore._leases[self.url] = lease
        lease["thread"].start()

    def _create_lock(self, body: dict) -> str | None:
        """The new lock's tag, or None when the lock exists already."""
        from xylent.stores import Conflict

        try:
            return self._put_lock(body)
        except Conflict:
            return None
        except Exception as exc:
            raise self._fail(exc, "creating the lock object") from None

    def _put_lock(self, body: dict, tag: str | None = None) -> str:
        """Write the lock: created when ``tag`` is None, else replaced if still at ``tag``."""
        data = json.dumps({**body, "expires": time.time() + LEASE_S}).encode()
        if tag is None:
            return self.store.create(self.key(LOCK), data)
        return self.store.replace(self.key(LOCK), data, tag)

    def _read_lock(self) -> tuple[dict, str]:
        """The lock object's body and tag, of one version (FileNotFoundError: there is none)."""
        try:
            data, tag = self.store.read(self.key(LOCK))
            return json.loads(data), tag
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise self._fail(exc, "reading the lock object") from None

    def _ours(self, body: dict) -> str | None:
        """The lock's tag when it is ours after all (a conditional write that succeeded on
        the server, its answer lost and the retry refused, is not a lost lease); None when
        another run holds it; FileNotFoundError when there is no lock any more."""
        holder, tag = self._read_lock()
        return tag if holder.get("owner") == body["owner"] else None

    def _take_over_if_expired(self, body: dict) -> str:
        from xylent.stores import Conflict

        holder, tag = self._read_lock()
        if holder.get("owner") == body["owner"]:
            return tag
        left = holder.get("expires", 0) - time.time()
        if left > 0:
            raise XylentError(
                f"the workspace is in use by another xylent run (host {holder.get('host')}, pid {holder.get('pid')}, "
                f"since {holder.get('since')}; its lease is renewed every {LEASE_S / 3:.0f} s)",
                where=self.url_of(LOCK),
                fix="wait for that run to finish, or give this one its own --workspace; a run that died frees "
                    f"the lock when its lease runs out (within {LEASE_S:.0f} s)")
        try:  # expired: whoever swaps it first (on the version just read) holds it
            return self._put_lock(body, tag)
        except FileNotFoundError:
            raise  # released meanwhile: acquire() creates it again
        except Conflict:
            if (mine := self._ours(body)) is not None:  # FileNotFoundError: released meanwhile, as above
                return mine
            raise XylentError("the workspace was just taken by another xylent run", where=self.url_of(LOCK),
                              fix="wait for that run to finish, or give this one its own --workspace") from None
        except Exception as exc:
            raise self._fail(exc, "taking over an expired lock") from None

    def _renew(self, lease: dict) -> None:
        from xylent.stores import Conflict

        while not lease["stop"].wait(LEASE_S / 3):
            started = time.time()
            try:
                try:
                    lease["etag"] = self._put_lock(lease["body"], lease["etag"])
                except (Conflict, FileNotFoundError):  # changed or gone: still ours only if it names us
                    mine = self._ours(lease["body"])
                    if mine is None:
                        lease["lost"] = True
                        return
                    # ours, from a write whose answer was lost: its expiry may be sooner than the
                    # lease this round would grant, so write again before extending it
                    lease["etag"] = self._put_lock(lease["body"], mine)
            except FileNotFoundError:  # deleted by a run that took it over and finished
                lease["lost"] = True
                return
            except Exception:
                continue  # transient: the lease still has two thirds left; publishing checks valid_until
            lease["valid_until"] = started + LEASE_S

    def release(self) -> None:
        lease = ObjectStore._leases.pop(self.url, None)
        if lease is None:
            return
        lease["stop"].set()
        lease["thread"].join(30)  # a renewal in flight changes the version the delete is conditional on
        with contextlib.suppress(Exception):  # a lost lease is someone else's now: leave it
            self.store.delete(self.key(LOCK), lease["etag"])


@contextlib.contextmanager
def fresh_folder(final: Path) -> Iterator[Path]:
    """A sibling temporary folder renamed onto ``final`` when the block succeeds.  Another
    process of this machine may fill the same copy at the same time: whichever renames
    first wins, and the other keeps that one when it holds the same manifest."""
    tmp = final.parent / f"{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if final.exists():
            if _same_manifest(final, tmp):
                return
            old = final.parent / f"{final.name}.tmp-old-{secrets.token_hex(4)}"
            final.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            tmp.rename(final)
        except OSError:
            if not _same_manifest(final, tmp):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _same_manifest(a: Path, b: Path) -> bool:
    try:
        return (a / MANIFEST).read_bytes() == (b / MANIFEST).read_bytes()
    except OSError:
        return False
