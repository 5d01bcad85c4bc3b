"""How well any estimator of a pair's translation help can tell a shuffled pair from a clean one
(issue 34 item 3): the help measured on an audit's final model over every row it can get.

    .venv/bin/python wip/help_power.py AUDIT_DIR [--rows 800] [--draws 1]

AUDIT_DIR is an audit's output folder (``WS/audit/<fingerprint>``: model/, train.json).  For each
pair, up to ``--rows`` training rows and all its held-out rows run forward as they are and with each
second sentence swapped for another row's of the same pair and direction (the audit's own
``partners_swapped``, replaying ELECTRA's replacements), in both directions, ``--draws`` masking
draws each.  Prints the help (swapped − own, ratio of sums over the pair, in the adversary's units:
w_G·L_G + w_D·L_D with the audit's ``audit.weights`` from train.json) with a bootstrap standard error,
its G and D parts, and the per-row standard deviation that sets how many rows a measurement needs:
se ≈ sd / √rows.  With ``--draws`` > 1 it also splits one held-out row's help variance into the
row's own (row to row) and the masks' (draw to draw): whether measuring the same rows more often
could stand in for more rows.  ELECTRA audits only (the swapped pass replays its replacements).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.audit_step import HELDOUT_NOISE, directed, partners_swapped  # noqa: E402
from models.masking import row_noise  # noqa: E402
from models.objectives import build_model  # noqa: E402
from models.pretrained import read_model_dir  # noqa: E402
from tasks.shards.loader import TrainingLoader  # noqa: E402

ROWS_PER_BATCH = 16


class _Engine:
    """What partners_swapped calls: the model itself, no DeepSpeed (one process, forward only)."""

    def __init__(self, model):
        self.module = model

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def measure(engine, loader: TrainingLoader, index: dict, g: int, rows: np.ndarray, flip: bool, draws: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """Per-row sums (draws × ROW_FIELDS × kept rows) of ``rows`` of pair ``g`` as they are and swapped."""
    own, swapped = [[] for _ in range(draws)], [[] for _ in range(draws)]
    for at in range(0, len(rows), ROWS_PER_BATCH):
        examples = []
        for i in rows[at: at + ROWS_PER_BATCH]:
            src, tgt = loader.rows[g].get(int(i), 0), loader.rows[g].get(int(i), 1)
            examples.append((g, flip, int(i), *((tgt, src) if flip else (src, tgt))))
        if len(examples) < 2:
            continue
        batch = loader._pack(examples)
        ids = torch.from_numpy(batch["input_ids"]).long()
        pad = ids == engine.module.cfg.special("pad")
        seg = torch.from_numpy(batch["segment_ids"])
        keys = directed(batch["pairs"], batch["flipped"], index)
        for d in range(draws):
            noise = row_noise(1234 + d, 7, HELDOUT_NOISE, list(range(len(examples))), (~pad).sum(1).tolist(),
                              ids.shape[1])
            with torch.no_grad():
                as_is = engine(ids, pad, seg, noise, per_row=True).rows
                sw, kept = partners_swapped(engine, ids, pad, seg, noise, keys, 0, 1, engine.module.corrupted)
            own[d].append(as_is[:, kept].numpy())
            swapped[d].append(sw.numpy())
    return (np.stack([np.concatenate(x, 1) for x in own]), np.stack([np.concatenate(x, 1) for x in swapped]))


def help_of(own: np.ndarray, sw: np.ndarray, weights: tuple[float, float]) -> tuple[float, float]:
    """(G part, D part) of swapped − own, per token, ratio of sums: the adversary's per-pair loss
    (``PairAdversary._weighted``) of the swapped rows less that of the rows as they are."""
    return (float(weights[0] * (sw[0].sum() - own[0].sum()) / own[1].sum()),
            float(weights[1] * (sw[2].sum() - own[2].sum()) / own[3].sum()))


def bootstrap_se(own: np.ndarray, sw: np.ndarray, weights: tuple[float, float], n: int = 300) -> float:
    rng = np.random.default_rng(1)
    cols = own.shape[1]
    draws = [sum(help_of(own[:, k], sw[:, k], weights)) for k in (rng.integers(0, cols, cols) for _ in range(n))]
    return float(np.std(draws))


def variance_split(own: np.ndarray, sw: np.ndarray, weights: tuple[float, float]) -> tuple[float, float]:
    """(row to row, draw to draw) variance of one row's help (per token, w_G·L_G + w_D·L_D), from
    draws × fields × rows sums of the same rows under different masks."""
    per = (weights[0] * (sw[:, 0] - own[:, 0]) / np.maximum(own[:, 1], 1)
           + weights[1] * (sw[:, 2] - own[:, 2]) / np.maximum(own[:, 3], 1))  # draws × rows
    draws = per.shape[0]
    within = float(per.var(0, ddof=1).mean())
    return max(0.0, float(per.mean(0).var(ddof=1)) - within / draws), within


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("audit_dir", type=Path)
    ap.add_argument("--rows", type=int, default=800, help="training rows per pair (default 800)")
    ap.add_argument("--draws", type=int, default=1, help="masking draws per row (default 1)")
    args = ap.parse_args(argv)
    try:
        meta, cfg, _ = read_model_dir(args.audit_dir / "model")
        train = json.loads((args.audit_dir / "train.json").read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{args.audit_dir}: not an audit's output ({exc}); point it at WS/audit/<fingerprint>")
    if meta.get("objective") != "electra" or not train.get("dro"):
        raise SystemExit(f"{args.audit_dir}: not an ELECTRA audit's output (objective {meta.get('objective')!r}); "
                         "point it at WS/audit/<fingerprint> of an audit with pretrain.objective electra")
    weights = (float(train["dro"]["weights"][0]), float(train["dro"]["weights"][1]))
    model = build_model("electra", cfg, float(train["pretrain"]["disc_weight"]), train["pretrain"]["mask_prob"])
    model.load_state_dict(load_file(str(args.audit_dir / "model" / "pretraining.safetensors")))
    model.eval()
    engine = _Engine(model)
    loader = TrainingLoader(train["shards_dir"], train["sampling_dir"], task="trtd", holdout=train["dro"]["holdout"],
                            verify=False)
    index = {p: i for i, p in enumerate(loader.names)}
    rng = np.random.default_rng(0)
    print(f"{'pair':8s} {'training rows: help ± se':>26s} {'G':>7s} {'D':>6s} {'row sd':>7s} {'n':>5s}   "
          f"{'held-out rows: help ± se':>24s} {'n':>4s}")
    for g, pair in enumerate(loader.names):
        held = np.asarray(loader.held[g])
        pool = np.setdiff1d(np.arange(loader.rows[g].n), held)
        trained = rng.choice(pool, min(args.rows, len(pool)), replace=False)
        out = []
        for rows in (trained, held):
            parts = [measure(engine, loader, index, g, rows, flip, args.draws) for flip in (False, True)]
            own, sw = (np.concatenate([p[k] for p in parts], 2) for k in (0, 1))  # draws × fields × rows
            flat_own, flat_sw = (np.concatenate(list(x), 1) for x in (own, sw))
            out.append((*help_of(flat_own, flat_sw, weights), bootstrap_se(flat_own, flat_sw, weights),
                        flat_own.shape[1], own, sw))
        (gt, dt, set_, nt, _, _), (gh, dh, seh, nh, own, sw) = out
        split = ""
        if args.draws > 1:
            rows_var, draws_var = variance_split(own, sw, weights)
            split = f"   held-out row to row {rows_var:7.1f}, draw to draw {draws_var:6.1f}"
        print(f"{pair:8s} {gt + dt:17.2f} ± {set_:5.2f} {gt:7.3f} {dt:6.2f} {set_ * np.sqrt(nt):7.1f} {nt:5d}   "
              f"{gh + dh:15.2f} ± {seh:5.2f} {nh:4d}{split}")


if __name__ == "__main__":
    main()
