"""benchmarks/projection.py: the papers' budgets costed from the measured GPU rows. Its arithmetic
holds and a side with no row renders "not measured" (that the committed projection is what the committed
rows give is tests/test_benchmarks.py's, with the other derived results). No timing."""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]

import harness  # noqa: E402
import projection  # noqa: E402
import render  # noqa: E402

COMMITTED = json.loads((harness.RESULTS / "projection.json").read_text())
PAYLOAD = ("step", "gpus", "devices", "h100_measured", "inputs", "budgets")


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b))


def _measured_row(line: dict) -> dict:
    """The row in gpu_results.json that a projection line says it used."""
    row = line["row"]
    run = next(r for r in json.loads((harness.RESULTS / "gpu_results.json").read_text())["runs"]
               if r["check"]["started"] == row["when"])
    rows = run["check"]["benchmark"]["rows"]
    if row["engine_stage"] is None:
        return rows["rows"][projection.STEP][line["side"]]
    return rows["zero_stages"]["stages"][str(row["engine_stage"])]


def test_the_arithmetic_holds_and_every_figure_is_a_measured_row():
    seen = 0
    for b in COMMITTED["budgets"]:
        assert b["tokens_per_step"] == b["mrtd_tokens_per_step"] + b["trtd_tokens_per_step"]
        assert b["mrtd_tokens_per_step"] == b["mrtd_sequences"] * b["seq_len"]
        assert b["total_tokens"] == b["steps"] * b["tokens_per_step"]
        for t in b["tables"]:
            for x in t["lines"]:
                if not x["measured"]:
                    continue
                seen += 1
                tps = x["tokens_per_s"]
                assert tps == _measured_row(x)["tokens_per_s_median"]
                assert _close(x["gpu_hours"] * tps * 3600, b["total_tokens"])
                for n in COMMITTED["gpus"]:
                    at = x["by_gpus"][str(n)]
                    assert _close(at["hours"] * tps * 3600 * n, b["total_tokens"])
                    assert _close(at["days"] * 24, at["hours"])
    assert seen, "the committed rows gave no projection at all"


def test_the_spec_picks_the_zero_stage_each_budget_is_costed_at():
    from xylent.spec.pretrain import PretrainConfig

    by = {b["name"]: b for b in COMMITTED["budgets"]}
    assert by["XLM-E Base"]["zero_stage"] == PretrainConfig.model_fields["zero_stage"].default
    import yaml

    spec = yaml.safe_load((ROOT / "data_specs" / "xy-lent-base.yaml").read_text())["pretrain"]
    assert by["XY-LENT Base"]["zero_stage"] == spec.get("zero_stage", PretrainConfig.model_fields["zero_stage"].default)
    for b in COMMITTED["budgets"]:
        for t in b["tables"]:
            engine = [x for x in t["lines"] if x["engine_stage"] is not None]
            assert engine and all(x["engine_stage"] == b["zero_stage"] for x in engine)


@pytest.mark.skipif(not projection.PAPERS.is_dir(), reason="the papers' text (../shared/papers) is not here")
def test_every_budget_figure_is_quoted_from_its_paper():
    assert projection.check_quotes() == []


def _results_with(tmp_path: Path, change) -> Path:
    """A results folder holding a changed copy of the committed gpu_results.json (and nothing else)."""
    gpu = json.loads((harness.RESULTS / "gpu_results.json").read_text())
    change(gpu)
    out = tmp_path / "results"
    out.mkdir()
    (out / "gpu_results.json").write_text(json.dumps(gpu))
    return out


def _newest_rows(gpu: dict) -> dict:
    return [r for r in gpu["runs"] if (r["check"].get("benchmark") or {}).get("rows")][-1]["check"]["benchmark"]["rows"]


