"""Pictures of the sampling tables: the paper's Figure 2 and the per-pair curve."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

TITLES = {"q": "log Q (data)", "p_m2m": "log P (M2M-100 LP)", "p_star": "log P* (XY-LENT Sinkhorn)"}


def heatmaps(matrices: dict[str, np.ndarray], languages: list[str], path: Path) -> Path:
    """Density heatmaps over languages ordered by size; white = exactly zero."""
    names = [k for k in ("q", "p_m2m", "p_star") if k in matrices]
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 5.5), squeeze=False)
    positive = np.concatenate([matrices[k][matrices[k] > 0] for k in names])
    vmin, vmax = np.log10(positive.min()), np.log10(positive.max())
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")
    for ax, key in zip(axes[0], names):
        m = matrices[key]
        with np.errstate(divide="ignore"):
            img = np.ma.masked_where(m <= 0, np.log10(np.where(m > 0, m, 1)))
        im = ax.imshow(img, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
        ax.set_title(f"{TITLES[key]}\n{int((m > 0).sum())} non-zero cells")
        step = max(1, len(languages) // 30)
        ticks = np.arange(0, len(languages), step)
        ax.set_xticks(ticks, [languages[i] for i in ticks], rotation=90, fontsize=7)
        ax.set_yticks(ticks, [languages[i] for i in ticks], fontsize=7)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="log10 probability")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def sorted_pair_probabilities(bitext: pl.DataFrame, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for col, label in (("q", "data Q"), ("p_star", "XY-LENT P*"), ("p_m2m", "M2M-100 LP"),
                       ("p_smoothed", "smoothed")):
        if col in bitext.columns and bitext[col].null_count() == 0:
            values = np.sort(bitext[col].to_numpy())[::-1]
            shown = values[values > 0]
            ax.plot(np.arange(1, len(shown) + 1), shown, label=f"{label} ({len(shown)} pairs > 0)")
    ax.set_yscale("log")
    ax.set_xlabel("pairs, sorted by probability")
    ax.set_ylabel("sampling probability")
    ax.set_title(f"Per-pair sampling probability ({len(bitext)} pairs with data)")
    ax.legend()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
