"""Planted defects, end to end through the CLI on real text, in a short run: a corpus of
Django's translations where one pair is shuffled (noise), one is a copy of its source
(trivial) and one is hub-aligned (tests/audit_planted.py).  What holds without a trained
model holds here: the evidence names all three defects and the report is whole.  Where the
copy ranks after full-size training, on two seeds, is the acceptance tier's claim
(tests/acceptance/test_planted_audit.py; measured across seeds in docs/records/audit-measured.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import polars as pl

from audit_planted import CLEAN, PLANTED, write_corpus
from xylent.tasks.audit.contract import read_audit

NOISY, COPY, HUB = (f"{min('en', x)}-{max('en', x)}" for x in (PLANTED["noisy"], PLANTED["copy"], PLANTED["hub"]))
SHORT = 60  # pretraining and audit steps: the evidence and the report need no trained model; five re-samplings


@pytest.mark.costs(deepspeed=1)
def test_planted_defects_are_named_by_the_evidence(run_cli, tmp_path):
    spec = write_corpus(tmp_path / "corpus", seed=0, steps=SHORT)
    rc, out, err = run_cli("run", "audit", "--spec", spec, "--workspace", tmp_path / "ws", "--json")
    assert rc == 0, err[-3000:]
    audit_dir = Path(json.loads(out)["stages"]["audit"]["output_dir"])
    table = read_audit(audit_dir)
    assert set(table["pair"]) == {f"{min('en', x)}-{max('en', x)}" for x in [*CLEAN, *PLANTED.values()]}
    verdicts = dict(zip(table["pair"], table["verdict"]))
    assert verdicts[COPY].startswith("near copies: 100 %") and verdicts[HUB].startswith("hub-aligned")
    assert table.filter(pl.col("pair") == HUB)["hub_max_sources"].item() >= 5
    assert "dedup removed" in verdicts[NOISY] and "length ratio" in verdicts[NOISY], verdicts[NOISY]
    report = (audit_dir / "report.md").read_text()
    assert "Ranking stability" in report and "- reading: " in report and "§6.6" in report
