"""Is a fetched file what its source's ``format`` says?  A login page, an error
page or a mirror's landing page served with status 200 would otherwise reach
prepare as a "damaged xz file"; here it is named for what it is."""

from __future__ import annotations

from pathlib import Path

from xylent.errors import XylentError

_MAGIC = {
    "text-xz": (b"\xfd7zXZ\x00",),
    "text-gz": (b"\x1f\x8b",),
    "moses-zip": (b"PK\x03\x04", b"PK\x05\x06"),
    "parquet": (b"PAR1",),
}
_HTML = (b"<!doctype html", b"<html", b"<head", b"<?xml")


def check_content(path: Path, fmt: str, *, where: str, fetched: bool) -> None:
    """Raise when the first bytes of ``path`` cannot start a ``fmt`` file."""
    with open(path, "rb") as f:
        head = f.read(512)
    if not head:
        return  # an empty file is prepare's to count (zero lines), not a format question
    page = head.lstrip().lower().startswith(_HTML)
    magic = _MAGIC.get(fmt)
    if not page and (magic is None or head.startswith(magic)):
        return
    what = "an HTML page" if page else "a file that is not " + fmt
    if fetched:
        fix = ("open the URL in a browser: a login or error page, or a mirror's landing page, is served instead of "
               "the file; put the file's own URL in the spec (or correct its 'format')")
    else:
        fix = "check the path and the source's 'format' in the spec"
    raise XylentError(f"got {what} where a {fmt} file was expected (it starts with {head[:40]!r})", where=where,
                      fix=fix)
