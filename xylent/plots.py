"""Plot helpers shared by the stages' pictures (headless matplotlib)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def bar_chart(names: list[str], values: list[float], ylabel: str, title: str, path: Path) -> Path:
    """One bar per language (or pair), wide enough for every label."""
    fig, ax = plt.subplots(figsize=(max(6, 0.4 * len(names)), 4))
    ax.bar(names, values)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
