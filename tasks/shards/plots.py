"""Picture of the shards: tokens per language."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from xylent.plots import bar_chart


def tokens_per_language(stats: pl.DataFrame, path: Path) -> Path:
    mono = stats.filter(pl.col("kind") == "mrtd").sort("tokens", descending=True)
    return bar_chart(mono["name"].to_list(), mono["tokens"].to_list(), "MRTD tokens",
                     "Tokens per language in the shards", path)
