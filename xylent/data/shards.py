"""``index.json``: the shards stage's table of contents, written last by the stage
and read by the training loader and the pretrain stage.

    {"seq_len": int,
     "tokenizer": {"path": "vocab/<fp>/spm.model" (relative to the workspace), "sha256": str},
     "specials": {"unk", "bos", "eos", "pad", "mask": int},   # read from the tokenizer
     "mrtd": {lang: {"shards": [{"path", "rows", "tokens", "bytes", "sha256"}], "rows", "tokens", "documents", ...}},
     "trtd": {"xx-yy": {"shards": [...], "rows", "tokens", "pairs", "truncated", "text_tokens"}}}

Shard paths are relative to the shards output; layout ``mrtd/lang=xx/shard-*.arrow``,
``trtd/pair=xx-yy/shard-*.arrow`` (schemas: :mod:`xylent.tasks.shards.build`).
"""

from __future__ import annotations

import json
from pathlib import Path

from xylent.errors import XylentError

INDEX_FILE = "index.json"
STATS_FILE = "shards_stats.parquet"
TASKS = ("mrtd", "trtd")
MRTD_DIR = "mrtd/lang={name}"
TRTD_DIR = "trtd/pair={name}"


def write_index(out: Path, *, seq_len: int, tokenizer: dict, specials: dict, groups: list[dict]) -> dict:
    """``groups``: one dict per language (kind mrtd) or pair (kind trtd), with its shards and counts."""
    index = {"seq_len": seq_len, "tokenizer": tokenizer, "specials": specials, "mrtd": {}, "trtd": {}}
    for g in sorted(groups, key=lambda g: (g["kind"], g["name"])):
        index[g["kind"]][g["name"]] = {k: v for k, v in g.items() if k not in ("kind", "name")}
    (Path(out) / INDEX_FILE).write_text(json.dumps(index, indent=1, sort_keys=True))
    return index


def is_url(location: str | Path) -> bool:
    return "://" in str(location)


def _join(shards_dir: str | Path, rel: str) -> str | Path:
    return f"{str(shards_dir).rstrip('/')}/{rel}" if is_url(shards_dir) else Path(shards_dir) / rel


def _read_bytes(location: str | Path) -> bytes:
    if not is_url(location):
        return Path(location).read_bytes()
    try:  # an object-store workspace: read straight from the bucket
        import fsspec

        with fsspec.open(str(location), "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise
    except Exception as exc:  # credentials, endpoint, the store's package missing on this node
        raise XylentError(f"reading from the object store failed: {type(exc).__name__}: {exc}", where=str(location),
                          fix="every node needs the store's package (pip install 'xylent[s3]', '[gcs]' or '[azure]') "
                              "and the bucket's credentials and endpoint (docs/workspace.md)") from None


def open_shard(shards_dir: str | Path, rel: str, sha256: str | None = None):
    """One shard as an Arrow table: memory-mapped from disk, or read from the object
    store into memory (no local copy); checked against ``sha256`` when given."""
    import hashlib

    import pyarrow as pa
    import pyarrow.ipc as ipc

    from xylent.workspace import sha256_file

    where = _join(shards_dir, rel)
    try:
        if is_url(where):
            data = _read_bytes(where)
            digest, source = (hashlib.sha256(data).hexdigest() if sha256 else None), pa.py_buffer(data)
        else:
            digest = sha256_file(where) if sha256 else None
            source = pa.memory_map(str(where))
    except FileNotFoundError:
        raise XylentError("a shard listed in index.json is missing", where=str(where),
                          fix="rebuild the shards: xylent run shards --force") from None
    if sha256 and digest != sha256:
        raise XylentError("shard checksum mismatch: the file is corrupt or was changed after it was written",
                          where=str(where), fix="rebuild the shards: xylent run shards --force")
    return ipc.open_file(source).read_all()


def read_index(shards_dir: str | Path) -> dict:
    path = _join(shards_dir, INDEX_FILE)
    try:
        index = json.loads(_read_bytes(path))
    except FileNotFoundError:
        raise XylentError("no index.json: this is not a shards output", where=str(shards_dir),
                          fix="point at workspace/shards/<fingerprint>") from None
    except json.JSONDecodeError as exc:
        raise XylentError(f"index.json is not valid JSON ({exc})", where=str(path),
                          fix="rebuild it: xylent run shards --force") from None
    missing = [k for k in ("seq_len", "specials", *TASKS) if k not in index]
    if missing:
        raise XylentError(f"index.json lacks {missing}", where=str(path),
                          fix="it was written by an older xylent: rebuild it with xylent run shards --force")
    return index


def has_rows(index: dict, task: str) -> bool:
    return any(g["rows"] for g in index.get(task, {}).values())
