"""What the download stage's output depends on beyond the spec's fields: the
identity of each source's bytes (its fingerprint slice)."""

from __future__ import annotations

import importlib.metadata
import os
import stat
from pathlib import Path
from typing import Any

from xylent.errors import XylentError
from xylent.spec import Spec


def source_identity(spec: Spec, source) -> dict[str, Any]:
    """What makes a source's bytes what they are, beyond its spec fields.

    URL downloads are identified by URL (+ checksum when given); a local file by
    its size and mtime; a package's catalogs by the installed package version.
    """
    d = source.model_dump(mode="json")
    if source.kind == "local":
        st = local_file(spec.resolve_path(source.path), source.name)
        d["_stat"] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    elif source.kind == "gettext" or getattr(source, "format", None) == "gettext":
        pkg = getattr(source, "package", None)
        if pkg:
            try:
                d["_package_version"] = importlib.metadata.version(pkg)
            except importlib.metadata.PackageNotFoundError:
                raise XylentError(
                    f"source {source.name!r}: Python package {pkg!r} is not installed",
                    where="spec field sources[].package",
                    fix=f"install it (pip install {pkg}); the demo's packages come with pip install -e '.[demo]'",
                ) from None
    return d


def spec_slice(spec: Spec) -> dict:
    """The download stage's fingerprint slice: languages and each source's identity
    (``max_lines`` is prepare's business: it does not change what is fetched)."""
    return {
        "languages": spec.languages,
        "sources": [{k: v for k, v in source_identity(spec, s).items() if k != "max_lines"} for s in spec.sources],
    }


def local_file(path: Path, source: str) -> os.stat_result:
    """A local source's stat, or a user error that says what the path is instead of a file."""
    where, fix = f"source {source!r}: {path}", "check the path (relative paths start at the spec file's folder)"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise XylentError(f"local file not found: {path}", where=f"source {source!r}", fix=fix) from None
    except OSError as exc:  # a symlink loop, a permission, a file used as a folder on the way
        raise XylentError(f"the local path cannot be opened: {exc.strerror}", where=where,
                          fix=f"{fix}: a symlink loop, a folder you may not read, a file used as a folder") from None
    if stat.S_ISDIR(st.st_mode):
        raise XylentError("the local path is a folder, not a file", where=where,
                          fix="name one file (a folder's files are separate sources)")
    if not stat.S_ISREG(st.st_mode):
        raise XylentError("the local path is not a regular file (a pipe, socket or device)", where=where,
                          fix="copy the data into a file: a local source is identified by its size and mtime")
    return st
