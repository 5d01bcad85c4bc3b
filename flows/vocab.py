"""vocab flow: VoCAP vocabulary construction with a joint-SentencePiece baseline."""

from __future__ import annotations

import shutil
from functools import lru_cache
from pathlib import Path

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.stage import Invocation, StageOutcome, markdown_table, run_stage_flow
from tasks.sampling import language_distribution
from tasks.vocab import allocate_vocabulary, evaluate_tokenizer
from tasks.vocab.merge import build_model
from tasks.vocab.plots import allocation_bars, alp_curves, tokens_per_sentence
from tasks.vocab.train import model_pieces, sample_language, train_grid, train_joint
from xylent.errors import XylentError
from xylent.progress import Progress
from xylent.runners import make_task_runner, submit_all
from xylent.spec import VocabConfig


@task(name="vocab-grid", task_run_name="grid {lang}", cache_policy=NO_CACHE)
def grid_task(lang: str, parts: list[str], out: str, cfg: VocabConfig, seed: int) -> dict:
    train, held = sample_language([Path(p) for p in parts], cfg, seed)
    result = train_grid(lang, train, held, Path(out), cfg, seed)
    return {**result, "held": held, "train_sample": train}


def _body(inv: Invocation):
    cfg, seed = inv.spec.vocab, inv.spec.seed

    def body(tmp: Path, upstream: dict, run_id: str) -> StageOutcome:
        dedup_dir = upstream["dedup"]
        langs = sorted(p.name.removeprefix("lang=") for p in (dedup_dir / "mono").glob("lang=*"))
        if not langs:
            raise XylentError("there is no monolingual text to build a vocabulary from", where=str(dedup_dir),
                              fix="add monolingual sources (or bitexts, whose sides count as monolingual text)")
        stats = pl.read_parquet(dedup_dir / "dedup_stats.parquet").filter(pl.col("kind") == "mono")
        examples = dict(stats.select("name", "out").iter_rows())
        models = tmp / "_grid"
        calls = [{"lang": lang, "parts": [str(p) for p in sorted((dedup_dir / "mono" / f"lang={lang}").glob("*.parquet"))],
                  "out": str(models), "cfg": cfg, "seed": seed} for lang in langs]
        progress = Progress("vocab grids", len(calls), unit="languages", key="vocab-progress")
        results = {}
        try:
            with make_task_runner(inv.spec.runner) as runner:
                for fut in submit_all(runner, grid_task, calls):
                    r = fut.result()
                    results[r["lang"]] = r
                    progress.advance(1)
        finally:
            progress.close()

        usable = [lang for lang in langs if results[lang]["points"]]
        skipped = {lang: results[lang]["failures"][0]["reason"] for lang in langs if lang not in usable}
        if not usable:
            why = "; ".join(f"{lang}: {reason}" for lang, reason in skipped.items())
            raise XylentError(f"no language has enough text for the smallest vocabulary size ({why})",
                              where="spec field vocab.grid", fix="use smaller grid sizes, or more text")
        sizes = [examples.get(lang, 0) for lang in usable]
        q = dict(zip(usable, language_distribution(sizes, cfg.alpha)))

        @lru_cache(maxsize=None)
        def pieces(lang: str, size: int) -> frozenset:
            return frozenset(model_pieces(models / f"{lang}.{size}.model"))

        report: dict = {}
        chosen = allocate_vocabulary({lang: results[lang]["points"] for lang in usable}, q, cfg.budget, pieces,
                                     beta=cfg.beta, report=report)
        final = build_model(models / f"{usable[0]}.{chosen[usable[0]]}.model",
                            {lang: model_pieces(models / f"{lang}.{chosen[lang]}.model") for lang in usable},
                            q, cfg.byte_fallback, tmp / "spm.model")
        vocab_size = sum(1 for _ in open(tmp / "spm.vocab", encoding="utf-8"))
        held = {lang: results[lang]["held"] for lang in langs}
        metrics_v = evaluate_tokenizer(str(final), held)
        metrics_j = {}
        if cfg.joint_baseline:
            joint = train_joint({lang: results[lang]["train_sample"] for lang in usable}, q, vocab_size, models,
                                cfg, seed)
            shutil.copyfile(joint, tmp / "joint.model")
            metrics_j = evaluate_tokenizer(str(tmp / "joint.model"), held)
        shutil.rmtree(models)  # the grid's models are intermediate; the chosen pieces live in spm.model

        alloc = pl.DataFrame([{
            "lang": lang, "examples": examples.get(lang, 0), "q": q.get(lang), "weight": q.get(lang, 0) ** cfg.beta if lang in q else None,
            "sizes": [s for s, _ in results[lang]["points"]], "alp": [a for _, a in results[lang]["points"]],
            "alp_smoothed": [a for _, a in report["smoothed"].get(lang, [])],
            "chosen_size": chosen.get(lang), "capped": lang in report["capped"],
            "failed_sizes": [f"{f['size']}: {f['reason']}" for f in results[lang]["failures"]],
        } for lang in langs], schema_overrides={"chosen_size": pl.Int64, "q": pl.Float64, "weight": pl.Float64})
        alloc.write_parquet(tmp / "allocation.parquet")
        cmp = pl.DataFrame([{
            "lang": lang, "examples": examples.get(lang, 0),
            **{f"{k}_vocap": v for k, v in metrics_v[lang].items()},
            **{f"{k}_joint": v for k, v in metrics_j.get(lang, {}).items()},
        } for lang in langs])
        cmp.write_parquet(tmp / "comparison.parquet")
        alp_curves(alloc, tmp / "alp_curves.png")
        allocation_bars(alloc.filter(pl.col("chosen_size").is_not_null()), tmp / "allocation.png")
        if metrics_j:
            tokens_per_sentence(cmp, tmp / "tokens_per_sentence.png")

        metrics = {"vocab_size": vocab_size, "union_size": report["union_size"], "budget": cfg.budget,
                   "threshold": report["threshold"], "languages": len(usable), "capped": len(report["capped"])}
        for lang in langs:
            if lang in chosen:
                metrics[f"allocated.{lang}"] = chosen[lang]
            metrics[f"tokens_per_sentence.vocap.{lang}"] = metrics_v[lang]["tokens_per_sentence"]
            if metrics_j:
                metrics[f"tokens_per_sentence.joint.{lang}"] = metrics_j[lang]["tokens_per_sentence"]
        notes = []
        if report["capped"]:
            notes.append(f"languages at the grid's maximum while budget remained (extend vocab.grid): "
                         f"{', '.join(report['capped'])}")
        if report["over_budget_at_floor"]:
            notes.append(f"even the smallest grid sizes exceed the budget ({report['union_size']} > {cfg.budget}); "
                         "every language got the smallest size")
        for lang, reason in skipped.items():
            notes.append(f"{lang}: no grid size could be trained ({reason}); covered by other languages' pieces"
                         + (" and byte fallback" if cfg.byte_fallback else ""))
        summary = "\n".join([
            f"VoCAP vocabulary: **{vocab_size}** pieces (union of the chosen vocabularies: {report['union_size']}, "
            f"budget {cfg.budget}).", "", *[f"- **note:** {n}" for n in notes], "",
            markdown_table(cmp.select("lang", "examples", "tokens_per_sentence_vocap",
                                      *(["tokens_per_sentence_joint"] if metrics_j else []),
                                      "unk_rate_vocap", "chars_per_token_vocap").to_dicts()),
            "", markdown_table(alloc.select("lang", "q", "chosen_size", "capped").to_dicts()),
        ])
        (tmp / "report.md").write_text(summary)
        return StageOutcome(metrics=metrics, table=cmp.to_dicts(), summary=summary, manifest={"notes": notes})

    return body


@flow(name="vocab", log_prints=True)
def vocab(spec_file: str, workspace: str | None = None, overrides: list[str] | None = None,
          force: bool = False, mlflow_parent_run_id: str | None = None):
    """VoCAP vocabulary: per-language grids, ALP allocation under a budget, one merged model."""
    inv = Invocation.open(spec_file, workspace, overrides, mlflow_parent_run_id, "vocab")
    return run_stage_flow(inv, "vocab", force, _body(inv))
