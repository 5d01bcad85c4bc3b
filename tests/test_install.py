"""A non-editable install works and collides with nothing: the wheel holds every module and every data file
the code reads under the one ``xylent`` package (flows/, tasks/ and models/ as xylent.flows, xylent.tasks,
xylent.models; no top-level ``models`` beside a user's own), and the installed package, run from outside
the checkout, finds its data files.  The whole demo pipeline from a fresh venv is ``make install-check``
(a CI step: .ci/run)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOMES = {"xylent": "xylent", "flows": "xylent/flows", "tasks": "xylent/tasks", "models": "xylent/models"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src")
    # from a copy of the files git would commit: a build/ left by an earlier build cannot fill a gap
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for rel in filter(None, files):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    # the venv's setuptools (no build isolation): the machine may have no index to fetch one from
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (found,) = out.glob("xylent-*.whl")
    return found


def _tracked(folder: str) -> list[str]:
    return subprocess.run(["git", "ls-files", folder], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.split()


@pytest.mark.costs(cli=1)  # pip builds the wheel in a process the cost guard counts as a CLI start
def test_the_wheel_holds_every_module_and_data_file_under_the_xylent_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"xylent"}, f"top-level names a user's own packages could clash with: {sorted(tops - {'xylent'})}"
    missing = [f"{rel} (as {HOMES[rel.split('/')[0]]}/{rel.split('/', 1)[1]})"
               for folder in HOMES for rel in _tracked(folder)
               if f"{HOMES[folder]}/{rel.split('/', 1)[1]}" not in names]
    assert not missing, "left out of the wheel (setup.py packages, pyproject.toml package-data):\n" + "\n".join(missing)
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "xylent = xylent.cli:entry" in entry, entry


@pytest.mark.costs(cli=2)  # the probe (it imports the command line's module) and `python -m xylent.cli stages`
def test_the_installed_package_runs_from_outside_the_checkout_and_finds_its_data(wheel, tmp_path):
    """The wheel unpacked alone into a fresh venv (its dependencies from this one, by a path entry), then the
    CLI and every reader of a shipped data file, from a folder that is not the checkout."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    zipfile.ZipFile(wheel).extractall(site)
    # a path entry, not a site dir: this venv's .pth files (the editable install of the checkout) stay unread
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    probe = (
        "import json, xylent, xylent.models.training.trainer, xylent.cli\n"
        "from xylent.tasks.pretrain.train_json import ZERO_CONFIGS\n"
        "from xylent.tasks.evaluate.paper_refs import PAPER_FILE\n"
        "from xylent.tasks.evaluate.scorecard import REFERENCES_FILE\n"
        "from xylent.spec import HPARAMS_FILE\n"
        "from xylent.models.hf_export import MODELING\n"
        "from xylent.flows.registry import STAGE_NAMES, stage_flow_of\n"
        "flows = [stage_flow_of(name) for name in STAGE_NAMES]  # each stage's flow, imported by name\n"
        "files = [*(ZERO_CONFIGS / f'zero{n}.json' for n in range(4)), PAPER_FILE, REFERENCES_FILE, HPARAMS_FILE, MODELING]\n"
        "print(json.dumps({'xylent': xylent.__file__, 'trainer': xylent.models.training.trainer.__file__,\n"
        "                  'missing': [str(f) for f in files if not f.is_file()]}))\n")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "DS_ACCELERATOR": "cpu"}
    r = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["missing"] == [], got
    assert Path(got["xylent"]).is_relative_to(site) and Path(got["trainer"]).is_relative_to(site / "xylent"), got
    cli = subprocess.run([str(venv / "bin" / "python"), "-m", "xylent.cli", "stages"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0 and "pretrain" in cli.stdout, cli.stdout + cli.stderr[-3000:]
