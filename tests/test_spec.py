"""Specs: strict YAML, --set overrides, language checks, the shipped specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import write_spec
from xylent.errors import XylentError
from xylent.spec import load_spec

from xylent.flows.registry import STAGES
from xylent.stage import stage_fingerprints as _fingerprints


def stage_fingerprints(spec):
    return _fingerprints(STAGES, spec)


ROOT = Path(__file__).resolve().parents[1]
BASE = {"languages": ["de", "en"],
        "sources": [{"name": "t", "kind": "url", "url": "http://x/y.tsv", "format": "tsv", "pair": "de-en"}]}


def test_shipped_specs_validate():
    from xylent.tasks.download.plan import plan_source

    demo = load_spec(ROOT / "data_specs" / "demo.yaml")
    assert len(demo.languages) == 20 and demo.sources[0].kind == "gettext"
    items = plan_source(demo, demo.sources[0])  # the installed Django has catalogs for every other language
    per_lang = {lang: [i for i in items if i.lang == lang] for lang in demo.languages}
    assert not per_lang["en"], "English is the msgids' language, not a catalog"
    assert all(len(per_lang[lang]) >= 3 and all(Path(i.path).is_file() for i in per_lang[lang])
               for lang in demo.languages if lang != "en"), {k: len(v) for k, v in per_lang.items()}
    fps = stage_fingerprints(demo)
    assert len(set(fps.values())) == 9 and all(len(f) == 16 and int(f, 16) >= 0 for f in fps.values())
    base = load_spec(ROOT / "data_specs" / "xy-lent-base.yaml")
    assert base.model.size == "base" and {s.kind for s in base.sources} == {"cc100", "opus"}
    assert base.pretrain.batch_schedule == "mix", "a batch of each task every step (XY-LENT Table 9)"
    assert len(base.languages) >= 100
    assert [(t.name, t.finetune.defaults, t.finetune.lr[0]) for t in base.evaluate.tasks] == \
        [("xnli", "xy-lent", 5e-6), ("pawsx", "xy-lent", 8e-6)], "fine-tuned as XY-LENT's Table 15"


def test_unknown_fields_are_errors_that_name_the_field(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", {**BASE, "prepare": {"min_chrs": 3}})
    with pytest.raises(XylentError) as err:
        load_spec(spec)
    assert "prepare.min_chrs" in str(err.value) and str(spec) in str(err.value)
    assert "did you mean 'min_chars'?" in str(err.value)


def test_a_spec_error_says_which_set_gave_the_value_and_suggests_the_nearest_field(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", BASE)
    with pytest.raises(XylentError) as err:
        load_spec(spec, ["pretrain.steps=-5", "audit.pair_los=paper", "sources.0.urll=x", "zzz=1"])
    text = err.value.render()
    assert "pretrain.steps: Input should be greater than 0 (from --set pretrain.steps=-5)" in text, text
    assert "audit.pair_los: unknown field (did you mean 'pair_loss'?" in text
    assert "did you mean 'url'?" in text, "a source's fields, through its kind"
    assert "zzz: unknown field (check the spelling;" in text
    where = text.split("where: ")[1].splitlines()[0]
    assert where.startswith(f"{spec}, --set ") and all(
        f"--set {ov}" in where for ov in ("pretrain.steps=-5", "audit.pair_los=paper", "sources.0.urll=x", "zzz=1"))
    assert "  - sources.0.urll: unknown field" in text, "the source's kind tag is not part of the location"


def test_a_spec_or_extends_that_is_a_folder_says_so(tmp_path):
    (tmp_path / "folder.yaml").mkdir()
    with pytest.raises(XylentError, match="folder.yaml is a folder, not a spec file"):
        load_spec(tmp_path / "folder.yaml")
    spec = write_spec(tmp_path / "s.yaml", {**BASE, "extends": "folder.yaml"})
    with pytest.raises(XylentError, match="which is a folder, not a spec file"):
        load_spec(spec)
    with pytest.raises(XylentError, match="which is not a regular file"):
        load_spec(write_spec(tmp_path / "d.yaml", {**BASE, "extends": "/dev/null"}))


def test_a_missing_extends_parent_names_the_spec_that_points_at_it(tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text("extends: gone/base.yaml\nname: child\n")
    with pytest.raises(XylentError) as err:
        load_spec(child)
    text = err.value.render()
    assert f"the spec extends {tmp_path / 'gone/base.yaml'}, which does not exist" in text
    assert f"{child.resolve()}: extends: gone/base.yaml" in text


def test_no_float_of_the_spec_takes_inf_or_nan(tmp_path):
    """Issue 64, item 0: pretrain.lr=.inf trained to NaN and published the model; vocab.beta=.inf gave every
    language the smallest grid.  Every float of every section refuses them (xylent.spec.base.Strict)."""
    spec = write_spec(tmp_path / "s.yaml", BASE)
    with pytest.raises(XylentError) as err:
        load_spec(spec, ["pretrain.lr=.inf", "vocab.beta=.nan", "download.timeout_s=.inf"])
    text = err.value.render()
    for field in ("pretrain.lr", "vocab.beta", "download.timeout_s"):
        assert f"{field}: Input should be a finite number" in text, text


def test_a_renamed_value_is_refused_with_its_new_name(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", {**BASE, "sampling": {"pair_method": "temperature"}})
    with pytest.raises(XylentError) as err:
        load_spec(spec)
    text = err.value.render()
    assert "sampling.pair_method" in text and "pair_method: smoothed" in text, text
    assert load_spec(spec, ["sampling.pair_method=smoothed"]).sampling.pair_method == "smoothed"


def test_a_renamed_field_is_read_under_its_old_name_reported_and_fingerprinted_as_before(tmp_path, capsys):
    """pretrain.tasks became pretrain.batch_kinds (and task_schedule batch_schedule): a spec or --set with the
    old name still means the field, says so on stderr, and moves no fingerprint; both names at once are refused."""
    import yaml

    demo = yaml.safe_load((ROOT / "data_specs" / "demo.yaml").read_text())
    new = load_spec(ROOT / "data_specs" / "demo.yaml", ["pretrain.batch_kinds=[mrtd]"])
    assert "is now" not in capsys.readouterr().err
    old_demo = {**demo, "pretrain": {("tasks" if k == "batch_kinds" else "task_schedule" if k == "batch_schedule"
                                      else k): v for k, v in demo["pretrain"].items()}}
    old_file = write_spec(tmp_path / "old.yaml", old_demo)
    old = load_spec(old_file, ["pretrain.tasks=[mrtd]"])
    err = capsys.readouterr().err
    assert "pretrain.tasks is now pretrain.batch_kinds" in err and "pretrain.task_schedule is now " \
        "pretrain.batch_schedule" in err and "--set pretrain.tasks is now pretrain.batch_kinds" in err, err
    assert (old.pretrain.batch_kinds, old.pretrain.batch_schedule) == (["mrtd"], new.pretrain.batch_schedule)
    for fp_old, fp_new in zip(stage_fingerprints(old).items(), stage_fingerprints(new).items()):
        if fp_old[0] in ("pretrain", "audit"):  # the stages that read the section; the rest read the corpus path
            assert fp_old == fp_new, "a rename recomputes no output"
    both = write_spec(tmp_path / "both.yaml", {**demo, "pretrain": {**demo["pretrain"], "tasks": ["mrtd"]}})
    with pytest.raises(XylentError, match="tasks and batch_kinds are one setting"):
        load_spec(both)


@pytest.mark.parametrize("override, message", [
    ("pretrain.betas=[0.9,1.0]", "each must be in [0, 1)"),
    ("pretrain.snapshot_tokens=[4000,4000]", "each larger than the one before"),
    ("pretrain.snapshot_tokens=[0]", "token counts above 0"),
    ("name=team/run", "'xylent-team/run', which MLflow refuses"),
    ("pretrain.register_name=enc:v1", "'enc:v1', which MLflow refuses"),
    ("=5", "no field named before '='"),
    ("sources.0.url_template=https://x/all.txt.xz", "lacks {file} or {lang}"),
    ("seed=4294967296", "less than 4294967296"),  # SentencePiece's seed is 32 bits: a TypeError in a task, 18 s in
    ("tracking.experiment=''", "tracking.experiment"),  # was blamed on the tracking URI
    ("pretrain.objective=transformers-electra", "set model.relative_bias: false"),  # died building the rank's model
    (["pretrain.objective=mlm", "model.generator_output=untied"], "objective mlm has none to untie"),  # else ignored
])
def test_what_a_rank_or_the_registry_would_die_on_is_refused_up_front(tmp_path, override, message):
    """Found only when a rank died ("run the same command again") or after the whole training (the registry's
    name rule): refused when the spec is read, naming the field."""
    spec = write_spec(tmp_path / "s.yaml", {**BASE, "sources": [{"name": "cc", "kind": "cc100"}]})
    with pytest.raises(XylentError) as err:
        load_spec(spec, override if isinstance(override, list) else [override])
    assert message in err.value.render(), err.value.render()


def test_set_overrides_nested_fields_lists_and_yaml_values(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", BASE)
    s = load_spec(spec, ["prepare.min_chars=5", "sources.0.max_lines=10", "languages=[de, en, fr]",
                         "runner.kind=processes"])
    assert s.prepare.min_chars == 5 and s.sources[0].max_lines == 10
    assert s.languages == ["de", "en", "fr"] and s.runner.kind == "processes"
    again = load_spec(spec)
    assert again.prepare.min_chars == 1 and again.sources[0].max_lines is None and again.languages == ["de", "en"], \
        "overrides do not leak into the next load of the same file"
    with pytest.raises(XylentError, match="not an index"):
        load_spec(spec, ["sources.3.max_lines=1"])
    with pytest.raises(XylentError, match="key.path=value"):
        load_spec(spec, ["prepare.min_chars"])
    with pytest.raises(XylentError, match="runner.kind"):
        load_spec(spec, ["runner.kind=spark"])


@pytest.mark.parametrize("bad, message", [
    ({"languages": ["de", "english"]}, "unknown language code 'english'"),
    ({"languages": ["de", "en\n"]}, "unknown language code 'en\\\\n'"),  # a folder name must not end in a newline
    ({"languages": ["de", "de", "en"]}, "twice"),
    ({"languages": ["de"]}, "not in the spec's 'languages'"),
    ({"sources": [{"name": "t", "kind": "url", "url": "u", "format": "moses-zip", "lang": "de"}]}, "bitext"),
    ({"sources": [{"name": "t", "kind": "local", "path": "p", "format": "tsv"}]}, "exactly one of"),
    ({"sources": [{"name": "t", "kind": "url", "url": "u", "format": "moses-zip", "pair": "de-en",
                   "max_bytes": 10}]}, "max_bytes"),
    ({"sources": [{"name": "t", "kind": "ftp", "url": "u"}]}, "sources.0"),
    ({"sources": BASE["sources"] * 2}, "unique"),
])
def test_invalid_specs_are_user_errors(tmp_path, bad, message):
    spec = write_spec(tmp_path / "s.yaml", {**BASE, **bad})
    with pytest.raises(XylentError, match=message):
        load_spec(spec)


def test_fingerprints_change_only_downstream_of_what_changed(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", BASE)
    a = stage_fingerprints(load_spec(spec))
    b = stage_fingerprints(load_spec(spec, ["prepare.min_chars=3"]))
    c = stage_fingerprints(load_spec(spec, ["sources.0.url=http://x/z.tsv"]))
    d = stage_fingerprints(load_spec(spec, ["download.concurrency=1", "runner.max_workers=7"]))
    assert a["download"] == b["download"] and a["prepare"] != b["prepare"]
    assert a["download"] != c["download"] and a["prepare"] != c["prepare"]
    assert a == d, "knobs that do not change outputs do not invalidate them"


def test_a_knob_added_later_at_its_default_keeps_existing_fingerprints():
    """sampling.exclude_pairs came after workspaces existed: left at [] it is not part of the
    sampling stage's identity (cached outputs and pretrain checkpoints stay valid); set, it is."""
    from xylent.stage import section_identity

    demo = load_spec(ROOT / "data_specs" / "demo.yaml")
    assert "exclude_pairs" not in section_identity(demo.sampling)
    fps = stage_fingerprints(demo)
    changed = stage_fingerprints(load_spec(ROOT / "data_specs" / "demo.yaml", ["sampling.exclude_pairs=[de-en]"]))
    assert {s for s in fps if fps[s] != changed[s]} == {"sampling", "pretrain", "audit", "evaluate"}


