"""What the download flow calls: :func:`materialise` (one planned file into the workspace, cached by
its fingerprint) and :func:`unit_fingerprint`."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from xylent.spec import DownloadConfig
from xylent.workspace import Workspace, check_files, fingerprint, sha256_file

from tasks import versions
from tasks.download.content import check_content
from tasks.download.http import fetch
from tasks.download.plan import FetchItem

__all__ = ["VERSION", "materialise", "unit_fingerprint"]

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
