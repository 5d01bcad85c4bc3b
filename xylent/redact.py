"""Credentials in URLs never reach a record.

A spec may name ``http://user:password@host/...`` (or a token as the user), or a
presigned URL whose query carries the secret (S3's ``X-Amz-Signature``, an Azure
SAS ``sig``, a ``jwt``, a ``sessionid``: no word list keeps up with them).  So the
rule is by position, not by name: the URL is fetched as written, but every place it
is recorded — MLflow params, manifests, ``records.json``, the spec artifact, error
messages — sees its userinfo masked whole (``http://***@host/...``, an ``@`` inside
the password included) and every query value masked but those of a short list of
keys that name no secret (:data:`PUBLIC_QUERY_KEYS`: ``?lang=de&sig=***``).
Fingerprints hash the real value (a hash reveals nothing), so a changed password is
a changed source, as a changed URL is.
"""

from __future__ import annotations

import re
from typing import Any

# the authority's userinfo: everything up to its last "@" (a password may hold one) before the path, query or fragment
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]*)@")
_QUERY_PARAM = re.compile(r"(?P<name>[?&][\w.-]+)=(?P<value>[^&#\s\"'<>]+)")
# query keys whose values are kept: what a corpus URL names (language, format, page, version), never a credential
PUBLIC_QUERY_KEYS = frozenset({"lang", "language", "format", "page", "version", "v", "file", "name", "split", "ref",
                               "download", "dl", "raw"})


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")


def redact_text(text: str) -> str:
    if "@" in text:
        text = _USERINFO.sub(lambda m: f"{m.group('scheme')}***@", text)
    if "=" in text and ("?" in text or "&" in text):  # a URL's query only: "a=b&c=d" in prose is not one
        text = _URL.sub(lambda u: _QUERY_PARAM.sub(_mask_param, u.group(0)), text)
    return text


def _mask_param(m: re.Match) -> str:
    return m.group(0) if m.group("name")[1:].lower() in PUBLIC_QUERY_KEYS else f"{m.group('name')}=***"


def redact(value: Any) -> Any:
    """``value`` with credentials masked in every string, at any depth (dicts, lists, tuples)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {redact(k): redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    return value
