"""Prefect task-runner selection from the spec's ``runner`` section."""

from __future__ import annotations

from xylent.errors import XylentError
from xylent.spec import RunnerConfig


def make_task_runner(cfg: RunnerConfig):
    """Threads (default) and processes come with Prefect; Dask and Ray need
    their integrations (``pip install prefect-dask`` / ``prefect-ray``)."""
    if cfg.kind == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=cfg.max_workers)
    if cfg.kind == "processes":
        from prefect.task_runners import ProcessPoolTaskRunner

        return ProcessPoolTaskRunner(max_workers=cfg.max_workers)
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


def submit_all(runner, task, calls: list[dict]) -> list:
    """Submit ``task`` once per parameter dict on an entered ``runner``; return futures.

    Flows build their runner from the spec at run time (the flow decorator's
    runner is fixed at import), which is why they submit through this.
    """
    return [runner.submit(task, parameters=kw) for kw in calls]
