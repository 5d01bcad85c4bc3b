"""Workspace: atomic publication, manifests, stale temporaries."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xylent.workspace import Workspace, fingerprint, read_manifest


def test_fingerprint_is_stable_and_order_free():
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})


def test_publish_writes_manifest_last_and_describes_files(tmp_path):
    ws = Workspace(tmp_path)
    final = ws.output_dir("prepare", "abc")
    with ws.building(final) as tmp:
        (tmp / "sub").mkdir()
        pq.write_table(pa.table({"x": [1, 2, 3]}), tmp / "sub" / "t.parquet")
        (tmp / "note.txt").write_text("hi")
        assert read_manifest(tmp) is None
        ws.publish(tmp, final, {"stage": "prepare"})
    m = read_manifest(final)
    files = {f["path"]: f for f in m["files"]}
    assert sorted(files) == ["note.txt", "sub/t.parquet"], "every file but the manifest itself"
    assert files["sub/t.parquet"]["rows"] == 3 and files["note.txt"]["bytes"] == 2
    for rel, f in files.items():
        data = (final / rel).read_bytes()
        assert f["sha256"] == hashlib.sha256(data).hexdigest() and f["bytes"] == len(data), rel
    assert json.loads((final / "_manifest.json").read_text())["stage"] == "prepare"
    assert sorted(p.name for p in final.parent.iterdir()) == ["abc"], "the temporary folder was renamed into place"


def test_a_file_whose_time_moved_is_hashed_once_and_a_same_size_edit_is_found(tmp_path):
    from xylent.workspace import check_files

    ws = Workspace(tmp_path)
    final = ws.output_dir("prepare", "abc")
    with ws.building(final) as tmp:
        (tmp / "note.txt").write_text("hello")
        ws.publish(tmp, final, {"stage": "prepare"})
    m = read_manifest(final)
    note = final / "note.txt"
    published = note.stat().st_mtime_ns
    assert m["files"][0]["mtime_ns"] == published
    os.utime(note, ns=(published, published + 10**9))  # touched, or copied without -p: the same bytes
    assert check_files(final, m) == [] and note.stat().st_mtime_ns == published, "hashed once, its time set back"
    note.write_text("jello")  # the same size, other bytes
    assert check_files(final, m) == ["note.txt: content changed (sha256 differs from the manifest's)"]


def test_a_failed_build_leaves_nothing(tmp_path):
    ws = Workspace(tmp_path)
    final = ws.output_dir("prepare", "abc")
    with pytest.raises(RuntimeError):
        with ws.building(final) as tmp:
            (tmp / "half.parquet").write_bytes(b"PAR1")
            raise RuntimeError("crash")
    assert not final.exists() and list(final.parent.iterdir()) == []


def test_stale_temporaries_are_removed_when_the_lock_is_taken(tmp_path):
    ws = Workspace(tmp_path / "ws")
    stale = tmp_path / "ws" / "prepare" / "_units" / "abc.tmp-999-dead"
    stale.mkdir(parents=True)
    partial = tmp_path / "ws" / "download" / "_partial" / "f.part"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"123")
    # a stage linked in from another workspace: a build there may be running, under that workspace's lock
    building = tmp_path / "other" / "vocab" / "abc.tmp-123-live"
    building.mkdir(parents=True)
    (tmp_path / "ws" / "vocab").symlink_to(tmp_path / "other" / "vocab", target_is_directory=True)
    with ws.lock():
        assert not stale.exists()
        assert partial.exists(), "partial downloads are kept: they are resumed"
        assert building.exists(), "another workspace's temporaries are not this lock's to remove"
        with ws.lock():  # re-entrant within one process
            assert (tmp_path / "ws" / ".xylent.lock").read_text().startswith(f"pid {os.getpid()} since ")
        assert _lock_in_another_process(tmp_path / "ws").returncode == 3, "held: another process is refused"
    assert _lock_in_another_process(tmp_path / "ws").returncode == 0, "released: another process takes it"


def _lock_in_another_process(root):
    code = ("import sys\n"
            "from xylent.errors import XylentError\n"
            "from xylent.workspace import Workspace\n"
            "try:\n"
            "    with Workspace(sys.argv[1]).lock():\n"
            "        pass\n"
            "except XylentError as exc:\n"
            "    assert 'in use by another xylent run' in str(exc) and f'pid {sys.argv[2]}' in str(exc), str(exc)\n"
            "    sys.exit(3)\n")
    done = subprocess.run([sys.executable, "-c", code, str(root), str(os.getpid())], check=False,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 3), done.stderr
    return done


def test_an_unsupported_object_store_is_refused_clearly():
    from xylent.errors import XylentError

    with pytest.raises(XylentError, match="ftp:// is not supported") as err:
        Workspace("ftp://host/ws")  # s3://, gs://, az:// work: tests/test_object_store.py
    assert "s3://, gs:// or az://bucket/prefix" in err.value.fix


def test_two_writers_of_one_file_never_share_a_temporary(tmp_path):
    """xylent.atomic: each writer has its own temporary, so both renames succeed and the file is
    one writer's whole text (with one shared name, the second writer truncated the first's and
    one rename found nothing)."""
    import threading

    from xylent.atomic import write_atomic

    target, both_open = tmp_path / "result.json", threading.Barrier(2)
    errors = []

    def writer(text: str):
        def write(tmp: Path):
            with open(tmp, "w") as f:
                f.write(text[:5])
                f.flush()
                both_open.wait(timeout=10)  # both temporaries exist before either is finished
                f.write(text[5:])
        try:
            write_atomic(target, write)
        except Exception as exc:  # collected: an assertion in a thread would be lost
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t * 100,)) for t in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and target.read_text() in ("a" * 100, "b" * 100)
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"], "no temporary left behind"
