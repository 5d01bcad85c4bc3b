"""What the sampling flow calls: :func:`build_tables` (the language and language-pair sampling
tables and their diagnostics from the example counts, as :class:`SamplingTables`) and
:func:`write_output` (the tables, plots and report written into the stage's output; the file
names: :mod:`xylent.data.sampling`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from xylent.distributions import language_distribution
from xylent.errors import XylentError
from xylent.markdown import markdown_table
from xylent.spec import SamplingConfig
from xylent.stage import StageOutcome

from xylent.data.sampling import MONO_TABLE, PAIR_TABLE
from xylent.tasks.sampling.tables import (
    m2m_pair_distribution,
    marginal_error,
    sinkhorn_pair_distribution,
    symmetric_counts,
    target_marginal,
    smoothed_pair_distribution,
)


@dataclass
class SamplingTables:
    mono: pl.DataFrame
    bitext: pl.DataFrame
    languages: list[str]  # bitext languages, ordered by size (largest first)
    matrices: dict[str, np.ndarray]  # q, p_star, p_m2m over `languages`
    metrics: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def read_pair_counts(tsv) -> tuple[list[str], np.ndarray]:
    """A pair-count table (lang_a, lang_b, sentence_pairs, ... with a header, like
    CCMatrix's published counts) as (languages, L×L count matrix)."""
    rows = [line.split("\t") for line in open(tsv, encoding="utf-8").read().splitlines()[1:] if line.strip()]
    langs = sorted({r[0] for r in rows} | {r[1] for r in rows})
    ix = {lang: i for i, lang in enumerate(langs)}
    counts = np.zeros((len(langs), len(langs)))
    for r in rows:
        counts[ix[r[0]], ix[r[1]]] += float(r[2])
    return langs, counts


def _entropy(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def _upper(mat: np.ndarray) -> np.ndarray:
    """Unordered-pair probabilities: P_ij + P_ji for i < j."""
    iu = np.triu_indices(len(mat), k=1)
    return (mat + mat.T)[iu]


def _exclude(pair_counts: dict[tuple[str, str], int], exclude: list[str], notes: list[str]
             ) -> dict[tuple[str, str], int]:
    """Drop the pairs the user excluded (sampling.exclude_pairs) as if they had no data."""
    if not exclude:
        return pair_counts
    names = {"-".join(sorted(p)): p for p in pair_counts}
    unknown = [p for p in exclude if p not in names]
    if unknown:
        raise XylentError(f"sampling.exclude_pairs names pairs the data does not have: {', '.join(unknown)}",
                          where="spec field sampling.exclude_pairs",
                          fix=f"use pair names as the shards stage writes them; this data has: {', '.join(sorted(names))}")
    notes.append(f"excluded by sampling.exclude_pairs (probability 0): {', '.join(exclude)}")
    dropped = {names[p] for p in exclude}
    return {p: n for p, n in pair_counts.items() if p not in dropped}


def _pivot_only(pair_counts: dict[tuple[str, str], int], pivot: str | None, notes: list[str]
                ) -> dict[tuple[str, str], int]:
    """Keep only the pairs with ``pivot`` on one side (sampling.pivot: the EN-X-only ablation of
    XY-LENT's X-Y bitexts); the others are treated as if they had no data."""
    if pivot is None:
        return pair_counts
    kept = {p: n for p, n in pair_counts.items() if pivot in p}
    if not kept:
        raise XylentError(f"sampling.pivot is {pivot!r} but no language pair of the data has it",
                          where="spec field sampling.pivot", fix="name a language of the bitext, or drop the field")
    notes.append(f"sampling.pivot={pivot}: {len(pair_counts) - len(kept)} pairs without {pivot} get probability 0")
    return kept


# the pair table's columns when there is no bitext (the same names as a full table's)
_PAIR_SCHEMA = {"lang_a": pl.String, "lang_b": pl.String, "pairs": pl.Int64, "q": pl.Float64,
                "p_star": pl.Float64, "p_m2m": pl.Float64, "p_smoothed": pl.Float64, "p": pl.Float64,
                "expected_epochs_star": pl.Float64, "expected_epochs_m2m": pl.Float64}


def build_tables(mono_counts: dict[str, int], pair_counts: dict[tuple[str, str], int],
                 cfg: SamplingConfig) -> SamplingTables:
    """Monolingual and bitext sampling tables from example counts."""
    notes: list[str] = []
    langs = sorted(mono_counts)
    sizes = np.array([mono_counts[lang] for lang in langs], dtype=np.float64)
    if len(langs) and sizes.sum() > 0:
        p = language_distribution(sizes, cfg.alpha)
        mono = pl.DataFrame({"lang": langs, "examples": sizes.astype(np.int64), "tokens": [None] * len(langs),
                             "p_raw": sizes / sizes.sum(), "p": p}, schema_overrides={"tokens": pl.Int64})
        empty = [lang for lang, n in zip(langs, sizes) if n == 0]
        if empty:
            notes.append(f"no monolingual examples for {', '.join(empty)}: sampled with probability 0")
    else:
        mono = pl.DataFrame(schema={"lang": pl.String, "examples": pl.Int64, "tokens": pl.Int64,
                                    "p_raw": pl.Float64, "p": pl.Float64})
        notes.append("no monolingual data")

    pair_counts = _pivot_only(_exclude(pair_counts, cfg.exclude_pairs, notes), cfg.pivot, notes)
    if not pair_counts:
        # a monolingual corpus (MetaXLM's phase 1, MLM on mono text) trains MRTD alone; TRTD on it is
        # refused by the pretrain stage, which knows the tasks ("the shards hold no TRTD data")
        notes.append("no bitext: the pair table is empty, so only MRTD can train on this corpus "
                     "(add bitext sources for TRTD)")
        return SamplingTables(mono=mono, bitext=pl.DataFrame(schema=_PAIR_SCHEMA), languages=[], matrices={},
                              metrics={"languages.mono": float(len(langs)), "languages.bitext": 0.0,
                                       "pairs.nonzero_q": 0.0}, notes=notes)
    blangs = sorted({x for pair in pair_counts for x in pair})
    ix = {lang: i for i, lang in enumerate(blangs)}
    counts = np.zeros((len(blangs), len(blangs)))
    for (a, b), n in pair_counts.items():
        counts[ix[a], ix[b]] += n
    sym = symmetric_counts(counts)
    dropped = [blangs[i] for i in np.flatnonzero(sym.sum(axis=1) == 0)]
    if dropped:
        notes.append(f"dropped from the pair table (no sentence pairs): {', '.join(dropped)}")
    q = sym / sym.sum()

    p_star = p_m2m = None
    try:
        p_star = sinkhorn_pair_distribution(counts, cfg.temperature, eps=cfg.eps, max_iter=cfg.max_iter,
                                            names=blangs)
    except XylentError as exc:
        if cfg.pair_method == "sinkhorn":
            raise
        notes.append(f"Sinkhorn table not available: {exc.what}")
    p_m2m = m2m_pair_distribution(counts, cfg.temperature)
    p_smoothed = smoothed_pair_distribution(counts, cfg.pair_alpha)
    chosen = {"sinkhorn": p_star, "m2m": p_m2m, "smoothed": p_smoothed}[cfg.pair_method]

    iu = np.triu_indices(len(blangs), k=1)
    n_pairs = sym[iu]  # sentence pairs of each unordered pair, X→Y and Y→X files summed
    keep = n_pairs > 0
    budget = float(cfg.bitext_budget)

    def col(mat):
        return None if mat is None else _upper(mat)[keep]

    cols = {
        "lang_a": [blangs[i] for i in iu[0][keep]], "lang_b": [blangs[j] for j in iu[1][keep]],
        "pairs": n_pairs[keep].astype(np.int64), "q": _upper(q)[keep],
        "p_star": col(p_star), "p_m2m": col(p_m2m), "p_smoothed": col(p_smoothed), "p": col(chosen),
    }
    for name in ("star", "m2m"):
        probs = cols[f"p_{name}"]
        cols[f"expected_epochs_{name}"] = None if probs is None else probs * budget / cols["pairs"]
    bitext = pl.DataFrame(cols, schema_overrides={k: pl.Float64 for k in (
        "p_star", "p_m2m", "expected_epochs_star", "expected_epochs_m2m")})
    bitext = bitext.sort("pairs", descending=True)

    metrics: dict[str, float] = {
        "languages.mono": float(len(langs)), "languages.bitext": float(len(blangs) - len(dropped)),
        "pairs.nonzero_q": float(keep.sum()), "entropy.q": _entropy(_upper(q)),
        "entropy.smoothed": _entropy(_upper(p_smoothed)),
    }
    active = sym.sum(axis=1) > 0
    a = target_marginal(q[np.ix_(active, active)], cfg.temperature)
    total = float(cols["pairs"].sum())
    for name, mat in (("star", p_star), ("m2m", p_m2m)):
        if mat is None:
            continue
        probs = _upper(mat)
        metrics[f"pairs.nonzero_{name}"] = float((probs > 0).sum())
        metrics[f"support_kept.{name}"] = float(((probs > 0) & (n_pairs > 0)).sum() / keep.sum())
        metrics[f"entropy.{name}"] = _entropy(probs)
        metrics[f"max_marginal_error.{name}"] = marginal_error(mat[np.ix_(active, active)], a)
        seen = np.minimum(cols["pairs"], cols[f"p_{name}"] * budget)
        metrics[f"wastage.{name}"] = float(1.0 - seen.sum() / total)
        metrics[f"mass_on_empty_pairs.{name}"] = float(probs[~keep].sum() + np.trace(mat))
    order = np.argsort(-sym.sum(axis=1), kind="stable")
    order = order[sym.sum(axis=1)[order] > 0]
    mats = {"q": q, "p_m2m": p_m2m, "p_star": p_star}
    return SamplingTables(
        mono=mono, bitext=bitext, languages=[blangs[i] for i in order],
        matrices={k: v[np.ix_(order, order)] for k, v in mats.items() if v is not None},
        metrics=metrics, notes=notes,
    )


def summary(t: SamplingTables, cfg: SamplingConfig) -> str:
    m = t.metrics
    if t.bitext.is_empty():
        lines = ["No bitext: the pair table is empty (MRTD only)."]
        lines += ["", *[f"- {n}" for n in t.notes], "", "Languages:", "", markdown_table(t.mono.to_dicts())]
        return "\n".join(lines)
    lines = [f"Pair table used by the loader: **{cfg.pair_method}** (T = {cfg.temperature}, "
             f"budget {cfg.bitext_budget:,} sentence pairs).", "",
             "| | pairs > 0 | support kept | entropy | max marginal error | data never seen |",
             "|---|---|---|---|---|---|",
             f"| data Q | {m['pairs.nonzero_q']:.0f} | 1 | {m['entropy.q']:.3f} | | |"]
    for key, label in (("star", "XY-LENT P*"), ("m2m", "M2M-100 LP")):
        if f"entropy.{key}" in m:
            lines.append(f"| {label} | {m[f'pairs.nonzero_{key}']:.0f} | {m[f'support_kept.{key}']:.3f} | "
                         f"{m[f'entropy.{key}']:.3f} | {m[f'max_marginal_error.{key}']:.1e} | "
                         f"{m[f'wastage.{key}']:.1%} |")
    if t.notes:
        lines += ["", *[f"- {n}" for n in t.notes]]
    lines += ["", "Languages:", "", markdown_table(t.mono.to_dicts())]
    return "\n".join(lines)


def write_output(t: SamplingTables, cfg: SamplingConfig, out: Path) -> StageOutcome:
    from xylent.tasks.sampling.plots import heatmaps, sorted_pair_probabilities  # matplotlib: not for the loader's ranks

    t.mono.write_parquet(out / MONO_TABLE)
    t.bitext.write_parquet(out / PAIR_TABLE)
    if t.matrices:  # no pictures of an empty pair table
        heatmaps(t.matrices, t.languages, out / "pair_heatmaps.png")
        sorted_pair_probabilities(t.bitext, out / "pair_probabilities.png")
    text = summary(t, cfg)
    (out / "report.md").write_text(text)
    table = t.bitext.head(200).with_columns(pl.col(pl.Float64).round(8)).to_dicts()
    return StageOutcome(metrics=t.metrics, table=table, summary=text, manifest={"notes": t.notes})
