"""Planted defects, end to end through the CLI on real text: a corpus of Django's
translations where one pair is shuffled (noise), one is a copy of its source
(trivial) and one is hub-aligned (tests/audit_planted.py). The audit must find
the copy at the bottom (the tiny model learns to copy across the pair, so that pair's
loss collapses); the noise and the hub are not yet separable at this size (see below).

Measured across seeds (issue 14's note): see docs/stages/audit.md, "Planted defects".
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from audit_planted import PLANTED, write_corpus
from tasks.audit.output import read_audit

NOISY, COPY, HUB = (f"{min('en', x)}-{max('en', x)}" for x in (PLANTED["noisy"], PLANTED["copy"], PLANTED["hub"]))


def test_planted_defects_rank_where_they_should(run_cli, tmp_path):
    spec = write_corpus(tmp_path / "corpus", seed=0)
    rc, out, err = run_cli("run", "audit", "--spec", spec, "--workspace", tmp_path / "ws", "--json")
    assert rc == 0, err[-3000:]
    audit_dir = Path(json.loads(out)["stages"]["audit"]["output_dir"])
    table = read_audit(audit_dir)
    n = table.height
    by_mean = dict(zip(table["pair"], table["rank_up_mean"]))
    w = dict(zip(table["pair"], table["w_mean"]))
    msg = table.select("pair", "w_final", "w_mean", "loss_ema", "g_loss_ema", "d_loss_ema").to_dicts()

    assert by_mean[COPY] == n and table["pair"][-1] == COPY, msg  # the trivial pair: the most down-weighted
    assert w[COPY] < 0.6 and table.filter(pl.col("pair") == COPY)["w_final"].item() < 0.6, msg
    # The shuffled and the hub pair are NOT asserted to rank high: at this size (a 64-wide model, 1 500
    # CPU steps) their losses sit inside the spread between languages (seeds 0 and 1: noisy ranks 3-4
    # of 9, hub 4-6), so the ranking says nothing about them yet; issue 14 stays open on this point.
    # What holds without the model: the evidence names both planted defects.
    verdicts = dict(zip(table["pair"], table["verdict"]))
    assert verdicts[COPY].startswith("near copies: 100 %") and verdicts[HUB].startswith("hub-aligned")
    assert table.filter(pl.col("pair") == HUB)["hub_max_sources"].item() >= 5
    assert "dedup removed" in verdicts[NOISY] and "length ratio" in verdicts[NOISY], verdicts[NOISY]
    report = (audit_dir / "report.md").read_text()
    assert "below it: the model learned" in report, "an audit of a model stuck at its base rate ranks nothing"
    assert "Ranking stability" in report
