"""The two test tiers stay honest. The acceptance tier's results stand for this tree (tests/acceptance/claims.py): every claim
has a committed result whose code hash is the tree's, and docs/acceptance.md shows them.  A
change to the code a claim exercises makes its result stale, naming the file."""

from __future__ import annotations

import json
import subprocess

from tests.acceptance import claims


def test_every_committed_acceptance_result_is_current_and_rendered():
    found = [p for claim in claims.CLAIMS for p in claims.problems(claim)]
    assert not found, "\n".join(found)
    doc = claims.DOC.read_text()
    assert doc == claims.rendered_doc(), "run `python -m tests.acceptance.claims --render`"
    for claim in claims.missing():  # a claim never run says so where its figures would be
        assert f"| {claim} | not run yet |" in doc, claim


def test_a_changed_learning_file_makes_its_claim_stale_naming_the_file(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "models").mkdir(parents=True)
    (repo / "models" / "loss.py").write_text("WEIGHT = 1.0\n")
    (repo / "docs").mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    monkeypatch.setattr(claims, "ROOT", repo)
    monkeypatch.setattr(claims, "RESULTS", repo / "results")
    monkeypatch.setattr(claims, "CLAIMS", {"toy": {"what": "a toy claim", "code": ["models/"]}})
    assert claims.problems("toy") == [] and claims.missing() == ["toy"]
    claims.record("toy", {"loss": 0.25}, {"loss": "< 0.3"}, seconds=1.0)
    assert claims.problems("toy") == []
    assert json.loads((repo / "results" / "toy.json").read_text())["code_files"] == {
        "models/loss.py": claims.code_files("toy")["models/loss.py"]}
    (repo / "models" / "loss.py").write_text("WEIGHT = 2.0\n")
    (found,) = claims.problems("toy")
    assert "stale" in found and "models/loss.py" in found and "make acceptance" in found
    (repo / "models" / "loss.py").write_text("WEIGHT = 1.0\n")
    (repo / "models" / "new.py").write_text("")  # an added file counts too
    assert "models/new.py" in claims.problems("toy")[0]
    # a failed run is on record with what failed; it stands for the tree only under an open issue's name
    (repo / "models" / "new.py").unlink()
    claims.record("toy", {"loss": 0.5}, {"loss": "< 0.3"}, seconds=1.0, failed=["loss 0.5, not < 0.3"])
    (found,) = claims.problems("toy")
    assert "failed (loss 0.5, not < 0.3)" in found and "open_failure" in found
    claims.CLAIMS["toy"]["open_failure"] = "issue 1"
    assert claims.problems("toy") == [] and "**FAILED** (loss 0.5, not < 0.3; open: issue 1)" in claims.render()
    claims.record("toy", {"loss": 0.25}, {"loss": "< 0.3"}, seconds=1.0)
    assert "remove it" in claims.problems("toy")[0]


def test_every_test_a_doc_names_exists():
    """docs/ and the README name the tests that prove each claim (`tests/x.py::name`, or `::name` after a
    file): a test renamed, moved to the acceptance tier or removed must take its doc line with it."""
    import re

    from tests.acceptance.claims import ROOT

    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    missing = []
    for doc in docs:
        current = None
        for m in re.finditer(r"(tests/[\w/]+\.py)?(::(\w+))?", doc.read_text()):
            if m.group(1):
                current = m.group(1)
                if not (ROOT / current).exists():
                    missing.append(f"{doc.relative_to(ROOT)}: {current} does not exist")
            if m.group(3) and current and (ROOT / current).exists():
                if not re.search(rf"^\s*(async )?def {m.group(3)}\(", (ROOT / current).read_text(), re.M):
                    missing.append(f"{doc.relative_to(ROOT)}: {current}::{m.group(3)} does not exist")
    assert not missing, "\n".join(missing)
