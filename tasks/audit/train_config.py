"""The audit stage's training run: the pretrain stage's settings (xylent.tasks.pretrain.train_json)
plus the DRO adversary's (xylent.models.training.audit.adversary), from the spec's ``audit`` section."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from xylent.models.training.audit.adversary import HELDOUT, PAIRED, STATE_FILE, USES_LANGUAGES
from xylent.models.training.run_config import DroConfig, TrainConfig, first_trtd_step, task_plan, trtd_share
from xylent.data.loader import TrainingLoader
from xylent.tasks.pretrain.train_json import train_config
from xylent.data.shards import has_rows, read_index
from xylent.errors import XylentError
from xylent.spec import Spec

FULL_WEIGHTS = "model/pretraining.safetensors"  # every weight of the pretrain stage's model (xylent.tasks.pretrain.contract)


def pair_loss_weights(pair_loss: str, objective: str, disc_weight: float) -> list[float]:
    """(w_G, w_D) of each pair's loss; the MLM ablation has no discriminator: its MLM loss alone."""
    if objective != "electra":
        return [1.0, 0.0]
    return [disc_weight, 1.0] if pair_loss == "paper" else [1.0, disc_weight]  # excess: the trained one


def auto_baseline_every(rows_per_measurement: float, ema: float, rows: int, trtd_share: float, cap: int) -> int:
    """audit.baseline_every auto: the largest N whose baseline EMAs still average ``rows`` rows of a pair
    that ``rows_per_measurement`` of its rows measure at a time.  An EMA at rate a averages (2 − a)/a
    measurements (its effective sample), and measuring every N steps moves it as far per measurement
    as ``ema`` moves in the N · ``trtd_share`` TRTD steps between (xylent.models.training.audit.adversary.rate_over), so
    r · (2 − a)/a ≥ rows  ⟺  a ≤ 2r / (rows + r)  ⟺  N · share ≤ ln(1 − 2r/(rows + r)) / ln(1 − ema).
    At most ``cap`` (a tenth of a re-sampling window: every window still measures ten times), at least 1."""
    bound = 2 * rows_per_measurement / (rows + rows_per_measurement)
    if bound >= 1:  # one measurement holds the rows: any rate will do
        return max(1, cap)
    updates = math.log1p(-bound) / math.log1p(-ema)
    if updates < 1:  # fewer than one TRTD step a measurement: no N measures more often than every TRTD step
        return 1
    return max(1, min(cap, math.floor(updates / trtd_share)))


def median_pair_rows(cfg: TrainConfig, draws: int = 16) -> float:
    """What one baseline measurement reads of the median pair under the sampling table: the mean global
    TRTD rows of a micro-batch (the loader's own packing of ``draws``) times a step's TRTD micro-batches
    times its share, or, held out, the two rows of each pair one held-out batch measures, over the pairs
    with rows to hold out."""
    loader = TrainingLoader(cfg.shards_dir, cfg.sampling_dir, task="trtd", seed=cfg.seed, batch_size=cfg.batch_size,
                            max_tokens=cfg.trtd_max_tokens, verify=False, holdout=cfg.dro.holdout)
    if cfg.dro.baseline in HELDOUT:
        measured = sum(len(h) > 0 for h in loader.held)
        return 2 * loader.heldout_pairs_per_batch() / max(1, measured)
    per_micro = np.mean([len(b["pairs"]) for b in loader.batches(draws)])
    micro = max(task_plan(cfg, s).count("trtd") for s in range(min(cfg.steps, 100)))
    return float(per_micro * max(1, micro) * np.median(loader.prior))


