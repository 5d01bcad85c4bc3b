"""vocab flow: a SentencePiece grid per language (in parallel), then VoCAP's composition."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from xylent.flows.kit.stage import StageContext, StageOutcome, stage_flow
from xylent.flows.registry import STAGE_BY_NAME
from xylent.flows.kit.runners import run_tasks
from xylent.spec import VocabConfig


@task(name="vocab-grid", task_run_name="grid {lang}", cache_policy=NO_CACHE)
def grid_task(lang: str, parts: list[Path], out: Path, cfg: VocabConfig, seed: int) -> dict:
    from xylent.tasks.vocab.run import language_grid

    return language_grid(lang, parts, out, cfg, seed)


@stage_flow(STAGE_BY_NAME["vocab"])
def vocab(ctx: StageContext) -> StageOutcome:
    from xylent.tasks.dedup.contract import read_counts
    from xylent.tasks.prepare import contract as layout  # the text layout
    from xylent.tasks.vocab.run import compose, no_text_error

    dedup_dir, cfg, grid = ctx.upstream["dedup"], ctx.spec.vocab, ctx.out / "_grid"
    langs = layout.group_names(dedup_dir, layout.MONO)
    if not langs:
        raise no_text_error(dedup_dir)
    calls = [{"lang": lang, "parts": layout.group_parts(dedup_dir, layout.MONO, lang), "out": grid, "cfg": cfg,
              "seed": ctx.spec.seed} for lang in langs]
    results = {r["lang"]: r for r in run_tasks(grid_task, calls, runner=ctx.spec.runner, title="vocab grids",
                                               unit="languages", key="vocab-progress")}
    outcome = compose(results, read_counts(dedup_dir)[0], grid, cfg, ctx.spec.seed, ctx.out)
    outcome.warnings.extend(f"{lang} is in the spec's languages but has no text after prepare and dedup: the "
                            "vocabulary covers it only through other languages' pieces"
                            for lang in ctx.spec.languages if lang not in langs)
    return outcome
