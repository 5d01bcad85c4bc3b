"""What the download flow calls: :func:`plan_source` (what a source consists of, from plan.py),
:func:`materialise` (one planned file into the workspace, cached by its fingerprint),
:func:`unit_fingerprint`, and :func:`assemble` (the stage's output from its units: every fetched
file linked in as ``<source>/<filename>``, the records file and per-source totals)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from xylent.redact import redact, redact_text
from xylent.spec import DownloadConfig
from xylent.stage import StageOutcome
from xylent.workspace import Workspace, check_files, fingerprint, link_or_copy, sha256_file

from xylent.tasks import versions
from xylent.tasks.download.content import check_content
from xylent.tasks.download.contract import RECORDS_FILE
from xylent.tasks.download.http import fetch
from xylent.tasks.download.plan import FetchItem, plan_source

__all__ = ["VERSION", "FetchItem", "assemble", "materialise", "plan_source", "unit_fingerprint"]

# the stage's code version (its fingerprint and every fetched file's), kept in tasks/versions.py
VERSION = versions.DOWNLOAD


def unit_fingerprint(item: FetchItem) -> str:
    ident = {k: v for k, v in item.to_dict().items() if k not in ("source", "filename", "lang", "pair", "catalog")}
    if item.path is not None:  # a file read in place is identified by its stat, like make does
        st = os.stat(item.path)
        ident["stat"] = [st.st_size, st.st_mtime_ns]
    return fingerprint({"stage": "download", "version": VERSION, "item": ident})


def materialise(item: FetchItem, ws: Workspace, cfg: DownloadConfig, on_bytes=lambda n: None) -> tuple[dict, bool]:
    """Make one planned file available in the workspace.

    URLs are fetched into ``download/_units/<fp>/``; local files and package
    catalogs are checksummed in place (a copy of a 100 GB local corpus would
    only waste disk), except catalogs, which are small and copied so the
    workspace does not depend on what is installed later.
    Returns (file record, cached?).
    """
    fp = unit_fingerprint(item)
    unit = ws.unit_dir("download", fp)
    manifest = ws.manifest(unit)
    # the stage's output links the unit's file: an edit there edits the unit, which is then fetched again
    if manifest is not None and not check_files(unit, manifest):
        return manifest["record"], True
    started = time.time()
    with ws.building(unit) as tmp:
        record = {**item.to_dict(), "unit": fp}
        if item.url is not None:
            part = ws.stage_dir("download") / "_partial" / f"{fp}.part"
            got = fetch(
                item.url, part, sha256=item.sha256, size=item.size, max_bytes=item.max_bytes,
                retries=cfg.retries, backoff_s=cfg.backoff_s, timeout_s=cfg.timeout_s,
                silent_attempts=cfg.silent_attempts,
                total_timeout_s=cfg.total_timeout_s, max_file_bytes=cfg.max_file_bytes,
                min_free_bytes=cfg.min_free_bytes, chunk_bytes=cfg.chunk_bytes, on_bytes=on_bytes,
            )
            dest = tmp / Path(item.filename).name
            shutil.move(str(part), dest)  # out of _partial: a wrong file is not resumed either
            check_content(dest, item.format, where=item.url, fetched=True)
            record.update(got, file=dest.name)
        elif item.copy:
            dest = tmp / Path(item.filename).name
            shutil.copyfile(item.path, dest)
            record.update(bytes=dest.stat().st_size, sha256=sha256_file(dest), file=dest.name, truncated=False)
        else:
            src = Path(item.path)
            check_content(src, item.format, where=str(src), fetched=False)
            st = src.stat()
            record.update(bytes=st.st_size, sha256=sha256_file(src), file=None, mtime_ns=st.st_mtime_ns,
                          truncated=False)
            on_bytes(st.st_size)
        ws.publish(tmp, unit, {"kind": "download-unit", "fingerprint": fp, "record": record,
                               "seconds": round(time.time() - started, 3)})
    return record, False


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