def resolve_baseline_every(cfg: TrainConfig, rows: int) -> int:
    """audit.baseline_every auto for this run (:func:`auto_baseline_every`).  The pairs decide: the
    language baseline's monolingual batch is a training batch's size over far fewer languages."""
    return auto_baseline_every(median_pair_rows(cfg), cfg.dro.ema, rows, trtd_share(cfg),
                               cap=cfg.steps // (cfg.dro.resamples + 1) // 10)


def audit_train_config(spec: Spec, upstream: dict[str, Path], ckdir: Path, run_id: str | None,
                       tracking_uri: str | None, shards_source: str | None = None) -> TrainConfig:
    a, p = spec.audit, spec.pretrain
    baseline = a.baseline
    if "trtd" not in p.batch_kinds:
        raise XylentError("the audit re-weights TRTD language pairs, but pretrain.batch_kinds has no 'trtd'",
                          where="spec field pretrain.batch_kinds", fix="add 'trtd' to pretrain.batch_kinds")
    index = read_index(upstream["shards"])
    if not has_rows(index, "trtd"):
        raise XylentError("the shards hold no TRTD (bitext) data: there are no language pairs to audit",
                          where=str(upstream["shards"]), fix="add bitext sources to the spec")
    if a.pair_loss == "excess" and baseline in PAIRED and p.objective == "infoxlm":
        raise XylentError(f"audit.baseline {baseline} runs an extra pass over each pair with other partners, "
                          "which would feed InfoXLM's XLCo key queue", where="spec field audit.baseline",
                          fix="use audit.baseline: sides or larger with objective infoxlm")
    if a.pair_loss == "excess" and baseline in USES_LANGUAGES:
        pair_langs = {x for pair, g in index["trtd"].items() if g["rows"] for x in pair.split("-")}
        missing = sorted(x for x in pair_langs if not index["mrtd"].get(x, {}).get("rows"))
        if missing:
            raise XylentError(f"audit.baseline language measures each language on its monolingual text, but "
                              f"{', '.join(missing)} has none in the shards", where="spec field audit.baseline",
                              fix="add monolingual sources for these languages, or set audit.baseline: "
                                  + {"partner-larger": "partner", "heldout-larger": "heldout"}.get(baseline, "sides"))
    heldout = a.pair_loss == "excess" and baseline in HELDOUT
    if heldout and a.holdout == 0:
        raise XylentError(f"audit.baseline {baseline} measures rows held out of training, but audit.holdout is 0",
                          where="spec field audit.holdout", fix="set audit.holdout above 0 (e.g. 0.02)")
    if heldout and not any(g["rows"] >= 4 for g in index["trtd"].values()):  # 2 held out, as many left
        raise XylentError(f"audit.baseline {baseline} holds 2 rows of a pair out at least, but every pair has "
                          "fewer than 4 rows", where=str(upstream["shards"]), fix="use audit.baseline: larger")
    cfg = train_config(spec, upstream, ckdir, run_id, tracking_uri, shards_source)
    cfg.steps = a.steps or p.steps
    cfg.warmup_steps = min(cfg.warmup_steps, max(0, cfg.steps - 1))
    cfg.checkpoint_every = min(cfg.checkpoint_every, cfg.steps)
    cfg.snapshot_tokens = []  # a learning curve is pretraining's; the audit's model is its last step
    if cfg.objective_options.get("freeze_body_steps"):  # VECO's two-phase start is pretraining's, not the audit's
        cfg.objective_options = {**cfg.objective_options, "freeze_body_steps": 0}
    first = first_trtd_step(cfg)
    if first is None or first >= cfg.steps:
        raise XylentError(f"the audit's {cfg.steps} step(s) of pretrain.batch_schedule {cfg.batch_schedule!r} train no "
                          "TRTD step: no language pair would be seen", where="spec field audit.steps",
                          fix=f"raise audit.steps to at least {first + 1}" if first is not None
                          else "set pretrain.trtd_ratio above 0")
    cfg.dro = DroConfig(rho=a.rho, min_ratio=a.min_ratio, ema=a.ema, resamples=a.resamples,
                        weights=pair_loss_weights(a.pair_loss, p.objective, p.disc_weight),
                        baseline=baseline if a.pair_loss == "excess" else None,
                        baseline_every=1 if a.baseline_every == "auto" else a.baseline_every,
                        language_every=a.language_every,
                        holdout=a.holdout if heldout else 0.0, state_file=str(ckdir / STATE_FILE))
    if a.baseline_every == "auto" and cfg.dro.baseline is not None:
        cfg.dro.baseline_every = resolve_baseline_every(cfg, a.baseline_rows)
    if a.init == "pretrain":
        weights = Path(upstream["pretrain"]) / FULL_WEIGHTS
        if not weights.is_file():
            raise XylentError("the pretrain output has no full weights to start the audit from", where=str(weights),
                              fix="rerun the pretrain stage (xylent run pretrain --force), or set audit.init: scratch")
        cfg.init_from = str(weights)
    return cfg

