"""The benchmarks a skeptic reruns: docs/records/benchmarks.md is what the committed JSON
says, and every script still runs (at its --quick smoke size) and renders.

Timings are never asserted here: speed targets are judged by the full runs
(`make bench`) on a quiet machine, and stated in the generated doc."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]

import harness  # noqa: E402
import render  # noqa: E402

# every smoke run: no untimed warm-up round (a smoke run's timings are never read)
SMOKE = ["--quick", "--warmup", "0"]
# extra flags of a smoke run: the audit's step overhead trains 2-rank DeepSpeed runs for minutes; fine-tuning
# at one torch thread count, not each of 1 and all cores; the throughput sweep at half its quick sizes (a slope
# needs two points; the larger size is most of its time); the cluster benchmark on threads alone (Ray's and
# Dask's spread and identical output are checked by tests/test_dedup_stage.py)
SMOKE_FLAGS = {"audit": ["--only", "best_response"], "finetune": ["--threads", "1"],
               "prepare_throughput": ["--sizes-mb", "2", "4"], "cluster": ["--runners", "threads"]}
# the benchmarks that drop the inherited PREFECT_* variables (scaling._isolate) and would start a server of
# their own (its new database's migrations): given the session's instead
ON_THE_SESSIONS_PREFECT = ("scaling", "cluster")


def test_the_doc_is_what_the_committed_json_says():
    proc = subprocess.run([sys.executable, "benchmarks/render.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_doc_names_a_block_for_every_benchmark_and_every_script_exists():
    text = (ROOT / "docs" / "records" / "benchmarks.md").read_text()
    for name in render.BENCHMARKS:
        assert f"<!-- bench:{name} -->" in text and f"<!-- /bench:{name} -->" in text
        assert (ROOT / "benchmarks" / f"{name}.py").exists()
        result = json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())
        assert result["benchmark"] == name and not result["quick"], name
        assert result["repeats"] >= 3, f"{name}: a committed result needs >= 3 repeats"
        env = result["environment"]
        assert env["machine"]["cpus"] and env["versions"]["numpy"] and env["git"]["commit"], name


@pytest.mark.parametrize("name", render.DERIVED)
def test_a_derived_result_is_what_its_committed_inputs_give(name):
    """Stale after a new scaling or GPU run until `benchmarks/<name>.py` is rerun: a derived result
    (the GPU-hours projection, the real corpus's cost) is arithmetic over other committed results."""
    committed = json.loads((harness.RESULTS / f"{name}.json").read_text())
    now = json.loads(json.dumps(importlib.import_module(name).project(harness.RESULTS)))
    assert now == {k: committed.get(k) for k in now}, \
        f"benchmarks/results/{name}.json is stale: run `python benchmarks/{name}.py` and `render.py`"


def test_a_hand_typed_figure_inside_a_generated_block_is_caught(tmp_path):
    doc = tmp_path / "b.md"
    doc.write_text((ROOT / "docs" / "records" / "benchmarks.md").read_text().replace(
        "<!-- /bench:sampling -->", "| hand typed | 1.23 s |\n<!-- /bench:sampling -->", 1))
    proc = subprocess.run([sys.executable, "benchmarks/render.py", "--check", "--doc", str(doc)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "hand typed" in proc.stdout


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, prefect_server):
    """Every benchmark at --quick into one scratch folder, two at a time: a smoke run checks that each
    script works and renders, not how fast (its timings are never read), so they may share the cores."""
    from concurrent.futures import ThreadPoolExecutor

    out = tmp_path_factory.mktemp("bench-quick")

    def run(name: str) -> str | None:
        cmd = [sys.executable, f"benchmarks/{name}.py", *SMOKE, "--out", str(out), *SMOKE_FLAGS.get(name, []),
               *(["--prefect-api-url", prefect_server] if name in ON_THE_SESSIONS_PREFECT else [])]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
        return None if proc.returncode == 0 else f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    first = ("scaling",)  # the longest smoke (about a minute): started first, the others fill the second lane
    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = [f for f in pool.map(run, [*first, *(b for b in render.BENCHMARKS if b not in first)]) if f]
    assert not failed, "\n\n".join(failed)
    return out


@pytest.mark.slow  # every benchmark script in a subprocess: minutes of CPU, none of the guard's kinds
def test_every_benchmark_runs_at_its_smoke_size_and_renders(smoke, tmp_path):
    for name in render.BENCHMARKS:
        result = json.loads((smoke / f"{name}.json").read_text())
        assert result["quick"] is True and result["benchmark"] == name
        assert result["environment"]["machine"]["usable_cpus"] >= 1
    doc = tmp_path / "benchmarks.md"
    proc = subprocess.run([sys.executable, "benchmarks/render.py", "--results", str(smoke), "--template",
                           str(ROOT / "docs" / "records" / "benchmarks.md"), "--doc", str(doc)], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = doc.read_text()
    for name in render.BENCHMARKS:
        block = text.split(f"<!-- bench:{name} -->")[1].split(f"<!-- /bench:{name} -->")[0]
        assert "| " in block, f"{name}: no table rendered from its smoke result"
        assert "--quick smoke size" in block, f"{name}: a smoke result must say so"


def test_the_scaling_doc_renders_its_slopes_bounds_and_findings_from_three_sizes(smoke, tmp_path):
    """The smoke run measures one size, so its doc has no slope: the full run's tables, findings, memory
    check and plots are rendered here from its result spread over three sizes (10x the text, 3x the time)."""
    import copy

    import scaling

    one = json.loads((smoke / "scaling.json").read_text())
    three = copy.deepcopy(one)
    factors = [1, 3.2, 10]
    three["sizes"] = [{**one["sizes"][0], "text_mb": one["sizes"][0]["text_mb"] * f} for f in factors]
    three["floors"] = one["floors"] * 3
    for stage, rows in one["stages"].items():
        three["stages"][stage] = [copy.deepcopy(rows[0]) for _ in factors]
        for row, f in zip(three["stages"][stage], factors):
            row["text_mb"] *= f
            row["stage_s"] = {**row["stage_s"], "median": row["stage_s"]["median"] * f ** 0.5}
    three["slopes"] = {s: scaling._slopes(three["stages"][s]) for s in (*scaling.STAGES, "cached_rerun")}
    knobs = {**one["knobs"], "prepare.part_rows": 100}  # the largest group in several parts at every size
    three["memory"] = scaling.memory_checks(three["sizes"], three["stages"], knobs, one["threads"])
    md = scaling.markdown(three)
    assert "**Time**" in md and "**Peak RSS**" in md and "segment slopes" in md
    assert "Memory against its bound" in md and "slope over full-part sizes" in md
    assert three["memory"]["full_part_sizes"] == [0, 1, 2]
    assert {m["flat"] for m in three["memory"]["stages"].values()} == {True}, "the same peak at every size"
    assert all(f"`{s}`: time" in md for s in scaling.STAGES) and "sublinear (slope 0.50)" in md
    assert len([p for p in scaling.plots(three, tmp_path) if p.stat().st_size > 5000]) == 3


def test_the_stage_docs_state_the_memory_bounds_the_scaling_benchmark_checks():
    import scaling

    for stage, (fixed, per_part) in scaling.MEMORY_BOUNDS.items():
        text = (ROOT / "docs" / "stages" / f"{stage}.md").read_text()
        want = f"{fixed} MB" + (f" + {per_part} × threads × part" if per_part else "")
        assert f"Memory bound: {want}" in text, (stage, want)
        if per_part:  # the part those bounds are stated in is capped where prepare caps it
            from xylent.tasks.prepare.writer import PART_TEXT_BYTES

            assert f"at most\n{PART_TEXT_BYTES >> 20} MiB" in text or f"at most {PART_TEXT_BYTES >> 20} MiB" in text, stage


def test_the_audit_profile_counts_functions_that_exist():
    """benchmarks/audit_profile.py attributes py-spy samples by (function, file): a function renamed or moved
    would silently read 0 %, so every piece it names must still be defined where it looks."""
    import importlib.util
    import re

    import audit_profile

    deepspeed = Path(importlib.util.find_spec("deepspeed").origin).parent
    for piece, (func, file) in {**audit_profile.PIECES, "training loop": ("train", "models/training/trainer.py")}.items():
        found = [p for root in (ROOT / "models", ROOT / "tasks", ROOT / "xylent", deepspeed) for p in root.rglob("*.py")
                 if p.as_posix().endswith("/" + file)]
        assert any(re.search(rf"^\s*def {func}\(", p.read_text(), re.M) for p in found), f"{piece}: no {func} in {file}"


def test_the_planted_sweep_reads_each_audit_with_the_acceptance_bar(tmp_path):
    """benchmarks/audit_planted_sweep.sh with no N only reads the audits already in its folder: one that
    holds issue 34's bar and one whose shuffled pair sits under a clean pair."""
    import polars as pl

    # tests/audit_planted.py's pairs: de shuffled, ca the copy, tr the hub
    pairs = ["en-fr", "en-es", "en-pt", "en-it", "en-nl", "en-pl", "de-en", "ca-en", "en-tr"]
    for name, noisy_rank in (("N1-s0", 1), ("N40-s2", 4)):
        ranks = {"de-en": noisy_rank, "ca-en": 9, "en-tr": 6}
        clean = iter(r for r in range(1, 10) if r not in ranks.values())
        rank = [ranks.get(p) or next(clean) for p in pairs]
        audit = tmp_path / f"ws-{name}" / "audit"
        audit.mkdir(parents=True)
        pl.DataFrame({"pair": pairs, "rank_up": rank, "w_final": [2.0 - r / 10 for r in rank]}).write_parquet(
            audit / "audit.parquet")
        (tmp_path / f"{name}.json").write_text(json.dumps({"stages": {"audit": {"output_dir": str(audit)}}}))
    proc = subprocess.run(["bash", "benchmarks/audit_planted_sweep.sh", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "N1-s0: copy / hub / shuffled 9 / 6 / 1 of 9; shuffled 1.90 vs best clean 1.80; bar held",
        "N40-s2: copy / hub / shuffled 9 / 6 / 4 of 9; shuffled 1.60 vs best clean 1.90; bar missed"]


def test_the_generated_corpus_is_deterministic_zipf_sized_and_line_aligned(tmp_path, monkeypatch):
    """benchmarks/corpus.py, the scale benchmark's corpus: the same seed writes the same bytes (xz files
    and zips alike) in many blocks; the languages' sizes fall off as the Zipf law says; documents end
    in a blank line; a bitext zip's two members have a line each per row."""
    import lzma
    import zipfile

    import corpus

    monkeypatch.setattr(corpus, "BLOCK_BYTES", 100_000)  # a few MB in many blocks, as gigabytes are
    monkeypatch.setattr(corpus, "BLOCK_ROWS", 300)
    langs = ["en", "de", "ru", "zh"]
    made = [corpus.make_corpus(tmp_path / name, 2.0, 0.004, langs=langs, seed=3) for name in ("a", "b")]
    assert made[0] == made[1] and abs(made[0]["bitext_pairs"] - 4000) <= 6  # each pair rounded to whole rows
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert len(files) == 4 + 6
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert made[0]["files"]["en"]["text_bytes"] > 5 * corpus.BLOCK_BYTES
    assert made[0]["files"]["de-en"]["lines"] > 2 * corpus.BLOCK_ROWS
    sizes = {lang: made[0]["files"][lang]["text_bytes"] for lang in langs}
    for lang, share in corpus.language_shares(langs).items():
        assert abs(sizes[lang] / 2e6 - share) < 0.01, (lang, sizes[lang], share)
    text = lzma.decompress((tmp_path / "a" / "cc100" / "zh.txt.xz").read_bytes()).decode()
    assert text.endswith("。\n\n") and "\n\n\n" not in text and " " not in text
    assert "\n\n" in text[:-2], "more than one document"
    with zipfile.ZipFile(tmp_path / "a" / "opus" / "Bench" / "v1" / "moses" / "de-en.txt.zip") as zf:
        de, en = (zf.read(f"Bench.de-en.{x}").decode().splitlines() for x in ("de", "en"))
    assert len(de) == len(en) == made[0]["files"]["de-en"]["lines"] > 0
    assert all(line and not line.endswith(" ") for line in de + en)
