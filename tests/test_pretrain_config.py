"""train.json is derived from the spec in one place: every knob comes from the spec's
pretrain section (no second set of defaults), the DeepSpeed stage is never overridden
behind the user's back, and the encoder carries the tokenizer's special ids."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from xylent.models.training.run_config import TrainConfig
from xylent.tasks.pretrain.train_json import ZERO_CONFIGS, deepspeed_config
from xylent.errors import XylentError
from xylent.spec import spec_from_dict

BASE = {"languages": ["de", "en"], "sources": [{"name": "x", "kind": "local", "path": "x.txt", "lang": "de", "format": "text"}]}


def _spec(tmp_path: Path, **pretrain):
    return spec_from_dict({**BASE, "pretrain": pretrain}, base_dir=str(tmp_path))


def test_zero_stage_picks_xylents_config(tmp_path):
    for stage in (0, 1, 2, 3):
        path, got = deepspeed_config(_spec(tmp_path, zero_stage=stage))
        assert path == ZERO_CONFIGS / f"zero{stage}.json" and got == stage
        assert json.loads(path.read_text())["zero_optimization"]["stage"] == stage


def test_a_users_deepspeed_file_decides_the_stage(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3, "reduce_bucket_size": 1}}))
    path, stage = deepspeed_config(_spec(tmp_path, deepspeed_config="ds.json"))
    assert path == tmp_path / "ds.json" and stage == 3, "zero_stage's default (2) does not override the file"
    assert deepspeed_config(_spec(tmp_path, deepspeed_config="ds.json", zero_stage=3))[1] == 3
    with pytest.raises(XylentError, match="zero_stage is 1 but ds.json says zero_optimization.stage 3") as e:
        deepspeed_config(_spec(tmp_path, deepspeed_config="ds.json", zero_stage=1))
    assert "drop pretrain.zero_stage" in e.value.render()


@pytest.mark.parametrize("content, what", [(None, "not found"), ("{oops", "not a JSON object"),
                                           ("[1, 2]", "not a JSON object")])
def test_a_broken_deepspeed_file_is_a_clear_error(tmp_path, content, what):
    if content is not None:
        (tmp_path / "ds.json").write_text(content)
    with pytest.raises(XylentError, match=what):
        deepspeed_config(_spec(tmp_path, deepspeed_config="ds.json"))


def test_the_trainer_uses_the_files_stage_without_rewriting_it(tmp_path):
    from xylent.models.training.trainer import ds_config

    user = {"zero_optimization": {"stage": 1, "overlap_comm": False}, "steps_per_print": 7}
    (tmp_path / "ds.json").write_text(json.dumps(user))
    cfg = TrainConfig(**{f.name: None for f in dataclasses.fields(TrainConfig)})
    cfg.deepspeed_config, cfg.zero_stage, cfg.batch_size, cfg.clip = str(tmp_path / "ds.json"), 3, 8, 1.0
    cfg.batch_kinds, cfg.grad_accum, cfg.batch_schedule, cfg.trtd_ratio = ["mrtd"], 2, "alternate", 0.5
    ds = ds_config(cfg, bf16=False, world=2)
    assert ds["zero_optimization"] == user["zero_optimization"], "the stage in the file is the one used"
    assert ds["train_micro_batch_size_per_gpu"] == 4 and ds["gradient_accumulation_steps"] == 2


def test_train_json_has_no_defaults_of_its_own(tmp_path):
    assert all(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
               for f in dataclasses.fields(TrainConfig)), "defaults live in the spec only"
    (tmp_path / "train.json").write_text(json.dumps({"shards_dir": "s"}))
    with pytest.raises(ValueError, match="missing"):
        TrainConfig.load(tmp_path / "train.json")


def test_every_knob_is_a_declared_field_named_as_the_spec_names_it():
    """No lookup at run time: reading a knob the config does not declare is an AttributeError, and the knobs
    copied from the spec are fields of xylent.spec.PretrainConfig with the same name."""
    from xylent.models.training.run_config import SPEC_KNOBS
    from xylent.spec import PretrainConfig

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(SPEC_KNOBS) <= names and set(SPEC_KNOBS) <= set(PretrainConfig.model_fields)
    assert {"lr", "clip"} <= set(PretrainConfig.model_fields), "resolved over the spec's own, same name"
    cfg = TrainConfig(**{n: None for n in names})
    with pytest.raises(AttributeError):
        cfg.not_a_knob


def test_train_config_takes_every_knob_from_the_spec(demo_run, tmp_path):
    from xylent.tasks.pretrain.train_json import train_config

    res, ws = demo_run
    stages = {k: Path(v["output_dir"]) for k, v in res["stages"].items()}
    spec = spec_from_dict({**BASE, "model": {"size": "tiny"}, "pretrain": {
        "steps": 77, "batch_size": 6, "warmup_steps": 5, "grad_accum": 3, "mask_prob": 0.2, "disc_weight": 20,
        "checkpoint_every": 11, "log_every": 4}}, base_dir=str(tmp_path))
    cfg = train_config(spec, stages, tmp_path, "run", "sqlite:///x.db")
    assert (cfg.steps, cfg.batch_size, cfg.warmup_steps, cfg.grad_accum) == (77, 6, 5, 3)
    assert (cfg.mask_prob, cfg.disc_weight, cfg.checkpoint_every, cfg.log_every) == (0.2, 20, 11, 4)
    assert cfg.lr == 2e-3 and cfg.clip == 2.0, "size-band defaults for tiny"
    index = json.loads((stages["shards"] / "index.json").read_text())
    assert cfg.model["specials"] == index["specials"], "the tokenizer's ids, as the shards recorded them"
    cfg.save(tmp_path / "train.json")
    assert TrainConfig.load(tmp_path / "train.json") == cfg


def test_stale_deepspeed_shm_segments_are_swept_and_live_ones_kept(tmp_path):
    import mmap
    import os

    from xylent import launch

    uid = os.getuid()
    stale = tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_1111_0"
    live = tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_2222_0"
    other = tmp_path / "something_else"
    starting = tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_3333_1"  # written, not yet mapped
    for p in (stale, live, other, starting):
        p.write_bytes(b"\0" * 4096)
    for p in (stale, live, other):
        os.utime(p, (os.stat(p).st_atime, os.stat(p).st_mtime - 3600))  # an hour old
    with open(live, "r+b") as fh, mmap.mmap(fh.fileno(), 4096):  # a running rank maps its segment
        assert launch.sweep_stale_shm_buffers(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and other.exists()
    assert starting.exists(), "a launch starting beside this one keeps the segment its peers wait for"
    cmd = ["deepspeed", "--master_port", "2222", "--module", "xylent.models.training.trainer"]
    assert launch.shm_buffers(cmd, tmp_path) == [live]
    launch.remove_shm_buffers(cmd, tmp_path)
    assert not live.exists() and other.exists()


def test_a_build_lock_left_by_a_killed_build_is_cleared_and_a_live_builds_kept(tmp_path):
    """A killed op build leaves torch's build lock, and DeepSpeed's ranks would wait on it forever."""
    import os
    import subprocess
    import threading
    import time

    from xylent.build_locks import clear_stale_build_locks

    root = tmp_path / "torch_extensions"
    stale, live, young = (root / "py311_cpu" / op / "lock" for op in ("killed", "compiling", "just_killed"))
    for lock in (stale, live, young):
        lock.parent.mkdir(parents=True)
        lock.touch()
    for lock in (stale, live):
        for path in (lock, lock.parent):  # nothing written in its build folder for an hour
            os.utime(path, (time.time() - 3600, time.time() - 3600))
    said = []
    ninja = subprocess.Popen(["sleep", "30"], cwd=live.parent)  # a build works in its op's directory
    try:
        assert clear_stale_build_locks([root], min_age_s=1.0, poll_s=0.05, say=said.append) == [young, stale]
    finally:
        ninja.kill()
        ninja.wait()
    assert live.exists() and not stale.exists() and not young.exists()
    assert [line.split(" ")[1] for line in said] == ["waiting", "removed", "removed"], said
    assert "just_killed" in said[0] and "untouched for 60 min" in said[2], said
    # a folder written while it waits has a build elsewhere (a shared cache): its lock is left, and said
    elsewhere = tmp_path / "shared_cache" / "py311_cpu" / "op" / "lock"
    elsewhere.parent.mkdir(parents=True)
    elsewhere.touch()
    stop = threading.Event()

    def compile_elsewhere():
        while not stop.wait(0.05):
            (elsewhere.parent / "obj.o").touch()

    writer = threading.Thread(target=compile_elsewhere)
    writer.start()
    try:
        assert clear_stale_build_locks([tmp_path / "shared_cache"], min_age_s=1.0, poll_s=0.05,
                                       say=(said := []).append) == []
    finally:
        stop.set()
        writer.join()
    assert elsewhere.exists() and said[-1].startswith(f"xylent: left the build lock {elsewhere}"), said


def test_an_attention_tensor_larger_than_the_machine_is_refused_before_any_rank_starts():
    """Issue 64: shards.seq_len 100000 asked CPU ranks for an 80 GB tensor; the rank died minutes in
    and the advice was to run the same command again."""
    from xylent.models.config import preset
    from xylent.tasks.pretrain.train_json import _attention_fits

    enc = preset("small", vocab_size=1000, specials={}, max_position=100_002)
    _attention_fits(enc, 512, 16, hostfile=None)  # the demo's shape fits any machine
    with pytest.raises(XylentError, match=r"one layer's attention would take .* GiB on each CPU rank") as err:
        _attention_fits(enc, 100_000, 16, hostfile=None)
    assert "shards.seq_len" in err.value.render() and "pretrain.batch_size" in err.value.render()
    _attention_fits(enc, 100_000, 16, hostfile="hosts.txt")  # other machines' memory: not known here
