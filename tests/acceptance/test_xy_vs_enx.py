"""XY-LENT's finding with the recipe that aligns (issue 63, item 5): the infoxlm recipe on every X–Y
pair (data_specs/recipes/infoxlm.yaml) against the same recipe on English-centric pairs only
(infoxlm-en-x.yaml), over three seeds, read by `xylent compare --seeds` (paired per seed and
language, Student's t over the seeds).

Held: every run trains and is evaluated, and each verdict is one `xylent compare` gives.  Recorded,
not held: the differences and their verdicts, whichever way they go (docs/recipes.md writes them)."""

from __future__ import annotations

import json
import time

import pytest

from conftest import ROOT, linked_data
from tests.acceptance.claims import kept_folder, record

SEEDS = (0, 1, 2)
TASKS = ("django-holdout stripped", "allauth stripped", "django-holdout", "allauth", "django-topics")


def measure_paired_over_seeds(claim: str, run_cli, demo_full, folder, recipes: tuple[str, str]) -> None:
    """Both recipes evaluated at every seed on one workspace, then ``xylent compare --seeds`` with the
    claim "first - second": each difference (and each recipe against the trivial peers) recorded as
    ``claim``'s figures, with its interval, its seeds up and down, and its verdict."""
    _, demo_ws, _ = demo_full
    start = time.monotonic()
    kept = kept_folder(claim)
    ws = kept / "ws" if kept else folder
    if not ws.exists():  # seed 0's data stages are the demo's; seeds 1, 2 build their own
        linked_data(demo_ws, ws)
    specs = [ROOT / "data_specs" / "recipes" / f"{r}.yaml" for r in recipes]
    for seed in SEEDS:
        for spec in specs:
            rc, _, err = run_cli("run", "evaluate", "--spec", spec, "--workspace", ws, "--set", f"seed={seed}")
            assert rc == 0, err[-3000:]
    first, second = recipes
    rc, out, err = run_cli("compare", *[a for s in specs for a in ("--spec", s)], "--workspace", ws,
                           "--seeds", *map(str, SEEDS), "--claim", f"{first}:{second}", "--json")
    assert rc == 0, err[-3000:]
    differences = json.loads(out)["differences"]
    figures = {}
    for task in TASKS:
        for pair in (f"{first} - {second}", f"{first} - random-init", f"{first} - bag-of-subwords",
                     f"{second} - random-init"):
            d = differences[task].get(pair)
            assert d is not None and d["seeds"] == len(SEEDS), (task, pair, sorted(differences[task]))
            assert d["verdict"].startswith(("shown", "not shown")), d
            figures[f"{task}: {pair}"] = (f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}], seeds "
                                          f"{d['seeds_up']}↑ {d['seeds_down']}↓: {d['verdict']}")
    record(claim, figures,
           {"every run": "trains and is evaluated at seeds 0 1 2", "differences": "recorded with their verdicts"},
           seconds=time.monotonic() - start)


@pytest.mark.costs(deepspeed=6)  # each recipe's pretraining at each seed
def test_xy_against_en_x_bitext_with_infoxlm_over_three_seeds(run_cli, demo_full, tmp_path):
    measure_paired_over_seeds("xy-vs-enx-infoxlm", run_cli, demo_full, tmp_path / "xy", ("infoxlm", "infoxlm-en-x"))
