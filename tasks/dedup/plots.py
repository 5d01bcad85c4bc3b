"""Bar plot of what dedup removed, and why."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402

REASONS = ["exact", "near", "copy", "ratio", "hub", "langid"]


def removal_bars(stats: pl.DataFrame, path: Path, top: int = 40) -> Path:
    """Stacked horizontal bars: removed fraction per language / pair and reason."""
    df = stats.with_columns(removed=pl.sum_horizontal(REASONS)).sort("removed", descending=True).head(top)
    fig, ax = plt.subplots(figsize=(9, max(3, 0.28 * len(df) + 1.5)))
    labels = [f"{k}:{n}" for k, n in df.select("kind", "name").iter_rows()]
    left = [0.0] * len(df)
    denom = [max(x, 1) for x in df["in"].to_list()]
    for reason in REASONS:
        vals = [v / d for v, d in zip(df[reason].to_list(), denom)]
        if any(vals):
            ax.barh(labels, vals, left=left, label=reason)
            left = [a + b for a, b in zip(left, vals)]
    if any(left):
        ax.legend(loc="lower right")
    else:  # every rule kept every row: say so rather than draw an empty frame
        ax.set_yticks(range(len(labels)), labels)
        ax.set_xlim(0, 1)
        ax.text(0.5, 0.5, "nothing removed", transform=ax.transAxes, ha="center", va="center")
    ax.invert_yaxis()
    ax.set_xlabel("fraction of rows removed")
    ax.set_title(f"dedup: removal reasons (top {len(df)} by rows removed)")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
