"""Fetching one URL to a local file: streaming, resumable, retried, verified.

The bytes go to ``<partial>.part`` (kept across runs, so a killed or failed
download resumes with an HTTP Range request); the caller moves the file into
its final place only after the size and checksum have been checked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Callable

import requests
import urllib3

from xylent import interrupt
from xylent.errors import XylentError, environment_error

_PERMANENT = {400, 401, 403, 404, 405, 410, 451}


class _Retry(Exception):
    """A transient failure (dropped connection, 5xx, 429): the fetch is tried again.  ``silent``:
    the server sent no byte of the file in the attempt (a timeout before it did)."""

    def __init__(self, message: str, *, silent: bool = False):
        super().__init__(message)
        self.silent = silent


def _until_stopped(call: Callable[[], requests.Response]) -> requests.Response:
    """``call()`` (a request waiting for the server's answer) in a thread of its own, so a stop
    request ends the wait at once, not at the timeout: a silent server once kept a SIGTERMed run
    alive for minutes.  The thread, abandoned then, ends at its own timeout."""
    box: dict = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="download-request", daemon=True).start()
    while not done.wait(0.2):
        interrupt.check()
    if "error" in box:
        raise box["error"]
    return box["value"]


@contextlib.contextmanager
def _stop_unblocks(resp: requests.Response):
    """While the body streams, a stop request shuts the connection down, so a read blocked on a
    server that went silent returns at once and the loop's ``interrupt.check()`` ends the download."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            if interrupt.requested():
                sock = getattr(resp.raw.connection, "sock", None)
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                return

    threading.Thread(target=watch, name="download-stop", daemon=True).start()
    try:
        yield
    finally:
        done.set()


def _load_meta(meta_path: Path) -> dict:
    try:
        return json.loads(meta_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


class _Limits:
    """What one file may take, across its attempts: ``download.total_timeout_s``, ``download.max_file_bytes``
    and ``download.min_free_bytes`` (a runaway server or a stream without end cannot fill the disk)."""

    def __init__(self, seconds: float | None, url: str, *, max_file_bytes: int | None = None,
                 min_free_bytes: int = 0, folder: Path | None = None):
        self.seconds, self.url = seconds, url
        self.at = None if seconds is None else time.monotonic() + seconds
        self.max_file_bytes, self.min_free_bytes, self.folder = max_file_bytes, min_free_bytes, folder

    def timeout(self, per_read: float) -> float:
        return per_read if self.at is None else max(0.01, min(per_read, self.at - time.monotonic()))

    def announced(self, total: int | None, have: int) -> None:
        """Refuse a file whose announced length (``total``, the whole file; ``have`` of it on disk) breaks
        a limit before a byte more is written."""
        if total is not None:
            self._size(total, announced=True)
            self._disk(max(0, total - have))

    def check(self, fetched: int, total: int | None = None) -> None:
        if self.at is not None and time.monotonic() > self.at:
            of = f" of {total:,}" if total else ""
            raise XylentError(f"the download took longer than download.total_timeout_s = {self.seconds:g} s "
                              f"({fetched:,}{of} bytes fetched)", where=self.url,
                              fix="raise download.total_timeout_s (or unset it) or use a faster mirror; the bytes "
                              "fetched are kept and the next run resumes from them")
        self._size(fetched, announced=False)
        self._disk(0)

    def _size(self, n: int, *, announced: bool) -> None:
        if self.max_file_bytes is not None and n > self.max_file_bytes:
            what = f"the server announces {n:,} bytes" if announced else f"the file passed {self.max_file_bytes:,} bytes"
            raise XylentError(f"{what}, more than download.max_file_bytes = {self.max_file_bytes:,}", where=self.url,
                              fix="raise download.max_file_bytes (null: no cap) if the file really is this big, or "
                              "set the source's max_bytes (below it) to fetch a prefix")

    def _disk(self, more: int) -> None:
        if self.folder is None or not self.min_free_bytes:
            return
        free = shutil.disk_usage(self.folder).free
        if free - more < self.min_free_bytes:
            need = f"{more:,} more bytes would leave" if more else "only"
            raise XylentError(f"the disk is nearly full: {need} {max(0, free - more):,} bytes free, under "
                              f"download.min_free_bytes = {self.min_free_bytes:,}", where=f"{self.url} -> {self.folder}",
                              fix="free space on that disk or point the workspace at a larger one; the bytes "
                              "fetched are kept and the next run resumes from them")


def _confirm_end(session: requests.Session, url: str, have: int, etag: str | None, timeout: float) -> bool | None:
    """A body sent without a length ends when the connection closes, so a cut
    connection looks like a whole file: ask for the bytes after it.  -> True
    (nothing more: complete), False (there is more), None (the server ignores
    ranges and cannot say)."""
    headers = {"Accept-Encoding": "identity", "Range": f"bytes={have}-"}
    if etag:
        headers["If-Range"] = etag
    try:
        with session.get(url, headers=headers, stream=True, timeout=timeout) as resp:
            if resp.status_code == 416:
                return True
            if resp.status_code == 206 and resp.headers.get("Content-Range", "").startswith(f"bytes {have}-"):
                return False
            return None
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise _Retry(f"connection failed while checking the end of the file: {exc}",
                     silent=isinstance(exc, requests.Timeout)) from None


def _stream_http(
    session: requests.Session,
    url: str,
    part: Path,
    meta_path: Path,
    *,
    max_bytes: int | None,
    timeout: float,
    chunk: int,
    on_bytes: Callable[[int], None],
    limits: _Limits,
) -> dict:
    have = part.stat().st_size if part.exists() else 0
    meta = _load_meta(meta_path)
    if meta.get("url") not in (None, url) or meta.get("encoded"):
        # a partial file of another URL, or of decoded bytes (no server range matches them), is never reused
        part.unlink(missing_ok=True)
        have, meta = 0, {}
    if max_bytes is not None and have >= max_bytes:
        return meta
    headers = {"Accept-Encoding": "identity"}
    if have or max_bytes is not None:
        end = "" if max_bytes is None else str(max_bytes - 1)
        headers["Range"] = f"bytes={have}-{end}"
        if have and meta.get("etag"):
            headers["If-Range"] = meta["etag"]
    try:
        resp = _until_stopped(lambda: session.get(url, headers=headers, stream=True, timeout=limits.timeout(timeout)))
    except requests.TooManyRedirects:
        raise XylentError("the server redirects in a loop (more than 30 redirects)", where=url,
                          fix="open the URL in a browser to see where it leads, and put the final URL in the spec"
                          ) from None
    except (requests.exceptions.InvalidSchema, requests.exceptions.InvalidURL, requests.exceptions.MissingSchema) as exc:
        # the server sent us somewhere requests cannot go (ftp://, a malformed Location): retrying cannot help
        raise XylentError(f"the server redirects to a URL that cannot be fetched over HTTP(S): {exc}", where=url,
                          fix="open the URL in a browser to see where it leads, and put a http(s):// or file:// "
                              "URL of the file in the spec") from None
    except requests.exceptions.InvalidHeader as exc:  # two Content-Lengths, a header that breaks HTTP: no retry mends it
        raise XylentError(f"the server's answer breaks HTTP: {exc}", where=url,
                          fix="the server (or a proxy on the way) is misconfigured: use another mirror, or fetch the "
                              "file by other means and point a local source (kind: local) at it") from None
    except requests.Timeout as exc:
        raise _Retry(f"the server sent no answer within download.timeout_s = {timeout:g} s: {exc}",
                     silent=True) from None
    except requests.ConnectionError as exc:
        raise _Retry(f"connection failed: {exc}") from None
    with resp, _stop_unblocks(resp):
        status = resp.status_code
        if status == 416 and have:
            return meta  # asked for bytes past the end: what we have is the whole file
        if status in _PERMANENT:
            raise XylentError(
                f"the server answered HTTP {status} {resp.reason} (not found or not allowed)",
                where=url,
                fix="check the URL / url_template in the spec and that this language or pair exists in the corpus",
            )
        if status == 429 or status >= 500:
            raise _Retry(f"HTTP {status} {resp.reason}")
        if status not in (200, 206):
            raise XylentError(f"unexpected HTTP {status} {resp.reason}", where=url)
        mode = "ab"
        encoded = resp.headers.get("Content-Encoding", "identity").lower() not in ("identity", "")
        if status == 200:
            mode, have = "wb", 0  # the server ignored the range: start over
        else:
            crange = resp.headers.get("Content-Range", "")
            if not crange.startswith(f"bytes {have}-"):
                part.unlink(missing_ok=True)
                raise _Retry(f"server answered a different range ({crange!r}); restarting from 0")
            etag = resp.headers.get("ETag")
            if have and meta.get("etag") and etag and etag != meta["etag"]:
                # the file changed on the server and it ignored If-Range: appending would splice two files
                part.unlink(missing_ok=True)
                meta_path.unlink(missing_ok=True)
                raise _Retry(f"the file changed on the server (ETag {meta['etag']} -> {etag}); restarting from 0")
        length = resp.headers.get("Content-Length")
        # requests decodes a Content-Encoding the server sent anyway: the length then counts other bytes
        expected = int(length) if length is not None and length.isdigit() and not encoded else None
        total = None
        crange = resp.headers.get("Content-Range", "")
        if "/" in crange and crange.rsplit("/", 1)[1].isdigit():
            total = int(crange.rsplit("/", 1)[1])
        elif expected is not None and status == 200:
            total = expected
        if encoded:
            total = None  # decoded bytes: no range of them can be resumed against the server's
        # no length and not chunked: the body's end is the connection's close, which a cut also looks like
        unsized = (length is None and not encoded
                   and "chunked" not in resp.headers.get("Transfer-Encoding", "").lower())
        meta = {"url": url, "etag": resp.headers.get("ETag"), "total": total, "encoded": encoded}
        meta_path.write_text(json.dumps(meta))
        if max_bytes is None:  # a prefix is capped already
            # no total: a 200's length is the whole file (have is 0 then), a 206's is what follows have
            limits.announced(total if total is not None else None if expected is None else have + expected, have)
        got = 0
        try:
            with open(part, mode) as f:
                # read1 hands over what has arrived (iter_content waits for a whole chunk): a trickling
                # server still meets total_timeout_s between blocks
                while block := resp.raw.read1(chunk, decode_content=True):
                    if max_bytes is not None and have + got + len(block) > max_bytes:
                        block = block[: max_bytes - have - got]
                    f.write(block)
                    got += len(block)
                    on_bytes(len(block))
                    if max_bytes is not None and have + got >= max_bytes:
                        break
                    limits.check(have + got, total)
                    interrupt.check()  # Ctrl-C / SIGTERM: the .part stays for a resume, nothing is published
        except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError, requests.Timeout,
                urllib3.exceptions.HTTPError, OSError) as exc:
            interrupt.check()  # the stop request shut the connection down: not the server's failure
            if _timed_out(exc):
                raise _Retry(f"the server went silent for download.timeout_s = {timeout:g} s after "
                             f"{have + got:,} bytes", silent=not got) from None
            raise _Retry(f"connection dropped after {have + got} bytes: {exc}") from None
        interrupt.check()  # a shut-down connection also reads as the body's end
        if expected is not None and got < expected and not (max_bytes is not None and have + got >= max_bytes):
            raise _Retry(f"connection dropped after {have + got} bytes")
    if unsized and not (max_bytes is not None and have + got >= max_bytes):
        whole = _confirm_end(session, url, have + got, meta["etag"], limits.timeout(timeout))
        if whole is False:
            raise _Retry(f"the body (sent without a length) ended after {have + got} bytes but the server has more")
        meta["length_verified"] = bool(whole)
        meta_path.write_text(json.dumps(meta))
    return meta


def _timed_out(exc: BaseException) -> bool:
    """Whether a read failed on the socket's timeout (wrapped by urllib3 or requests, or bare)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (TimeoutError, socket.timeout, requests.Timeout, urllib3.exceptions.TimeoutError)):
            return True
        exc = exc.__cause__ or exc.__context__ or (exc.args[0] if exc.args and isinstance(exc.args[0], BaseException)
                                                  else None)
    return False


def _stream_fsspec(url: str, part: Path, *, max_bytes: int | None, chunk: int, on_bytes, limits: _Limits) -> dict:
    import fsspec

    protocol = url.split("://", 1)[0] if "://" in url else "file"
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise XylentError(f"unsupported URL scheme {protocol + '://'!r}", where=url,
                          fix="use http(s)://, file:// or a scheme fsspec knows (s3://, gs://, ... with its "
                          "package installed)") from None
    except ImportError as exc:
        raise XylentError(f"reading {protocol}:// URLs needs a package that is not installed ({exc})", where=url,
                          fix="install it (e.g. pip install s3fs for s3://)") from None
    if protocol == "file":  # /dev/zero would fill the disk, a FIFO would hang: a regular file or nothing
        from urllib.parse import unquote, urlparse

        from xylent.tasks.download.identity import local_file

        local_file(Path(unquote(urlparse(url).path)) if "://" in url else Path(url), url)
    have = part.stat().st_size if part.exists() else 0
    try:
        with fsspec.open(url, "rb") as src, open(part, "ab") as dst:
            if max_bytes is None:
                limits.announced(getattr(src, "size", None), have)
            if have:
                src.seek(have)
            while True:
                want = chunk if max_bytes is None else min(chunk, max_bytes - have)
                if want <= 0:
                    break
                block = src.read(want)
                if not block:
                    break
                dst.write(block)
                interrupt.check()
                have += len(block)
                on_bytes(len(block))
                limits.check(have)
    except FileNotFoundError:
        raise XylentError("file not found", where=url, fix="check the URL or path in the spec") from None
    except IsADirectoryError:
        raise XylentError("the URL names a folder, not a file", where=url,
                          fix="name one file in the spec (a folder's files are separate sources)") from None
    except (OSError, ValueError) as exc:
        if isinstance(exc, OSError) and (env := environment_error(exc, str(part.parent))) is not None:
            raise env from None  # a full disk or a read-only folder: retrying cannot help
        raise _Retry(str(exc)) from None
    return {"url": url, "etag": None}


def fetch(
    url: str,
    part: Path,
    *,
    sha256: str | None = None,
    size: int | None = None,
    max_bytes: int | None = None,
    retries: int = 5,
    backoff_s: float = 0.5,
    timeout_s: float = 15.0,
    silent_attempts: int = 2,
    total_timeout_s: float | None = None,
    max_file_bytes: int | None = None,
    min_free_bytes: int = 0,
    chunk_bytes: int = 1 << 20,
    on_bytes: Callable[[int], None] = lambda n: None,
) -> dict:
    """Fetch ``url`` into ``part`` (resuming what is there) and verify it.

    A server that sends no byte of the file for ``silent_attempts`` attempts in a row (each
    ``timeout_s`` long) is abandoned before ``retries`` is spent: it is not going to answer.

    Returns ``{"url", "bytes", "sha256", "etag", "truncated"}``, and
    ``length_verified`` when the server sent no length (False: nothing could
    tell a cut connection from the file's end).  A checksum or
    size mismatch deletes the partial file (it cannot be trusted) and raises.
    """
    part.parent.mkdir(parents=True, exist_ok=True)
    meta_path = part.with_name(part.name + ".json")
    is_http = url.startswith(("http://", "https://"))
    session = requests.Session() if is_http else None
    attempt = silent = 0
    limits = _Limits(total_timeout_s, url, max_file_bytes=max_file_bytes, min_free_bytes=min_free_bytes,
                       folder=part.parent)
    while True:
        try:
            if is_http:
                meta = _stream_http(
                    session, url, part, meta_path,
                    max_bytes=max_bytes, timeout=timeout_s, chunk=chunk_bytes, on_bytes=on_bytes, limits=limits,
                )
            else:
                meta = _stream_fsspec(url, part, max_bytes=max_bytes, chunk=chunk_bytes, on_bytes=on_bytes,
                                      limits=limits)
            break
        except _Retry as exc:
            attempt += 1
            silent = silent + 1 if exc.silent else 0
            if is_http and silent >= silent_attempts and attempt <= retries:
                raise XylentError(
                    f"the server sent nothing for {silent} attempts in a row, {timeout_s:g} s each: {exc}",
                    where=url,
                    fix="check that the server is up (open the URL in a browser) or use another mirror; raise "
                        "download.timeout_s or download.silent_attempts for a server that is slow to start; the "
                        "bytes already fetched are kept and the next run resumes from them",
                ) from None
            if attempt > retries:
                raise XylentError(
                    f"download failed after {retries + 1} attempts: {exc}",
                    where=url,
                    fix="check the network and the server; rerunning resumes from the bytes already fetched",
                ) from None
            limits.check(part.stat().st_size if part.exists() else 0)
            wait = min(backoff_s * 2 ** min(attempt - 1, 30), 300.0)  # doubling, but never past five minutes
            deadline = time.monotonic() + wait
            while (left := deadline - time.monotonic()) > 0:  # a stop request ends the wait too
                interrupt.check()
                time.sleep(min(left, 0.2))
    if not part.exists():
        part.touch()
    got = part.stat().st_size
    truncated = max_bytes is not None and got >= max_bytes
    total = meta.get("total")
    if not truncated and total is not None and got != total:
        part.unlink(missing_ok=True)
        raise XylentError(f"got {got} bytes but the server announced {total}", where=url, fix="rerun the download")
    if size is not None and not truncated and got != size:
        part.unlink(missing_ok=True)
        raise XylentError(
            f"size mismatch: the spec says {size} bytes, the server sent {got}; the file was discarded",
            where=url,
            fix="check the 'size' in the spec, or whether the mirror serves a different version",
        )
    h = hashlib.sha256()
    with open(part, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    digest = h.hexdigest()
    if sha256 is not None and not truncated and digest != sha256:
        part.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)
        raise XylentError(
            f"checksum mismatch: expected sha256 {sha256}, got {digest}; the file was discarded",
            where=url,
            fix="check the sha256 in the spec, or whether the mirror serves a different version",
        )
    meta_path.unlink(missing_ok=True)
    out = {"url": url, "bytes": got, "sha256": digest, "etag": meta.get("etag"), "truncated": truncated}
    if "length_verified" in meta:  # only for bodies sent without a length
        out["length_verified"] = meta["length_verified"] or sha256 is not None or size is not None
    return out
