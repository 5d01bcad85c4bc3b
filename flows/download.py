"""download flow: every file the spec's sources name, fetched once and verified."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed
from prefect.task_runners import ThreadPoolTaskRunner

from flows.stage import Invocation, StageOutcome, run_stage_flow
from tasks.download import FetchItem, materialise, plan_source
from xylent.errors import XylentError
from xylent.progress import Progress
from xylent.runners import submit_all
from xylent.spec import DownloadConfig
from xylent.workspace import Workspace, link_or_copy


def _retry_unless_user_error(task, task_run, state) -> bool:
    try:
        state.result()
    except XylentError:
        return False  # 404, checksum mismatch ...: retrying cannot help
    except Exception:
        return True
    return False


@task(name="plan-source", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE,
      retry_condition_fn=_retry_unless_user_error)
def plan_source_task(spec, source_name: str) -> list[FetchItem]:
    source = next(s for s in spec.sources if s.name == source_name)
    return plan_source(spec, source)


@task(name="fetch", task_run_name="fetch {label}", retries=2, retry_delay_seconds=5,
      cache_policy=NO_CACHE, retry_condition_fn=_retry_unless_user_error)
def fetch_task(label: str, items: list[FetchItem], ws_root: str, cfg: DownloadConfig,
               progress: Progress | None = None):
    ws = Workspace(ws_root)
    on_bytes = progress.advance if progress else (lambda n: None)
    done = [materialise(it, ws, cfg, on_bytes=on_bytes) for it in items]
    records = [rec for rec, _ in done]
    if all(cached for _, cached in done):
        return Completed(name="Cached", message="already fetched", data=records)
    return records


def _batches(items: list[FetchItem]) -> dict[str, list[FetchItem]]:
    """One task per URL; files read from disk go together per source and language
    (a package's catalogs are hundreds of small files)."""
    out: dict[str, list[FetchItem]] = {}
    for it in items:
        label = f"{it.source}/{it.filename}" if it.url else f"{it.source}/{it.lang or it.pair}"
        out.setdefault(label, []).append(it)
    return out


def _body(inv: Invocation):
    spec = inv.spec

    def body(tmp: Path, upstream: dict, run_id: str) -> StageOutcome:
        plans = [plan_source_task.submit(spec, s.name) for s in spec.sources]
        items = [it for p in plans for it in p.result()]
        total = sum(it.size or 0 for it in items) or None
        progress = Progress("download", total, key="download-progress")
        try:
            # downloads are I/O-bound: always threads, download.concurrency at a time
            with ThreadPoolTaskRunner(max_workers=spec.download.concurrency) as runner:
                futures = submit_all(runner, fetch_task, [
                    {"label": label, "items": batch, "ws_root": str(inv.ws.root), "cfg": spec.download,
                     "progress": progress}
                    for label, batch in _batches(items).items()
                ])
                records = [rec for f in futures for rec in f.result()]
        finally:
            progress.close()
        known = {}
        for rec in records:
            if rec.get("file"):  # fetched or copied: visible in the stage output as <source>/<filename>
                src = inv.ws.unit_dir("download", rec["unit"]) / rec["file"]
                rel = f"{rec['source']}/{rec['filename']}"
                link_or_copy(src, tmp / rel)
                known[rel] = {"bytes": rec["bytes"], "sha256": rec["sha256"]}
        (tmp / "records.json").write_text(json.dumps(records, indent=1, sort_keys=True))
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
        return StageOutcome(metrics=metrics, table=table, summary=summary, known_files=known,
                            manifest={"sources": table})

    return body


@flow(name="download", log_prints=True)
def download(spec_file: str, workspace: str | None = None, overrides: list[str] | None = None,
             force: bool = False, mlflow_parent_run_id: str | None = None):
    """Fetch every file of every source into the workspace, verified and resumable."""
    inv = Invocation.open(spec_file, workspace, overrides, mlflow_parent_run_id, "download")
    return run_stage_flow(inv, "download", force, _body(inv))
