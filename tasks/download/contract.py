"""The download stage's output contract.

    <source>/<filename>   every fetched file, as fetched
    records.json          one record per file: source, url, bytes, sha256, etag, unit
"""

from __future__ import annotations

import json
from pathlib import Path

RECORDS_FILE = "records.json"


def read_records(download_dir: Path) -> list[dict]:
    return json.loads((Path(download_dir) / RECORDS_FILE).read_text())
