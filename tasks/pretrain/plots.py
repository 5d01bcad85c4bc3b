"""Loss curves of a pretraining run from metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _smooth(y: np.ndarray, k: int) -> np.ndarray:
    if len(y) < k or k < 2:
        return y
    return np.convolve(y, np.ones(k) / k, mode="valid")


def loss_curves(rows: list[dict], out: Path) -> None:
    """Generator and discriminator loss per task (moving average), lr, and throughput."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    k = max(1, len(rows) // 50)
    # each loss next to its trivial peer (dashed): below it is learning, on it is not
    panels = [("generator_loss", "generator_unigram_loss", "unigram", axes[0, 0], "generator (MLM) loss"),
              ("discriminator_loss", "discriminator_base_loss", "base rate", axes[0, 1], "discriminator (RTD) loss")]
    for key, peer, peer_name, ax, title in panels:
        for task in ("mrtd", "trtd"):
            for name, style, label in ((key, "-", task.upper()), (peer, "--", f"{task.upper()} {peer_name}")):
                pts = [(r["step"], r[f"{task}/{name}"]) for r in rows if f"{task}/{name}" in r]
                if pts:
                    s, y = np.array(pts).T
                    color = {"mrtd": "C0", "trtd": "C1"}[task]
                    ax.plot(s[k - 1:] if k > 1 and len(y) >= k else s, _smooth(y, k), style, color=color,
                            label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend()
    steps = [r["step"] for r in rows]
    axes[1, 0].plot(steps, [r["lr"] for r in rows])
    axes[1, 0].set_title("learning rate")
    tps = _smooth(np.array([r["tokens_per_second"] for r in rows]), max(k, 2))
    axes[1, 1].plot(steps[len(steps) - len(tps):], tps)
    axes[1, 1].set_title("tokens / s, all ranks (moving average)")
    for ax in axes[1]:
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
