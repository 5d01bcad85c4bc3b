"""The download stage's output assembled from its units: every fetched file linked in as
``<source>/<filename>``, the records file and per-source totals (:mod:`tasks.download.contract`)."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.download.contract import RECORDS_FILE
from xylent.redact import redact, redact_text
from xylent.stage import StageOutcome
from xylent.workspace import Workspace, link_or_copy


def assemble(records: list[dict], ws: Workspace, out: Path) -> StageOutcome:
    known = {}
    for rec in records:
        if rec.get("file"):  # fetched or copied: visible in the stage output as <source>/<filename>
            rel = f"{rec['source']}/{rec['filename']}"
            link_or_copy(ws.ensure_local(ws.unit_dir("download", rec["unit"])) / rec["file"], out / rel)
            known[rel] = {"bytes": rec["bytes"], "sha256": rec["sha256"]}
    (out / RECORDS_FILE).write_text(json.dumps(redact(records), indent=1, sort_keys=True))
    by_source: dict[str, dict] = {}
    for rec in records:
        s = by_source.setdefault(rec["source"], {"source": rec["source"], "files": 0, "bytes": 0, "truncated": 0})
        s["files"] += 1
        s["bytes"] += rec["bytes"]
        s["truncated"] += int(bool(rec.get("truncated")))
    table = list(by_source.values())
    metrics = {"files": len(records), "bytes": sum(r["bytes"] for r in records)}
    metrics.update({f"bytes.{s['source']}": s["bytes"] for s in table})
    summary = f"{len(records)} files, {metrics['bytes'] / 1e6:.1f} MB from {len(table)} sources."
    unverified = [redact_text(r["url"]) for r in records if r.get("length_verified") is False]
    warnings = [f"{url}: the server sent no length and ignores range requests, so a connection cut short cannot "
                "be told from the end of the file; give the source a sha256 (or size) in the spec to verify it"
                for url in unverified]
    return StageOutcome(metrics=metrics, table=table, summary=summary + "".join(f"\n\n**Warning:** {w}"
                                                                                for w in warnings),
                        known_files=known, manifest={"sources": table}, warnings=warnings)