def test_set_is_named_for_the_field_it_gave_through_a_source_kind_and_not_for_a_section_error(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", BASE)
    with pytest.raises(XylentError) as err:
        load_spec(spec, ["sources.0.format=xml", "pretrain.objective=veco", "pretrain.batch_kinds=[mrtd]"])
    text = err.value.render()
    # the source's kind ("url") is a tag in pydantic's location, not a field a user can write
    assert "  - sources.0.format: " in text and "(from --set sources.0.format=xml)" in text, text
    # the section's own check failed; neither --set inside it gave the section
    assert "  - pretrain: " in text and "add 'trtd'" in text, text
    assert "(from --set pretrain." not in text and "--set pretrain." not in text.split("where:")[1], text


def test_a_yaml_alias_bomb_is_refused_before_it_is_merged(tmp_path):
    keys = [f"k{i}" for i in range(10)]
    bomb = ["d0: &d0 {" + ", ".join(f"{k}: x" for k in keys) + "}"]
    bomb += [f"d{i}: &d{i} {{" + ", ".join(f"{k}: *d{i - 1}" for k in keys) + "}" for i in range(1, 9)]
    # the same mapping on both sides of extends: the merge would recurse into all 10**8 copies
    base = tmp_path / "base.yaml"
    base.write_text("\n".join(bomb) + "\npretrain: {x: *d8}\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: base.yaml\n" + "\n".join(bomb) + "\npretrain: {x: *d8}\n")
    for spec in (child, base):
        with pytest.raises(XylentError) as err:
            load_spec(spec)
        assert "more than 100,000 values once its YAML aliases" in err.value.render()