def test_a_new_side_and_a_full_vocabulary_are_picked_up_and_a_missing_side_says_not_measured(tmp_path):
    """A fast-path side and V = 250 002 rows (nested with their own model), with no transformers row at
    that vocabulary: projected without a code change, and the peer's line there says "not measured"."""
    def change(gpu):
        rows = _newest_rows(gpu)
        ours = rows["rows"]["electra"]["xylent"]
        rows["rows"]["electra"]["xylent, flex"] = {**ours, "tokens_per_s_median": 2 * ours["tokens_per_s_median"]}
        full = copy.deepcopy({k: rows[k] for k in ("model", "rows", "zero_stages")})
        full["model"]["vocab_size"] = 250_002
        full["rows"] = {"electra": {"xylent, flex": {**ours, "tokens_per_s_median": 123_456.0}}}
        stage = full["zero_stages"]["stages"]["2"]
        full["zero_stages"]["stages"] = {"2": {"xylent, flex": {**stage, "tokens_per_s_median": 100_000.0}}}
        rows["full_vocab"] = full

    result = json.loads(json.dumps(projection.project(_results_with(tmp_path, change))))
    xlme = next(b for b in result["budgets"] if b["name"] == "XLM-E Base")
    first = xlme["tables"][0]
    assert first["vocab_size"] == 250_002 and first["at_paper_vocab"]  # the paper's vocabulary first
    lines = {(x["side"], x["engine_stage"]): x for x in first["lines"]}
    assert lines[("xylent, flex", None)]["tokens_per_s"] == 123_456.0
    assert lines[("xylent, flex", 2)]["tokens_per_s"] == 100_000.0
    peer = next(k for k in lines if k[0].startswith("transformers") and k[1] is None)
    assert not lines[peer]["measured"] and not lines[("xylent", None)]["measured"]
    at_32k = {(x["side"], x["engine_stage"]): x for x in xlme["tables"][1]["lines"]}
    assert at_32k[("xylent, flex", None)]["tokens_per_s"] == 2 * at_32k[("xylent", None)]["tokens_per_s"]
    assert _close(at_32k[("xylent, flex", None)]["vs_transformers"] * at_32k[peer]["gpu_hours"],
                  at_32k[("xylent, flex", None)]["gpu_hours"])
    text = projection.markdown(result)
    peer_line = next(line for line in text.splitlines() if line.startswith(f"| {peer[0]} | step alone |"))
    assert "not measured" in peer_line and "| xylent, flex | engine, ZeRO 2 | 100 000 |" in text
    assert "**H100: not measured.**" in text


def test_an_h100_row_gets_its_own_table_and_no_row_at_all_says_not_measured(tmp_path):
    def h100(gpu):
        rows = _newest_rows(gpu)
        rows["device"] = "NVIDIA H100 80GB HBM3"

    (tmp_path / "a").mkdir()
    result = projection.project(_results_with(tmp_path / "a", h100))
    assert result["h100_measured"] and result["devices"][0].startswith("NVIDIA H100")
    assert all(b["tables"][0]["device"].startswith("NVIDIA H100") for b in result["budgets"])
    assert "H100: not measured" not in projection.markdown(json.loads(json.dumps(result)))

    def none(gpu):
        for r in gpu["runs"]:
            r["check"]["benchmark"] = None

    (tmp_path / "b").mkdir()
    empty = json.loads(json.dumps(projection.project(_results_with(tmp_path / "b", none))))
    assert all(not b["tables"] for b in empty["budgets"]) and not empty["inputs"]
    assert "Projection: **not measured**" in projection.markdown(empty)


def test_the_script_writes_its_result_and_render_reads_it(tmp_path):
    out = tmp_path / "out"
    shutil.copytree(harness.RESULTS, out, ignore=shutil.ignore_patterns("quick"))
    projection.main(["--results", str(out)])
    written = json.loads((out / "projection.json").read_text())
    assert written["benchmark"] == "projection" and {k: written[k] for k in PAYLOAD} == \
        {k: COMMITTED[k] for k in PAYLOAD}
    assert "GPU-hours" in render.render_block("projection", out)
