"""prepare flow: downloaded files -> cleaned mono/ and bitext/ Parquet plus statistics."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed

from flows.stage import Invocation, StageOutcome, markdown_table, run_stage_flow
from tasks.prepare import group_units, prepare_unit
from xylent.progress import Progress
from xylent.runners import make_task_runner, submit_all
from xylent.spec import PrepareConfig
from xylent.workspace import Workspace, link_or_copy


@task(name="prepare-unit", task_run_name="prepare {key}", cache_policy=NO_CACHE)
def prepare_unit_task(key: str, records: list[dict], ws_root: str, cfg: PrepareConfig, source_cfg: dict,
                      force: bool = False):
    manifest, cached = prepare_unit(records, Workspace(ws_root), cfg, source_cfg, force=force)
    if cached:
        return Completed(name="Cached", message="unit up to date", data=manifest)
    return manifest


def _source_cfg(spec, name: str) -> dict:
    src = next(s for s in spec.sources if s.name == name)
    return {k: getattr(src, k) for k in ("max_lines", "plurals", "source_language") if hasattr(src, k)}


def _body(inv: Invocation, force: bool):
    spec = inv.spec

    def body(tmp: Path, upstream: dict, run_id: str) -> StageOutcome:
        records = json.loads((upstream["download"] / "records.json").read_text())
        units = group_units(records)
        calls = [
            {"key": f"{u[0]['source']}/{u[0].get('lang') or u[0].get('pair') or 'catalogs'}", "records": u,
             "ws_root": str(inv.ws.root), "cfg": spec.prepare, "source_cfg": _source_cfg(spec, u[0]["source"]), "force": force}
            for u in units
        ]
        progress = Progress("prepare", len(calls), unit="units", key="prepare-progress")
        manifests = []
        try:
            with make_task_runner(spec.runner) as runner:
                for fut in submit_all(runner, prepare_unit_task, calls):
                    manifests.append(fut.result())
                    progress.advance(1)
        finally:
            progress.close()
        known, stats = {}, []
        for m in manifests:
            unit = inv.ws.unit_dir("prepare", m["fingerprint"])
            for f in m["files"]:
                link_or_copy(unit / f["path"], tmp / f["path"])
                known[f["path"]] = f
            stats.extend(m["stats"])
        stats.sort(key=lambda r: (r["kind"], r["name"], r["source"]))
        pq.write_table(pa.Table.from_pylist(stats), tmp / "stats.parquet")
        (tmp / "stats.md").write_text(markdown_table(stats))
        mono = [r for r in stats if r["kind"] == "mono"]
        bitext = [r for r in stats if r["kind"] == "bitext"]
        metrics = {
            "mono.rows": sum(r["rows_out"] for r in mono), "bitext.rows": sum(r["rows_out"] for r in bitext),
            "mono.languages": len({r["name"] for r in mono if r["rows_out"]}),
            "bitext.pairs": len({r["name"] for r in bitext if r["rows_out"]}),
            "invalid_utf8": sum(r["invalid_utf8"] for r in stats),
            "dropped.too_short": sum(r["too_short"] for r in stats),
            "dropped.too_long": sum(r["too_long"] for r in stats),
        }
        for r in mono:
            metrics[f"mono.rows.{r['name']}"] = metrics.get(f"mono.rows.{r['name']}", 0) + r["rows_out"]
        for r in bitext:
            metrics[f"bitext.rows.{r['name']}"] = metrics.get(f"bitext.rows.{r['name']}", 0) + r["rows_out"]
        empty = sorted({r["name"] for r in mono} - {r["name"] for r in mono if r["rows_out"]})
        summary = (f"{metrics['mono.rows']:,} monolingual rows in {metrics['mono.languages']} languages, "
                   f"{metrics['bitext.rows']:,} sentence pairs in {metrics['bitext.pairs']} pairs.")
        if empty:
            summary += f"\n\n**Warning:** no text survived for {', '.join(empty)}."
        return StageOutcome(metrics=metrics, table=stats, summary=summary + "\n\n" + markdown_table(mono),
                            known_files=known, manifest={"units": [m["fingerprint"] for m in manifests]})

    return body


@flow(name="prepare", log_prints=True)
def prepare(spec_file: str, workspace: str | None = None, overrides: list[str] | None = None,
            force: bool = False, mlflow_parent_run_id: str | None = None):
    """Decode, normalise and filter every downloaded file into hive-partitioned Parquet."""
    inv = Invocation.open(spec_file, workspace, overrides, mlflow_parent_run_id, "prepare")
    return run_stage_flow(inv, "prepare", force, _body(inv, force))
