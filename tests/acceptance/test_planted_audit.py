"""Planted defects at full size (tests/audit_planted.py: 1500 pretraining and 1500 audit steps),
on two seeds: the copied pair, whose loss collapses, is the most down-weighted by w averaged over
the re-samplings, in the bottom 2 at the final re-sampling (issue 34's bar; with the paper's gate,
seed 1 put it 8th of 9 there, w 0.54 against 0.52), and below w = 0.6; an audit of a model that
learned says so.  The shuffled and the hub-aligned pair are not held to a rank (docs/stages/audit.md,
"Planted defects"): their ranks are recorded."""

from __future__ import annotations

import json
import time
from pathlib import Path

import polars as pl
import pytest

from audit_planted import PLANTED, write_corpus
from tasks.audit.output import read_audit
from tests.acceptance.claims import record

NOISY, COPY, HUB = (f"{min('en', x)}-{max('en', x)}" for x in (PLANTED["noisy"], PLANTED["copy"], PLANTED["hub"]))
SEEDS = (0, 1)
W_COPY = 0.6


@pytest.mark.costs(deepspeed=6)  # pretrain and audit on each seed, then the excess form's audit
def test_the_copied_pair_ranks_last_on_two_seeds(run_cli, tmp_path):
    start, figures = time.monotonic(), {}
    for seed in SEEDS:
        spec = write_corpus(tmp_path / f"corpus-{seed}", seed=seed)
        rc, out, err = run_cli("run", "audit", "--spec", spec, "--workspace", tmp_path / f"ws-{seed}", "--json")
        assert rc == 0, err[-3000:]
        audit_dir = Path(json.loads(out)["stages"]["audit"]["output_dir"])
        table = read_audit(audit_dir)
        n, rank = table.height, dict(zip(table["pair"], table["rank_up_mean"]))
        w = dict(zip(table["pair"], table["w_mean"]))
        figures[f"seed {seed}: rank of copy / noisy / hub (of {n})"] = f"{rank[COPY]} / {rank[NOISY]} / {rank[HUB]}"
        figures[f"seed {seed}: w of copy (mean / final)"] = \
            f"{w[COPY]:.3f} / {table.filter(pl.col('pair') == COPY)['w_final'].item():.3f}"
        figures[f"seed {seed}: rank of copy at the final re-sampling"] = table["pair"].to_list().index(COPY) + 1
        msg = table.select("pair", "w_final", "w_mean", "loss_ema").to_dicts()
        assert rank[COPY] == n and COPY in table["pair"].to_list()[-2:], msg
        assert w[COPY] < W_COPY and table.filter(pl.col("pair") == COPY)["w_final"].item() < W_COPY, msg
        report = (audit_dir / "report.md").read_text()
        assert "below it: the model learned" in report
        copy_section = report.split(f"#### {COPY} ", 1)[1].split("####", 1)[0]
        assert "reading: trivial: near copy" in copy_section, "§6.6's reading of a pushed-down copy"
        # the same corpus and seed with pair_loss excess (docs/stages/audit.md): recorded beside, not held
        rc, out, err = run_cli("run", "audit", "--spec", spec, "--workspace", tmp_path / f"ws-{seed}", "--json",
                               "--set", "audit.pair_loss=excess", "--set", "audit.baseline_every=5")
        assert rc == 0, err[-3000:]
        table = read_audit(Path(json.loads(out)["stages"]["audit"]["output_dir"]))
        rank = dict(zip(table["pair"], table["rank_up_mean"]))
        clean = [p for p in table["pair"] if p not in (COPY, NOISY, HUB)]
        figures[f"seed {seed}, excess: rank of copy / noisy / hub (of {n})"] = \
            f"{rank[COPY]} / {rank[NOISY]} / {rank[HUB]}"
        figures[f"seed {seed}, excess: noisy above every clean pair"] = all(rank[NOISY] < rank[p] for p in clean)
    record("planted-audit", figures, {"copy": f"last by w_mean, bottom 2 by w_final, both < {W_COPY}, seeds "
                                              f"{list(SEEDS)}",
                                      "noisy, hub": "recorded, not held",
                                      "pair_loss excess": "recorded beside, not held"},
           seconds=time.monotonic() - start)
