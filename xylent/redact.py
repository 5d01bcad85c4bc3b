"""Credentials in URLs never reach a record.

A spec may name ``http://user:password@host/...`` (or a token as the user).
The URL is fetched as written, but every place it is recorded — MLflow params,
manifests, ``records.json`` — sees ``http://user:***@host/...``.  Fingerprints
hash the real value (a hash reveals nothing), so a changed password is a
changed source, as a changed URL is.
"""

from __future__ import annotations

import re
from typing import Any

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s]+)@")


def _mask(m: re.Match) -> str:
    user, sep, _ = m.group("userinfo").partition(":")
    # user:password keeps the user (who it was); a lone user part is often the token itself
    return f"{m.group('scheme')}{user}:***@" if sep else f"{m.group('scheme')}***@"


def redact_text(text: str) -> str:
    return _USERINFO.sub(_mask, text) if "@" in text else text


def redact(value: Any) -> Any:
    """``value`` with credentials masked in every string, at any depth (dicts, lists, tuples)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {redact(k): redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    return value
