"""The audit's adversary while the model trains: one loss EMA per language pair and
the K best-response re-samplings (XY-LENT §6.6, iterated best response).

It runs inside every training rank (``xylent.models.training.trainer``) on per-pair sums that were
all-reduced over the ranks, so every rank holds the same state and draws the same
batches; the state is plain lists (saved in each checkpoint, written as JSON at the
end), so a resumed run continues the same q trajectory.  Pure NumPy.
"""

from __future__ import annotations

import math

import numpy as np

from xylent.models.training.audit.dro import chi2_best_response, chi2_divergence

# columns of the per-pair sums the trainer hands in (xylent.models.stats.ROW_FIELDS + a row count)
SUM_FIELDS = ("g_loss", "g_count", "d_loss", "d_count", "d_pos", "rows")
EMAS = ("loss", "g", "d", "d_base", "base", "paired")  # each pair's: see PairAdversary.observe
STATE_FILE = "adversary.json"


def resample_steps(steps: int, resamples: int) -> list[int]:
    """The steps (optimizer steps done) at which q is re-solved: K points spread evenly
    inside the run, so the last q is trained on too; fewer when the run is too short."""
    if steps < 2:
        return []
    return sorted({min(steps - 1, max(1, round(k * steps / (resamples + 1)))) for k in range(1, resamples + 1)})


BASELINES = (None, "language", "sides", "larger", "partner", "partner-larger", "heldout", "heldout-larger")
USES_LANGUAGES = ("language", "larger", "partner-larger", "heldout-larger")  # each language's monolingual loss
PARTNER = ("partner", "partner-larger")  # the partner-swapped pass over the training rows
HELDOUT = ("heldout", "heldout-larger")  # the same, over rows held out of training
PAIRED = PARTNER + HELDOUT  # the translation's help measured on the same tokens beside another partner


def best_response_on_seen(losses: np.ndarray, prior: np.ndarray, rho: float, min_ratio: float) -> np.ndarray:
    """q over all pairs: the χ² best response on the pairs with a finite loss, within their share of
    the prior; the others keep q = Q (nothing is known of them)."""
    seen = np.isfinite(losses)
    q = np.asarray(prior, dtype=np.float64).copy()
    if seen.sum() >= 2:
        mass = q[seen].sum()
        q[seen] = chi2_best_response(losses[seen], q[seen] / mass, rho, min_ratio=min_ratio) * mass
    return q


def rate_over(ema: float, updates: float) -> float:
    """The rate that moves an EMA as far in one update as ``ema`` moves in ``updates``."""
    # 1 keeps ema itself: 1 - (1 - ema) ** 1 is not ema in floating point (0.1 -> 0.09999999999999998)
    return ema if updates == 1 else 1.0 - (1.0 - ema) ** updates


def binary_entropy(p: np.ndarray) -> np.ndarray:
    """The loss of always answering the base rate p (nats)."""
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return -(p * np.log(p) + (1 - p) * np.log(1 - p))


