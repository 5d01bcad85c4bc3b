"""Every pretraining objective through the real stage (DeepSpeed ZeRO-2, CPU ranks): a run
stopped after a checkpoint resumes bit for bit, 1 and 2 ranks agree up to float
rounding, and the exported encoder loads with xylent.models.load_pretrained.  (ELECTRA's own checks are
in test_pretrain.py, the kill -9 itself with them: what a kill leaves is the same for every
objective, what the checkpoint must hold is each objective's own.  That the infoxlm recipe
retrieves better than random-init on the demo is the acceptance tier's claim:
tests/acceptance/test_infoxlm_retrieval.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cost_guard import costs
from conftest import linked_data, stopped_after
import torch

from tests.test_pretrain import (DEMO, SMALL, _assert_bit_identical, _assert_like_the_reference_on_other_ranks,
                                 _metrics)

pytestmark = pytest.mark.demo_data  # reads the session demo only (pyproject.toml's markers)

# 28 steps (test_pretrain's runs are shorter): the queue wraps and the losses have room to fall
LONG_STEPS = 28
LONG = [*SMALL, "--set", f"pretrain.steps={LONG_STEPS}", "--set", "pretrain.checkpoint_every=7"]
RESUME_AT = 21  # the last checkpoint but one: the resumed run trains 7 steps on the restored objective state

OBJECTIVES = {
    # a small queue, so it wraps within the run; in-batch negatives, so keys cross ranks inside the loss;
    # mixup, so pairs merge across ranks (a merged pair's rows can sit on two ranks)
    "infoxlm": ["--set", "pretrain.objective=infoxlm", "--set", "pretrain.infoxlm.queue_size=64",
                "--set", "pretrain.infoxlm.pool=mean", "--set", "pretrain.infoxlm.in_batch_negatives=true",
                "--set", "pretrain.infoxlm.normalize=true", "--set", "pretrain.infoxlm.temperature=0.1",
                "--set", "pretrain.infoxlm.mixup=0.5"],
    "veco": ["--set", "pretrain.objective=veco"],
}


@pytest.fixture(scope="module", params=sorted(OBJECTIVES))
@costs(deepspeed=3)
def objective_runs(request, demo_run, tmp_path_factory, prefect_server):
    """(objective, its reference run on 2 ranks, a run of the same spec resumed from the reference's
    checkpoint at step RESUME_AT, a run on 1 rank)."""
    from xylent.cli import main  # in-process: the session's Prefect server

    name, extra = request.param, OBJECTIVES[request.param]
    demo_ws = Path(demo_run[1])
    root = tmp_path_factory.mktemp(f"objective-{name}")

    def run(ws: Path, *more: str) -> tuple[dict, Path]:
        import contextlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(["run", "pretrain", "--spec", str(DEMO), "--workspace", str(ws), "--json", *LONG, *extra,
                       "--set", "pretrain.zero_stage=2", "--set", "pretrain.keep_checkpoints=4", *more])
        assert rc == 0
        res = json.loads(buf.getvalue())["stages"]["pretrain"]
        return res, Path(res["output_dir"])

    two_ws = linked_data(demo_ws, root / "two")
    ref = run(two_ws, "--set", "pretrain.ranks=2")
    stopped_ws = stopped_after(two_ws, linked_data(demo_ws, root / "stopped"), "pretrain", RESUME_AT)
    resumed = run(stopped_ws, "--set", "pretrain.ranks=2")
    one = run(linked_data(demo_ws, root / "one"), "--set", "pretrain.ranks=1")
    return {"name": name, "ref": (*ref, two_ws), "resumed": (*resumed, stopped_ws), "one": one}


def test_a_run_stopped_after_a_checkpoint_resumes_bit_for_bit(objective_runs):
    _, ref_out, ref_ws = objective_runs["ref"]
    res, out, ws = objective_runs["resumed"]
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["resumed_from_step"] == RESUME_AT, "from the newest complete checkpoint, not the cut one"
    assert [r["step"] for r in _metrics(out)] == list(range(1, LONG_STEPS + 1)), "no step lost, none twice"
    # the checkpoint files compared include the objective's own state (InfoXLM: key encoder and queue)
    _assert_bit_identical(out, ws, ref_out, ref_ws)


def test_one_rank_equals_two_up_to_float_rounding(objective_runs):
    _, ref_out, _ = objective_runs["ref"]
    _, out = objective_runs["one"]
    _assert_like_the_reference_on_other_ranks(out, ref_out, resumed=0)


def test_the_objective_learns_and_its_encoder_loads(objective_runs):
    from xylent import models

    name = objective_runs["name"]
    _, out, _ = objective_runs["ref"]
    rows = _metrics(out)
    cfg = json.loads((out / "model" / "config.json").read_text())
    assert cfg["objective"] == name
    first, last = rows[:10], rows[-10:]

    def mean(rs, k):
        vals = [r[k] for r in rs if k in r]
        assert vals, k
        return sum(vals) / len(vals)

    assert mean(last, "mrtd/generator_loss") < mean(first, "mrtd/generator_loss")
    if name == "infoxlm":
        assert mean(last, "trtd/contrast_loss") < mean(last, "trtd/contrast_chance_loss"), "below chance"
        assert rows[-1]["trtd/contrast_queue_fill"] == 1.0, "the queue of 64 has filled"
        # each free row starts a merge with p = 0.5, taking a second row: 2p / (1 + p) = 2/3 of the rows merge
        assert 0.5 < mean(rows, "trtd/contrast_mixup_share") < 0.8
    if name == "veco":
        assert mean(last, "trtd/generator_loss") < mean(first, "trtd/generator_loss")
        assert {"trtd/plug_in_loss", "trtd/plug_out_loss"} <= set().union(*rows)
        from safetensors.torch import load_file

        full = load_file(str(out / "model" / "pretraining.safetensors"))
        assert any(k.startswith("cross.") for k in full), "the plug-in weights are kept for continued training"
        assert not any(k.startswith("cross.") for k in load_file(str(out / "model" / "model.safetensors")))
    enc = models.load_pretrained(out / "model")
    vecs = enc.embed(["Hallo Welt", "Bonjour"])
    assert vecs.shape == (2, enc.config.hidden) and torch.isfinite(vecs).all()


def test_vecos_two_phase_schedule_holds_the_body_still_then_trains_it():
    """freeze_body_steps: lr 0 for the body's parameter groups (AdamW's decay included), the
    cross-attention trains from step 0; afterwards everything trains."""
    from xylent.models.config import preset
    from xylent.models.masking import row_noise
    from xylent.models.training.optim import lr_lambdas, make_optimizer, warmup_linear_decay
    from xylent.models.stats import Norms
    from xylent.models.veco import VecoOptions, VecoModel
    from tests.test_models_electra import SPECIALS, _batch

    torch.manual_seed(0)
    from xylent.spec import VecoConfig

    options = VecoOptions(**VecoConfig(freeze_body_steps=3).model_dump())
    model = VecoModel(preset("tiny", vocab_size=500, specials=SPECIALS), options=options)
    opt = make_optimizer(model, 1e-3, weight_decay=0.01)
    assert sorted(g["body"] for g in opt.param_groups) == [False, False, True, True]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambdas(model, opt.param_groups, warmup_linear_decay(0, 10)))
    body = {n: p.detach().clone() for n, p in model.named_parameters() if not model.is_cross(n)}
    cross = {n: p.detach().clone() for n, p in model.named_parameters() if model.is_cross(n)}

    def step(k):
        ids, seg, _ = _batch(k)
        pad = ids == SPECIALS["pad"]
        st = model(ids, pad, seg, row_noise(0, k, 0, list(range(len(ids))), (~pad).sum(1).tolist(), ids.shape[1]))
        opt.zero_grad()
        model.loss(st, Norms(int(st.g_count))).backward()
        opt.step()
        sched.step()

    for k in range(3):
        step(k)
    now = dict(model.named_parameters())
    assert all(torch.equal(now[n], v) for n, v in body.items()), "the body has not moved"
    assert all(not torch.equal(now[n], v) for n, v in cross.items() if v.ndim == 2), "the cross-attention has"
    step(3)
    assert sum(not torch.equal(now[n], v) for n, v in body.items()) > len(body) // 2, "then the body trains"


def test_an_objectives_knobs_reach_train_json_and_only_its_own_enter_the_fingerprint():
    from xylent.spec import load_spec
    from xylent.stage import section_identity

    electra = load_spec(DEMO, ["pretrain.infoxlm.temperature=0.5", "pretrain.veco.freeze_body_steps=7"])
    plain = load_spec(DEMO)
    assert section_identity(electra.pretrain) == section_identity(plain.pretrain), \
        "knobs of objectives the run does not train change nothing it computes"
    veco = load_spec(DEMO, ["pretrain.objective=veco", "pretrain.veco.freeze_body_steps=7"])
    assert veco.pretrain.objective_options() == {"freeze_body_steps": 7, "pair_mask_prob": 0.25, "tlm": True,
                                                 "combine": "sum"}
    assert section_identity(veco.pretrain)["veco"] == {"freeze_body_steps": 7}, "knobs added later, at their default"
    info = load_spec(DEMO, ["pretrain.objective=infoxlm", "pretrain.infoxlm.temperature=0.5"])
    assert info.pretrain.objective_options()["temperature"] == 0.5 and "veco" not in section_identity(info.pretrain)


def test_the_model_side_options_are_the_spec_sections_fields_with_no_second_default():
    """models/ types an objective's options (the ranks read train.json, not the spec) with the spec
    section's fields and no defaults of its own: the spec is where defaults live, a model is built
    from a section whole, and one without its options is refused by name."""
    from dataclasses import MISSING, asdict, fields

    from xylent.models.config import preset
    from xylent.models.infoxlm import XLCoConfig
    from xylent.models.objectives import build_model
    from xylent.models.veco import VecoOptions, VecoModel
    from tests.test_models_electra import SPECIALS
    from xylent.spec import InfoXLMConfig, VecoConfig

    for typed, section in ((XLCoConfig, InfoXLMConfig()), (VecoOptions, VecoConfig())):
        assert [f.name for f in fields(typed)] == list(section.model_dump())
        assert all(f.default is MISSING and f.default_factory is MISSING for f in fields(typed)), typed.__name__
        assert asdict(typed(**section.model_dump())) == section.model_dump()
    cfg = preset("tiny", vocab_size=300, specials=SPECIALS)
    with pytest.raises(ValueError, match="objective veco needs its options"):
        build_model("veco", cfg)
    with pytest.raises(RuntimeError, match="built to encode"):
        VecoModel(cfg).body_frozen(0)
