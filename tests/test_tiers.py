"""The two test tiers stay honest. The acceptance tier's results stand for this tree (tests/acceptance/claims.py): every claim
has a committed result whose code hash is the tree's, and docs/acceptance.md shows them.  A
change to the code a claim exercises makes its result stale, naming the file."""

from __future__ import annotations

import json
import re
import subprocess

from tests.acceptance import claims


def test_every_committed_acceptance_result_is_current_and_rendered():
    found = [p for claim in claims.CLAIMS for p in claims.problems(claim)]
    assert not found, "\n".join(found)
    doc = claims.DOC.read_text()
    assert doc == claims.rendered_doc(), "run `python -m tests.acceptance.claims --render`"
    for claim in claims.missing():  # a claim never run says so where its figures would be
        assert f"| {claim} | not run yet |" in doc, claim
    pages = claims.figure_docs()
    assert claims.ROOT / "docs" / "stages" / "pretrain.md" in pages
    for page in pages:  # a figure a page quotes is the committed result's, not a typed copy
        text = page.read_text()
        assert text == claims.rendered_figures(text, page.name), f"{page}: run `python -m tests.acceptance.claims --render`"


def test_a_quoted_figure_is_rewritten_from_its_result_and_an_unknown_one_is_named():
    import pytest

    measured = json.loads((claims.RESULTS / "demo-learns.json").read_text())["figures"]["mrtd precision"]
    typed = "-1"  # a precision no run gives: the rewrite is seen to happen
    quoted = f"precision <!-- figure demo-learns: mrtd precision -->{typed}<!-- /figure -->."
    assert claims._fmt(measured) != typed
    assert claims.rendered_figures(quoted) == quoted.replace(typed, claims._fmt(measured))
    with pytest.raises(KeyError, match="no figure 'mrtd recall'"):
        claims.rendered_figures("<!-- figure demo-learns: mrtd recall -->0.24<!-- /figure -->", "pretrain.md")


def test_the_recipes_table_is_the_scorecards_means():
    """docs/recipes.md's short table quotes docs/recipes-scorecard.md, which `make recipes` writes."""
    def rows(path, columns):
        out = {}
        for line in (claims.ROOT / "docs" / path).read_text().splitlines():
            cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
            if len(cells) > max(columns) and "±" in line:
                out.setdefault(cells[0], [cells[i] for i in columns])
        return out

    card = rows("recipes-scorecard.md", (3, 6, 9))
    peers = rows("recipes-scorecard.md", (4, 7, 10)), rows("recipes-scorecard.md", (5, 8, 11))
    short = rows("recipes.md", (1, 2, 3))
    assert short.pop("random-init") == next(iter(peers[0].values()))
    assert short.pop("bag-of-subwords") == next(iter(peers[1].values()))
    assert short and all(card[name] == means for name, means in short.items()), (short, card)


def test_every_interval_and_spread_docs_recipes_quotes_is_the_scorecards():
    """The claims table and prose of docs/recipes.md quote paired differences ("+3.7 [+2.1, +5.2]") and
    seed spreads ("24.2 ± 0.6") by hand: each must be one the scorecards `make recipes` writes say (a
    figure quoted at two decimals, from the runs' scores.json, at the scorecard's one)."""
    def one_decimal(match: re.Match) -> str:
        return f"{float(match.group(0).replace('−', '-')):+.1f}".replace("+-", "-")

    def quotes(text: str, pattern: str) -> set[str]:
        signed = re.compile(r"[+−-]\d+\.\d+")
        return {signed.sub(one_decimal, q).replace("-0.0", "+0.0") for q in re.findall(pattern, text)}

    interval, spread = r"[+−-]?\d+\.\d+ \[[+−-]\d+\.\d+, [+−-]\d+\.\d+\]", r"\d+\.\d+ ± \d+\.\d+"
    doc = (claims.ROOT / "docs" / "recipes.md").read_text()
    cards = "".join((claims.ROOT / "docs" / f).read_text()
                    for f in ("recipes-scorecard.md", "recipes-scorecard-metaxlm.md"))
    for pattern in (interval, spread):
        quoted, written = quotes(doc, pattern), quotes(cards, pattern)
        assert quoted and quoted <= written, f"docs/recipes.md quotes what no scorecard says: {quoted - written}"


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


def test_a_kept_acceptance_workspace_is_keyed_by_the_code_every_claim_hashes(tmp_path, monkeypatch):
    """`XYLENT_ACCEPTANCE_KEEP=DIR make acceptance` keeps the claims' workspaces in DIR, so a run cut short
    resumes where it stopped; a change to any hashed file gives new folders, never a stale workspace."""
    repo = tmp_path / "repo"
    (repo / "models").mkdir(parents=True)
    (repo / "models" / "loss.py").write_text("WEIGHT = 1.0\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    monkeypatch.setattr(claims, "ROOT", repo)
    monkeypatch.setattr(claims, "CLAIMS", {"toy": {"what": "a toy claim", "code": ["models/"]}})
    monkeypatch.delenv(claims.KEEP, raising=False)
    assert claims.kept_folder("toy") is None, "without the setting, pytest's temporary folders"
    monkeypatch.setenv(claims.KEEP, str(tmp_path / "keep"))
    first = claims.kept_folder("toy")
    assert first.is_dir() and first.parent == tmp_path / "keep" and first.name.startswith("toy-")
    assert claims.kept_folder("toy") == first, "the same code: the same folder, found again"
    (repo / "models" / "loss.py").write_text("WEIGHT = 2.0\n")
    assert claims.kept_folder("toy") != first
