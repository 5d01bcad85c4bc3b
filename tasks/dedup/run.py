"""What the dedup flow calls: the stage's four phases over work items, as plain functions (the flow
runs each phase's batches as Prefect tasks on the spec's runner), then :func:`assemble` (report.py:
statistics, evidence, plot and report); and :func:`near_duplicate_clusters`, the same map -> reduce ->
resolve path over a list of texts in this process (tests, benchmarks).

An item is one input part (:meth:`xylent.tasks.prepare.contract.Part.as_dict`); a
bucket is ``(kind, name, bucket index)``; ``work`` is the stage's scratch folder
(``<work>/<kind>/<name>/``), removed once the output is assembled.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl

from xylent.spec import DedupConfig

from xylent.tasks.dedup import bitext as bitext_dedup
from xylent.tasks.dedup import mono as mono_dedup
from xylent.tasks.dedup.minhash import usable_threads
from xylent.tasks.dedup.report import assemble  # the flow's last step; its home is report.py
from xylent.tasks.dedup.scratch import write_scratch

__all__ = ["apply_items", "assemble", "map_items", "near_duplicate_clusters", "plan_buckets",
           "reduce_buckets", "resolve_languages"]


def plan_buckets(items: list[dict], buckets: int) -> list[tuple[str, str, int]]:
    """Give each item its group's hash buckets (``item["buckets"]``) and return every (kind, name, bucket) to
    reduce. A group of several parts gets ``buckets`` or one per part, whichever is more, so that a reduce
    holds about one part's keys however many parts the language has (a fixed count would let each bucket
    grow with the language); a group held in one part gets one, as its map already holds all its keys (a
    corpus of many small pairs otherwise wrote and removed sixteen scratch files where one does). Which
    bucket a key falls in never changes what is dropped."""
    parts = Counter((it["kind"], it["name"]) for it in items)
    count = {group: 1 if n == 1 else max(buckets, n) for group, n in parts.items()}
    for it in items:
        it["buckets"] = count[it["kind"], it["name"]]
    return [(kind, name, b) for kind, name in sorted(count) for b in range(count[kind, name])]


def map_items(items: list[dict], work: Path, cfg: DedupConfig, languages: tuple[str, ...]) -> int:
    """Each item's ``buckets`` (plan_buckets) decide its scratch layout."""
    for it in items:
        w = Path(work) / it["kind"] / it["name"]
        its = cfg.model_copy(update={"buckets": it["buckets"]})
        if it["kind"] == "mono":
            mono_dedup.map_part(Path(it["part"]), it["idx"], it["name"], w, its)
        else:
            bitext_dedup.map_part(Path(it["part"]), it["idx"], w, its, languages)
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
        # copied out: polars' strings are views into the part's text buffers, so a few sample rows kept
        # every part's text alive until the stage ended (its apply phase grew with the parts)
        keep = pl.DataFrame(keep.to_dict(as_series=False), schema=keep.schema)
        results.append((it, counts, keep))
    return results


def near_duplicate_clusters(texts: list[str], cfg: DedupConfig | None = None, *,
                            char_ngrams: bool = False, threads: int | None = None) -> np.ndarray:
    """One cluster id per text (the smallest index in its cluster); equal ids are
    near-duplicates (estimated Jaccard of shingle sets >= ``cfg.threshold``).
    Texts with no shingles (empty) are singletons.  ``char_ngrams``: shingle
    characters, as the stage does for ``cfg.char_languages``.  ``threads``: the
    MinHash threads and the buckets reduced at once (default: the cores this
    process may use; the stage runs its buckets as parallel tasks instead)."""
    threads = usable_threads() if threads is None else threads
    base = cfg or DedupConfig()
    lang = "xx"
    # a bucket per thread: buckets bound a reduce's memory when parts are many; one part's keys are in memory
    cfg = base.model_copy(update={"exact": False, "near": True, "near_level": "line", "buckets": threads,
                                  "char_languages": [lang] if char_ngrams else []})
    with tempfile.TemporaryDirectory(prefix="xylent-near-") as tmp:
        part, work = Path(tmp) / "part-00000.parquet", Path(tmp) / "work"
        write_scratch(pl.DataFrame({"doc_id": np.arange(len(texts), dtype=np.int64), "text": list(texts)},
                                   schema={"doc_id": pl.Int64, "text": pl.String}), part)
        mono_dedup.map_part(part, 0, lang, work, cfg, threads=threads)
        with ThreadPoolExecutor(threads) as pool:  # polars and numpy release the GIL; buckets share nothing
            list(pool.map(lambda bucket: mono_dedup.reduce_near(work, bucket, cfg), range(cfg.buckets)))
        mono_dedup.resolve_near(work)
        drops = pl.read_parquet(work / "drops" / "near.parquet")
    ids = np.arange(len(texts), dtype=np.int64)
    ids[drops["rid"].to_numpy()] = drops["kept"].to_numpy()  # part 0: row ids are row indices
    return ids
