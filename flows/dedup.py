"""dedup flow: map / reduce / apply over prepare's parts, on the spec's task runner."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.stage import Invocation, StageOutcome, markdown_table, run_stage_flow
from tasks.dedup import bitext as bitext_dedup
from tasks.dedup import mono as mono_dedup
from tasks.dedup.plots import removal_bars
from xylent.progress import Progress
from xylent.runners import make_task_runner, submit_all
from xylent.spec import DedupConfig

STAT_COLUMNS = ["kind", "name", "in", "exact", "near", "copy", "ratio", "hub", "langid", "out"]


def _inputs(prepare_dir: Path) -> list[dict]:
    """One item per input part: kind, name, part index within its language/pair, paths."""
    items = []
    for kind, prefix in (("mono", "lang="), ("bitext", "pair=")):
        for group in sorted((prepare_dir / kind).glob(f"{prefix}*")):
            for i, part in enumerate(sorted(group.glob("*.parquet"))):
                items.append({"kind": kind, "name": group.name.removeprefix(prefix), "idx": i,
                              "part": str(part), "rel": str(part.relative_to(prepare_dir))})
    return items


def _batches(items: list, n: int) -> list[list]:
    n = max(1, min(len(items), n))
    return [items[i::n] for i in range(n)] if items else []


@task(name="dedup-map", cache_policy=NO_CACHE)
def map_task(items: list[dict], work: str, cfg: DedupConfig, languages: tuple[str, ...]) -> int:
    for it in items:
        w = Path(work) / it["kind"] / it["name"]
        if it["kind"] == "mono":
            mono_dedup.map_part(Path(it["part"]), it["idx"], it["name"], w, cfg)
        else:
            bitext_dedup.map_part(Path(it["part"]), it["idx"], w, cfg, languages)
    return len(items)


@task(name="dedup-reduce", cache_policy=NO_CACHE)
def reduce_task(items: list[tuple[str, str, int]], work: str, cfg: DedupConfig) -> int:
    for kind, name, bucket in items:
        w = Path(work) / kind / name
        if kind == "mono":
            if cfg.exact:
                mono_dedup.reduce_exact(w, bucket)
            if cfg.near:
                mono_dedup.reduce_near(w, bucket, cfg)
        else:
            bitext_dedup.reduce_bucket(w, bucket, cfg)
    return len(items)


@task(name="dedup-resolve", cache_policy=NO_CACHE)
def resolve_task(names: list[str], work: str) -> int:
    return sum(mono_dedup.resolve_near(Path(work) / "mono" / n) for n in names)


@task(name="dedup-apply", cache_policy=NO_CACHE)
def apply_task(items: list[dict], work: str, out: str, cfg: DedupConfig) -> list[tuple[dict, dict, pl.DataFrame]]:
    results = []
    for it in items:
        w = Path(work) / it["kind"] / it["name"]
        dest = Path(out) / it["rel"]
        if it["kind"] == "mono":
            counts, removed = mono_dedup.apply_part(Path(it["part"]), it["idx"], dest, w, cfg)
        else:
            counts, removed = bitext_dedup.apply_part(Path(it["part"]), it["idx"], dest, w)
        keep = removed.sort("rid").group_by("reason", maintain_order=True).head(cfg.samples_per_reason)
        results.append((it, counts, keep))
    return results


def _kept_text(prepare_dir: Path, items: list[dict], kind: str, name: str, rid: int) -> str | None:
    if rid < 0:
        return None
    part = next(it for it in items if it["kind"] == kind and it["name"] == name and it["idx"] == rid >> 32)
    row = pq.read_table(part["part"], columns=["text"] if kind == "mono" else ["src", "tgt"]).slice(rid & 0xFFFFFFFF, 1)
    if kind == "mono":
        return row.column("text")[0].as_py()
    return f"{row.column('src')[0].as_py()} ||| {row.column('tgt')[0].as_py()}"


def _body(inv: Invocation, force: bool):
    cfg = inv.spec.dedup
    languages = tuple(inv.spec.languages)
    workers = inv.spec.runner.max_workers or 2

    def body(tmp: Path, upstream: dict, run_id: str) -> StageOutcome:
        prepare_dir = upstream["prepare"]
        items = _inputs(prepare_dir)
        work = tmp / "_work"
        names = sorted({(it["kind"], it["name"]) for it in items})
        buckets = [(k, n, b) for k, n in names for b in range(cfg.buckets)]
        progress = Progress("dedup", 4, unit="phases", key="dedup-progress")
        try:
            with make_task_runner(inv.spec.runner) as runner:
                n_tasks = 4 * workers
                [f.result() for f in submit_all(runner, map_task, [
                    {"items": b, "work": str(work), "cfg": cfg, "languages": languages}
                    for b in _batches(items, n_tasks)])]
                progress.advance(1)
                [f.result() for f in submit_all(runner, reduce_task, [
                    {"items": b, "work": str(work), "cfg": cfg} for b in _batches(buckets, n_tasks)])]
                progress.advance(1)
                if cfg.near:
                    monos = [n for k, n in names if k == "mono"]
                    [f.result() for f in submit_all(runner, resolve_task, [
                        {"names": b, "work": str(work)} for b in _batches(monos, n_tasks)])]
                progress.advance(1)
                applied = [r for f in submit_all(runner, apply_task, [
                    {"items": b, "work": str(work), "out": str(tmp), "cfg": cfg}
                    for b in _batches(items, n_tasks)]) for r in f.result()]
                progress.advance(1)
        finally:
            progress.close()
        hubs = []
        for k, n in names:
            if k == "bitext":
                files = sorted((work / k / n / "drops").glob("hubs-*.parquet"))
                if files:
                    h = pl.read_parquet(files)
                    if len(h):
                        hubs.append(h.with_columns(pl.lit(n).alias("pair")))
        if work.exists():  # nothing is written when every rule is switched off
            shutil.rmtree(work)

        rows: dict[tuple[str, str], dict] = {}
        samples = []
        for it, counts, removed in sorted(applied, key=lambda r: (r[0]["kind"], r[0]["name"], r[0]["idx"])):
            row = rows.setdefault((it["kind"], it["name"]), {c: 0 for c in STAT_COLUMNS[2:]})
            for c, v in counts.items():
                row[c] += v
            if len(removed):
                samples.append(removed.with_columns(pl.lit(it["kind"]).alias("kind"), pl.lit(it["name"]).alias("name")))
        stats = pl.DataFrame([{"kind": k, "name": n, **v} for (k, n), v in sorted(rows.items())],
                             schema={c: (pl.String if c in ("kind", "name") else pl.Int64) for c in STAT_COLUMNS})
        stats.write_parquet(tmp / "dedup_stats.parquet")
        sample_df = _samples(prepare_dir, items, samples, cfg.samples_per_reason)
        sample_df.write_parquet(tmp / "removed_samples.parquet")
        hub_df = (pl.concat(hubs).sort(["pair", "partners", "pairs", "side", "text"],
                                       descending=[False, True, True, False, False])
                  .group_by("pair", maintain_order=True).head(10) if hubs else pl.DataFrame(schema={"side": pl.Int8, "partners": pl.UInt32,
                                                             "pairs": pl.UInt32, "text": pl.String, "pair": pl.String}))
        hub_df.write_parquet(tmp / "top_hubs.parquet")
        removal_bars(stats, tmp / "removal_reasons.png")
        metrics, summary = _report(stats, hub_df, sample_df)
        (tmp / "report.md").write_text(summary)
        return StageOutcome(metrics=metrics, table=stats.to_dicts(), summary=summary)

    return body


def _samples(prepare_dir: Path, items: list[dict], samples: list[pl.DataFrame], per_reason: int) -> pl.DataFrame:
    schema = {"kind": pl.String, "name": pl.String, "reason": pl.String, "text": pl.String, "kept_text": pl.String}
    if not samples:
        return pl.DataFrame(schema=schema)
    df = (pl.concat(samples).sort("kind", "name", "reason", "rid")
            .group_by("kind", "name", "reason", maintain_order=True).head(per_reason))
    kept = [_kept_text(prepare_dir, items, k, n, r) for k, n, r in df.select("kind", "name", "kept").iter_rows()]
    return df.with_columns(pl.Series("kept_text", kept, dtype=pl.String)).select(list(schema))


def _report(stats: pl.DataFrame, hubs: pl.DataFrame, samples: pl.DataFrame) -> tuple[dict, str]:
    metrics: dict[str, float] = {}
    for kind in ("mono", "bitext"):
        s = stats.filter(pl.col("kind") == kind)
        if not len(s):
            continue
        total = max(int(s["in"].sum()), 1)
        metrics[f"{kind}.in"] = float(s["in"].sum())
        metrics[f"{kind}.out"] = float(s["out"].sum())
        for r in (("exact", "near") if kind == "mono" else ("exact", "copy", "ratio", "hub", "langid")):
            metrics[f"{kind}.removed.{r}"] = float(s[r].sum())
            metrics[f"{kind}.rate.{r}"] = float(s[r].sum()) / total
        for name, n_in, n_out in s.select("name", "in", "out").iter_rows():
            metrics[f"{kind}.kept_fraction.{name}"] = n_out / max(n_in, 1)
    lines = ["Removed rows by reason (each row counted under its first reason):", "",
             markdown_table(stats.to_dicts())]
    if len(hubs):
        lines += ["", "Top hub sentences (one side aligned to many distinct others):", "",
                  markdown_table(hubs.select("pair", "side", "partners", "pairs", "text").head(20).to_dicts())]
    if len(samples):
        lines += ["", "Samples of removed rows (all in removed_samples.parquet):", "",
                  markdown_table(samples.group_by("reason", maintain_order=True).head(3).to_dicts())]
    return metrics, "\n".join(lines)


@flow(name="dedup", log_prints=True)
def dedup(spec_file: str, workspace: str | None = None, overrides: list[str] | None = None,
          force: bool = False, mlflow_parent_run_id: str | None = None):
    """Exact and near-duplicate removal, bitext cleaning with evidence."""
    inv = Invocation.open(spec_file, workspace, overrides, mlflow_parent_run_id, "dedup")
    return run_stage_flow(inv, "dedup", force, _body(inv, force))
