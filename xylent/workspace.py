"""Fingerprinted, atomically written stage outputs.

Layout: ``<ws>/<stage>/<fingerprint>/`` for a stage's output and
``<ws>/<stage>/_units/<fingerprint>/`` for the independent pieces a stage is
made of (one file fetched, one source prepared).  Both are built in a sibling
``*.tmp-<pid>-<rand>`` directory and renamed into place only after
``_manifest.json`` has been written, so a directory with a manifest is complete
and anything else is never trusted (left-overs are removed under the lock).

An object-store workspace (``s3://``, ``gs://``, ``az://``) keeps the same guarantees on object storage (see
:mod:`xylent.remote`): stages build in this machine's copy of it, publishing
uploads the output (manifest last), and reading an output another machine built
downloads and checks it first.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from xylent.errors import XylentError
from xylent.manifest import MANIFEST, well_formed
from xylent.redact import redact

TMP_MARK = ".tmp-"


def fingerprint(obj: Any) -> str:
    """Stable short hash of a JSON-able object (key order does not matter)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def sha256_file(path: Path, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


def describe_file(path: Path, root: Path) -> dict[str, Any]:
    """Manifest entry for one output file: size, checksum and, for tables, rows."""
    st = path.stat()
    entry: dict[str, Any] = {
        "path": path.relative_to(root).as_posix(),
        "bytes": st.st_size,
        "sha256": sha256_file(path),
        "mtime_ns": st.st_mtime_ns,  # a same-size edit moves it: that file is hashed again on a cache hit
    }
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        entry["rows"] = pq.ParquetFile(path).metadata.num_rows
    return entry


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of a complete output, or None when it is absent, unreadable or not a manifest."""
    try:
        return well_formed(json.loads((Path(directory) / MANIFEST).read_text()))
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def check_files(directory: Path, manifest: dict[str, Any], *, full: bool = False) -> list[str]:
    """What differs between a published output and its manifest: files it does not list
    (stages read folders whole: an added file would be read under an unchanged fingerprint),
    missing files and sizes (cheap: every cache hit), and the checksum of every file whose modification
    time is not the published one (an edit that kept the size); every checksum with ``full`` (``xylent verify``)."""
    listed = {entry["path"] for entry in manifest.get("files", [])} | {MANIFEST}
    root = Path(directory)
    # hidden files are an editor's or a file system's (.report.md.swp, .DS_Store, .nfs*), never a stage's
    problems = [f"{rel}: not in the manifest (added after publishing)" for p in sorted(root.rglob("*"))
                if p.is_file() and (rel := p.relative_to(root).as_posix()) not in listed
                and not any(part.startswith(".") for part in p.relative_to(root).parts)]
    for entry in manifest.get("files", []):
        path = Path(directory) / entry["path"]
        try:
            st = path.stat()
        except FileNotFoundError:
            problems.append(f"{entry['path']}: missing")
            continue
        touched = entry.get("mtime_ns") is not None and st.st_mtime_ns != entry["mtime_ns"]
        if st.st_size != entry["bytes"]:
            problems.append(f"{entry['path']}: {st.st_size} bytes, published with {entry['bytes']}")
        elif (full or touched) and sha256_file(path) != entry["sha256"]:
            problems.append(f"{entry['path']}: content changed (sha256 differs from the manifest's)")
        elif touched:  # the published bytes under a new time (touch, a copy without -p): hashed once, not every read
            with contextlib.suppress(OSError):
                os.utime(path, ns=(st.st_atime_ns, entry["mtime_ns"]))
    return problems


def verified_manifest(directory: Path, stage: str) -> dict[str, Any] | None:
    """The manifest of a complete output whose files still match it (sizes);
    a damaged one is an error, never a cache hit a later stage reads."""
    manifest = read_manifest(directory)
    if manifest is not None and (problems := check_files(directory, manifest)):
        raise XylentError(f"the {stage} output was changed after it was published ({len(problems)} file(s)): "
                          + "; ".join(problems[:5]), where=str(directory),
                          fix=f"rebuild it: xylent run {stage} --force (same --spec/--workspace); "
                          "`xylent verify` checks every stage's checksums")
    return manifest


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link a finished file into another output (no copy on one filesystem)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


class Workspace:
    def __init__(self, root: str | Path):
        root_s = str(root)
        self.remote = None
        if "://" in root_s and not root_s.startswith("file://"):
            from xylent.remote import ObjectStore

            self.remote = ObjectStore(root_s)
            root_s = str(self.remote.cache_dir)
        self.root = Path(root_s.removeprefix("file://")).expanduser().resolve()
        # what names this workspace to another process or machine (a worker, a subflow)
        self.location = self.remote.url if self.remote else str(self.root)
        taken = next((p for p in (self.root, *self.root.parents) if p.exists()), None)
        if taken is not None and not taken.is_dir():  # the workspace, or a folder it would go in, is a file
            raise XylentError(f"the workspace {self.root} cannot be a folder: {taken} is a file", where=str(taken),
                              fix="pass --workspace a folder (new or existing), not a file")

    @property
    def slug(self) -> str:
        """A short name no other workspace shares (``ws-3f9a1c``): the folder's name and a hash of
        where it is, in the letters Prefect allows in a tag and an artifact key."""
        tail = re.sub(r"[^a-z0-9]+", "-", self.location.rstrip("/").rsplit("/", 1)[-1].lower()).strip("-")
        return f"{tail[:24].strip('-') or 'ws'}-{hashlib.sha256(self.location.encode()).hexdigest()[:6]}"

    def ensure_writable(self) -> None:
        """Create the workspace and prove it takes a file, before anything opens
        it: MLflow's SQLite store retries a read-only database for minutes."""
        from xylent.errors import environment_error

        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.root, prefix=".xylent-probe-"):
                pass
        except OSError as exc:
            # /proc/x, a path under a file: no errno of a full or read-only disk, still the user's to fix
            raise environment_error(exc, str(self.root)) or XylentError(
                f"the workspace cannot be made or written here ({exc.strerror or exc})", where=str(self.root),
                fix="choose a folder this user can create and write: --workspace on the command line, the "
                    "workspace parameter of a deployment's run, or workspace: in the spec") from None
        if self.remote is not None:
            self.remote.probe()

    # -- paths -------------------------------------------------------------
    def stage_dir(self, stage: str) -> Path:
        return self.root / stage

    def output_dir(self, stage: str, fp: str) -> Path:
        return self.root / stage / fp

    def unit_dir(self, stage: str, fp: str) -> Path:
        return self.root / stage / "_units" / fp

    def is_complete(self, directory: Path) -> bool:
        return self.manifest(directory) is not None

    # -- reading published outputs (from the bucket when the workspace is remote) --
    def _rel(self, directory: Path) -> str:
        return Path(directory).resolve().relative_to(self.root).as_posix()

    def manifest(self, directory: Path, fetch: bool = True) -> dict[str, Any] | None:
        """The manifest of a complete output, or None.  Remote: the bucket decides; an
        output this machine lacks (or holds in another version) is downloaded first
        (unless ``fetch`` is false: only asking whether it is published)."""
        if self.remote is None:
            return read_manifest(directory)
        rel = self._rel(directory)
        published = self.remote.read_manifest(rel)
        if published is None or not fetch:
            return published
        if read_manifest(directory) != published:
            from xylent.remote import fresh_folder

            with fresh_folder(Path(directory)) as tmp:
                self.remote.download_dir(rel, published, tmp)
        return published

    def ensure_local(self, unit: Path) -> Path:
        """A unit made by a worker (maybe on another machine, maybe rebuilt by --force):
        this machine's copy brought up to the bucket's version."""
        if self.remote is not None and self.manifest(unit) is None:
            raise XylentError("a unit this stage reads is not in the bucket", where=self.url_of(unit),
                              fix="rerun the stage that makes it (its worker may have failed before publishing)")
        return unit

    def verified(self, directory: Path, stage: str) -> dict[str, Any] | None:
        """:func:`verified_manifest`, through :meth:`manifest`: on object storage only what
        the bucket has is published (a local copy whose upload failed is not)."""
        if self.manifest(directory) is None and self.remote is not None:
            return None
        return verified_manifest(directory, stage)

    def url_of(self, directory: Path) -> str | None:
        """The object-store URL of an output (None for a local workspace)."""
        return self.remote.url_of(self._rel(directory)) if self.remote else None

    # -- atomic build --------------------------------------------------------
    @contextlib.contextmanager
    def building(self, final: Path) -> Iterator[Path]:
        """Yield an empty temporary directory; the caller fills it and calls
        :meth:`publish`.  On any error the temporary directory is removed."""
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f"{final.name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            yield tmp
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def publish(
        self,
        tmp: Path,
        final: Path,
        manifest: dict[str, Any],
        *,
        known_files: dict[str, dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Describe every file in ``tmp``, write the manifest last, rename into place.

        ``known_files`` (relative path -> entry) skips re-hashing files that were
        hard-linked from already published units.
        """
        known_files = known_files or {}
        files = []
        for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
            rel = path.relative_to(tmp).as_posix()
            if rel == MANIFEST:
                continue
            if rel in known_files:  # a unit's file, checked when the unit was reused: its time now is the one
                files.append({**known_files[rel], "path": rel, "mtime_ns": path.stat().st_mtime_ns})
            else:
                files.append(describe_file(path, tmp))
        manifest = redact({**manifest, "files": files})
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
        _fsync_dir(tmp)
        if self.remote is not None:  # the bucket first: a failed upload leaves no local copy to trust
            self.remote.upload_dir(tmp, self._rel(final))
        if final.exists():  # --force: move the old output aside first, then drop it
            old = final.parent / f"{final.name}{TMP_MARK}old-{secrets.token_hex(4)}"
            final.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        tmp.rename(final)
        _fsync_dir(final.parent)
        return manifest

    # -- locking -------------------------------------------------------------
    _local = threading.RLock()
    _held: dict[Path, tuple[int, int]] = {}

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive lock on the workspace for this process (re-entrant).

        Another process holding it is a user error: two runs writing the same
        workspace could otherwise interleave their outputs.
        """
        with Workspace._local:
            if self.root in Workspace._held:
                fd, depth = Workspace._held[self.root]
                Workspace._held[self.root] = (fd, depth + 1)
                acquired = False
            else:
                self.root.mkdir(parents=True, exist_ok=True)
                lock_path = self.root / ".xylent.lock"
                try:
                    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
                except IsADirectoryError:
                    raise XylentError("the workspace's lock file is a folder", where=str(lock_path),
                                      fix="remove that folder (xylent makes the file itself); no run is using it: "
                                          "a run's lock is a file") from None
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = os.pread(fd, 512, 0).decode(errors="replace").strip()
                    os.close(fd)
                    raise XylentError(
                        "the workspace is in use by another xylent run" + (f" ({holder})" if holder else ""),
                        where=str(self.root),
                        fix="wait for that run to finish, or give this one its own --workspace",
                    ) from None
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
                Workspace._held[self.root] = (fd, 1)
                acquired = True
        if acquired and self.remote is not None:
            try:
                self.remote.acquire()
            except BaseException:
                self._release_local()
                raise
        try:
            if acquired:
                self.remove_stale_temporaries()
            yield
        finally:
            if acquired and self.remote is not None:
                self.remote.release()
            self._release_local()

    def _release_local(self) -> None:
        with Workspace._local:
            fd, depth = Workspace._held[self.root]
            if depth == 1:
                del Workspace._held[self.root]
                os.close(fd)  # releases the flock
            else:
                Workspace._held[self.root] = (fd, depth - 1)

    def remove_stale_temporaries(self) -> list[Path]:
        """Delete half-built outputs left by killed runs (only safe under the lock)."""
        removed = []
        if not self.root.exists():
            return removed
        for stage in self.root.iterdir():
            if stage.is_symlink() or not stage.is_dir():  # a linked stage is another workspace's: not our lock
                continue
            for parent in (stage, stage / "_units"):
                if not parent.is_dir():
                    continue
                for child in parent.iterdir():
                    if TMP_MARK in child.name:
                        shutil.rmtree(child, ignore_errors=True)
                        removed.append(child)
        # download/_partial/*.part is not touched: partial downloads are resumed
        return removed
