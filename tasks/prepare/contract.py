"""The text layout prepare writes and dedup keeps (a data contract; every reader imports it).

    mono/lang=<xx>/part-*.parquet        doc_id, text, source      (xylent.tasks.prepare.writer.MONO_SCHEMA)
    bitext/pair=<xx>-<yy>/part-*.parquet src, tgt, src_lang, tgt_lang, source (BITEXT_SCHEMA)

Hive-partitioned, so polars/pyarrow can scan it lazily; pairs are in canonical
(sorted) order.  A group's parts are read in file-name order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MONO, BITEXT = "mono", "bitext"
PREFIX = {MONO: "lang=", BITEXT: "pair="}
STATS_FILE = "stats.parquet"  # prepare: one row per (kind, name, source)


def partition(kind: str, name: str) -> str:
    """``mono/lang=de`` or ``bitext/pair=de-en``: where a group's parts live."""
    return f"{kind}/{PREFIX[kind]}{name}"


def group_names(root: Path, kind: str) -> list[str]:
    """Languages (``mono``) or pairs (``bitext``) present under ``root``, sorted."""
    return sorted(p.name.removeprefix(PREFIX[kind]) for p in (Path(root) / kind).glob(f"{PREFIX[kind]}*"))


def group_parts(root: Path, kind: str, name: str) -> list[Path]:
    return sorted((Path(root) / partition(kind, name)).glob("*.parquet"))


@dataclass(frozen=True)
class Part:
    kind: str   # mono | bitext
    name: str   # language or pair
    idx: int    # position of the part within its group
    path: Path
    rel: str    # path relative to the layout's root

    def as_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "idx": self.idx, "part": str(self.path), "rel": self.rel}


def parts(root: Path, kinds: tuple[str, ...] = (MONO, BITEXT)) -> list[Part]:
    """Every part under ``root``, grouped by kind then name, in reading order."""
    root = Path(root)
    return [Part(kind, name, i, p, str(p.relative_to(root)))
            for kind in kinds for name in group_names(root, kind)
            for i, p in enumerate(group_parts(root, kind, name))]
