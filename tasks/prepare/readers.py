"""Streaming readers: never a whole file in memory.

Text (plain, xz, gz) is read in blocks of whole lines by a background thread,
so decompression (which releases the GIL) overlaps with cleaning.  Moses zips
are read member by member in lockstep.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import lzma
import queue
import threading
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Iterator

import numpy as np
import pyarrow as pa

from xylent.errors import XylentError

_END = object()
BLOCK_BYTES = 8 << 20  # what a reader hands over at a time: lines of text, or both sides of a moses batch


def _open(path: Path, fmt: str):
    if fmt == "text-xz":
        return lzma.open(path, "rb")
    if fmt == "text-gz":
        return gzip.open(path, "rb")
    return open(path, "rb")


def _read_error(exc: BaseException, where: str, fmt: str) -> XylentError:
    if isinstance(exc, EOFError):
        return XylentError(
            f"truncated {fmt} file: the compressed stream ends before its end marker ({exc})",
            where=where,
            fix="a file xylent downloaded: fetch it again with `xylent run download --force` (same --spec and "
            "--workspace); a file of your own (a local source): restore it from where it came from, xylent never "
            "deletes it; or set the source's max_bytes to read a prefix on purpose",
        )
    return XylentError(
        f"cannot decode {fmt} file: {exc}",
        where=where,
        fix="the file is damaged or not in the declared format: check 'format' in the spec and re-fetch it",
    )


SNIFF_BYTES = 64 << 10  # what the evidence is read from: the head of the (decompressed) text
MAX_NON_UTF8 = 0.1      # a head with more of its lines not UTF-8 is in another encoding, not damaged here and there
_MAGIC = {b"\x1f\x8b": "gzip-compressed (declare format: text-gz)",
          b"\xfd7zXZ\x00": "xz-compressed (declare format: text-xz)",
          b"PK\x03\x04": "a zip archive (unpack it, or declare the source's moses-zip format)",
          b"BZh": "bzip2-compressed (decompress it: xylent reads text, text-gz and text-xz)"}


def sniff_text(path: Path, fmt: str, where: str) -> None:
    """Refuse, naming the file, a text source whose first bytes say it is something else: compressed
    or an archive in another format than declared, UTF-16 (a BOM, or NULs), a tar archive, an HTML page
    (a server's error page saved as the corpus), or text in a legacy encoding (most lines not UTF-8).
    Read as UTF-8 such files would put garbage rows into the corpus, or lose most of their rows, silently."""
    with open(path, "rb") as f:
        raw = f.read(8)
    for magic, what in _MAGIC.items():
        if raw.startswith(magic) and not (fmt == "text-gz" and magic == b"\x1f\x8b"
                                          or fmt == "text-xz" and magic == b"\xfd7zXZ\x00"):
            raise XylentError(f"declared {fmt}, but the file is {what}", where=where,
                              fix="correct the source's format in the spec (or its file)")
    head = b""
    # a damaged or cut stream: the reader reports it, with what it could read; the head is what we have
    with contextlib.suppress(OSError, EOFError, lzma.LZMAError, zlib.error), _open(path, fmt) as f:
        while len(head) < SNIFF_BYTES and (chunk := f.read1(SNIFF_BYTES - len(head))):
            head += chunk
    fix = "convert it to UTF-8 text, one sentence per line (e.g. iconv -f <its encoding> -t UTF-8), or fix the URL"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise XylentError("the text is UTF-16 (its byte order mark says so), not UTF-8", where=where, fix=fix)
    if head[257:262] == b"ustar":
        raise XylentError(f"the {fmt} file holds a tar archive, not text", where=where,
                          fix="unpack the archive and point the source at the text file inside")
    if head.count(b"\x00") > len(head) // 100:
        raise XylentError(f"{head.count(0)} of the first {len(head)} bytes are NUL: binary data, or UTF-16 "
                          "without a byte order mark", where=where, fix=fix)
    start = head.removeprefix(b"\xef\xbb\xbf").lstrip().lower()
    if start.startswith((b"<!doctype html", b"<html")):
        raise XylentError("the file is an HTML page (a server's error or login page saved as the corpus?), "
                          "not text", where=where, fix="check the URL in a browser; fetch again with --force")
    lines = head.split(b"\n")[:-1] or head.split(b"\n")  # the last may be cut mid-character
    bad = sum(1 for ln in lines if not _utf8(ln))
    if len(lines) >= 10 and bad > MAX_NON_UTF8 * len(lines):
        raise XylentError(f"{bad} of the first {len(lines)} lines are not UTF-8: the file is in another encoding "
                          "(Latin-1, Windows-1252, ...)", where=where, fix=fix)


def _utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def line_cap(max_chars: int) -> int:
    """Bytes beyond which a line cannot survive ``max_chars`` (UTF-8 spends at
    most 4 bytes a character): readers keep only this much of a longer line, so
    one 150 MB line costs no more memory than a block."""
    return 4 * (max_chars + 1)


def iter_line_blocks(
    path: Path, fmt: str, *, where: str, prefix_only: bool = False, block_bytes: int = BLOCK_BYTES,
    max_line_bytes: int | None = None,
) -> Iterator[bytes]:
    """Yield blocks of whole lines (joined by ``\\n``, no trailing newline).

    ``prefix_only``: the file was cut on purpose (max_bytes); its end is not an
    error, and the incomplete last line is dropped.  ``max_line_bytes``: a line
    that grows past it across blocks is cut to that length (it stays one line,
    later dropped as too long) and the rest of it is skipped as it streams by.
    """
    sniff_text(path, fmt, where)
    q: queue.Queue = queue.Queue(maxsize=3)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        # read1 hands over what was decompressed before a truncation is noticed,
        # so a prefix cut on purpose keeps every complete line it holds
        buf = bytearray()
        try:
            with _open(path, fmt) as f:
                while not stop.is_set():
                    chunk = f.read1(1 << 20)
                    if not chunk:
                        break
                    buf += chunk
                    if len(buf) >= block_bytes:
                        if not put(bytes(buf)):
                            return
                        buf.clear()
            if buf:
                put(bytes(buf))
            put(_END)
        except BaseException as exc:  # handed to the consumer, which decides
            if buf:
                put(bytes(buf))
            put(exc)

    thread = threading.Thread(target=produce, name=f"read:{path.name}", daemon=True)
    thread.start()
    rest = b""
    clean_end = skipping = False
    try:
        while True:
            item = q.get()
            if item is _END:
                clean_end = True
                break
            if isinstance(item, BaseException):
                if prefix_only and isinstance(item, EOFError):
                    break
                if isinstance(item, (EOFError, lzma.LZMAError, gzip.BadGzipFile, OSError, zlib.error)):
                    raise _read_error(item, where, fmt) from None
                raise item
            if skipping:  # the overlong line goes on: drop its bytes up to its end
                end = item.find(b"\n")
                if end < 0:
                    continue
                item, skipping = item[end:], False
            data = rest + item if rest else item
            cut = data.rfind(b"\n")
            if cut < 0:
                if max_line_bytes is not None and len(data) > max_line_bytes:
                    data, skipping = data[:max_line_bytes], True
                rest = data
                continue
            yield data[:cut]
            rest = data[cut + 1 :]
        if rest and (clean_end and not prefix_only):
            yield rest
    finally:
        stop.set()
        thread.join(timeout=5)


def lines_to_array(block: bytes) -> pa.Array | None:
    """A block of lines -> Arrow string array without a Python object per line.

    Each value keeps its trailing ``\\n`` (cleaning trims it).  Returns None
    when the block is not valid UTF-8, so the caller decodes it line by line.
    """
    buf = np.frombuffer(block, dtype=np.uint8)
    newlines = np.flatnonzero(buf == 10)
    offsets = np.empty(len(newlines) + 2, dtype=np.int64)
    offsets[0] = 0
    offsets[1:-1] = newlines + 1
    offsets[-1] = len(buf)
    arr = pa.Array.from_buffers(
        pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(block)]
    )
    try:
        return arr.cast(pa.large_string())
    except pa.ArrowInvalid:
        return None


def safe_member_name(name: str, *, where: str) -> str:
    p = PurePosixPath(name)
    if name.startswith(("/", "\\")) or p.is_absolute() or ".." in p.parts or ":" in (p.parts[0] if p.parts else ""):
        raise XylentError(
            f"the zip holds a member with an unsafe path {name!r} (absolute or with '..')",
            where=where,
            fix="do not use this archive: such members can overwrite files outside the workspace",
        )
    return name


def open_moses_zip(path: Path, lang_a: str, lang_b: str, *, where: str, max_member_bytes: int | None = None):
    """Return (zipfile, member for lang_a, member for lang_b) after checking the
    archive; a member that expands past ``max_member_bytes`` is refused before it
    is read (a zip bomb would fill the disk with prepare's output)."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise XylentError(
            f"not a readable zip archive ({exc}); it is probably truncated",
            where=where,
            fix="delete the file and rerun the download",
        ) from None
    names = [safe_member_name(n, where=where) for n in zf.namelist()]
    found = {}
    for lang in (lang_a, lang_b):
        cands = [n for n in names if n.endswith(f".{lang}") and not n.endswith("/")]
        if len(cands) != 1:
            zf.close()
            raise XylentError(
                f"the moses zip has {len(cands)} members for language {lang!r} (expected exactly one "
                f"named '*.{lang}'); members: {names[:10]}",
                where=where,
                fix="check the pair in the spec: the archive does not hold this language",
            )
        found[lang] = cands[0]
        _readable_member(zf, zf.getinfo(cands[0]), where=where)
        size = zf.getinfo(cands[0]).file_size  # zipfile stops reading past it: it cannot lie upwards
        if max_member_bytes is not None and size > max_member_bytes:
            zf.close()
            raise XylentError(f"the zip member {cands[0]} expands to {size:,} bytes, more than "
                              f"prepare.max_member_bytes = {max_member_bytes:,}", where=where,
                              fix="raise prepare.max_member_bytes if the archive is what you expect (or unset it), "
                              "else drop this source")
    return zf, found[lang_a], found[lang_b]


_ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "Deflate", zipfile.ZIP_BZIP2: "bzip2",
                zipfile.ZIP_LZMA: "LZMA"}
