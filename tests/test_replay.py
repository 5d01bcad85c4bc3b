"""The acceptance replay (tests/acceptance/replay.py): a change that moves code an acceptance claim
hashes but alters no arithmetic carries the claim's result to the new tree; a one-ulp change in a
loss does not.  Real training on both sides (DeepSpeed's CPU rank, a few steps of the demo's tiny
ELECTRA) in a clone of this repository at HEAD, on the session demo's data stages."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import polars as pl
import pytest

from tests.acceptance import claims, replay

pytestmark = pytest.mark.demo_data  # links the session demo's data stages; runs nothing on its workspace

STEPS = 6
DOC = "# acceptance\n\n<!-- acceptance:results -->\n<!-- /acceptance:results -->\n"


@pytest.fixture()
def clone(tmp_path, monkeypatch):
    """A clone of this repository at HEAD that claims.py reads as its tree, one toy claim over the model,
    its training and the spec, replayed by the ELECTRA workload alone, measured at HEAD."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(claims.ROOT), str(repo)], check=True)
    doc = tmp_path / "acceptance.md"
    doc.write_text(DOC)
    monkeypatch.setattr(claims, "ROOT", repo)
    monkeypatch.setattr(claims, "RESULTS", repo / "results")  # untracked, outside what the claim hashes
    monkeypatch.setattr(claims, "DOC", doc)
    monkeypatch.setattr(claims, "CLAIMS", {"toy": {"what": "a toy claim", "replay": ["electra"],
                                                   "code": ["models/", "tasks/pretrain/", "xylent/spec/"]}})
    claims.record("toy", {"loss": 0.25}, {"loss": "< 0.3"}, seconds=60.0)
    return repo


@pytest.mark.costs(cli=3)  # the base's run and the ulp tree's, then the moved tree's (the base's is reused)
def test_a_pure_move_is_carried_and_a_one_ulp_change_in_a_loss_is_not(clone, demo_run, tmp_path):
    _, demo_ws = demo_run
    measured = json.loads((claims.RESULTS / "toy.json").read_text())
    electra = clone / "models" / "electra.py"
    original = electra.read_text()
    # the discriminator's loss times (1 + 2**-23): one float32 ulp of every value it scales
    ulp, n = re.subn(r"st\.d_loss / norms\.d\b", "st.d_loss / norms.d * (1 + 2**-23)", original)
    assert n == 1, "models/electra.py's discriminator loss moved: update the patch here"
    electra.write_text(ulp)
    said = []
    kw = {"steps": STEPS, "workloads": ("electra",), "data": demo_ws, "work": tmp_path / "work", "log": said.append}
    assert replay.replay(**kw) == 1, "\n".join(said)
    out = "\n".join(said)
    assert "electra pretrain: DIFFERS" in out and "ulps" in out and "run `make acceptance`" in out, out
    assert json.loads((claims.RESULTS / "toy.json").read_text()) == measured  # nothing carried

    # a pure move: _prefixed (the encoder's state-dict slice the export reads) into a module of its own
    moved, n = re.subn(r"\n\ndef _prefixed\(.*\n    return .*\n", "\n", original)
    assert n == 1, "models/electra.py's _prefixed changed: move another function here"
    electra.write_text(moved.replace("from __future__ import annotations\n",
                                     "from __future__ import annotations\n\nfrom xylent.models.prefixed import _prefixed\n"))
    (clone / "models" / "prefixed.py").write_text(
        '"""A state dict\'s entries under some prefixes (moved out of models/electra.py)."""\n\n'
        "from __future__ import annotations\n\nimport torch\nfrom torch import nn\n\n\n"
        + re.search(r"def _prefixed\(.*\n    return .*\n", original).group(0))
    assert claims.problems("toy") and "stale" in claims.problems("toy")[0]
    said.clear()
    assert replay.replay(**kw) == 0, "\n".join(said)
    assert "reused" in said[1], said  # the base's run of the first replay
    carried = json.loads((claims.RESULTS / "toy.json").read_text())
    assert claims.problems("toy") == []
    assert {k: carried[k] for k in measured if k not in ("code_hash", "code_files")} == \
        {k: v for k, v in measured.items() if k not in ("code_hash", "code_files")}
    assert carried["code_files"]["models/prefixed.py"] == claims.code_files("toy")["models/prefixed.py"]
    (entry,) = carried["replays"]
    assert entry["from_commit"] == measured["commit"] and entry["to_commit"] == "working tree"
    assert entry["head"] == measured["commit"] and entry["steps"] == STEPS
    got = entry["compared"]["electra pretrain"]
    assert got["metrics lines"] == STEPS and got["tensors"] > 100 and got["model files"] == 2, got
    assert f"measured at `{measured['commit'][:10]}`" in claims.DOC.read_text()
    assert f"replayed at a working tree over `{measured['commit'][:10]}`" in claims.DOC.read_text()
    assert subprocess.run(["git", "worktree", "list"], cwd=clone, capture_output=True, text=True,
                          check=True).stdout.count("\n") == 1  # the base's worktree is gone
    assert replay.replay(**kw) == 0 and "nothing to replay" in said[-1]


