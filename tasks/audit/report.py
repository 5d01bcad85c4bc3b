"""The audit's tables, plots and report from the adversary's final state and the evidence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from xylent.markdown import markdown_table
from xylent.stage import StageOutcome

from xylent.tasks.audit.evidence import reading, sample_pairs, verdict
from xylent.tasks.audit.contract import (AUDIT_TABLE, LEFT_BASE_RATE, SAMPLES_TABLE, TRAJECTORY_TABLE, audit_table,
                                  trajectory_table)

SAMPLES_PER_PAIR = 5
EVIDENCE_PLOTTED = ("copy_rate", "hub_rate", "length_outlier_rate", "duplicate_rate", "langid_mismatch_rate")


def flagged(table: pl.DataFrame, n: int) -> tuple[list[str], list[str]]:
    """(the n most up-weighted pairs, the n most down-weighted), by w_final; a pair is in one list only."""
    ranked = table.sort("rank_up")["pair"].to_list()
    if len(ranked) < 2:
        return ranked, []
    n = min(n, len(ranked) // 2)
    return ranked[:n], ranked[::-1][:n]


def rank_stability(state: dict) -> float | None:
    """Mean Spearman correlation of w between consecutive re-samplings: near 1, the adversary
    ranks the pairs the same way each time; near 0, the ranking is the EMAs' noise."""
    from scipy.stats import spearmanr

    ws = [np.asarray(t["q"]) / np.asarray(state["prior"]) for t in state["trajectory"]]
    rs = [spearmanr(a, b).statistic for a, b in zip(ws, ws[1:]) if np.ptp(a) > 0 and np.ptp(b) > 0]
    return float(np.mean(rs)) if rs else None


