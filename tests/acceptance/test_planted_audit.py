"""Planted defects at full size (tests/audit_planted.py: 3000 audit steps from scratch), issue 34's
bar on three seeds with the default pair loss (each pair's loss with its own translation less beside
another row's of the same pair and direction, less how far the pair's loss sits below its languages'
beyond the median pair's: xylent.models.training.audit.adversary.excess_baselines): the copied pair in the bottom 2, the
hub-aligned pair in the bottom half (both trivial: XY-LENT §6.6 pushes them down), the shuffled pair
in the top 3 and above every clean pair, all by w_final, the final distribution against the initial
one: XY-LENT's Figure 4 ranks the pairs "between the initial and final language distributions", and
the report ranks by it.  The same ranks by w averaged over the re-samplings (w_mean), the paper's
form (L_D + λ·L_G) read on the same runs (w_paper: its best response to the same EMAs) and a
dose-response on seed 0 (w and the excess loss of the noisy pair at 0, 25, 50, 100 % of it
shuffled) are recorded, not held.

"""

from __future__ import annotations

import json
import time
from pathlib import Path

import polars as pl
import pytest

from audit_planted import PLANTED, write_corpus
from xylent.tasks.audit.contract import read_audit
from tests.acceptance.claims import record

NOISY, COPY, HUB = (f"{min('en', x)}-{max('en', x)}" for x in (PLANTED["noisy"], PLANTED["copy"], PLANTED["hub"]))
SEEDS = (0, 1, 2)
DOSES = (0.0, 0.25, 0.5)  # and 1.0: seed 0's own corpus
DOSE_SEED = 0


def _audit(run_cli, spec: Path, ws: Path, *extra: str) -> pl.DataFrame:
    rc, out, err = run_cli("run", "audit", "--spec", spec, "--workspace", ws, "--json", *extra)
    assert rc == 0, err[-3000:]
    audit_dir = Path(json.loads(out)["stages"]["audit"]["output_dir"])
    report = (audit_dir / "report.md").read_text()
    assert "below it: the model learned" in report, "an audit of a model that learned says so"
    return read_audit(audit_dir).with_columns(pl.lit(report).alias("_report"))


def _ranks(table: pl.DataFrame, column: str = "rank_up") -> dict[str, int]:
    """pair -> its rank, 1 the most up-weighted: by w_final (``rank_up``) or by w_mean (``rank_up_mean``)."""
    return dict(zip(table["pair"], table[column]))


def bar(table: pl.DataFrame) -> tuple[bool, bool, bool]:
    """Issue 34's bar on one audit, by w_final: (the copy in the bottom 2, the hub in the bottom half,
    the shuffled pair in the top 3 and above every clean pair)."""
    n, rank = table.height, _ranks(table)
    clean = [p for p in table["pair"] if p not in (COPY, NOISY, HUB)]
    return rank[COPY] >= n - 1, rank[HUB] > n // 2, rank[NOISY] <= 3 and all(rank[NOISY] < rank[p] for p in clean)


