"""dedup flow: map / reduce / resolve / apply over prepare's parts, on the spec's task runner."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from xylent.flows.kit.stage import StageContext, StageOutcome, stage_flow
from xylent.flows.kit.progress import Progress
from xylent.flows.registry import STAGE_BY_NAME
from xylent.flows.kit.runners import (batches, make_task_runner, ran, record_spread, run_tasks, task_slots, timed,
                                      worker_spread)


@task(name="dedup-map", cache_policy=NO_CACHE)
def map_task(items, work, cfg, languages):
    from xylent.tasks.dedup import run as phases

    return ran(phases.map_items, items, work, cfg, languages)


@task(name="dedup-reduce", cache_policy=NO_CACHE)
def reduce_task(items, work, cfg):
    from xylent.tasks.dedup import run as phases

    return ran(phases.reduce_buckets, items, work, cfg)


@task(name="dedup-resolve", cache_policy=NO_CACHE)
def resolve_task(names, work):
    from xylent.tasks.dedup import run as phases

    return ran(phases.resolve_languages, names, work)


@task(name="dedup-apply", cache_policy=NO_CACHE)
def apply_task(items, work, out, cfg):
    from xylent.tasks.dedup import run as phases

    return ran(phases.apply_items, items, work, out, cfg)


@stage_flow(STAGE_BY_NAME["dedup"])
def dedup(ctx: StageContext) -> StageOutcome:
    from xylent.tasks.dedup.run import assemble, plan_buckets
    from xylent.tasks.prepare import contract as layout  # the text layout

    cfg = ctx.spec.dedup
    items = [p.as_dict() for p in layout.parts(ctx.upstream["prepare"])]
    work = ctx.out / "_work"
    buckets = plan_buckets(items, cfg.buckets)
    names = sorted({(it["kind"], it["name"]) for it in items})
    monos = [n for k, n in names if k == "mono"] if cfg.near else []
    n = task_slots(ctx.spec.runner)
    phases = [  # one after the other: each reads what the one before wrote
        ("map", map_task, [{"items": b, "work": work, "cfg": cfg, "languages": tuple(ctx.spec.languages)}
                    for b in batches(items, n)]),
        ("reduce", reduce_task, [{"items": b, "work": work, "cfg": cfg} for b in batches(buckets, n)]),
        ("resolve", resolve_task, [{"names": b, "work": work} for b in batches(monos, n)]),
        ("apply", apply_task, [{"items": b, "work": work, "out": ctx.out, "cfg": cfg} for b in batches(items, n)]),
    ]
    # a bar of tasks, not of phases: counted in phases it sat at 0/4 through the long first one
    progress = Progress("dedup", sum(len(calls) for _, _, calls in phases), unit="tasks", key="dedup-progress")
    ran_by = {name: [] for name, _, _ in phases}
    seconds, done = {}, []
    try:
        with make_task_runner(ctx.spec.runner) as runner:
            for name, phase, calls in phases:
                with timed(seconds, name):
                    done.append(list(run_tasks(phase, calls, runner=runner, progress=progress,
                                               workers=ran_by[name])))
    finally:
        progress.close()
    applied = [r for rs in done[-1] for r in rs]
    with timed(seconds, "assemble"):
        outcome = assemble(items, applied, work, ctx.out, cfg.samples_per_reason)
    spread = worker_spread(items, {name: calls for name, _, calls in phases}, ran_by, split=("map", "apply"))
    return record_spread(outcome, spread, seconds)