class PairAdversary:
    def __init__(self, pairs: list[str], prior: np.ndarray, *, rho: float, min_ratio: float, ema: float,
                 weights: tuple[float, float], steps: int, resamples: int, baseline: str | None = None,
                 languages: list[str] | None = None, updates_per_base: float = 1.0,
                 updates_per_language: float = 1.0):
        """``weights``: (w_G, w_D), each pair's loss is w_G·L_G + w_D·L_D.  ``baseline``: the adversary
        reads each pair's loss minus a baseline (pair_loss excess), None: the loss itself.

        - ``language``: the mean of its two languages' losses on their own monolingual text
          (:meth:`observe`'s ``lang``, one column per entry of ``languages``): what neither
          language's difficulty explains.  Text the pair memorised or gives away (a hub's
          repeated target, a copy) sits far below it; a noisy pair near it.
        - ``sides``: the same loss of the pair's own two sentences run alone (``base``): what the
          translation does not explain, pair by pair.
        - ``larger``: ``sides`` raised by how far the pair's loss sits below its languages' beyond the
          median pair's (see :func:`excess_baselines`): a pair whose text is far easier than its
          languages' (memorised repeats, a copy) goes down by the difference.
        - ``partner``: the same loss of the same tokens under the same masks, each sentence beside
          another row's partner of the same pair (``base``), against the training pass's loss of those
          very rows (``paired``): the translation's help alone, paired token by token.
        - ``partner-larger``: ``larger`` with ``partner`` in place of ``sides``.
        - ``heldout`` / ``heldout-larger``: ``partner`` / ``partner-larger`` measured on rows held out
          of training (``paired`` is then those rows as they are, not the training pass): the help
          of a translation the model never trained on, so a pairing it memorised (a shuffled pair
          seen for epochs) does not read as help.

        ``updates_per_base`` / ``updates_per_language``: how many of the loss EMA's updates (TRTD
        steps) pass between two measurements of the pairs' baselines / of the language baseline
        (audit.baseline_every, audit.language_every); each such EMA then moves as far per measurement
        as ``ema`` moves in that many updates, so every EMA spans the same stretch of the run (at
        baseline_every 10 the baselines otherwise averaged ten times as many steps as the loss)."""
        if baseline not in BASELINES:
            raise ValueError(f"unknown baseline {baseline!r}")
        self.baseline = baseline
        self.languages = list(languages or [])
        self.pairs = list(pairs)
        if baseline in USES_LANGUAGES:
            lang = {x: i for i, x in enumerate(self.languages)}
            missing = sorted({x for p in self.pairs for x in p.split("-")} - set(lang))
            if missing:
                raise ValueError(f"no monolingual baseline for language(s) {', '.join(missing)}")
            self.sides = np.array([[lang[x] for x in p.split("-")] for p in self.pairs], dtype=np.int64)
        self.index = {p: i for i, p in enumerate(self.pairs)}
        self.prior = np.asarray(prior, dtype=np.float64) / np.sum(prior)
        self.rho, self.min_ratio, self.ema_rate = rho, min_ratio, ema  # the spec's audit.ema
        self.base_rate = rate_over(ema, updates_per_base)
        self.lang_rate = rate_over(ema, updates_per_language)
        self.weights = (float(weights[0]), float(weights[1]))
        self.schedule = resample_steps(steps, resamples)
        n = len(self.pairs)
        # EMAs stay NaN until a pair is first seen: an unseen pair has no loss, not a made-up one
        self.ema = {k: np.full(n, np.nan) for k in EMAS}
        self.lang_ema = np.full(len(self.languages), np.nan)  # baseline language: each language's own loss
        # each EMA's total weight so far, 1 - (1 - rate) ** updates: what corrects its start (see _fold)
        self.mass = {k: np.zeros(n) for k in EMAS}
        self.lang_mass = np.zeros(len(self.languages))
        self.rows = np.zeros(n, dtype=np.int64)
        self.last_step = np.full(n, -1, dtype=np.int64)
        self.q = self.prior.copy()
        self.trajectory: list[dict] = []

    # -- training-time updates ------------------------------------------------
    def _weighted(self, sums: np.ndarray) -> tuple[np.ndarray, ...]:
        """(w_G·L_G + w_D·L_D, L_G, L_D, the discriminator's base-rate loss, seen) per pair."""
        g_loss, g_count, d_loss, d_count, d_pos, rows = np.asarray(sums, dtype=np.float64).T
        with np.errstate(invalid="ignore", divide="ignore"):
            g = np.where(g_count > 0, g_loss / g_count, np.nan)
            d = np.where(d_count > 0, d_loss / d_count, np.nan)
            d_base = np.where(d_count > 0, binary_entropy(d_pos / np.maximum(d_count, 1)), np.nan)
        # a component with weight whose count is 0 makes the step's loss unknown, not smaller
        loss = np.where((self.weights[0] > 0) & np.isnan(g) | (self.weights[1] > 0) & np.isnan(d), np.nan,
                        self.weights[0] * np.nan_to_num(g) + self.weights[1] * np.nan_to_num(d))
        return loss, g, d, d_base, rows > 0

    def _fold(self, key: str, x: np.ndarray, seen: np.ndarray) -> None:
        """An EMA corrected for its start (Adam's bias correction): after t updates it is the mean of
        the values seen, weighted by (1 - rate) ** age.  Started at the first value instead, a slow EMA
        (audit.ema 0.003 spans ~330 steps) kept that first value, the untrained model's loss, at 22 %
        of its weight 500 steps on; corrected, the first steps of a run are a plain running mean."""
        old, mass = (self.lang_ema, self.lang_mass) if key == "lang" else (self.ema[key], self.mass[key])
        upd = seen & np.isfinite(x)
        rate = {"lang": self.lang_rate, "base": self.base_rate, "paired": self.base_rate}.get(key, self.ema_rate)
        mass[upd] = (1 - rate) * mass[upd] + rate
        step = rate / mass[upd]  # 1 at the first update (NaN until then): the EMA starts at that value
        prev = np.nan_to_num(old[upd])
        old[upd] = prev + step * (x[upd] - prev)

    def observe(self, step: int, sums: np.ndarray, base: np.ndarray | None = None,
                lang: np.ndarray | None = None, paired: np.ndarray | None = None) -> None:
        """Fold one optimizer step's per-pair sums (n_pairs × SUM_FIELDS, all ranks) into the EMAs;
        ``base``: the same sums of the pairs' sides run alone (or beside another row's partner),
        ``paired``: the training pass's sums of exactly the rows ``base`` ran with another partner,
        ``lang``: of each language's monolingual rows (n_languages × SUM_FIELDS), on the steps that
        computed them."""
        loss, g, d, d_base, seen = self._weighted(sums)
        for key, x in (("loss", loss), ("g", g), ("d", d), ("d_base", d_base)):
            self._fold(key, x, seen)
        if base is not None:
            alone, *_, base_seen = self._weighted(base)
            self._fold("base", alone, base_seen)
        if lang is not None:
            own, *_, lang_seen = self._weighted(lang)
            self._fold("lang", own, lang_seen)
        if paired is not None:
            same, *_, paired_seen = self._weighted(paired)
            self._fold("paired", same, paired_seen)
        self.rows += np.asarray(sums, dtype=np.float64)[:, -1].astype(np.int64)
        self.last_step[seen] = step

    def baselines(self) -> np.ndarray:
        """Each pair's baseline (NaN until seen; all NaN without one)."""
        own = self.lang_ema[self.sides].mean(axis=1) if self.baseline in USES_LANGUAGES else None
        return excess_baselines(self.baseline, near_baseline(self.baseline, self.ema), own, self.ema["loss"])

    def pair_losses(self) -> np.ndarray:
        """What the adversary ranks: each pair's loss EMA, or its excess over the baseline
        (NaN until both were seen)."""
        return self.ema["loss"] - self.baselines() if self.baseline else self.ema["loss"]

    def due(self, step: int) -> bool:
        """Whether q is re-solved before optimizer step ``step`` (0-based) runs."""
        return step in self.schedule and all(t["step"] != step for t in self.trajectory)

    def resample(self, step: int) -> np.ndarray:
        """Solve the χ² best response on the pairs seen so far (unseen ones keep q = Q:
        the adversary knows nothing of them) and record it; returns the new q."""
        losses = self.pair_losses()
        seen = np.isfinite(losses)
        q = best_response_on_seen(losses, self.prior, self.rho, self.min_ratio)
        q_free = best_response_on_seen(losses, self.prior, self.rho, 0.0)
        self.q = q
        self.trajectory.append({"resample": len(self.trajectory) + 1, "step": int(step), "q": q.tolist(),
                                "q_unfloored": q_free.tolist(), "loss": _list(losses),
                                "pairs_seen": int(seen.sum())})
        return q

    def metrics(self) -> dict[str, float]:
        """What rank 0 logs at a re-sampling."""
        w = self.q / self.prior
        return {"audit/resample": float(len(self.trajectory)), "audit/w_max": float(w.max()),
                "audit/w_min": float(w.min()), "audit/divergence": chi2_divergence(self.q, self.prior),
                "audit/floored_pairs": float(np.sum(w <= self.min_ratio + 1e-9)),
                "audit/pairs_seen": float(np.isfinite(self.pair_losses()).sum())}

    # -- state ---------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"pairs": self.pairs, "prior": self.prior.tolist(), "schedule": self.schedule,
                "ema": {k: _list(v) for k, v in self.ema.items()}, "rows": self.rows.tolist(),
                "last_step": self.last_step.tolist(), "q": self.q.tolist(), "trajectory": self.trajectory,
                "rho": self.rho, "min_ratio": self.min_ratio, "ema_rate": self.ema_rate, "weights": list(self.weights),
                "baseline": self.baseline, "languages": self.languages, "lang_ema": _list(self.lang_ema),
                "mass": {k: v.tolist() for k, v in self.mass.items()}, "lang_mass": self.lang_mass.tolist()}

    def load_state_dict(self, state: dict) -> None:
        saved = state.get("baseline", "sides" if state.get("excess") else None)  # "excess": states before baselines
        if state["pairs"] != self.pairs or list(state["weights"]) != list(self.weights) or saved != self.baseline \
                or list(state.get("languages", [])) != self.languages:
            raise ValueError("the checkpoint's audit state is for other language pairs or another pair loss; train "
                             "again with --force")
        self.ema = {k: np.full(len(self.pairs), np.nan) for k in self.ema}  # a state from before "base": all NaN
        self.ema.update({k: np.array([np.nan if v is None else v for v in vals], dtype=np.float64)
                         for k, vals in state["ema"].items()})
        self.lang_ema = np.array([np.nan if v is None else v for v in state.get("lang_ema", [])] or
                                 np.full(len(self.languages), np.nan), dtype=np.float64)
        # a state from before the start correction: its EMAs are warm, so weight 1
        self.mass = {k: np.array(state.get("mass", {}).get(k) or np.isfinite(self.ema[k]).astype(np.float64))
                     for k in EMAS}
        self.lang_mass = np.array(state.get("lang_mass") or np.isfinite(self.lang_ema).astype(np.float64))
        self.rows = np.array(state["rows"], dtype=np.int64)
        self.last_step = np.array(state["last_step"], dtype=np.int64)
        self.q = np.array(state["q"], dtype=np.float64)
        self.trajectory = list(state["trajectory"])


