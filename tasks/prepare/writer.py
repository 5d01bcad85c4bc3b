"""Hive-partitioned Parquet parts with a bounded number of rows each."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

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


class PartWriter:
    """Writes ``<root>/<partition>/part-<key>-NNNNN.parquet``, rolling over every ``part_rows`` rows."""

    def __init__(self, root: Path, partition: str, key: str, schema: pa.Schema, part_rows: int):
        self.dir = root / partition
        self.key = key
        self.schema = schema
        self.part_rows = part_rows
        self._writer: pq.ParquetWriter | None = None
        self._rows_in_part = 0
        self.parts = 0
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        table = table.cast(self.schema)
        start = 0
        while start < table.num_rows:
            if self._writer is None:
                self.dir.mkdir(parents=True, exist_ok=True)
                path = self.dir / f"part-{self.key}-{self.parts:05d}.parquet"
                self._writer = pq.ParquetWriter(path, self.schema, compression="zstd")
                self.parts += 1
            take = min(table.num_rows - start, self.part_rows - self._rows_in_part)
            self._writer.write_table(table.slice(start, take))
            self._rows_in_part += take
            self.rows += take
            start += take
            if self._rows_in_part >= self.part_rows:
                self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._rows_in_part = 0
