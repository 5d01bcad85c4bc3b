"""shards flow: dedup's Parquet + vocab's tokenizer -> memory-mappable Arrow shards."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import sentencepiece as spm
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.stage import Invocation, StageOutcome, markdown_table, run_stage_flow
from tasks.shards.build import encode_pairs, pack_tokens, tokenize_part
from tasks.shards.plots import tokens_per_language
from xylent.progress import Progress
from xylent.runners import make_task_runner, submit_all
from xylent.spec import ShardsConfig
from xylent.workspace import sha256_file


@task(name="tokenize", cache_policy=NO_CACHE)
def tokenize_task(items: list[dict], model: str, out: str, cfg: ShardsConfig) -> list[dict]:
    """A batch of Parquet parts (tasks stay few when parts are many and small)."""
    sp = spm.SentencePieceProcessor(model_file=model)
    return [_tokenize(sp, **it, out=out, cfg=cfg) for it in items]


def _tokenize(sp, kind: str, name: str, idx: int, part: str, out: str, cfg: ShardsConfig) -> dict:
    """One Parquet part: MRTD parts become token files to pack; TRTD parts become shards directly."""
    if kind == "mrtd":
        return {"kind": kind, "name": name, "idx": idx,
                **tokenize_part(Path(part), sp, Path(out) / "_tokens" / name / f"p{idx:05d}.npz")}
    dest = Path(out) / "trtd" / f"pair={name}"
    result = encode_pairs([Path(part)], sp, dest, cfg.seq_len, cfg.shard_mb << 20, prefix=f"shard-{idx:05d}")
    return {"kind": kind, "name": name, "idx": idx, **result, "shards": result["shards"].finish(Path(out))}


@task(name="pack", task_run_name="pack {name}", cache_policy=NO_CACHE)
def pack_task(name: str, tokenized: list[dict], out: str, cfg: ShardsConfig, specials: dict) -> dict:
    dest = Path(out) / "mrtd" / f"lang={name}"
    result = pack_tokens(tokenized, dest, cfg.seq_len, cfg.shard_mb << 20, specials["bos"], specials["eos"])
    return {"kind": "mrtd", "name": name, **result, "shards": result["shards"].finish(Path(out))}


def _merge_pairs(parts: list[dict]) -> dict:
    first = parts[0]
    out = {"kind": "trtd", "name": first["name"], "shards": [sh for p in parts for sh in p["shards"]]}
    for key in ("pairs", "truncated", "text_tokens"):
        out[key] = sum(p[key] for p in parts)
    return out


def _body(inv: Invocation):
    cfg = inv.spec.shards

    def body(tmp: Path, upstream: dict, run_id: str) -> StageOutcome:
        dedup_dir, model = upstream["dedup"], upstream["vocab"] / "spm.model"
        sp = spm.SentencePieceProcessor(model_file=str(model))
        specials = {"unk": sp.unk_id(), "bos": sp.bos_id(), "eos": sp.eos_id(), "pad": sp.pad_id(),
                    "mask": sp.piece_to_id("<mask>")}
        calls = []
        for kind, sub, prefix in (("mrtd", "mono", "lang="), ("trtd", "bitext", "pair=")):
            for group in sorted((dedup_dir / sub).glob(f"{prefix}*")):
                for idx, part in enumerate(sorted(group.glob("*.parquet"))):
                    calls.append({"kind": kind, "name": group.name.removeprefix(prefix), "idx": idx,
                                  "part": str(part)})
        # parts in parallel: batched (largest first, dealt round-robin) into at most 4 x workers tasks
        calls.sort(key=lambda c: -Path(c["part"]).stat().st_size)
        n_tasks = max(1, min(len(calls), 4 * (inv.spec.runner.max_workers or 2)))
        batches = [calls[i::n_tasks] for i in range(n_tasks)]
        progress = Progress("shards", len(batches), unit="tasks", key="shards-progress")
        done = []
        try:
            with make_task_runner(inv.spec.runner) as runner:
                for fut in submit_all(runner, tokenize_task, [
                        {"items": b, "model": str(model), "out": str(tmp), "cfg": cfg} for b in batches]):
                    done.extend(fut.result())
                    progress.advance(1)
                langs = sorted({d["name"] for d in done if d["kind"] == "mrtd"})
                packs = submit_all(runner, pack_task, [
                    {"name": lang, "tokenized": sorted((d for d in done if d["kind"] == "mrtd" and d["name"] == lang),
                                                       key=lambda d: d["idx"]),
                     "out": str(tmp), "cfg": cfg, "specials": specials} for lang in langs])
                results = [f.result() for f in packs]
        finally:
            progress.close()
        shutil.rmtree(tmp / "_tokens", ignore_errors=True)
        for pair in sorted({d["name"] for d in done if d["kind"] == "trtd"}):
            results.append(_merge_pairs(sorted((d for d in done if d["kind"] == "trtd" and d["name"] == pair),
                                               key=lambda d: d["idx"])))
        for r in results:
            r["rows"] = sum(s["rows"] for s in r["shards"])
            r["tokens"] = sum(s["tokens"] for s in r["shards"])
        index = {"seq_len": cfg.seq_len, "tokenizer": {"path": str(model), "sha256": sha256_file(model)},
                 "specials": specials, "mrtd": {}, "trtd": {}}
        for r in sorted(results, key=lambda r: (r["kind"], r["name"])):
            index[r["kind"]][r["name"]] = {k: v for k, v in r.items() if k not in ("kind", "name")}
        (tmp / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
        stats = pl.DataFrame([{"kind": r["kind"], "name": r["name"], "rows": r["rows"], "tokens": r["tokens"],
                               "shards": len(r["shards"]), "truncated": r.get("truncated", 0),
                               "documents": r.get("documents", 0)} for r in results]).sort("kind", "name")
        stats.write_parquet(tmp / "shards_stats.parquet")
        tokens_per_language(stats, tmp / "tokens_per_language.png")
        metrics = {"mrtd.sequences": float(stats.filter(pl.col("kind") == "mrtd")["rows"].sum()),
                   "mrtd.tokens": float(stats.filter(pl.col("kind") == "mrtd")["tokens"].sum()),
                   "trtd.pairs": float(stats.filter(pl.col("kind") == "trtd")["rows"].sum()),
                   "trtd.tokens": float(stats.filter(pl.col("kind") == "trtd")["tokens"].sum()),
                   "trtd.truncated": float(stats["truncated"].sum())}
        for r in stats.filter(pl.col("kind") == "mrtd").iter_rows(named=True):
            metrics[f"mrtd.tokens.{r['name']}"] = r["tokens"]
        summary = (f"{metrics['mrtd.sequences']:.0f} MRTD sequences of {cfg.seq_len} tokens, "
                   f"{metrics['trtd.pairs']:.0f} TRTD pairs ({metrics['trtd.truncated']:.0f} truncated).\n\n"
                   + markdown_table(stats.filter(pl.col("kind") == "mrtd").to_dicts()))
        return StageOutcome(metrics=metrics, table=stats.to_dicts(), summary=summary)

    return body


@flow(name="shards", log_prints=True)
def shards(spec_file: str, workspace: str | None = None, overrides: list[str] | None = None,
           force: bool = False, mlflow_parent_run_id: str | None = None):
    """Tokenise and pack the cleaned text into Arrow shards for pretraining."""
    inv = Invocation.open(spec_file, workspace, overrides, mlflow_parent_run_id, "shards")
    return run_stage_flow(inv, "shards", force, _body(inv))
