"""What a user sees on the terminal: progress and warnings, not a log line per
task (unless --verbose), and a closing table with times and headline numbers
whose paths and run ids are printed whole."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import write_spec

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    # a terminal 80 columns wide, as a user's; COLUMNS is what rich reads
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "COLUMNS": "80", **env})


def test_the_console_shows_no_info_lines_unless_verbose_and_the_table_keeps_paths_whole(tmp_path):
    (tmp_path / "en.txt").write_text("".join(f"an English sentence number {i}\n" for i in range(300)))
    ws = tmp_path / "a-workspace-with-a-rather-long-name-that-would-not-fit-in-a-table-column"
    spec = write_spec(tmp_path / "spec.yaml", {"name": "term", "languages": ["en"], "workspace": str(ws),
                                               "sources": [{"name": "loc", "kind": "local", "format": "text",
                                                            "lang": "en", "path": str(tmp_path / "en.txt")}]})
    quiet = _cli("run", "prepare", "--spec", str(spec))
    assert quiet.returncode == 0, quiet.stderr
    assert "| INFO" not in quiet.stderr and "Creating initial MLflow database" not in quiet.stderr, quiet.stderr
    out = quiet.stdout
    assert "time" in out and "headline" in out and "rows 300" in out, out
    manifest_dirs = sorted(p.parent for p in ws.glob("*/*/_manifest.json"))
    assert manifest_dirs and all(str(d) in out for d in manifest_dirs), "every output path, whole"
    loud = _cli("run", "prepare", "--spec", str(spec), "--verbose", PREFECT_LOGGING_LEVEL="INFO")  # the suite's is WARNING
    assert loud.returncode == 0 and "| INFO" in loud.stderr, "--verbose brings Prefect's lines back"
