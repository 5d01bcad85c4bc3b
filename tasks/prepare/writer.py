"""Hive-partitioned Parquet parts, each bounded in rows and in bytes of text."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# Every later stage holds a part at a time per thread (dedup, shards, the audit), so a part's bytes set their
# memory. Rows alone do not bound them: 500 000 rows are 60 MB of English sentences but 170 MB of Hindi
# (three bytes a character) and gigabytes of whole documents. A part also ends once its rows' strings hold
# this many bytes.
PART_TEXT_BYTES = 64 << 20

MONO_SCHEMA = pa.schema([("doc_id", pa.string()), ("text", pa.large_string()), ("source", pa.string())])
BITEXT_SCHEMA = pa.schema(
    [
        ("src", pa.large_string()),
        ("tgt", pa.large_string()),
        ("src_lang", pa.string()),
        ("tgt_lang", pa.string()),
        ("source", pa.string()),
    ]
)


def _text_bytes(table: pa.Table) -> np.ndarray:
    """Each row's bytes of text: the UTF-8 bytes of its string columns."""
    out = np.zeros(table.num_rows, dtype=np.int64)
    for col in table.columns:
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            out += pc.fill_null(pc.binary_length(col), 0).to_numpy()
    return out


class PartWriter:
    """Writes ``<root>/<partition>/part-<key>-NNNNN.parquet``, rolling over every ``part_rows`` rows or
    ``part_bytes`` of text, whichever comes first (a part holds at least one row)."""

    def __init__(self, root: Path, partition: str, key: str, schema: pa.Schema, part_rows: int,
                 part_bytes: int = PART_TEXT_BYTES):
        self.dir = root / partition
        self.key = key
        self.schema = schema
        self.part_rows = part_rows
        self.part_bytes = part_bytes
        self._writer: pq.ParquetWriter | None = None
        self._rows_in_part = 0
        self._bytes_in_part = 0
        self.parts = 0
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        table = table.cast(self.schema)
        ends = np.cumsum(_text_bytes(table))  # text bytes of rows [0, i] of the table
        start = 0
        while start < table.num_rows:
            if self._writer is None:
                self.dir.mkdir(parents=True, exist_ok=True)
                path = self.dir / f"part-{self.key}-{self.parts:05d}.parquet"
                self._writer = pq.ParquetWriter(path, self.schema, compression="zstd")
                self.parts += 1
            before = ends[start - 1] if start else 0
            fit = int(np.searchsorted(ends, before + self.part_bytes - self._bytes_in_part, side="right")) - start
            take = min(table.num_rows - start, self.part_rows - self._rows_in_part, fit)
            if take == 0:
                if self._rows_in_part:  # the next row does not fit in this part: it starts the next
                    self.close()
                    continue
                take = 1  # a row longer than a whole part is a part of its own
            self._writer.write_table(table.slice(start, take))
            self._rows_in_part += take
            self._bytes_in_part += int(ends[start + take - 1] - before)
            self.rows += take
            start += take
            if self._rows_in_part >= self.part_rows or self._bytes_in_part >= self.part_bytes:
                self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._rows_in_part = 0
            self._bytes_in_part = 0
