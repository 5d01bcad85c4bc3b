"""The dedup stage's four phases over work items, as plain functions (the flow
runs each phase's batches as Prefect tasks on the spec's runner).

An item is one input part (:meth:`tasks.prepare.layout.Part.as_dict`); a
bucket is ``(kind, name, bucket index)``; ``work`` is the stage's scratch folder
(``<work>/<kind>/<name>/``), removed once the output is assembled.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from xylent.spec import DedupConfig

from tasks.dedup import bitext as bitext_dedup
from tasks.dedup import mono as mono_dedup


def map_items(items: list[dict], work: Path, cfg: DedupConfig, languages: tuple[str, ...]) -> int:
    for it in items:
        w = Path(work) / it["kind"] / it["name"]
        if it["kind"] == "mono":
            mono_dedup.map_part(Path(it["part"]), it["idx"], it["name"], w, cfg)
        else:
            bitext_dedup.map_part(Path(it["part"]), it["idx"], w, cfg, languages)
    return len(items)


def reduce_buckets(buckets: list[tuple[str, str, int]], work: Path, cfg: DedupConfig) -> int:
    for kind, name, bucket in buckets:
        w = Path(work) / kind / name
        if kind == "mono":
            if cfg.exact:
                mono_dedup.reduce_exact(w, bucket)
            if cfg.near:
                mono_dedup.reduce_near(w, bucket, cfg)
        else:
            bitext_dedup.reduce_bucket(w, bucket, cfg)
    return len(buckets)


def resolve_languages(names: list[str], work: Path) -> int:
    return sum(mono_dedup.resolve_near(Path(work) / "mono" / n) for n in names)


def apply_items(items: list[dict], work: Path, out: Path, cfg: DedupConfig) -> list[tuple[dict, dict, pl.DataFrame]]:
    """Write each part without its dropped rows; return (item, counts, a sample of the removed rows)."""
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
