"""``index.json``: the shards stage's table of contents, written last by the stage
and read by the training loader and the pretrain stage.

    {"seq_len": int,
     "tokenizer": {"path": "vocab/<fp>/spm.model" (relative to the workspace), "sha256": str},
     "specials": {"unk", "bos", "eos", "pad", "mask": int},   # read from the tokenizer
     "mrtd": {lang: {"shards": [{"path", "rows", "tokens", "bytes", "sha256"}], "rows", "tokens", "documents", ...}},
     "trtd": {"xx-yy": {"shards": [...], "rows", "tokens", "pairs", "truncated", "text_tokens"}}}

Shard paths are relative to the shards output; layout ``mrtd/lang=xx/shard-*.arrow``,
``trtd/pair=xx-yy/shard-*.arrow`` (schemas: :mod:`tasks.shards.build`).
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


def read_index(shards_dir: Path) -> dict:
    path = Path(shards_dir) / INDEX_FILE
    try:
        index = json.loads(path.read_text())
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
