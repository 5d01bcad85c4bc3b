"""Picture of the shards: tokens per language."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402


def tokens_per_language(stats: pl.DataFrame, path: Path) -> Path:
    mono = stats.filter(pl.col("kind") == "mrtd").sort("tokens", descending=True)
    fig, ax = plt.subplots(figsize=(max(6, 0.4 * len(mono)), 4))
    ax.bar(mono["name"].to_list(), mono["tokens"].to_list())
    ax.set_ylabel("MRTD tokens")
    ax.set_title("Tokens per language in the shards")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
