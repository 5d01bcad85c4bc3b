"""The audit stage's output contract (other tools read these names; keep them):

    audit.parquet        one row per TRTD language pair: pair (``a-b``, a < b, as the shards name
                         it), prior (Q), q_final, w_final (= q_final / Q), w_mean (w averaged over
                         the K re-samplings), q_unfloored, w_unfloored (the best response without the
                         floor), loss_ema (the pair loss audit.pair_loss names), g_loss_ema,
                         d_loss_ema, d_base_loss_ema, baseline_loss_ema and excess_loss_ema (pair_loss
                         excess: the baseline audit.baseline names, and loss_ema minus it),
                         left_base_rate, rows_trained, paper_loss_ema and w_paper (XY-LENT's Eq. 3
                         as printed, from the same run's EMAs, and the best response to it: the
                         paper's form beside the trained one), rank_up (1 = most up-weighted by
                         w_final), rank_up_mean (by w_mean), rank_up_paper (by w_paper), verdict, and
                         the evidence columns
                         (xylent.tasks.audit.evidence)
    trajectory.parquet   one row per (re-sampling, pair): resample, step, pair, prior, q, q_unfloored,
                         w, loss_ema
    samples.parquet      pair, side (up | down), n, source, target: random sentence pairs of the
                         flagged pairs, for a reader to judge
    model/, train.json, metrics.jsonl, train.log, loss_curves.png   the audited model, as pretrain's
    figure4_weights.png, w_trajectories.png, w_vs_evidence.png, report.md
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

AUDIT_TABLE = "audit.parquet"
TRAJECTORY_TABLE = "trajectory.parquet"
SAMPLES_TABLE = "samples.parquet"
# a pair's discriminator loss this far under the loss of its base rate counts as having left it
LEFT_BASE_RATE = 0.97


def read_audit(audit_dir: Path) -> pl.DataFrame:
    return pl.read_parquet(Path(audit_dir) / AUDIT_TABLE)


def trajectory_table(state: dict) -> pl.DataFrame:
    """The adversary's q at each re-sampling, long form."""
    pairs, prior = state["pairs"], np.asarray(state["prior"])
    frames = [pl.DataFrame({
        "resample": [t["resample"]] * len(pairs), "step": [t["step"]] * len(pairs), "pair": pairs,
        "prior": prior, "q": np.asarray(t["q"]), "q_unfloored": np.asarray(t["q_unfloored"]),
        "w": np.asarray(t["q"]) / prior, "loss_ema": np.array([np.nan if x is None else x for x in t["loss"]]),
    }) for t in state["trajectory"]]
    schema = {"resample": pl.Int64, "step": pl.Int64, "pair": pl.String, "prior": pl.Float64, "q": pl.Float64,
              "q_unfloored": pl.Float64, "w": pl.Float64, "loss_ema": pl.Float64}
    return pl.concat(frames).cast(schema) if frames else pl.DataFrame(schema=schema)


def pair_baselines(state: dict) -> np.ndarray:
    """Each pair's excess baseline from an adversary state (xylent.models.training.audit.adversary.excess_baselines);
    all NaN without one."""
    from xylent.models.training.audit.adversary import USES_LANGUAGES, excess_baselines, near_baseline

    n = len(state["pairs"])
    kind = state.get("baseline", "sides" if state.get("excess") else None)  # "excess": states before baselines
    ema = {k: np.array([np.nan if x is None else x for x in state["ema"].get(k) or [None] * n], dtype=np.float64)
           for k in ("loss", "base", "paired")}
    langs = None
    if kind in USES_LANGUAGES:
        own = dict(zip(state["languages"], (np.nan if x is None else x for x in state["lang_ema"])))
        langs = np.array([np.mean([own[x] for x in p.split("-")]) for p in state["pairs"]], dtype=np.float64)
    return excess_baselines(kind, near_baseline(kind, ema), langs, ema["loss"])


def paper_form(state: dict, g: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """XY-LENT's Eq. 3 as printed (L_D + λ·L_G; the MLM ablation's loss itself) from the same run's
    component EMAs, and the floored best response the adversary would give it now, as q / Q: the
    paper's form read beside whatever pair loss the run trained against, on the same batches."""
    from xylent.models.training.audit.adversary import best_response_on_seen

    w_g, w_d = state["weights"]
    lam = w_d if w_g == 1.0 else w_g  # (1, λ) trained (electra, excess) or (λ, 1) (paper): λ either way
    loss = d + lam * g if w_d > 0 else g
    prior = np.asarray(state["prior"], dtype=np.float64)
    return loss, best_response_on_seen(loss, prior, state["rho"], state["min_ratio"]) / prior


def audit_table(state: dict, evidence: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per pair from the adversary's final state (+ the evidence, joined on ``pair``)."""
    pairs, prior = state["pairs"], np.asarray(state["prior"])

    def ema(key: str) -> np.ndarray:
        values = state["ema"].get(key) or [None] * len(pairs)  # "base": states written before it existed
        return np.array([np.nan if x is None else x for x in values], dtype=np.float64)

    traj = state["trajectory"]
    q = np.asarray(traj[-1]["q"]) if traj else prior
    q_free = np.asarray(traj[-1]["q_unfloored"]) if traj else prior
    w_mean = np.mean([np.asarray(t["q"]) / prior for t in traj], axis=0) if traj else np.ones(len(pairs))
    d, base = ema("d"), ema("d_base")
    df = pl.DataFrame({
        "pair": pairs, "prior": prior, "q_final": q, "w_final": q / prior, "w_mean": w_mean,
        "q_unfloored": q_free, "w_unfloored": q_free / prior, "loss_ema": ema("loss"), "g_loss_ema": ema("g"),
        "d_loss_ema": d, "d_base_loss_ema": base,
        # pair_loss excess: the baseline, and what is left of the loss beyond it
        "baseline_loss_ema": pair_baselines(state), "excess_loss_ema": ema("loss") - pair_baselines(state),
        "left_base_rate": pl.Series([bool(x < LEFT_BASE_RATE * b) if np.isfinite(x) and np.isfinite(b) else None
                                     for x, b in zip(d, base)], dtype=pl.Boolean),
        "rows_trained": np.asarray(state["rows"], dtype=np.int64),
    })
    paper_loss, w_paper = paper_form(state, ema("g"), d)
    df = df.with_columns(pl.Series("paper_loss_ema", paper_loss), pl.Series("w_paper", w_paper))
    df = df.with_columns(
        pl.col("w_final").rank("ordinal", descending=True).cast(pl.Int64).alias("rank_up"),
        pl.col("w_mean").rank("ordinal", descending=True).cast(pl.Int64).alias("rank_up_mean"),
        pl.col("w_paper").rank("ordinal", descending=True).cast(pl.Int64).alias("rank_up_paper"),
    )
    if evidence is not None:
        df = df.join(evidence, on="pair", how="left")
    return df.sort("rank_up")