_ZIP_METHOD_NAMES = {9: "Deflate64", 93: "Zstandard", 95: "XZ", 96: "JPEG", 97: "WavPack", 98: "PPMd", 99: "AES"}


def _readable_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, *, where: str) -> None:
    """Refuse, by name, a member Python's zipfile cannot read (it would fail deep in prepare)."""
    repack = ("unpack it with 7-Zip or your archiver and repack it with plain Deflate (`zip -9 out.zip *`), "
              "then point a local source (kind: local, format: moses-zip) at the new file")
    if info.flag_bits & 0x1 or info.compress_type == 99:
        zf.close()
        raise XylentError(f"the zip member {info.filename} is password-protected (encrypted)", where=where,
                          fix=f"{repack}; a corpus that needs a password cannot be read unattended")
    if info.compress_type not in _ZIP_METHODS:
        zf.close()
        method = _ZIP_METHOD_NAMES.get(info.compress_type, "an unknown method")
        raise XylentError(f"the zip member {info.filename} is compressed with {method} (zip method "
                          f"{info.compress_type}), which Python cannot read", where=where,
                          fix=f"{repack} (readable: {', '.join(_ZIP_METHODS.values())})")


def _capped_line(reader, cap: int | None) -> bytes:
    """One line, of which at most ``cap`` bytes are kept (the rest is read past)."""
    if cap is None:
        return reader.readline()
    line = reader.readline(cap)
    if len(line) == cap and not line.endswith(b"\n"):
        while (more := reader.readline(1 << 20)) and not more.endswith(b"\n"):
            continue
        line += b"\n"
    return line


