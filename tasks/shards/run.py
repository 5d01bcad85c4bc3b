"""What the shards flow calls: which Parquet parts become which work items (:func:`work_items`), each batch's tokenising (:func:`tokenize_items`), each language's
packing (:func:`pack_part`), then the index, statistics, plot and report (:func:`assemble`)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import sentencepiece as spm

from xylent.markdown import markdown_table
from xylent.spec import ShardsConfig
from xylent.stage import StageOutcome
from xylent.workspace import sha256_file

from xylent.tasks.prepare import contract as layout  # the text layout
from xylent.tasks.shards.build import encode_pairs, pack_tokens, tokenize_part
from xylent.data.shards import MRTD_DIR, STATS_FILE, TRTD_DIR, write_index
from xylent.tasks.shards.plots import tokens_per_language

TASK_OF = {layout.MONO: "mrtd", layout.BITEXT: "trtd"}


def work_items(dedup_dir: Path) -> list[dict]:
    """One item per dedup part, largest first (so batches dealt round-robin even out)."""
    items = [{"kind": TASK_OF[p.kind], "name": p.name, "idx": p.idx, "part": str(p.path)}
             for p in layout.parts(dedup_dir)]
    return sorted(items, key=lambda c: -Path(c["part"]).stat().st_size)


def merge_pair(parts: list[dict]) -> dict:
    """A pair's TRTD shards from all its parts, in part order."""
    parts = sorted(parts, key=lambda d: d["idx"])
    out = {"kind": "trtd", "name": parts[0]["name"], "shards": [sh for p in parts for sh in p["shards"]]}
    for key in ("pairs", "truncated", "text_tokens"):
        out[key] = sum(p[key] for p in parts)
    return out


def assemble(packed: list[dict], tokenized: list[dict], model: Path, specials: dict, cfg: ShardsConfig,
             out: Path) -> StageOutcome:
    """``packed``: one result per MRTD language; ``tokenized``: every part's result (TRTD parts hold their shards)."""
    groups = list(packed)
    for pair in sorted({d["name"] for d in tokenized if d["kind"] == "trtd"}):
        groups.append(merge_pair([d for d in tokenized if d["kind"] == "trtd" and d["name"] == pair]))
    for g in groups:
        g["rows"] = sum(s["rows"] for s in g["shards"])
        g["tokens"] = sum(s["tokens"] for s in g["shards"])
    # the tokenizer by its place in the workspace (vocab/<fp>/spm.model), so the index does not name the machine
    write_index(out, seq_len=cfg.seq_len, tokenizer={"path": Path(*model.parts[-3:]).as_posix(),
                                                     "sha256": sha256_file(model)},
                specials=specials, groups=groups)
    stats = pl.DataFrame([{"kind": g["kind"], "name": g["name"], "rows": g["rows"], "tokens": g["tokens"],
                           "shards": len(g["shards"]), "truncated": g.get("truncated", 0),
                           "documents": g.get("documents", 0)} for g in groups]).sort("kind", "name")
    stats.write_parquet(out / STATS_FILE)
    tokens_per_language(stats, out / "tokens_per_language.png")
    mrtd, trtd = stats.filter(pl.col("kind") == "mrtd"), stats.filter(pl.col("kind") == "trtd")
    metrics = {"mrtd.sequences": float(mrtd["rows"].sum()), "mrtd.tokens": float(mrtd["tokens"].sum()),
               "trtd.pairs": float(trtd["rows"].sum()), "trtd.tokens": float(trtd["tokens"].sum()),
               "trtd.truncated": float(stats["truncated"].sum())}
    for r in mrtd.iter_rows(named=True):
        metrics[f"mrtd.tokens.{r['name']}"] = r["tokens"]
    summary = (f"{metrics['mrtd.sequences']:.0f} MRTD sequences of {cfg.seq_len} tokens, "
               f"{metrics['trtd.pairs']:.0f} TRTD pairs ({metrics['trtd.truncated']:.0f} truncated).\n\n"
               + markdown_table(mrtd.to_dicts()))
    return StageOutcome(metrics=metrics, table=stats.to_dicts(), summary=summary)


def tokenize_items(items: list[dict], model: Path, out: Path, seq_len: int, max_bytes: int) -> list[dict]:
    """A batch of Parquet parts (see :func:`work_items`): MRTD parts
    become token files to pack (``<out>/_tokens``); TRTD parts become shards directly."""
    sp = spm.SentencePieceProcessor(model_file=str(model))
    results = []
    for it in items:
        kind, name, idx, part = it["kind"], it["name"], it["idx"], Path(it["part"])
        if kind == "mrtd":
            results.append({"kind": kind, "name": name, "idx": idx,
                            **tokenize_part(part, sp, Path(out) / "_tokens" / name / f"p{idx:05d}.npz")})
            continue
        dest = Path(out) / TRTD_DIR.format(name=name)
        r = encode_pairs([part], sp, dest, seq_len, max_bytes, prefix=f"shard-{idx:05d}")
        results.append({"kind": kind, "name": name, "idx": idx, **r, "shards": r["shards"].finish(Path(out))})
    return results


def pack_part(name: str, tokenized: list[dict], out: Path, seq_len: int, max_bytes: int, specials: dict) -> dict:
    """One language's token files (in part order) packed into MRTD shards."""
    dest = Path(out) / MRTD_DIR.format(name=name)
    r = pack_tokens(tokenized, dest, seq_len, max_bytes, specials["bos"], specials["eos"])
    return {"kind": "mrtd", "name": name, **r, "shards": r["shards"].finish(Path(out))}
