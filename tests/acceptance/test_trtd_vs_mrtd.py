"""XLM-E's ablation with the paper's question (issue 63, item 5): ELECTRA on MRTD and TRTD (the demo's
own recipe, data_specs/recipes/electra.yaml) against ELECTRA on monolingual MRTD only
(electra-mrtd-only.yaml), over three seeds, read by `xylent compare --seeds` on the stripped
retrieval tasks and as given.

Held: every run trains and is evaluated, and each verdict is one `xylent compare` gives.  Recorded,
not held: what the translation pairs add, whichever way it goes (docs/recipes.md writes it)."""

from __future__ import annotations

import pytest

from tests.acceptance.test_xy_vs_enx import measure_paired_over_seeds


@pytest.mark.costs(deepspeed=6)  # each recipe's pretraining at each seed
def test_trtd_against_mrtd_only_with_electra_over_three_seeds(run_cli, demo_full, tmp_path):
    measure_paired_over_seeds("trtd-vs-mrtd-electra", run_cli, demo_full, tmp_path / "trtd",
                              ("electra", "electra-mrtd-only"))
