"""download flow: every file the spec's sources name, fetched once and verified."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed
from prefect.task_runners import ThreadPoolTaskRunner

from xylent.flows.kit.stage import StageContext, StageOutcome, stage_flow
from xylent.flows.kit.progress import Progress
from xylent.flows.registry import STAGE_BY_NAME
from xylent.flows.kit.runners import run_tasks
from xylent.errors import XylentError, environment_error
from xylent.spec import DownloadConfig
from xylent.workspace import Workspace

if TYPE_CHECKING:
    from xylent.tasks.download import run as dl


def _retry_unless_user_error(task, task_run, state) -> bool:
    try:
        state.result()
    except XylentError:
        return False  # 404, checksum mismatch ...: retrying cannot help
    except Exception as exc:
        return environment_error(exc) is None  # nor can it free a full disk
    return False


@task(name="plan-source", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE,
      retry_condition_fn=_retry_unless_user_error)
def plan_source_task(spec, source_name: str) -> list[dl.FetchItem]:
    from xylent.tasks.download import run as dl

    source = next(s for s in spec.sources if s.name == source_name)
    return dl.plan_source(spec, source)


@task(name="fetch", task_run_name="fetch {label}", retries=2, retry_delay_seconds=5,
      cache_policy=NO_CACHE, retry_condition_fn=_retry_unless_user_error)
def fetch_task(label: str, items: list[dl.FetchItem], ws_root: str, cfg: DownloadConfig,
               progress: Progress | None = None):
    from xylent.tasks.download import run as dl

    ws = Workspace(ws_root)
    on_bytes = progress.advance if progress else (lambda n: None)
    done = [dl.materialise(it, ws, cfg, on_bytes=on_bytes) for it in items]
    records = [rec for rec, _ in done]
    if all(cached for _, cached in done):
        return Completed(name="Cached", message="already fetched", data=records)
    return records


def _batches(items: list[dl.FetchItem]) -> dict[str, list[dl.FetchItem]]:
    """One task per URL; files read from disk go together per source and language
    (a package's catalogs are hundreds of small files)."""
    out: dict[str, list[dl.FetchItem]] = {}
    for it in items:
        label = f"{it.source}/{it.filename}" if it.url else f"{it.source}/{it.lang or it.pair}"
        out.setdefault(label, []).append(it)
    return out


@stage_flow(STAGE_BY_NAME["download"])
def download(ctx: StageContext) -> StageOutcome:
    from xylent.tasks.download import run as dl

    spec = ctx.spec
    plans = [plan_source_task.submit(spec, s.name) for s in spec.sources]
    items = [it for p in plans for it in p.result()]
    progress = Progress("download", sum(it.size or 0 for it in items) or None, key="download-progress")
    try:
        # downloads are I/O-bound: always threads, download.concurrency at a time
        with ThreadPoolTaskRunner(max_workers=spec.download.concurrency) as runner:
            records = [rec for batch in run_tasks(fetch_task, [
                {"label": label, "items": batch, "ws_root": ctx.ws.location, "cfg": spec.download,
                 "progress": progress} for label, batch in _batches(items).items()
            ], runner=runner, progress=progress, count=False) for rec in batch]
    finally:
        progress.close()
    return dl.assemble(records, ctx.ws, ctx.out)
