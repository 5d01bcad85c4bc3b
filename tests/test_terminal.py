"""What a user sees on the terminal: progress and warnings, not a log line per
task (unless --verbose), and a closing table with times and headline numbers
whose paths and run ids are printed whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_spec

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    # a terminal 80 columns wide, as a user's; COLUMNS is what rich reads
    return subprocess.run([sys.executable, "-m", "xylent.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "80", **env})


@pytest.mark.costs(cli=3)
def test_the_console_shows_no_info_lines_unless_verbose_and_the_table_keeps_paths_whole(tmp_path, monkeypatch):
    (tmp_path / "en.txt").write_text("".join(f"an English sentence number {i}\n" for i in range(300)))
    ws = tmp_path / "a-workspace-with-a-rather-long-name-that-would-not-fit-in-a-table-column"
    spec = write_spec(tmp_path / "spec.yaml", {"name": "term", "languages": ["en"], "workspace": str(ws),
                                               "sources": [{"name": "loc", "kind": "local", "format": "text",
                                                            "lang": "en", "path": str(tmp_path / "en.txt")}]})
    quiet = _cli("run", "prepare", "--spec", str(spec), PREFECT_LOGGING_LEVEL="INFO")  # the suite's is WARNING
    assert quiet.returncode == 0, quiet.stderr
    # piped (a CI log, tee): xylent's own line first, then a line as each stage starts and ends
    lines = quiet.stderr.splitlines()
    assert lines[0] == f"xylent: run prepare: spec term, workspace {ws}", quiet.stderr
    fps = {p.parent.parent.name: p.parent.name[:8] for p in ws.glob("*/*/_manifest.json")}
    for stage in ("download", "prepare"):
        said = [line for line in lines if line.startswith(f"xylent: {stage} {fps[stage]}: ")]
        assert said[0].endswith(": building") and said[-1].split(": ")[-1].startswith("done in "), quiet.stderr
    assert "| INFO" not in quiet.stderr and "Creating initial MLflow database" not in quiet.stderr, quiet.stderr
    assert "Warning" not in quiet.stderr and "WARNING" not in quiet.stderr, f"no stray warnings: {quiet.stderr}"
    # the lines the console leaves out are in the run's log file, named below the table
    (log,) = (ws / "logs").glob("*-prepare-*.log")
    assert f"log:      {log}" in quiet.stdout
    text = log.read_text()
    assert "| INFO" in text and "Finished in state Completed" in text, text[-2000:]
    out = quiet.stdout
    assert "time" in out and "headline" in out and "mono 300" in out, out
    manifest_dirs = sorted(p.parent for p in ws.glob("*/*/_manifest.json"))
    assert manifest_dirs and all(str(d) in out for d in manifest_dirs), "every output path, whole"
    loud = _cli("run", "prepare", "--spec", str(spec), "--verbose", PREFECT_LOGGING_LEVEL="INFO")  # the suite's is WARNING
    assert loud.returncode == 0 and "| INFO" in loud.stderr, "--verbose brings Prefect's lines back"

    # a failed run is when the task lines are wanted: the error names the file that has them
    # (the failure: joining a Ray cluster with token authentication, no token on this machine)
    before = set((ws / "logs").glob("*.log"))
    home = tmp_path / "home-without-a-ray-token"
    home.mkdir()
    for name in [k for k in os.environ if k.startswith("RAY_AUTH_TOKEN")]:  # no token in any form
        monkeypatch.delenv(name)
    failed = _cli("run", "dedup", "--spec", str(spec), "--set", "runner.kind=ray", "--set",
                  "runner.address=127.0.0.1:1", PREFECT_LOGGING_LEVEL="INFO", HOME=str(home), RAY_AUTH_MODE="token",
                  PREFECT_HOME=os.environ.get("PREFECT_HOME", str(Path.home() / ".prefect")))
    assert failed.returncode == 2 and "cannot join the Ray cluster" in failed.stderr, failed.stderr[-3000:]
    (log,) = set((ws / "logs").glob("*.log")) - before
    assert f"  log: {log} (every task's lines of this run)" in failed.stderr, failed.stderr[-3000:]
    assert "| ERROR" in log.read_text() and "cannot join the Ray cluster" in log.read_text(), log.read_text()[-2000:]


def test_headline_cells_read_short_with_the_baseline_beside_the_loss():
    from xylent.cli import _short
    from xylent.flows.kit.run_record import headline_text

    pretrain = {"final.trtd/discriminator_loss": 0.3301, "final.trtd/discriminator_base_loss": 0.3921,
                "final.trtd/generator_loss": 6.27, "final.mrtd/discriminator_loss": 0.367,
                "final.mrtd/discriminator_base_loss": 0.422, "final.mrtd/generator_loss": 6.51, "step": 400}
    assert headline_text("pretrain", pretrain, _short).splitlines() == [
        "mrtd D 0.367 (base 0.422)", "mrtd G 6.51", "trtd D 0.3301 (base 0.3921)", "trtd G 6.27"]
    assert headline_text("evaluate", {"eval/allauth/avg": 12.6, "eval/allauth/en-de": 3.0}) == "allauth 12.6"
    assert headline_text("dedup", {"bitext.out": 75745.0, "mono.out": 10735.0}, _short) == "bitext 76k\nmono 11k"


def test_a_piped_console_gets_a_heartbeat_with_the_newest_bar_during_silent_work(capsys, monkeypatch):
    """Piped, nothing moves on the screen: after XYLENT_HEARTBEAT_S of silence (10 s by default) a
    line says how long the stage has worked and what its newest bar counts; a line said resets it."""
    import time

    from xylent.flows.kit.progress import Progress, console, heartbeat, say

    monkeypatch.setenv("XYLENT_HEARTBEAT_S", "0.2")
    with console(), heartbeat("dedup 3f9a1c2e"):
        bar = Progress("dedup", 4, unit="phases")
        bar.advance(1)
        time.sleep(0.7)
        say("something else")
        bar.close()
    lines = capsys.readouterr().err.splitlines()
    beats = [line for line in lines if line.startswith("xylent: dedup 3f9a1c2e: working, ")]
    assert 1 <= len(beats) <= 4 and all(line.endswith(", dedup 1/4 phases") for line in beats), lines
    assert lines[-1] == "xylent: something else", "a heartbeat waits for silence"
    with heartbeat("off"):  # outside the CLI's console (a worker's run): no line at all
        time.sleep(0.3)
    assert capsys.readouterr().err == ""


@pytest.mark.costs(cli=1)  # a fresh process runs the CLI's main() once
def test_third_party_progress_bars_stay_off_the_console():
    """DeepSpeed consolidates a ZeRO checkpoint at every publish behind a tqdm bar ("Loading checkpoint
    shards") that landed between the console's lines: the CLI turns tqdm off before anything imports it,
    for itself and the processes it starts."""
    probe = ("import os, sys; from xylent.cli import main; main(['stages']); from tqdm import tqdm; "
             "sys.stderr.write(f\"{tqdm([1]).disable} {os.environ['TQDM_DISABLE']}\\n\")")
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    got = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert got.returncode == 0 and got.stderr.strip().endswith("True 1"), got.stderr