@pytest.mark.costs(deepspeed=6)  # each seed's audit, three more dose corpora on one seed
def test_planted_defects_rank_as_section_6_6_reads_them_on_three_seeds(run_cli, tmp_path):
    start, figures, held, dose = time.monotonic(), {}, [], {}
    for seed in SEEDS:
        spec = write_corpus(tmp_path / f"corpus-{seed}", seed=seed)
        table = _audit(run_cli, spec, tmp_path / f"ws-{seed}")
        n, rank, by_mean = table.height, _ranks(table), _ranks(table, "rank_up_mean")
        clean = [p for p in table["pair"] if p not in (COPY, NOISY, HUB)]
        w = dict(zip(table["pair"], table["w_final"]))
        w_mean = dict(zip(table["pair"], table["w_mean"]))
        excess = dict(zip(table["pair"], table["excess_loss_ema"]))
        figures[f"seed {seed}: rank of copy / hub / noisy (of {n})"] = f"{rank[COPY]} / {rank[HUB]} / {rank[NOISY]}"
        figures[f"seed {seed}: w_final of copy / hub / noisy / best clean"] = \
            f"{w[COPY]:.2f} / {w[HUB]:.2f} / {w[NOISY]:.2f} / {max(w[p] for p in clean):.2f}"
        figures[f"seed {seed}, by w_mean: rank of copy / hub / noisy (of {n})"] = \
            f"{by_mean[COPY]} / {by_mean[HUB]} / {by_mean[NOISY]}"
        figures[f"seed {seed}: w_mean of copy / hub / noisy / best clean"] = \
            f"{w_mean[COPY]:.2f} / {w_mean[HUB]:.2f} / {w_mean[NOISY]:.2f} / {max(w_mean[p] for p in clean):.2f}"
        figures[f"seed {seed}: excess of copy / hub / noisy / clean (mean)"] = \
            f"{excess[COPY]:.2f} / {excess[HUB]:.2f} / {excess[NOISY]:.2f} / " \
            f"{sum(excess[p] for p in clean) / len(clean):.2f}"
        paper = _ranks(table, "rank_up_paper")
        figures[f"seed {seed}, paper form on the same run (w_paper): rank of copy / hub / noisy (of {n})"] = \
            f"{paper[COPY]} / {paper[HUB]} / {paper[NOISY]}"
        copy_section = table["_report"][0].split(f"#### {COPY} ", 1)[-1].split("####", 1)[0]
        figures[f"seed {seed}: the report's reading of the copy"] = \
            copy_section.split("- reading: ", 1)[-1].split("\n", 1)[0] if "- reading: " in copy_section else "not shown"
        held.append((seed, bar(table), table.select("pair", "w_final", "w_mean", "loss_ema", "baseline_loss_ema",
                                            "excess_loss_ema").to_dicts()))
        if seed == DOSE_SEED:
            dose[1.0] = (w[NOISY], w_mean[NOISY], excess[NOISY])
    for share in DOSES:
        spec = write_corpus(tmp_path / f"dose-{share}", seed=DOSE_SEED, shuffled=share)
        row = _audit(run_cli, spec, tmp_path / f"dose-ws-{share}").filter(pl.col("pair") == NOISY).row(0, named=True)
        dose[share] = (row["w_final"], row["w_mean"], row["excess_loss_ema"])
    doses = sorted(dose)
    for k, name in enumerate(("w_final", "w_mean", "excess")):
        figures[f"dose-response, seed {DOSE_SEED}: {name} of the noisy pair at 0 / 25 / 50 / 100 % shuffled"] = \
            " / ".join(f"{dose[d][k]:.2f}" for d in doses)
        figures[f"dose-response, seed {DOSE_SEED}: {name} rises with the share"] = \
            all(dose[a][k] < dose[b][k] for a, b in zip(doses, doses[1:]))
    print(json.dumps(figures, indent=1))  # shown by pytest when the assertion below fails
    failed = []
    for seed, (copy_ok, hub_ok, noisy_ok), rows in held:
        top = sorted(rows, key=lambda r: -r["w_final"])[:4]
        above = ", ".join(f"{r['pair']} {r['w_final']:.2f}" for r in top)
        failed += [f"seed {seed}: {what} (top by w_final: {above})" for ok, what in (
            (copy_ok, "the copy is not in the bottom 2"), (hub_ok, "the hub is not in the bottom half"),
            (noisy_ok, "the shuffled pair is not in the top 3 above every clean pair")) if not ok]
    record("planted-audit", figures,
           {"default pair loss (excess, baseline partner-larger), by w_final (Figure 4's final against initial "
            "distribution), every seed of " + str(list(SEEDS)):
            "copy in the bottom 2, hub in the bottom half, noisy in the top 3 and above every clean pair",
            "the same by w_mean": "recorded, not held",
            "dose-response (one seed)": "recorded, not held: w moved more between corpora than a quarter of the "
                                        "pair shuffled at 1 500 steps (issue 34)",
            "paper form (w_paper, the same runs)": "recorded beside, not held"},
           seconds=time.monotonic() - start, failed=failed)
    assert not failed, (failed, [rows for _, _, rows in held])
