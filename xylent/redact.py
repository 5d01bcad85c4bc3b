"""Credentials in URLs never reach a record.

A spec may name ``http://user:password@host/...`` (or a token as the user), or a
presigned URL whose query carries the secret (S3's ``X-Amz-Signature`` and
``X-Amz-Security-Token``, GCS's ``X-Goog-Signature``, an Azure SAS ``sig``, any
``token``/``key``/``secret``/``password``/``signature``/``credential`` parameter).
The URL is fetched as written, but every place it is recorded — MLflow params,
manifests, ``records.json``, the spec artifact, error messages — sees
``http://user:***@host/...?sig=***``.  Fingerprints hash the real value (a hash
reveals nothing), so a changed password is a changed source, as a changed URL is.
"""

from __future__ import annotations

import re
from typing import Any

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s]+)@")
# a query parameter whose name says it holds a secret (one of its words, split at - _ .): its value is
# masked, its name kept; "keyword" or "monkey" are not secrets
_QUERY_PARAM = re.compile(r"(?P<name>[?&][\w.-]+)=(?P<value>[^&#\s\"'<>]+)")
_SECRET_WORDS = {"token", "key", "apikey", "secret", "password", "passwd", "pwd", "signature", "sig", "credential",
                 "credentials", "auth", "authorization"}


def _mask(m: re.Match) -> str:
    user, sep, _ = m.group("userinfo").partition(":")
    # user:password keeps the user (who it was); a lone user part is often the token itself
    return f"{m.group('scheme')}{user}:***@" if sep else f"{m.group('scheme')}***@"


def redact_text(text: str) -> str:
    if "@" in text:
        text = _USERINFO.sub(_mask, text)
    if "=" in text and ("?" in text or "&" in text):
        text = _QUERY_PARAM.sub(_mask_param, text)
    return text


def _mask_param(m: re.Match) -> str:
    words = set(re.split(r"[-_.]", m.group("name")[1:].lower()))
    return f"{m.group('name')}=***" if words & _SECRET_WORDS else m.group(0)


def redact(value: Any) -> Any:
    """``value`` with credentials masked in every string, at any depth (dicts, lists, tuples)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {redact(k): redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    return value
