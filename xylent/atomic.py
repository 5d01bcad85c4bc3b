"""Files written whole or not at all: through a temporary sibling renamed into place, so a
reader, or a rerun after a kill -9, never sees half a file.  (Stage outputs are published
whole as folders, ``xylent.workspace``; these are the single files written outside one:
checkpoints' side files, results, records.)"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable


def write_atomic(path: Path, write: Callable[[Path], Any]) -> Path:
    """``write(tmp)`` writes the file under a temporary name beside ``path``, which then
    replaces ``path`` in one rename; a failed write leaves ``path`` as it was.  The name is
    the writer's own (pid + random), so two processes writing one file never write into
    each other's temporary: the last rename wins, whole."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json_atomic(path: Path, data: Any, **dumps: Any) -> Path:
    """``dumps``: :func:`json.dumps`'s options (``indent``, ``ensure_ascii``)."""
    return write_text_atomic(path, json.dumps(data, **dumps))
