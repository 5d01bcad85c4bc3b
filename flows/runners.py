"""Prefect task runners from the spec's ``runner`` section, and the one way stages
fan work out over them: :func:`run_tasks`."""

from __future__ import annotations

from typing import Iterator

from flows.progress import Progress
from xylent.errors import XylentError
from xylent.spec import RunnerConfig


def make_task_runner(cfg: RunnerConfig):
    """Threads (default) and processes come with Prefect; Dask and Ray need
    their integrations (``pip install prefect-dask`` / ``prefect-ray``)."""
    if cfg.kind == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=cfg.max_workers)
    if cfg.kind == "processes":
        import os

        from prefect.task_runners import ProcessPoolTaskRunner

        from flows.hygiene import worker_init

        return ProcessPoolTaskRunner(max_workers=cfg.max_workers, initializer=worker_init, initargs=(os.getpid(),))
    if cfg.kind == "dask":
        try:
            from prefect_dask import DaskTaskRunner
        except ImportError:
            raise XylentError(
                "runner.kind is 'dask' but prefect-dask is not installed",
                where="spec field runner.kind",
                fix="pip install prefect-dask, or use runner.kind: threads",
            ) from None
        if cfg.address:
            return DaskTaskRunner(address=cfg.address)
        return DaskTaskRunner(cluster_kwargs={"n_workers": cfg.max_workers or 2, "processes": True})
    if cfg.kind == "ray":
        try:
            from prefect_ray import RayTaskRunner
        except ImportError:
            raise XylentError(
                "runner.kind is 'ray' but prefect-ray is not installed",
                where="spec field runner.kind",
                fix="pip install prefect-ray, or use runner.kind: threads",
            ) from None
        init_kwargs = {} if cfg.address else {"num_cpus": cfg.max_workers or 2}
        return RayTaskRunner(address=cfg.address, init_kwargs=init_kwargs)
    raise XylentError(f"unknown runner kind {cfg.kind!r}", where="spec field runner.kind")


def _submit_all(runner, task, calls: list[dict]) -> list:
    """Submit ``task`` once per parameter dict on an entered ``runner``; return futures.
    (Runners come from the spec at run time: a flow decorator's runner is fixed at import.)"""
    return [runner.submit(task, parameters=kw) for kw in calls]


def run_tasks(task, calls: list[dict], *, runner, title: str = "", unit: str = "tasks",
              key: str | None = None, progress: Progress | None = None, count: bool = True) -> Iterator:
    """Run ``task`` once per parameter dict on ``runner`` (a RunnerConfig, or an
    already entered task runner), yielding results in submission order.

    Without ``progress`` a bar (terminal + Prefect UI) counts finished tasks;
    pass your own to share one bar between several fan-outs (``count=False``:
    the caller or the tasks themselves advance it, e.g. by bytes or by phase)."""
    own = progress is None
    if own:
        progress = Progress(title, len(calls), unit=unit, key=key)
    try:
        if isinstance(runner, RunnerConfig):
            with make_task_runner(runner) as entered:
                yield from _results(entered, task, calls, progress if count else None)
        else:
            yield from _results(runner, task, calls, progress if count else None)
    finally:
        if own:
            progress.close()


def _results(runner, task, calls, progress):
    for fut in _submit_all(runner, task, calls):
        yield fut.result()
        if progress is not None:
            progress.advance(1)


def batches(items: list, n: int) -> list[list]:
    """``items`` dealt round-robin into at most ``n`` non-empty batches (tasks stay
    few when the work items are many and small)."""
    n = max(1, min(len(items), n))
    return [items[i::n] for i in range(n)] if items else []


def task_slots(cfg: RunnerConfig) -> int:
    """How many tasks to cut fan-out work into: a few per worker, so a slow one
    does not hold the others up."""
    return 4 * (cfg.max_workers or 2)
