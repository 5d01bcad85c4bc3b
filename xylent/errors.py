"""Errors a user can cause and fix.

Anything raised as `XylentError` is reported by the CLI without a traceback and
exits with code 2; every other exception is a bug (exit 1).
"""

from __future__ import annotations


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

    def __reduce__(self):  # survive pickling across process/Ray task runners
        return (_rebuild, (self.what, self.where, self.fix))


def _rebuild(what, where, fix):
    return XylentError(what, where=where, fix=fix)