def learning_check(train: dict, table: pl.DataFrame) -> tuple[bool, list[str]]:
    """Whether the audited model left its trivial peers: per-pair losses of a model stuck at
    the base rate rank nothing but the pairs' base rates."""
    d, base = train.get("final.trtd/discriminator_loss"), train.get("final.trtd/discriminator_base_loss")
    left = table["left_base_rate"].drop_nulls()
    n_left, n = int(left.sum()), len(left)
    lines = []
    g, uni = train.get("final.trtd/generator_loss"), train.get("final.trtd/generator_unigram_loss")
    if d is None or base is None:  # the MLM ablation: no discriminator, the MLM loss against a unigram model
        learned = g is not None and uni is not None and g < LEFT_BASE_RATE * uni
    else:
        learned = d < LEFT_BASE_RATE * base
    if d is not None and base is not None:
        lines.append(f"TRTD discriminator: final loss {d:.3f} against {base:.3f} for always answering the base rate "
                     f"('original') — {'below it: the model learned' if learned else 'NOT below it'}.")
    if g is not None and uni is not None:
        lines.append(f"TRTD generator: final loss {g:.3f} against {uni:.3f} for a unigram model.")
    lines.append(f"{n_left} of {n} pairs have a discriminator loss EMA below {LEFT_BASE_RATE:.2f}× their own base "
                 "rate's.")
    if not learned or (n and n_left < max(1, n // 2)):
        lines.append("**The model has not left its base rate on most pairs: the ranking below reflects how hard "
                     "each pair's base rate is, not its quality. Train longer (audit.steps) before acting on it.**")
        learned = False
    return learned, lines


def write_output(state: dict, evidence: pl.DataFrame, dedup_dir: Path, spec, train: dict, out: Path
                 ) -> StageOutcome:
    from xylent.tasks.audit import plots  # matplotlib: not for the training ranks

    a = spec.audit
    table = audit_table(state, evidence)
    table = table.with_columns(pl.Series("verdict", [verdict(r) for r in table.iter_rows(named=True)],
                                         dtype=pl.String))
    traj = trajectory_table(state)
    table.write_parquet(out / AUDIT_TABLE)
    traj.write_parquet(out / TRAJECTORY_TABLE)
    up, down = flagged(table, a.top_n)
    samples = [{"pair": p, "side": side, "n": i, "source": s, "target": t}
               for side, pairs in (("up", up), ("down", down)) for p in pairs
               for i, (s, t) in enumerate(sample_pairs(dedup_dir, p, SAMPLES_PER_PAIR, spec.seed))]
    pl.DataFrame(samples, schema={"pair": pl.String, "side": pl.String, "n": pl.Int64, "source": pl.String,
                                  "target": pl.String}).write_parquet(out / SAMPLES_TABLE)

    w = dict(zip(table["pair"], table["w_final"]))
    plots.figure4(w, out / "figure4_weights.png", n=a.top_n, title="DRO audit: w = q/Q, most up- and down-weighted")
    plots.trajectories(traj, up + down, out / "w_trajectories.png")
    plotted = [c for c in EVIDENCE_PLOTTED if c in table.columns and table[c].null_count() < len(table)]
    if plotted:
        plots.w_against_evidence(table, plotted, out / "w_vs_evidence.png")

    learned, check = learning_check(train, table)
    stability = rank_stability(state)
    if stability is not None:
        rows = int(table["rows_trained"].median())
        check.append(f"Ranking stability: Spearman correlation of w between consecutive re-samplings "
                     f"{stability:.2f} (median {rows} trained rows per pair)" +
                     (" — low: the ranking is mostly the per-pair losses' noise; train longer (audit.steps) or "
                      "lower audit.ema." if stability < 0.3 else "."))
    text = report(state, table, samples, up, down, check, a)
    (out / "report.md").write_text(text)
    metrics = {"pairs": float(len(table)), "resamples": float(len(state["trajectory"])),
               "w_final_max": float(table["w_final"].max()), "w_final_min": float(table["w_final"].min()),
               "pairs_left_base_rate": float(table["left_base_rate"].sum() or 0), "model_learned": float(learned),
               **({"rank_stability": stability} if stability is not None else {}),
               **{k: v for k, v in train.items() if k.startswith("final.trtd/") or k in ("steps", "tokens_total")}}
    shown = table.head(200).select([c for c in table.columns if table[c].dtype != pl.List(pl.String)])
    rows = [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items()} for r in shown.to_dicts()]
    return StageOutcome(metrics=metrics, table=rows, summary=text,
                        manifest={"flagged_up": up, "flagged_down": down, "model_learned": learned,
                                  "suggested_exclude_pairs": up[: a.exclude_top_up]},
                        warnings=[f"audit.resamples asked for {a.resamples} re-samplings; a run of "
                                  f"{a.steps or spec.pretrain.steps} steps has room for {len(state['schedule'])}: "
                                  "raise audit.steps for more"] if len(state["schedule"]) < a.resamples else [])


def _pair_section(row: dict, side: str, samples: list[dict], traj_w: list[float]) -> list[str]:
    lines = [f"#### {row['pair']} — w = {row['w_final']:.2f} (mean over re-samplings {row['w_mean']:.2f}), {side}",
             f"- reading: {reading(row, 'up' if side.startswith('up') else 'down')}",
             f"- evidence: {row['verdict']}",
             f"- size: {row.get('rows', row['rows_trained'])} sentence pairs; prior Q = {row['prior']:.4f}; "
             f"loss EMA {row['loss_ema']:.3f} (discriminator {row['d_loss_ema']:.3f} vs base rate "
             f"{row['d_base_loss_ema']:.3f})",
             "- w trajectory: " + " → ".join(f"{x:.2f}" for x in traj_w)]
    for s in samples:
        lines.append(f"  - `{s['source'][:120]}` ⇄ `{s['target'][:120]}`")
    return lines


def report(state: dict, table: pl.DataFrame, samples: list[dict], up: list[str], down: list[str],
           check: list[str], a) -> str:
    by_pair = {r["pair"]: r for r in table.iter_rows(named=True)}
    traj = {p: [t["q"][i] / state["prior"][i] for t in state["trajectory"]] for i, p in enumerate(state["pairs"])}
    steps = [t["step"] for t in state["trajectory"]]
    lines = [f"**DRO audit** of {len(table)} language pairs: χ² ball ρ = {a.rho}, floor q/Q ≥ {a.min_ratio}, "
             f"loss EMA α = {a.ema}, {len(steps)} re-samplings (at steps {', '.join(map(str, steps)) or 'none'})"
             + (f"; **audit.resamples asked for {a.resamples}**: a run this short has room for "
                f"{len(state['schedule'])} (raise audit.steps for more)." if len(state["schedule"]) < a.resamples
                else "."),
             "As XY-LENT §6.6 reads the weights: pairs pushed **down** (w < 1) are the ones that make TRTD "
             "trivial — hub-aligned bitext (many sentences aligned to one, as en–xh) and near copies (ca–es, "
             "cs–sk); pairs pushed **up** are the ones the model keeps failing on — possibly noisy translations "
             "(es–ta, tr–ur, si–tr), or a clean pair of a harder language: the evidence and samples tell which.",
             *([f"Pair loss: the excess of each pair's loss over its baseline (`audit.baseline: {state.get('baseline')}`): "
                "what neither its languages' difficulty nor its translation explains, so a clean pair of a hard "
                "language does not pass for a noisy one (docs/stages/audit.md). `w_paper`: the weight the paper's "
                "form (Eq. 3 as printed, L_D + λ·L_G) would give on the same run."] if a.pair_loss == "excess" else
               [f"Pair loss: `{a.pair_loss}`, the raw loss: w also measures how hard each pair's languages are."]),
             "", *[f"- {c}" for c in check], ""]
    cols = ["pair", "w_final", "w_mean", "prior", "loss_ema",
            *(["baseline_loss_ema", "excess_loss_ema", "w_paper"] if a.pair_loss == "excess" else []), "reading",
            "verdict"]
    sides = {**{p: "up" for p in up}, **{p: "down" for p in down}}
    show = (table.filter(pl.col("pair").is_in(up + down))
            .with_columns(pl.Series("reading", [reading(r, sides[r["pair"]]) for r in table.filter(
                pl.col("pair").is_in(up + down)).iter_rows(named=True)], dtype=pl.String))
            .select(cols).with_columns(pl.col(pl.Float64).round(4)))
    lines += ["### Most up-weighted", "", markdown_table(show.filter(pl.col("pair").is_in(up)).to_dicts()), "",
              "### Most down-weighted", "",
              markdown_table(show.filter(pl.col("pair").is_in(down)).sort("w_final").to_dicts()), "",
              "### Evidence", ""]
    for side, pairs in (("up-weighted", up), ("down-weighted", down)):
        for p in pairs:
            lines += _pair_section(by_pair[p], side, [s for s in samples if s["pair"] == p], traj[p]) + [""]
    if a.exclude_top_up:
        chosen = up[: a.exclude_top_up]
        lines += ["### To train without the most up-weighted pairs", "",
                  "Check the evidence above first. Then (sampling and the stages after it rerun; the data stages "
                  "and the shards stay cached):", "", f"    xylent run pipeline --spec <spec> --set 'sampling.exclude_pairs=[{', '.join(chosen)}]'",
                  ""]
    unseen = int((table["loss_ema"].is_nan() | table["loss_ema"].is_null()).sum())
    if unseen:
        lines.append(f"{unseen} pair(s) were never drawn during the audit: their q stayed at Q (no loss to judge).")
    if a.pair_loss == "excess":
        drawn = ~(table["loss_ema"].is_nan() | table["loss_ema"].is_null())
        unmeasured = int((drawn & (table["baseline_loss_ema"].is_nan() | table["baseline_loss_ema"].is_null())).sum())
        if unmeasured:
            kind = state.get("baseline")
            why = (": a pair too small to hold out 2 rows with as many left has none" if str(kind).startswith("heldout")
                   else "")
            lines.append(f"{unmeasured} drawn pair(s) have no baseline (audit.baseline {kind}{why}): their q "
                         "stayed at Q.")
    return "\n".join(lines)