def test_the_audit_outputs_compare_as_numbers_to_the_bit(demo_run, tmp_path):
    """What the audit workload compares, on the session demo's audit: itself, the same bits; one
    float one ulp off in a copy of its table, a difference named with its row and size."""
    res, _ = demo_run
    audit = Path(res["stages"]["audit"]["output_dir"])
    same = replay.compare_stage("audit", audit, audit)
    assert same.first is None and same.counts["tables"] >= 2 and same.counts["tensors"] > 100, same
    assert same.counts["json files"] == 1 and same.counts["metrics lines"] > 0, same
    copy = tmp_path / "audit.parquet"
    table = pl.read_parquet(audit / "audit.parquet")
    w = table["w_final"].to_numpy().copy()
    w.view("int64")[3] += 1
    table.with_columns(pl.Series("w_final", w)).write_parquet(copy)
    out = replay.Compared("audit")
    replay.compare_table(audit / "audit.parquet", copy, out)
    assert out.first.startswith("audit: audit.parquet[w_final] row 3: ") and "1 ulps" in out.first, out.first
    assert "1 rows differ" in out.first


def test_a_result_measured_on_another_cpu_model_is_not_replayed_here(tmp_path, monkeypatch):
    repo = _toy_repo(tmp_path, monkeypatch)
    path = claims.record("toy", {"loss": 0.25}, {"loss": "< 0.3"}, seconds=1.0)
    result = json.loads(path.read_text())
    result["machine"]["cpu"] = "Another CPU 9000"
    path.write_text(json.dumps(result))
    (repo / "models" / "loss.py").write_text("WEIGHT = 1.0  # a comment\n")
    said = []
    assert replay.replay(steps=2, log=said.append) == 1
    assert "Another CPU 9000" in said[-1] and "one CPU model" in said[-1] and "make acceptance" in said[-1]


def test_the_base_is_the_recorded_commit_or_its_first_descendant_with_the_hashed_files(tmp_path, monkeypatch):
    repo = _toy_repo(tmp_path, monkeypatch)
    first = _commit(repo, "first")
    claims.record("toy", {"loss": 0.25}, {"loss": "< 0.3"}, seconds=1.0)
    result = json.loads((claims.RESULTS / "toy.json").read_text())
    assert replay.base_commit("toy", result) == first
    (repo / "models" / "loss.py").write_text("WEIGHT = 1.0  # moved nothing\n")
    carried = {**result, "code_files": claims.code_files("toy")}  # as a replay leaves it, committed later
    (repo / "README").write_text("unrelated\n")
    _commit(repo, "unrelated", paths=["README"])
    second = _commit(repo, "the carried tree", paths=["models"])
    assert replay.base_commit("toy", carried) == second
    with pytest.raises(replay.Refused, match="--base"):
        replay.base_commit("toy", carried, forced=first)
    # the claim's list moves on with its code (moved to another folder): the base is still the tree it hashed
    (repo / "core").mkdir()
    subprocess.run(["git", "mv", "models/loss.py", "core/loss.py"], cwd=repo, check=True)
    _commit(repo, "moved", paths=["models", "core"])
    monkeypatch.setitem(claims.CLAIMS["toy"], "code", ["core/"])
    assert replay.base_commit("toy", carried) == second
    subprocess.run(["git", "mv", "core/loss.py", "models/loss.py"], cwd=repo, check=True)
    _commit(repo, "moved back", paths=["models", "core"])
    monkeypatch.setitem(claims.CLAIMS["toy"], "code", ["models/"])
    (repo / "models" / "loss.py").write_text("WEIGHT = 2.0\n")
    with pytest.raises(replay.Refused, match="make acceptance"):
        replay.base_commit("toy", {**result, "code_files": claims.code_files("toy")})
    # what it refuses before training: a spec's value changed (a comment may), code no workload runs
    monkeypatch.setitem(claims.CLAIMS["toy"], "code", ["models/", "data_specs/", "tasks/evaluate/"])
    monkeypatch.setitem(claims.CLAIMS["toy"], "replay", ["electra"])  # no evaluate workload: evaluate code unrun
    for path, text in (("data_specs/demo.yaml", "steps: 1500\n"), ("tasks/evaluate/run.py", "X = 1\n")):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    third = _commit(repo, "specs", paths=["data_specs", "tasks"])
    then = claims.code_files("toy")
    (repo / "data_specs" / "demo.yaml").write_text("steps: 1500  # a comment\n")
    assert replay._unprovable("toy", third, then, claims.code_files("toy")) == []
    (repo / "tasks" / "evaluate" / "run.py").write_text('"""Its docstring, new."""\nX = 1  # a comment\n')
    assert replay._unprovable("toy", third, then, claims.code_files("toy")) == [], "the same program"
    # the namespace move: the same statements on modules renamed tasks.x -> xylent.tasks.x
    assert replay._same_program('from tasks.evaluate.data import f\nimport models.pretrained as p\nM = "tasks.x"\n',
                                'from xylent.tasks.evaluate.data import f\nimport xylent.models.pretrained as p\n'
                                'M = "xylent.tasks.x"\n')
    assert not replay._same_program("from tasks.evaluate.data import f\n", "from tasks.evaluate.data import g\n")
    # a move inside it: models.rank is models.training.rank; a module that did not move is not another's
    assert replay._same_program("from xylent.models.rank import f\nimport models.audit.dro\n",
                                "from xylent.models.training.rank import f\nimport xylent.models.training.audit.dro\n")
    assert not replay._same_program("from xylent.models.rank import f\n", "from xylent.models.training.optim import f\n")
    assert not replay._same_program('M = "tasks.x"\n', 'M = "xylent.tasks.y"\n')
    (repo / "data_specs" / "demo.yaml").write_text("steps: 1000\n")
    (repo / "tasks" / "evaluate" / "run.py").write_text("X = 2\n")
    assert replay._unprovable("toy", third, then, claims.code_files("toy")) == [
        "data_specs/demo.yaml (its values changed)", "tasks/evaluate/run.py (the replay never runs it)"]
    # a claim the evaluate workload replays: its evaluate code may change, the scores it leaves are compared
    monkeypatch.setitem(claims.CLAIMS["toy"], "replay", ["electra", "evaluate"])
    assert replay._unprovable("toy", third, then, claims.code_files("toy")) == ["data_specs/demo.yaml (its values changed)"]


