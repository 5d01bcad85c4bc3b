"""shards flow: dedup's Parquet + vocab's tokenizer -> memory-mappable Arrow shards."""

from __future__ import annotations

import shutil
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from xylent.flows.kit.stage import StageContext, StageOutcome, stage_flow
from xylent.flows.kit.progress import Progress
from xylent.flows.registry import STAGE_BY_NAME
from xylent.flows.kit.runners import (Ran, batches, make_task_runner, ran, record_spread, run_tasks, task_slots,
                                      timed, worker_spread)
from xylent.spec import ShardsConfig


@task(name="tokenize", cache_policy=NO_CACHE)
def tokenize_task(items: list[dict], model: Path, out: Path, cfg: ShardsConfig) -> Ran:
    from xylent.tasks.shards.run import tokenize_items

    return ran(tokenize_items, items, model, out, cfg.seq_len, cfg.shard_mb << 20)


@task(name="pack", task_run_name="pack {name}", cache_policy=NO_CACHE)
def pack_task(name: str, tokenized: list[dict], out: Path, cfg: ShardsConfig, specials: dict) -> Ran:
    from xylent.tasks.shards.run import pack_part

    return ran(pack_part, name, tokenized, out, cfg.seq_len, cfg.shard_mb << 20, specials)


@stage_flow(STAGE_BY_NAME["shards"])
def shards(ctx: StageContext) -> StageOutcome:
    from xylent.tasks.shards.run import assemble, work_items
    from xylent.tasks.vocab.contract import tokenizer_and_specials, tokenizer_path

    cfg = ctx.spec.shards
    model = tokenizer_path(ctx.upstream["vocab"])
    _, specials = tokenizer_and_specials(ctx.upstream["vocab"])  # refused here when the vocab lacks a special piece
    items = work_items(ctx.upstream["dedup"])
    tokenize_calls = [{"items": b, "model": model, "out": ctx.out, "cfg": cfg}
                      for b in batches(items, task_slots(ctx.spec.runner))]
    progress = Progress("shards", len(tokenize_calls), unit="tasks", key="shards-progress")
    ran_by, seconds = {"tokenize": [], "pack": []}, {}
    try:
        with make_task_runner(ctx.spec.runner) as runner:
            with timed(seconds, "tokenize"):
                done = [d for batch in run_tasks(tokenize_task, tokenize_calls, runner=runner, progress=progress,
                                                 workers=ran_by["tokenize"]) for d in batch]
            langs = sorted({d["name"] for d in done if d["kind"] == "mrtd"})
            with timed(seconds, "pack"):
                packed = list(run_tasks(pack_task, [
                    {"name": lang, "tokenized": sorted((d for d in done if d["kind"] == "mrtd" and d["name"] == lang),
                                                       key=lambda d: d["idx"]),
                     "out": ctx.out, "cfg": cfg, "specials": specials} for lang in langs], runner=runner,
                    progress=progress, count=False, workers=ran_by["pack"]))
    finally:
        progress.close()
    shutil.rmtree(ctx.out / "_tokens", ignore_errors=True)
    with timed(seconds, "assemble"):
        outcome = assemble(packed, done, model, specials, cfg, ctx.out)
    # a language's parts are tokenised by any worker; its packing is one task (a sequence carries over parts)
    return record_spread(outcome, worker_spread(items, {"tokenize": tokenize_calls}, ran_by, split=("tokenize",)),
                         seconds)