def iter_moses_pairs(path: Path, lang_a: str, lang_b: str, *, where: str, batch: int = 50_000,
                     batch_bytes: int = BLOCK_BYTES, max_line_bytes: int | None = None,
                     max_member_bytes: int | None = None):
    """Yield (src_lines, tgt_lines) as lists of bytes, checking that both sides
    have the same number of lines (longer lines than ``max_line_bytes`` are cut
    to it, to be dropped as too long).  A batch ends at ``batch`` pairs or once
    its two sides hold ``batch_bytes``, whichever comes first: a count alone would
    let a batch of long lines (documents, not sentences) grow to gigabytes."""
    zf, ma, mb = open_moses_zip(path, lang_a, lang_b, where=where, max_member_bytes=max_member_bytes)
    n = 0
    try:
        with zf, zf.open(ma) as fa, zf.open(mb) as fb:
            ra, rb = io.BufferedReader(fa, 1 << 20), io.BufferedReader(fb, 1 << 20)
            ended = False
            while not ended:
                la, lb, size = [], [], 0
                while not la or len(la) < batch and size < batch_bytes:  # a batch holds a pair at least
                    x, y = _capped_line(ra, max_line_bytes), _capped_line(rb, max_line_bytes)
                    if not x or not y:
                        if x or y:
                            rest_a = n + len(la) + (1 if x else 0) + sum(1 for _ in ra)
                            rest_b = n + len(lb) + (1 if y else 0) + sum(1 for _ in rb)
                            raise XylentError(
                                f"the two sides of the bitext have different line counts: "
                                f"{ma} has {rest_a} lines, {mb} has {rest_b}",
                                where=where,
                                fix="the files are not line-aligned; fix or drop this pair",
                            )
                        ended = True
                        break
                    la.append(x.rstrip(b"\r\n"))
                    lb.append(y.rstrip(b"\r\n"))
                    size += len(x) + len(y)
                if la:
                    n += len(la)
                    yield la, lb
    except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise XylentError(f"damaged zip member ({exc})", where=where, fix="delete the file and rerun the download") from None
