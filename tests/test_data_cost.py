"""benchmarks/data_cost.py: XY-LENT's corpus costed from the scaling run's measured rates. Its arithmetic
holds and the published tables are read whole (that the committed cost is what the committed inputs give
is tests/test_benchmarks.py's, with the other derived results). No timing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]

import data_cost  # noqa: E402
import harness  # noqa: E402

COMMITTED = json.loads((harness.RESULTS / "data_cost.json").read_text())


def test_the_published_tables_are_read_whole():
    sizes = data_cost.cc100_sizes()
    rows = [line for line in data_cost.INFOXLM.read_text().split(data_cost.TABLE_CAPTION)[0]
            .rsplit("Code\tSize (GB)", 1)[1].splitlines()[1:] if line.strip()]
    assert len(sizes) == 3 * len(rows)  # every cell of every row
    assert (sizes["af"], sizes["en"], sizes["zh"]) == (0.2, 731.6, 96.8)  # the table's first, largest and last
    pairs = data_cost.ccmatrix_pairs()
    lines = data_cost.CCMATRIX_PAIRS.read_text().splitlines()[1:]
    assert len(pairs) == len(lines)
    en_es = next(p for p in pairs if (p["a"], p["b"]) == ("en", "es"))
    assert (en_es["pairs"], en_es["words"]) == (409_061_333, 16.02e9)  # "409061333  16.02G"
    assert all(p["words"] > p["pairs"] for p in pairs)  # words of both sides, more than one a pair


def test_the_arithmetic_holds_and_rates_are_the_scaling_runs():
    scaling = harness.load_result("scaling", harness.RESULTS)
    c = COMMITTED["corpus"]
    assert c["text_mb"] == c["mono_mb"] + c["bitext_mb"]
    assert abs(c["mono_mb"] - 1000 * sum(data_cost.cc100_sizes().values())) < 1e-6
    for stage, s in COMMITTED["stages"].items():
        row = scaling["stages"][stage][-1]
        rate = row["stage_s"]["median"] * scaling["threads"] / scaling["sizes"][-1]["text_mb"]
        assert abs(s["core_s_per_mb"] - rate) <= 1e-12 * rate
        assert abs(s["core_hours"] - rate * c["text_mb"] / 3600) <= 1e-9 * s["core_hours"]
        assert all(abs(s["wall_hours"][str(n)] * n - s["core_hours"]) <= 1e-9 * s["core_hours"]
                   for n in COMMITTED["cores"])
    assert set(COMMITTED["stages"]) | set(COMMITTED["not_projected"]) == set(scaling["stages"]) - {"cached_rerun"}
    assert abs(COMMITTED["totals"]["core_hours"] - sum(s["core_hours"] for s in COMMITTED["stages"].values())) < 1e-9


def test_bytes_per_word_are_measured_on_real_catalog_text():
    bpw = data_cost.bytes_per_word()
    assert len(bpw) >= 50
    # a Latin-script word is a few bytes; Thai and Japanese put no spaces between words, so theirs are long
    assert 5 < bpw["en"] < 10 and 5 < bpw["de"] < 12
    assert bpw["ja"] > 2 * bpw["en"]
