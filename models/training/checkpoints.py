"""The training run's checkpoints on disk, as the trainer writes them and the stages read them back:
``<checkpoint_dir>/step-XXXXXXXX/`` with DeepSpeed's files, each rank's RNG state and ``COMPLETE``,
written last by rank 0 with the step, the world it was saved by and every file's size and sha256.

A checkpoint is trusted only whole: before the ranks start, the newest complete one is checked
against its record, and one that is damaged (a file missing, truncated or changed) is set aside as
``damaged-step-XXXXXXXX`` (kept, never deleted), reported, and the one before it is used.  No torch
here: the stage's process reads this without the trainer's imports."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

COMPLETE = "COMPLETE"
DAMAGED = "damaged-"  # the prefix a damaged checkpoint is set aside under (not a step-* tag: never resumed)


def complete_checkpoints(root: Path) -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if (p / COMPLETE).exists())


def checkpoint_info(tag_dir: Path) -> dict:
    """What a checkpoint's COMPLETE marker records: step, time, world_size, zero_stage, files."""
    try:
        return json.loads((Path(tag_dir) / COMPLETE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def file_records(tag_dir: Path) -> dict[str, dict]:
    """Every file of a checkpoint but its marker: relative path -> bytes and sha256."""
    out = {}
    for p in sorted(Path(tag_dir).rglob("*")):
        if p.is_file() and p.name != COMPLETE:
            with open(p, "rb") as f:
                out[p.relative_to(tag_dir).as_posix()] = {"bytes": p.stat().st_size,
                                                          "sha256": hashlib.file_digest(f, "sha256").hexdigest()}
    return out


def damage(tag_dir: Path) -> str | None:
    """What is wrong with a complete checkpoint's files against its record, or None (a marker from
    before files were recorded, 2026-12-06, is taken as it is)."""
    info = checkpoint_info(tag_dir)
    if not info:
        return f"its {COMPLETE} marker cannot be read"
    want = info.get("files")
    if want is None:
        return None
    have = {}
    for rel, rec in want.items():
        p = Path(tag_dir) / rel
        if not p.is_file():
            return f"{rel} is missing"
        if p.stat().st_size != rec["bytes"]:
            return f"{rel} has {p.stat().st_size} bytes, {rec['bytes']} were written"
        have[rel] = rec
    now = file_records(tag_dir)
    changed = [rel for rel, rec in want.items() if now.get(rel, {}).get("sha256") != rec["sha256"]]
    return f"{changed[0]} changed since it was written (sha256)" if changed else None


def usable_checkpoints(root: Path) -> tuple[list[Path], list[str]]:
    """(the complete checkpoints, newest last, with every damaged newer one set aside; what was set aside
    and why).  Only the newest is read whole: the ranks load that one, and older ones are checked only
    when a newer one is found damaged."""
    done, notes = complete_checkpoints(root), []
    while done:
        why = damage(done[-1])
        if why is None:
            break
        aside = done[-1].with_name(DAMAGED + done[-1].name)
        done[-1].rename(aside)
        before = f"resuming from step {checkpoint_info(done[-2]).get('step')}" if len(done) > 1 else \
            "no earlier complete checkpoint: training starts from step 0"
        notes.append(f"the checkpoint {done[-1].name} is damaged ({why}); set aside as {aside} (delete it once "
                     f"you have looked), {before}")
        done = done[:-1]
    return done, notes


def resume_problem(tag_dir: Path, world: int, zero_stage: int) -> str | None:
    """Why a checkpoint cannot be resumed on ``world`` ranks, or None.

    DeepSpeed saves ZeRO 1-3 optimizer state partitioned by rank and cannot
    re-partition it for another data-parallel size; ZeRO-0 state is whole."""
    info = checkpoint_info(tag_dir)
    saved = info.get("world_size")
    if saved is None or saved == world or (zero_stage == 0 and info.get("zero_stage", 0) == 0):
        return None
    return (f"the checkpoint at step {info.get('step')} was saved by {saved} rank(s) with ZeRO-{info.get('zero_stage')} "
            f"and this run has {world}: DeepSpeed cannot re-partition ZeRO optimizer state for another world size")


def refuse_other_world_size(tag_dir: Path, world: int, zero_stage: int) -> None:
    why = resume_problem(tag_dir, world, zero_stage)
    if why:
        raise SystemExit(f"xylent: {why}; resume with the same number of ranks, or train again with --force")
