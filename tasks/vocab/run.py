"""What the vocab flow calls: one language's SentencePiece grid (:func:`language_grid`, in
parallel), then VoCAP's composition once every grid is trained (:func:`compose`): α-smoothed
language weights, the allocation under the budget, the merged tokenizer, the joint baseline,
the comparison table, plots and report (METHODS.md steps 3–5)."""

from __future__ import annotations

import shutil
from functools import lru_cache
from pathlib import Path

import polars as pl

from xylent.distributions import language_distribution
from xylent.errors import XylentError
from xylent.markdown import markdown_table
from xylent.spec import VocabConfig
from xylent.stage import StageOutcome

from xylent.tasks.vocab.allocate import allocate_vocabulary
from xylent.tasks.vocab.alp import evaluate_tokenizer
from xylent.tasks.vocab.merge import merge_vocab_model
from xylent.tasks.vocab.contract import ALLOCATION_FILE, COMPARISON_FILE, JOINT_MODEL_FILE, MODEL_FILE, VOCAB_FILE
from xylent.tasks.vocab.plots import allocation_bars, alp_curves, tokens_per_sentence
from xylent.tasks.vocab.train import model_pieces, sample_language, train_grid, train_joint


def language_grid(lang: str, parts: list[Path], out: Path, cfg: VocabConfig, seed: int) -> dict:
    """One language's grid of SentencePiece models on its sample, with the sample and held-out sentences."""
    train, held = sample_language(parts, cfg, seed)
    return {**train_grid(lang, train, held, out, cfg, seed), "held": held, "train_sample": train}


def no_text_error(where: Path) -> XylentError:
    return XylentError("there is no monolingual text to build a vocabulary from", where=str(where),
                       fix="add monolingual sources (or bitexts, whose sides count as monolingual text)")


def compose(results: dict[str, dict], examples: dict[str, int], grid_dir: Path, cfg: VocabConfig, seed: int,
            out: Path) -> StageOutcome:
    """``results``: language -> its grid (points, failures, held, train_sample) from
    :func:`xylent.tasks.vocab.train.train_grid`; ``grid_dir`` holds the grid's models
    (removed here: the chosen pieces live on in spm.model)."""
    langs = sorted(results)
    usable = [lang for lang in langs if results[lang]["points"]]
    skipped = {lang: results[lang]["failures"][0]["reason"] for lang in langs if lang not in usable}
    if not usable:
        why = "; ".join(f"{lang}: {reason}" for lang, reason in skipped.items())
        raise XylentError(f"no language has enough text for the smallest vocabulary size ({why})",
                          where="spec field vocab.grid", fix="use smaller grid sizes, or more text")
    q = dict(zip(usable, language_distribution([examples.get(lang, 0) for lang in usable], cfg.alpha,
                                               field="vocab.alpha")))

    @lru_cache(maxsize=256)  # the allocation scan asks for each grid model once: keep few in memory
    def pieces(lang: str, size: int) -> frozenset:
        return frozenset(model_pieces(grid_dir / f"{lang}.{size}.model"))

    report: dict = {}
    chosen = allocate_vocabulary({lang: results[lang]["points"] for lang in usable}, q, cfg.budget, pieces,
                                 beta=cfg.beta, report=report)
    final = merge_vocab_model(grid_dir / f"{usable[0]}.{chosen[usable[0]]}.model",
                        {lang: model_pieces(grid_dir / f"{lang}.{chosen[lang]}.model") for lang in usable},
                        q, cfg.byte_fallback, out / MODEL_FILE)
    vocab_size = sum(1 for _ in open(out / VOCAB_FILE, encoding="utf-8"))
    held = {lang: results[lang]["held"] for lang in langs}
    metrics_v = evaluate_tokenizer(str(final), held)
    metrics_j = {}
    if cfg.joint_baseline:
        joint = train_joint({lang: results[lang]["train_sample"] for lang in usable}, q, vocab_size, grid_dir,
                            cfg, seed)
        shutil.copyfile(joint, out / JOINT_MODEL_FILE)
        metrics_j = evaluate_tokenizer(str(out / JOINT_MODEL_FILE), held)
    shutil.rmtree(grid_dir)

    alloc = pl.DataFrame([{
        "lang": lang, "examples": examples.get(lang, 0), "q": q.get(lang),
        "weight": q[lang] ** cfg.beta if lang in q else None,
        "sizes": [s for s, _ in results[lang]["points"]], "alp": [a for _, a in results[lang]["points"]],
        "alp_smoothed": [a for _, a in report["smoothed"].get(lang, [])],
        "chosen_size": chosen.get(lang), "capped": lang in report["capped"],
        "failed_sizes": [f"{f['size']}: {f['reason']}" for f in results[lang]["failures"]],
    } for lang in langs], schema_overrides={"chosen_size": pl.Int64, "q": pl.Float64, "weight": pl.Float64})
    alloc.write_parquet(out / ALLOCATION_FILE)
    cmp = pl.DataFrame([{
        "lang": lang, "examples": examples.get(lang, 0),
        **{f"{k}_vocap": v for k, v in metrics_v[lang].items()},
        **{f"{k}_joint": v for k, v in metrics_j.get(lang, {}).items()},
    } for lang in langs])
    cmp.write_parquet(out / COMPARISON_FILE)
    alp_curves(alloc, out / "alp_curves.png")
    allocation_bars(alloc.filter(pl.col("chosen_size").is_not_null()), out / "allocation.png")
    if metrics_j:
        tokens_per_sentence(cmp, out / "tokens_per_sentence.png")

    metrics = {"vocab_size": vocab_size, "union_size": report["union_size"], "budget": cfg.budget,
               "threshold": report["threshold"], "languages": len(usable), "capped": len(report["capped"])}
    for lang in langs:
        if lang in chosen:
            metrics[f"allocated.{lang}"] = chosen[lang]
        metrics[f"tokens_per_sentence.vocap.{lang}"] = metrics_v[lang]["tokens_per_sentence"]
        if metrics_j:
            metrics[f"tokens_per_sentence.joint.{lang}"] = metrics_j[lang]["tokens_per_sentence"]
    tips, notes = [], []  # tips: how to do better; notes: what the user must hear (warnings)
    if report["capped"]:
        tips.append(f"languages at the grid's maximum while budget remained (extend vocab.grid): "
                    f"{', '.join(report['capped'])}")
    if report["over_budget_at_floor"]:
        notes.append(f"even the smallest grid sizes exceed the budget ({report['union_size']} > {cfg.budget}); "
                     "every language got the smallest size")
    for lang, reason in skipped.items():
        notes.append(f"{lang}: no grid size could be trained ({reason}); covered by other languages' pieces"
                     + (" and byte fallback" if cfg.byte_fallback else ""))
    summary = "\n".join([
        f"VoCAP vocabulary: **{vocab_size}** pieces (union of the chosen vocabularies: {report['union_size']}, "
        f"budget {cfg.budget}).", "", *[f"- **note:** {n}" for n in tips + notes], "",
        markdown_table(cmp.select("lang", "examples", "tokens_per_sentence_vocap",
                                  *(["tokens_per_sentence_joint"] if metrics_j else []),
                                  "unk_rate_vocap", "chars_per_token_vocap").to_dicts()),
        "", markdown_table(alloc.select("lang", "q", "chosen_size", "capped").to_dicts()),
    ])
    (out / "report.md").write_text(summary)
    return StageOutcome(metrics=metrics, table=cmp.to_dicts(), summary=summary, manifest={"notes": tips + notes},
                        warnings=notes)
