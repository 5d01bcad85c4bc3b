"""shards flow: dedup's Parquet + vocab's tokenizer -> memory-mappable Arrow shards."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402
import sentencepiece as spm  # noqa: E402
from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from flows.stage import Invocation, StageOutcome, markdown_table, run_stage_flow  # noqa: E402
from tasks.shards.build import encode_pairs, pack_language  # noqa: E402
from xylent.progress import Progress  # noqa: E402
from xylent.runners import make_task_runner, submit_all  # noqa: E402
from xylent.spec import ShardsConfig  # noqa: E402
from xylent.workspace import sha256_file  # noqa: E402


@task(name="shard", task_run_name="shard {kind} {name}", cache_policy=NO_CACHE)
def shard_task(kind: str, name: str, parts: list[str], model: str, out: str, cfg: ShardsConfig) -> dict:
    sp = spm.SentencePieceProcessor(model_file=model)
    dest = Path(out) / kind / (f"lang={name}" if kind == "mrtd" else f"pair={name}")
    fn = pack_language if kind == "mrtd" else encode_pairs
    result = fn([Path(p) for p in parts], sp, dest, cfg.seq_len, cfg.shard_mb << 20)
    shards = result.pop("shards").finish(Path(out))
    return {"kind": kind, "name": name, **result, "shards": shards,
            "rows": sum(s["rows"] for s in shards), "tokens": sum(s["tokens"] for s in shards)}


def _body(inv: Invocation):
    cfg = inv.spec.shards

    def body(tmp: Path, upstream: dict, run_id: str) -> StageOutcome:
        dedup_dir, model = upstream["dedup"], upstream["vocab"] / "spm.model"
        calls = []
        for kind, sub, prefix in (("mrtd", "mono", "lang="), ("trtd", "bitext", "pair=")):
            for group in sorted((dedup_dir / sub).glob(f"{prefix}*")):
                calls.append({"kind": kind, "name": group.name.removeprefix(prefix),
                              "parts": [str(p) for p in sorted(group.glob("*.parquet"))],
                              "model": str(model), "out": str(tmp), "cfg": cfg})
        progress = Progress("shards", len(calls), unit="groups", key="shards-progress")
        results = []
        try:
            with make_task_runner(inv.spec.runner) as runner:
                for fut in submit_all(runner, shard_task, calls):
                    results.append(fut.result())
                    progress.advance(1)
        finally:
            progress.close()
        index = {"seq_len": cfg.seq_len, "tokenizer": {"path": str(model), "sha256": sha256_file(model)},
                 "specials": {"unk": 0, "bos": 1, "eos": 2, "pad": 3, "mask": 4}, "mrtd": {}, "trtd": {}}
        for r in sorted(results, key=lambda r: (r["kind"], r["name"])):
            index[r["kind"]][r["name"]] = {k: v for k, v in r.items() if k not in ("kind", "name")}
        (tmp / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
        stats = pl.DataFrame([{"kind": r["kind"], "name": r["name"], "rows": r["rows"], "tokens": r["tokens"],
                               "shards": len(r["shards"]), "truncated": r.get("truncated", 0),
                               "documents": r.get("documents", 0)} for r in results]).sort("kind", "name")
        stats.write_parquet(tmp / "shards_stats.parquet")
        _tokens_plot(stats, tmp / "tokens_per_language.png")
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


def _tokens_plot(stats: pl.DataFrame, path: Path) -> None:
    mono = stats.filter(pl.col("kind") == "mrtd").sort("tokens", descending=True)
    fig, ax = plt.subplots(figsize=(max(6, 0.4 * len(mono)), 4))
    ax.bar(mono["name"].to_list(), mono["tokens"].to_list())
    ax.set_ylabel("MRTD tokens")
    ax.set_title("Tokens per language in the shards")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


@flow(name="shards", log_prints=True)
def shards(spec_file: str, workspace: str | None = None, overrides: list[str] | None = None,
           force: bool = False, mlflow_parent_run_id: str | None = None):
    """Tokenise and pack the cleaned text into Arrow shards for pretraining."""
    inv = Invocation.open(spec_file, workspace, overrides, mlflow_parent_run_id, "shards")
    return run_stage_flow(inv, "shards", force, _body(inv))
