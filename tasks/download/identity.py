"""What the download stage's output depends on beyond the spec's fields: the
identity of each source's bytes (its fingerprint slice)."""

from __future__ import annotations

import importlib.metadata
import os
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
        path = spec.resolve_path(source.path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise XylentError(
                f"source {source.name!r}: local file not found: {path}",
                where="spec field sources[].path",
                fix="check the path (relative paths are resolved from the spec file's folder)",
            ) from None
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
                    fix=f"install it (for the demo: pip install -e '.[demo]', which brings {pkg})",
                ) from None
    return d


def spec_slice(spec: Spec) -> dict:
    """The download stage's fingerprint slice: languages and each source's identity
    (``max_lines`` is prepare's business: it does not change what is fetched)."""
    return {
        "languages": spec.languages,
        "sources": [{k: v for k, v in source_identity(spec, s).items() if k != "max_lines"} for s in spec.sources],
    }
