"""Recipes as specs: ``extends:`` (a recipe = a base spec + what it changes) and
``xylent compare`` (several runs side by side, each beside its trivial peers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from xylent.errors import XylentError
from xylent.spec import load_spec

from conftest import DEMO_SHORT  # the session demo's spec (tests/data/demo-short.yaml)

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data_specs" / "demo.yaml"


def test_a_spec_extends_another_section_by_section(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(DEMO.read_text())
    (tmp_path / "sub").mkdir()
    recipe = tmp_path / "sub" / "r.yaml"
    recipe.write_text("extends: ../base.yaml\nname: r\npretrain: {objective: mlm, steps: 7}\n"
                      "evaluate: {models: [pipeline]}\n")
    spec, demo = load_spec(recipe, ["pretrain.lr=0.01"]), load_spec(DEMO)
    assert (spec.name, spec.pretrain.objective, spec.pretrain.steps, spec.pretrain.lr) == ("r", "mlm", 7, 0.01)
    assert spec.pretrain.batch_size == demo.pretrain.batch_size, "the base's other knobs of the section stay"
    assert spec.evaluate.models == ["pipeline"] and spec.evaluate.tasks == demo.evaluate.tasks
    assert spec.sources == demo.sources and spec.languages == demo.languages
    assert Path(spec.base_dir) == recipe.parent, "relative paths: against the file named on the command line"


def test_an_extends_cycle_or_a_missing_base_is_a_clear_error(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\nname: a\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\nname: b\n")
    with pytest.raises(XylentError, match="cycle"):
        load_spec(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(XylentError, match="the spec extends .*nowhere.yaml, which does not exist") as err:
        load_spec(tmp_path / "c.yaml")
    assert "c.yaml: extends: nowhere.yaml" in err.value.render(), "it names the spec that points at it"
    (tmp_path / "d.yaml").write_text("extends: [a.yaml, b.yaml]\n")
    with pytest.raises(XylentError, match="one spec file"):
        load_spec(tmp_path / "d.yaml")


def test_compare_marks_a_tie_at_the_precision_it_shows():
    from xylent.tasks.evaluate.compare import table

    def run(ours, base):
        return {"label": "r", "objective": "electra", "pretrain": {},
                "scores": {"pipeline": {"t": {"avg": ours}}, "random-init": {"t": {"avg": base}}}}

    rows = table([run(12.44, 12.36), run(12.46, 12.36), run(12.30, 12.36)]).splitlines()[2:5]
    assert ["12.4 = (12.4)" in rows[0], "12.5 ▲ (12.4)" in rows[1], "12.3 ▼ (12.4)" in rows[2]] == [True] * 3


def test_a_claim_over_seeds_is_shown_only_when_its_paired_interval_excludes_zero():
    """tasks/evaluate/paired.py on toy scores: paired per seed and language, the seed as the unit
    (Student's t over the per-seed mean differences), and "shown" only over >= 3 seeds."""
    import math

    from scipy.stats import t as student_t

    from xylent.tasks.evaluate.compare import seed_table
    from xylent.tasks.evaluate.paired import difference

    base = {s: {"de": 10.0 + s, "fr": 20.0, "ja": 30.0 - s} for s in range(3)}
    better = {s: {lang: v + 1.0 + 0.5 * (lang == "de") + 0.1 * s for lang, v in langs.items()}
              for s, langs in base.items()}  # per seed: +1.5 (de), +1.0, +1.0, and 0.1 more each seed
    d = difference(better, base)
    seed_means = [3.5 / 3 + 0.1 * s for s in range(3)]
    half = student_t.ppf(0.975, 2) * 0.1 / math.sqrt(3)
    assert d["mean"] == pytest.approx(sum(seed_means) / 3) and d["low"] == pytest.approx(d["mean"] - half)
    assert (d["seeds"], d["seeds_up"], d["languages"], d["languages_up"]) == (3, 3, 3, 3)
    assert d["verdict"] == "shown: above"
    # one seed reverses: its languages all agree, but the seeds do not
    mixed = {**better, 2: {lang: v - 3.0 for lang, v in base[2].items()}}
    assert difference(mixed, base)["verdict"] == "not shown at this scale"
    two = {s: better[s] for s in (0, 1)}
    assert difference(two, base)["verdict"] == "not shown: 2 seeds (at least 3 measure the spread)"
    assert difference(better, {5: base[0]}) is None, "no shared seed: nothing to pair"
    assert difference({0: {"de": math.nan}}, {0: {"de": 1.0}}) is None, "a missing score is not a difference"

    def run(scores_by_model):
        return {"label": "r", "objective": "electra", "pretrain": {}, "kinds": {"t": "tatoeba"},
                "scores": {m: {"t": {"avg": sum(v.values()) / len(v), "languages": {k: {"accuracy": x}
                                                                                    for k, x in v.items()}}}
                           for m, v in scores_by_model.items()}}

    groups = [{"label": "a", "objective": "electra", "runs": {s: run({"pipeline": base[s], "random-init": base[s]})
                                                            for s in range(3)}},
              {"label": "b", "objective": "mlm", "runs": {s: run({"pipeline": better[s], "random-init": base[s]})
                                                          for s in range(3)}}]
    markdown, numbers = seed_table(groups)
    rows = markdown.splitlines()
    assert rows[0] == "| run | objective | seeds | t: pipeline | t: random-init |"
    assert rows[2] == "| a | electra | 0 1 2 | 20.0 ± 0.0 | 20.0 ± 0.0 |"
    assert numbers["t"]["b - a"] == d and numbers["t"]["b - random-init"] == d
    assert numbers["t"]["a - random-init"]["verdict"] == "not shown at this scale"
    assert "| b − a | +1.3 [" in markdown and ": shown: above |" in markdown
    named = seed_table(groups, [("a", "b")])[1]["t"]
    assert named["a - b"]["verdict"] == "shown: below" and "b - a" not in named, "a named claim reads as named"
    with pytest.raises(XylentError, match="--claim names \\['c'\\]"):
        seed_table(groups, [("c", "a")])


def test_every_recipe_loads_and_changes_only_what_it_names():
    demo = load_spec(DEMO)
    expected = {"electra": ("electra", ["mrtd", "trtd"], None), "mlm": ("mlm", ["mrtd", "trtd"], None),
                "infoxlm": ("infoxlm", ["mrtd", "trtd"], None), "veco": ("veco", ["mrtd", "trtd"], None),
                "electra-mrtd-only": ("electra", ["mrtd"], None), "electra-en-x": ("electra", ["mrtd", "trtd"], "en"),
                "infoxlm-en-x": ("infoxlm", ["mrtd", "trtd"], "en"),
                "transformers-electra": ("transformers-electra", ["mrtd", "trtd"], None),
                "electra-no-bias": ("electra", ["mrtd", "trtd"], None)}
    plain = demo.model.model_copy(update={"relative_bias": False})  # the reference peer and ours without the bias
    for name, (objective, tasks, pivot) in expected.items():
        spec = load_spec(ROOT / "data_specs" / "recipes" / f"{name}.yaml")
        assert (spec.pretrain.objective, spec.pretrain.batch_kinds, spec.sampling.pivot) == (objective, tasks, pivot)
        model = plain if name in ("transformers-electra", "electra-no-bias") else demo.model
        assert spec.vocab == demo.vocab and spec.shards == demo.shards and spec.model == model, name
        assert spec.pretrain.steps == demo.pretrain.steps, f"{name}: the same training budget as the demo"


def test_compare_puts_runs_side_by_side_with_their_peers(run_cli, demo_run, tmp_path):
    _, ws = demo_run
    out = tmp_path / "table.md"
    rc, stdout, err = run_cli("compare", "--spec", DEMO_SHORT, "--spec", DEMO_SHORT, "--workspace", ws, "--out", out)
    assert rc == 0, err
    lines = [ln for ln in stdout.splitlines() if ln.startswith("| demo-short |")]
    assert len(lines) == 2 and out.read_text() == stdout
    header = stdout.splitlines()[0]
    assert "django-holdout (random-init)" in header and "mrtd/generator_loss (generator_unigram_loss)" in header
    assert "django-holdout stripped (random-init)" in header, "each retrieval task's stripped variant beside it"
    cells = lines[0].split(" | ")
    assert cells[1] == "electra" and ("▲" in lines[0] or "▼" in lines[0])
    rc, _, err = run_cli("compare", "--spec", DEMO, "--workspace", tmp_path / "empty")
    assert rc == 2 and "xylent run evaluate" in err
    # over seeds: the session demo's run is seed 0 (the spec's); one seed measures no spread
    rc, stdout, err = run_cli("compare", "--spec", DEMO_SHORT, "--workspace", ws, "--seeds", "0")
    assert rc == 0, err
    assert "| demo-short | electra | 0 |" in stdout and "demo-short − random-init" in stdout
    assert "not shown: 1 seed (at least 3 measure the spread)" in stdout and "shown: above" not in stdout
    rc, _, err = run_cli("compare", "--spec", DEMO_SHORT, "--workspace", ws, "--seeds", "0", "7")
    assert rc == 2 and f"xylent run evaluate --spec {DEMO_SHORT} --set seed=7" in err, err
    # a --set after a --spec: what that spec's runs were made with, {seed} each seed (MetaXLM's phase 2 per seed)
    rc, _, err = run_cli("compare", "--spec", DEMO_SHORT, "--set", "pretrain.register_name=demo-{seed}",
                         "--workspace", ws, "--seeds", "0")
    assert rc == 0, err  # an operational field: the same run
    rc, _, err = run_cli("compare", "--spec", DEMO_SHORT, "--set", "pretrain.lr={seed}e-4", "--workspace", ws,
                         "--seeds", "7")
    assert rc == 2 and f"--spec {DEMO_SHORT} --set pretrain.lr=7e-4 --set seed=7" in err, err
    with pytest.raises(SystemExit):
        run_cli("compare", "--set", "seed=1", "--spec", DEMO_SHORT)


def test_recipe_knobs_out_of_range_are_caught_before_anything_trains(tmp_path):
    with pytest.raises(XylentError, match="sampling.pivot"):
        load_spec(DEMO, ["sampling.pivot=english"])
    with pytest.raises(XylentError, match="trtd"):
        load_spec(DEMO, ["pretrain.objective=veco", "pretrain.batch_kinds=[mrtd]"])
    with pytest.raises(XylentError, match="ZeRO-3"):
        load_spec(DEMO, ["pretrain.objective=infoxlm", "pretrain.zero_stage=3"])
