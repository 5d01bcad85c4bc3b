"""Prefect task runners from the spec's ``runner`` section, and the one way stages
fan work out over them: :func:`run_tasks`."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from xylent.flows.kit.progress import Progress
from xylent.errors import XylentError
from xylent.spec import RunnerConfig
from xylent.stage import StageOutcome

# The Dask scheduler or Ray cluster this invocation started (or joined): every stage's
# task runner connects to it instead of starting a cluster of its own (~5 s each).
_CLUSTER: ContextVar[str | None] = ContextVar("xylent_cluster", default=None)


@contextlib.contextmanager
def shared_cluster(cfg: RunnerConfig) -> Iterator[str | None]:
    """One Dask or Ray cluster for a whole invocation, started here unless
    ``runner.address`` names one (or an enclosing invocation already did); yields its
    address.  Threads and processes need none."""
    if cfg.kind not in ("dask", "ray") or _CLUSTER.get() is not None:
        yield _CLUSTER.get()
        return
    with contextlib.ExitStack() as stack:
        address = _start_dask(cfg, stack) if cfg.kind == "dask" else _start_ray(cfg, stack)
        token = _CLUSTER.set(address)
        stack.callback(_CLUSTER.reset, token)
        yield address


def _start_dask(cfg: RunnerConfig, stack: contextlib.ExitStack) -> str:
    if cfg.address:
        from xylent.flows.kit.preflight import check_address

        check_address(cfg.address, "Dask scheduler")
        return cfg.address
    _require("dask", "prefect_dask")
    from distributed import LocalCluster

    cluster = stack.enter_context(LocalCluster(n_workers=cfg.max_workers or 2, processes=True,
                                               threads_per_worker=1, dashboard_address=None))
    return cluster.scheduler_address


def _start_ray(cfg: RunnerConfig, stack: contextlib.ExitStack) -> str:
    _require("ray", "prefect_ray")
    import ray
    import ray.exceptions  # noqa: F401  (the join maps its errors)

    if not ray.is_initialized():
        _read_ray_auth_afresh()
        with _ray_auth_notice_muted():
            if cfg.address:
                _join_ray(ray, cfg.address)
            else:
                # "local": a private instance, never a cluster `ray start` left on this machine (its
                # /tmp/ray/ray_current_cluster outlives a killed head, and ray.init() would join it)
                ray.init(address="local", num_cpus=cfg.max_workers or 2, include_dashboard=False,
                         logging_level=logging.WARNING)
        stack.callback(ray.shutdown)
    return ray.get_runtime_context().gcs_address


def _read_ray_auth_afresh() -> None:
    """Ray caches the first token a process read, and the auth mode in its config: a local
    `ray.init` earlier in a long-lived process (a worker, a test session) made and read
    ~/.ray/auth_token, and its token would go to a cluster that expects another.  Read
    what is set now; the config first, as Ray's own reset does, so that a draining gRPC
    thread never reloads a token under a stale mode."""
    with contextlib.suppress(ImportError):  # a Ray without token authentication caches nothing
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def _join_ray(ray, address: str) -> None:
    """Connect to a running cluster.  `ray start` turns token authentication on when it
    finds a token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token), but a
    driver only sends one with RAY_AUTH_MODE=token: with a token at hand and no mode
    chosen, choose token, as the cluster did."""
    with contextlib.suppress(ImportError):  # a Ray without token authentication has nothing to choose
        # Ray >= 2.5x; the mode is read into Ray's config, which this refreshes
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    # a token missing here is AuthenticationError (a RayError); a GCS that never answers, RuntimeError
    unreachable = (ConnectionError, RuntimeError, getattr(ray.exceptions, "AuthenticationError", ConnectionError))
    try:
        ray.init(address, logging_level=logging.WARNING)
    except unreachable as exc:
        raise XylentError(f"cannot join the Ray cluster at {address}: {exc}", where="spec field runner.address",
                          fix="check the address `ray start --head` printed and that this machine reaches it; a "
                              "cluster with token authentication needs its token here (RAY_AUTH_TOKEN or "
                              "~/.ray/auth_token) and RAY_AUTH_MODE=token; one without it needs "
                              "RAY_AUTH_MODE=disabled") from None


@contextlib.contextmanager
def _ray_auth_notice_muted() -> Iterator[None]:
    """Ray tells at every start that token authentication is on and how to opt out.  The
    cluster is this invocation's own, or one the user started with a token: not news, and
    a warning line on a terminal that should show only what needs a look."""
    notice = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = notice.level
    notice.setLevel(logging.ERROR)
    try:
        yield
    finally:
        notice.setLevel(level)


def cluster_tags() -> dict[str, str]:
    """MLflow tags saying which cluster ran a stage (empty for threads and processes)."""
    address = _CLUSTER.get()
    return {"xylent.cluster": address} if address else {}


def _require(kind: str, module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        raise XylentError(
            f"runner.kind is '{kind}' but {module.replace('_', '-')} is not installed",
            where="spec field runner.kind",
            fix=f"pip install 'xylent[{kind}]' (or {module.replace('_', '-')}), or use runner.kind: threads",
        ) from None


def make_task_runner(cfg: RunnerConfig):
    """Threads (default) and processes come with Prefect; Dask and Ray need
    their integrations (the ``dask`` / ``ray`` extras).  Inside :func:`shared_cluster`
    they connect to the invocation's cluster."""
    if cfg.kind == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=cfg.max_workers)
    if cfg.kind == "processes":
        import os

        from prefect.task_runners import ProcessPoolTaskRunner

        from xylent.flows.kit.processes import worker_init

        return ProcessPoolTaskRunner(max_workers=cfg.max_workers, initializer=worker_init, initargs=(os.getpid(),))
    if cfg.kind == "dask":
        _require("dask", "prefect_dask")
        from prefect_dask import DaskTaskRunner

        if address := cfg.address or _CLUSTER.get():
            return DaskTaskRunner(address=address)
        # one task at a time per worker, as _start_dask's cluster: LocalCluster's default gives each
        # worker cores / n_workers threads, and max_workers would then not cap the tasks (nor their memory)
        return DaskTaskRunner(cluster_kwargs={"n_workers": cfg.max_workers or 2, "processes": True,
                                              "threads_per_worker": 1, "dashboard_address": None})
    if cfg.kind == "ray":
        _require("ray", "prefect_ray")
        from prefect_ray import RayTaskRunner

        # inside shared_cluster() Ray is initialised: the runner joins it and leaves it running
        init_kwargs = {} if cfg.address else {"num_cpus": cfg.max_workers or 2}
        return RayTaskRunner(address=cfg.address, init_kwargs=init_kwargs)
    raise XylentError(f"unknown runner kind {cfg.kind!r}", where="spec field runner.kind")


