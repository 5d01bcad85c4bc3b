"""The README's layout names every top-level folder of the repository, and names no folder that is not
there: a folder added, moved or removed takes its layout line with it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def layout(readme: str) -> str:
    """The README's "## Layout" section, up to the next section."""
    found = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", readme, re.S | re.M)
    assert found, "README.md has no '## Layout' section"
    return found.group(1)


def layout_problems(readme: str, folders: set[str]) -> list[str]:
    """What the layout gets wrong about ``folders`` (every folder path in the repository, ``a`` and ``a/b``):
    a top-level folder it does not name, or a folder line (``name/`` at a line's start, indented under its
    top-level folder for a subfolder) for a folder that does not exist."""
    text = layout(readme)
    top = {f for f in folders if "/" not in f}
    problems = [f"{f}/ is not named in README.md's layout" for f in sorted(top)
                if not re.search(rf"^ *{re.escape(f)}/(\s|$)", text, re.M)]
    parent = None
    for m in re.finditer(r"^( *)([\w.-]+)/(?=\s|$)", text, re.M):
        indent, name = len(m.group(1)), m.group(2)
        if indent <= 4:  # a top-level line of the indented block (or of a fenced one)
            parent, path = name, name
        else:
            path = f"{parent}/{name}"
        if path not in folders:
            problems.append(f"README.md's layout names {path}/, which is not in the repository")
    return problems


def repository_folders() -> set[str]:
    """Every folder that holds a tracked file, as a path from the root (``tests``, ``tests/acceptance`` ...)."""
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the layout is checked against what git tracks")
    folders = set()
    for line in files.splitlines():
        parts = line.split("/")[:-1]
        folders.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    return folders


def test_the_readme_layout_names_every_top_level_folder_and_no_other():
    problems = layout_problems((ROOT / "README.md").read_text(), repository_folders())
    assert not problems, "\n".join(problems)


def test_the_layout_check_catches_a_folder_left_out_and_one_that_is_gone():
    readme = ("# x\n\n## Layout\n\n    core/      the core\n      sub/     a part of it\n    old/       gone\n\n"
              "## Next\n")
    assert layout_problems(readme, {"core", "core/sub", "new"}) == [
        "new/ is not named in README.md's layout",
        "README.md's layout names old/, which is not in the repository"]
    assert layout_problems(readme.replace("old/", "new/"), {"core", "core/sub", "new"}) == []
    assert layout_problems(readme, {"core", "old"}) == [
        "README.md's layout names core/sub/, which is not in the repository"]
