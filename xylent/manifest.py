"""A published output's manifest: its file name and its shape (xylent.workspace writes and reads it locally,
xylent.remote in a bucket)."""

from __future__ import annotations

from typing import Any

MANIFEST = "_manifest.json"


def well_formed(manifest: Any) -> dict[str, Any] | None:
    """``manifest`` if it has a manifest's shape (an object whose ``files`` lists entries with a path, size and
    checksum), else None: a ``[]`` or ``{}`` left in its place is never a published output, so it is rebuilt
    and ``xylent verify`` reports it instead of "ok (0 files)"."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        return None
    entry_ok = all(isinstance(e, dict) and isinstance(e.get("path"), str) and isinstance(e.get("bytes"), int)
                   and isinstance(e.get("sha256"), str) for e in manifest["files"])
    return manifest if entry_ok else None