def near_baseline(kind: str | None, ema: dict[str, np.ndarray]) -> np.ndarray:
    """The pair-by-pair part of a baseline on the loss EMA's own scale: the sides run alone, or
    (partner kinds) the loss EMA less the translation's measured help, i.e. less the training
    pass's loss of the partner-measured rows minus their loss beside another partner."""
    if kind in PAIRED:
        return ema["loss"] - (ema["paired"] - ema["base"])
    return ema["base"]


def excess_baselines(kind: str | None, sides: np.ndarray, languages: np.ndarray | None,
                     loss: np.ndarray) -> np.ndarray:
    """Each pair's baseline for pair_loss excess (NaN until measured), from the EMAs of its sides
    run alone (or its loss less the translation's measured help: :func:`near_baseline`), of its two
    languages' monolingual text (the mean of the two) and of its own loss.

    The ``-larger`` kinds (``larger``, ``partner-larger``, ``heldout-larger``) read two defects, one
    term each: the loss the translation leaves (loss − sides: below 0 as far as the translation
    helps, near 0 for a noisy pair) and how far the pair's loss sits below its languages' (loss −
    language) beyond where the median pair sits (the monolingual text is packed documents, not
    single sentences, so its loss is at another level, about 3 above the pairs' on the planted
    corpus; only differences between pairs mean anything).  The baseline is the sides' raised by
    that shortfall, so the excess is loss − sides less it: a typical pair keeps its own sentences'
    baseline, a pair whose text is easier than its languages by more than the median pair's (a
    hub's repeated target, a copy, another language's text) goes down by the difference.  The
    shortfall is read on the loss itself, not on the sides' loss (the form until 2026-12-02): there
    the help entered both terms, and a shuffled pair, whose own partner read as worse than another
    row's, read as easier than its languages and went down with the hubs (planted corpus, seed 2)."""
    if kind is None:
        return np.full(len(sides), np.nan)
    if kind in ("sides", "partner", "heldout"):
        return sides
    if kind == "language":
        return languages
    below = np.where(np.isfinite(sides), loss - languages, np.nan)  # the median over pairs with both baselines
    if not np.isfinite(below).any():
        return np.full(len(sides), np.nan)
    return sides + np.maximum(0.0, np.nanmedian(below) - below)  # NaN until both were measured


def _list(a: np.ndarray) -> list:
    """JSON-safe: NaN (never seen) as None."""
    return [None if not math.isfinite(x) else float(x) for x in a]