def _submit_all(runner, task, calls: list[dict]) -> list:
    """Submit ``task`` once per parameter dict on an entered ``runner``; return futures.
    (Runners come from the spec at run time: a flow decorator's runner is fixed at import.)"""
    return [runner.submit(task, parameters=kw) for kw in calls]


@dataclass(frozen=True)
class Ran:
    """A task's result with the worker process that ran it (``host:pid``) and the seconds its body took
    there: a task that returns :func:`ran` tells :func:`run_tasks` where it ran and for how long, so a
    stage can say how its work spread and how busy each worker was. Where a worker process runs one task
    at a time (Dask, Ray, processes), the rest of a phase's time is spent outside the bodies: the runner's
    scheduling, moving arguments and results, Prefect's records of each task run, a fresh worker's imports;
    the threads runner's one process adds up the seconds of its threads."""

    value: Any
    worker: str
    seconds: float = 0.0


def ran(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Ran:
    """``fn(*args, **kwargs)`` timed, as a :class:`Ran`."""
    start = time.perf_counter()
    value = fn(*args, **kwargs)
    return Ran(value, f"{socket.gethostname()}:{os.getpid()}", round(time.perf_counter() - start, 4))


def worker_spread(items: list[dict], calls: dict[str, list[dict]], workers: dict[str, list[tuple[str, float]]], *,
                  split: tuple[str, ...]) -> dict:
    """How each phase's tasks spread over the runner's worker processes (``workers``: each phase's
    (worker, seconds) of its :class:`Ran` results, in the order of its ``calls``): tasks per worker, the
    seconds each worker spent in task bodies (``busy_s``; beside the phase's wall time, what the runner
    itself cost) and, for the ``split`` phases (those whose calls carry ``items`` of a group's parts), how
    many workers ran the largest group's (the language or pair of most parts) share: 1 means one
    language's work did not spread."""
    parts = Counter((it["kind"], it["name"]) for it in items)
    largest = max(parts, key=parts.get) if parts else None
    out = {"largest_group": None if largest is None else {"kind": largest[0], "name": largest[1],
                                                          "parts": parts[largest]}, "phases": {}}
    for name, ran_on in workers.items():
        ws = [w for w, _ in ran_on]
        tasks = dict(Counter(ws))
        busy: dict[str, float] = {}
        for w, sec in ran_on:
            busy[w] = round(busy.get(w, 0.0) + sec, 3)
        phase = {"tasks": tasks, "workers": len(tasks), "tasks_max": max(tasks.values(), default=0),
                 "tasks_min": min(tasks.values(), default=0), "busy_s": busy,
                 "busy_max_s": max(busy.values(), default=0.0), "busy_sum_s": round(sum(busy.values()), 3)}
        if name in split and largest is not None:
            phase["largest_group_workers"] = len({w for call, w in zip(calls[name], ws)
                                                   if any((it["kind"], it["name"]) == largest for it in call["items"])})
        out["phases"][name] = phase
    return out


@contextlib.contextmanager
def timed(seconds: dict[str, float], phase: str) -> Iterator[None]:
    """``seconds[phase]``: the block's wall-clock seconds (the phases :func:`record_spread` records)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[phase] = round(time.perf_counter() - start, 3)


def record_spread(outcome: StageOutcome, spread: dict, seconds: dict[str, float]) -> StageOutcome:
    """The manifest keeps the spread whole (``workers``) and each phase's seconds (``phase_seconds``);
    the metrics their numbers (``workers.<phase>.*``, ``seconds.<phase>``) for MLflow's charts."""
    outcome.manifest["workers"] = spread
    outcome.manifest["phase_seconds"] = seconds
    outcome.metrics.update({f"workers.{name}.{k}": v for name, s in spread["phases"].items()
                            for k, v in s.items() if not isinstance(v, dict)})
    outcome.metrics.update({f"seconds.{name}": v for name, v in seconds.items()})
    return outcome


def run_tasks(task, calls: list[dict], *, runner, title: str = "", unit: str = "tasks",
              key: str | None = None, progress: Progress | None = None, count: bool = True,
              workers: list[tuple[str, float]] | None = None) -> Iterator:
    """Run ``task`` once per parameter dict on ``runner`` (a RunnerConfig, or an
    already entered task runner), yielding results in submission order.

    A task's :class:`Ran` result is yielded as its value, and its (worker, seconds) appended to
    ``workers`` (in submission order) when one is given.

    Without ``progress`` a bar (terminal + Prefect UI) counts finished tasks;
    pass your own to share one bar between several fan-outs (``count=False``:
    the caller or the tasks themselves advance it, e.g. by bytes or by phase)."""
    own = progress is None
    if own:
        progress = Progress(title, len(calls), unit=unit, key=key)
    try:
        if isinstance(runner, RunnerConfig):
            with make_task_runner(runner) as entered:
                yield from _results(entered, task, calls, progress if count else None, workers)
        else:
            yield from _results(runner, task, calls, progress if count else None, workers)
    finally:
        if own:
            progress.close()


def _results(runner, task, calls, progress, workers):
    from xylent import interrupt

    try:
        for fut in _submit_all(runner, task, calls):
            out = fut.result()
            if isinstance(out, Ran):
                if workers is not None:
                    workers.append((out.worker, out.seconds))
                out = out.value
            yield out
            if progress is not None:
                progress.advance(1)
    except BaseException as exc:
        if not isinstance(exc, Exception):  # Ctrl-C / SIGTERM while waiting: the task runner's exit waits
            interrupt.request()             # for its running tasks, so they must hear it now, not after
        raise


def batches(items: list, n: int) -> list[list]:
    """``items`` dealt round-robin into at most ``n`` non-empty batches (tasks stay
    few when the work items are many and small)."""
    n = max(1, min(len(items), n))
    return [items[i::n] for i in range(n)] if items else []


def task_slots(cfg: RunnerConfig) -> int:
    """How many tasks to cut fan-out work into: a few per worker, so a slow one
    does not hold the others up."""
    return 4 * (cfg.max_workers or 2)