def test_the_scores_compare_to_the_bit_and_a_score_only_the_tree_has_is_added(tmp_path):
    scores = {"models": {"pipeline": {"retrieval": {"avg": 10.25, "languages": {"de": {"accuracy": 12.5, "n": 8}}}}},
              "tasks": {"retrieval": {"kind": "tatoeba"}}}
    a, b = tmp_path / "base", tmp_path / "tree"
    for d in (a, b):
        d.mkdir()
    (a / "scores.json").write_text(json.dumps(scores))
    grown = json.loads(json.dumps(scores))
    grown["models"]["pipeline"]["retrieval"]["curve"] = [{"tokens": 1000, "avg": 3.0}]
    grown["models"]["pipeline"]["retrieval2"] = {"avg": 1.0}
    (b / "scores.json").write_text(json.dumps(grown))
    same = replay.compare_scores("electra evaluate", a, b)
    assert same.first is None and same.counts == {"added values": 2, "values": 4}, same
    grown["models"]["pipeline"]["retrieval"]["languages"]["de"]["accuracy"] = 12.500000000000002
    (b / "scores.json").write_text(json.dumps(grown))
    moved = replay.compare_scores("electra evaluate", a, b)
    assert moved.first.startswith("electra evaluate: scores.json/models/pipeline/retrieval/languages/de/accuracy: "
                                  "12.5 (base) vs 12.500000000000002 (this tree)"), moved.first
    assert "1 ulps" in moved.first
    del grown["models"]["pipeline"]["retrieval"]["avg"]
    (b / "scores.json").write_text(json.dumps(grown))
    gone = replay.compare_scores("electra evaluate", a, b)  # a score the base had and the tree lost
    assert "scores.json/models/pipeline/retrieval/avg" in gone.differing, gone


def _toy_repo(tmp_path: Path, monkeypatch) -> Path:
    repo = tmp_path / "repo"
    (repo / "models").mkdir(parents=True)
    (repo / "models" / "loss.py").write_text("WEIGHT = 1.0\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    _commit(repo, "first")
    monkeypatch.setattr(claims, "ROOT", repo)
    monkeypatch.setattr(claims, "RESULTS", repo / "results")
    monkeypatch.setattr(claims, "CLAIMS", {"toy": {"what": "a toy claim", "code": ["models/"]}})
    return repo


def _commit(repo: Path, message: str, paths: list[str] = ("models",)) -> str:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "add", *paths], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", message], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()

