"""Errors a user can cause and fix.

Anything raised as `XylentError` is reported by the CLI without a traceback and
exits with code 2, and so is what :func:`environment_error` recognises (a full
disk, a read-only or forbidden path); every other exception is a bug (exit 1).
"""

from __future__ import annotations

import errno


class XylentError(Exception):
    """A problem with the user's spec, inputs or environment.

    The message must say *what* went wrong, *where* (file, URL, spec field) and
    *what to do* about it.
    """

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None):
        from xylent.redact import redact_text  # a URL's password is never printed or logged

        self.what = redact_text(what)
        self.where = redact_text(where) if where else where
        self.fix = redact_text(fix) if fix else fix
        super().__init__(self.render())

    def render(self) -> str:
        parts = [self.what]
        if self.where:
            parts.append(f"  where: {self.where}")
        if self.fix:
            parts.append(f"  what to do: {self.fix}")
        return "\n".join(parts)

    def one_line(self) -> str:
        """The message on one line (a Prefect state's message, a table cell)."""
        return "; ".join([self.what, *([f"where: {self.where}"] if self.where else []),
                          *([f"what to do: {self.fix}"] if self.fix else [])])

    def __repr__(self) -> str:
        # Prefect logs a failed flow as "Encountered exception during execution: {exc!r}": the
        # message as people read it, lines and all, not a Python string with literal \n in it
        return f"XylentError: {self.render()}"

    def __reduce__(self):  # survive pickling across process/Ray task runners
        return (_rebuild, (self.what, self.where, self.fix))


def _rebuild(what, where, fix):
    return XylentError(what, where=where, fix=fix)


# What the machine, not the user's data, refused; recognised by errno where the
# library kept the OSError, and by its words where it turned it into text
# (SQLite through SQLAlchemy/MLflow, polars, pyarrow).
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_READ_ONLY = {errno.EROFS}
_DENIED = {errno.EACCES, errno.EPERM}
_WORDS = (
    (_NO_SPACE, ("no space left on device", "database or disk is full", "disk quota exceeded", "file too large")),
    (_READ_ONLY, ("read-only file system", "readonly database", "unable to open database file")),
    (_DENIED, ("permission denied",)),
)


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def environment_error(exc: BaseException, workspace: str | None = None) -> XylentError | None:
    """The user-facing error for a full disk, a read-only or forbidden path, or
    None when ``exc`` is something else (then it is a bug)."""
    found, path = None, None
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _NO_SPACE | _READ_ONLY | _DENIED:
            found = next(kind for kind, _ in _WORDS if e.errno in kind)
            path = e.filename or path
            break
        text = str(e).lower()
        found = found or next((kind for kind, words in _WORDS if any(w in text for w in words)), None)
    if found is None:
        return None
    where = str(path or workspace or "the workspace")
    if found is _NO_SPACE:
        return XylentError("no space left on the device (or the disk quota is used up) while writing",
                           where=where, fix="free space on that disk or point --workspace at a bigger one, then "
                           "run the same command again: finished stages are kept, nothing half-written is trusted")
    if found is _READ_ONLY:
        return XylentError("the workspace is on a read-only file system (or its MLflow database cannot be "
                           "written)", where=where, fix="make it writable, or choose a writable --workspace "
                           "(copy the workspace there to keep its cached stages)")
    return XylentError("permission denied", where=where,
                       fix="give this user read and write access to it (or choose another --workspace)")
