"""A checkpoint is trusted only whole (xylent.models.training.checkpoints; issue 64, 0c): each kind of
damage to the newest complete checkpoint is found from its COMPLETE record, the checkpoint is set aside
(kept) and the one before it is used.  On files laid out as the trainer writes them; the real run with a
flipped byte is tests/test_pretrain.py::test_a_killed_launcher_leaves_no_rank_and_the_rerun_is_bit_identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xylent.models.training.checkpoints import COMPLETE, damage, file_records, usable_checkpoints


def _checkpoint(root: Path, step: int, record_files: bool = True) -> Path:
    tag = root / f"step-{step:08d}"
    (tag / "sub").mkdir(parents=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(bytes(range(256)) * 40)
    (tag / "sub" / "rng-rank0.pt").write_bytes(b"rng" * 10)
    info = {"step": step, "world_size": 1, "zero_stage": 2}
    if record_files:
        info["files"] = file_records(tag)
    (tag / COMPLETE).write_text(json.dumps(info))
    return tag


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("harm, said", [
    (lambda t: _flip(t / "mp_rank_00_model_states.pt"), "mp_rank_00_model_states.pt changed since it was written"),
    (lambda t: (t / "mp_rank_00_model_states.pt").write_bytes(b"x" * 10), "has 10 bytes, 10240 were written"),
    (lambda t: (t / "sub" / "rng-rank0.pt").unlink(), "sub/rng-rank0.pt is missing"),
    (lambda t: (t / COMPLETE).write_text("{not json"), "marker cannot be read"),
])
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_one_before_it_used(tmp_path, harm, said):
    first, second = _checkpoint(tmp_path, 5), _checkpoint(tmp_path, 10)
    assert damage(first) is None and damage(second) is None
    harm(second)
    done, notes = usable_checkpoints(tmp_path)
    assert done == [first]
    assert len(notes) == 1 and said in notes[0] and "resuming from step 5" in notes[0]
    aside = tmp_path / "damaged-step-00000010"
    assert aside.is_dir() and not second.exists(), "set aside, never deleted"
    assert usable_checkpoints(tmp_path) == ([first], []), "a set-aside checkpoint is not looked at again"


def test_with_every_checkpoint_damaged_training_starts_again_and_an_old_marker_is_trusted(tmp_path):
    only = _checkpoint(tmp_path, 5)
    _flip(only / "mp_rank_00_model_states.pt")
    done, notes = usable_checkpoints(tmp_path)
    assert done == [] and "no earlier complete checkpoint: training starts from step 0" in notes[0]
    old = _checkpoint(tmp_path / "old", 5, record_files=False)  # written before files were recorded
    _flip(old / "mp_rank_00_model_states.pt")
    assert usable_checkpoints(tmp_path / "old") == ([old], []), "nothing to check it against: taken as it is"
