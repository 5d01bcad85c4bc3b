"""VoCAP pictures: ALP curves with the chosen sizes, the allocation, and
tokens per sentence against the joint baseline."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402

from xylent.plots import bar_chart  # noqa: E402


def alp_curves(alloc: pl.DataFrame, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(9, 6))
    for row in alloc.iter_rows(named=True):
        if not row["sizes"]:
            continue
        line, = ax.plot(row["sizes"], row["alp_smoothed"], label=row["lang"], lw=1.2)
        ax.plot(row["sizes"], row["alp"], ls=":", color=line.get_color(), lw=0.8)
        if row["chosen_size"] in row["sizes"]:
            i = row["sizes"].index(row["chosen_size"])
            ax.plot([row["chosen_size"]], [row["alp_smoothed"][i]], "o", color=line.get_color())
    ax.set_xlabel("vocabulary size")
    ax.set_ylabel("ALP (held sample)")
    ax.set_title("ALP curves (dotted: raw, solid: concave), dots: VoCAP's choice")
    ax.legend(ncol=4, fontsize=7)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def allocation_bars(alloc: pl.DataFrame, path: Path) -> Path:
    df = alloc.sort("chosen_size", descending=True)
    return bar_chart(df["lang"].to_list(), df["chosen_size"].to_list(), "pieces allocated",
                     "VoCAP allocation per language", path)


def tokens_per_sentence(cmp: pl.DataFrame, path: Path) -> Path:
    df = cmp.sort("examples", descending=True)
    langs = df["lang"].to_list()
    x = range(len(langs))
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(langs)), 4))
    ax.bar([i - 0.2 for i in x], df["tokens_per_sentence_vocap"].to_list(), width=0.4, label="VoCAP")
    ax.bar([i + 0.2 for i in x], df["tokens_per_sentence_joint"].to_list(), width=0.4, label="joint SentencePiece")
    ax.set_xticks(list(x), langs)
    ax.set_ylabel("tokens per sentence (held sample)")
    ax.set_title("Sequence length: VoCAP vs a joint model of the same size (languages by data size)")
    ax.legend()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
