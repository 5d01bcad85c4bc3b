"""Pictures of the DRO audit: the paper's Figure 4 (w = q/Q of the most up- and
down-weighted pairs), w over the re-samplings, and w against the evidence.

Every function leaves out non-finite values and says how many in its title,
and grows the figure with the number of pairs so labels stay readable.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from xylent.errors import XylentError  # noqa: E402

UP, DOWN = "tab:red", "tab:blue"  # up-weighted (the adversary wants more of it) / down-weighted
LEGEND_MAX = 20  # beyond this a legend hides the plot: lines are labelled at their ends instead
ANNOTATE = 3     # extreme points named per panel and direction


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def _left_out(n: int) -> str:
    return f" ({n} without a finite value left out)" if n else ""


def figure4(w: dict[str, float], path: Path, n: int = 10,
            title: str = "DRO audit: w = q/Q of the most up- and down-weighted pairs") -> Path:
    """Horizontal bars: the ``n`` pairs with the largest w > 1 on top, the ``n``
    with the smallest w < 1 below, a line at w = 1 (the training distribution)."""
    finite = {p: float(v) for p, v in w.items() if _finite(v)}
    ranked = sorted(finite.items(), key=lambda kv: (-kv[1], kv[0]))
    up = [kv for kv in ranked if kv[1] >= 1][:n]
    down = [kv for kv in reversed(ranked) if kv[1] < 1][:n][::-1]
    bars = up + down
    fig, ax = plt.subplots(figsize=(8, max(3, 0.3 * len(bars) + 1.5)))
    if bars:
        names, values = [p for p, _ in bars], [v for _, v in bars]
        ax.barh(names, values, color=[UP if v >= 1 else DOWN for v in values])
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=8 if len(bars) > 30 else 10)
    else:
        ax.text(0.5, 0.5, "no pair has a finite w", transform=ax.transAxes, ha="center", va="center")
    ax.axvline(1.0, color="black", linewidth=1)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=UP), plt.Rectangle((0, 0), 1, 1, color=DOWN)],
              labels=[f"up-weighted (top {len(up)})", f"down-weighted (bottom {len(down)})"], loc="lower right")
    ax.set_xlabel("w = q / Q (adversary's weight over the training distribution)")
    ax.set_title(title + _left_out(len(w) - len(finite)))
    return _save(fig, path)


def trajectories(traj: pl.DataFrame, pairs: list[str], path: Path) -> Path:
    """w of each given pair at each re-sampling (x: training step), one labelled line per pair."""
    missing = [c for c in ("resample", "step", "pair", "w") if c not in traj.columns]
    if missing:
        raise XylentError(f"the trajectory table lacks columns {missing}", where="xylent.tasks.audit.plots.trajectories",
                          fix="pass the audit's trajectory (resample, step, pair, q, prior, w)")
    shown = [p for p in dict.fromkeys(pairs) if p in set(traj["pair"].to_list())]
    fig, ax = plt.subplots(figsize=(9 + 0.02 * len(shown), max(4.5, 0.12 * len(shown) + 2)))
    for p in shown:
        rows = traj.filter(pl.col("pair") == p).sort("resample")
        x = rows["step"].cast(pl.Float64).to_numpy()
        y = rows["w"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
        (line,) = ax.plot(x, y, marker="o", markersize=3, label=p)
        ok = np.flatnonzero(np.isfinite(y))
        if len(shown) > LEGEND_MAX and len(ok):
            ax.annotate(p, (x[ok[-1]], y[ok[-1]]), xytext=(3, 0), textcoords="offset points", fontsize=6,
                        va="center", color=line.get_color())
    ax.axhline(1.0, color="black", linewidth=1)
    if 0 < len(shown) <= LEGEND_MAX:
        ax.legend(fontsize=8, loc="best")
    if not shown:
        ax.text(0.5, 0.5, "none of the pairs is in the trajectory", transform=ax.transAxes, ha="center")
    ax.set_xlabel("training step of the re-sampling")
    ax.set_ylabel("w = q / Q")
    absent = len(set(pairs)) - len(shown)
    ax.set_title(f"DRO audit: w over {traj['resample'].n_unique()} re-samplings, {len(shown)} pairs"
                 + (f" ({absent} not in the trajectory)" if absent else ""))
    return _save(fig, path)


def _extremes(x: np.ndarray, y: np.ndarray) -> set[int]:
    """Indices of the points worth naming: highest and lowest w, largest evidence value."""
    by_y = np.argsort(y, kind="stable")
    by_x = np.argsort(x, kind="stable")
    return set(by_y[:ANNOTATE]) | set(by_y[-ANNOTATE:]) | set(by_x[-ANNOTATE:])


def w_against_evidence(table: pl.DataFrame, columns: list[str], path: Path) -> Path:
    """One scatter per evidence column (x) against ``w_final`` (y), extreme pairs named."""
    missing = [c for c in ("pair", "w_final", *columns) if c not in table.columns]
    if missing:
        raise XylentError(f"the evidence table lacks columns {missing}", where="xylent.tasks.audit.plots.w_against_evidence",
                          fix="join pair_evidence() with the audit's w_final per pair")
    if not columns:
        raise XylentError("no evidence column to plot", where="xylent.tasks.audit.plots.w_against_evidence",
                          fix="name at least one numeric column, e.g. hub_rate")
    cols = min(3, len(columns))
    rows = math.ceil(len(columns) / cols)
    side = 4 + min(4, len(table) / 50)  # more points need more room for their names
    fig, axes = plt.subplots(rows, cols, figsize=(side * cols, side * rows), squeeze=False)
    names = table["pair"].to_list()
    y_all = table["w_final"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
    for ax, col in zip(axes.flat, columns):
        x_all = table[col].cast(pl.Float64).fill_null(float("nan")).to_numpy()
        ok = np.flatnonzero(np.isfinite(x_all) & np.isfinite(y_all))
        x, y = x_all[ok], y_all[ok]
        ax.scatter(x, y, s=14, c=[UP if v >= 1 else DOWN for v in y])
        for i in _extremes(x, y) if len(ok) else ():
            ax.annotate(names[ok[i]], (x[i], y[i]), xytext=(3, 3), textcoords="offset points", fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel(col)
        ax.set_ylabel("w_final = q / Q")
        ax.set_title(f"{col}: {len(ok)} pairs" + _left_out(len(table) - len(ok)), fontsize=9)
    for ax in list(axes.flat)[len(columns):]:
        ax.set_visible(False)
    fig.suptitle("DRO audit: the adversary's weight against the evidence")
    fig.tight_layout()
    return _save(fig, path)
