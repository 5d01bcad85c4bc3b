"""A new workspace's MLflow store comes from a migrated template (xylent.tracking.store_template)
instead of MLflow's chain of alembic migrations: it must be the very store MLflow would have made,
and concurrent first creations (of the template, of one workspace's store) must leave a whole one."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import xylent.tracking as tracking

ROOT = Path(__file__).resolve().parents[1]


def _dump(db: Path, ws: Path) -> tuple[list, dict]:
    """Schema and rows, with the workspace's path, ids and times left out."""
    with sqlite3.connect(db) as con:
        # a table's clauses as a set: alembic's batch migrations recreate tables with their constraints in
        # hash order, so two stores MLflow makes itself can list the same constraints in another order
        schema = sorted((kind, name, table, tuple(sorted(re.split(r",\s*\n", sql or ""))))
                        for kind, name, table, sql in con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))
        rows = {}
        for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            cols = [c[1] for c in con.execute(f"PRAGMA table_info({table})")]
            keep = [c for c in cols if not c.endswith(("_time", "_id", "timestamp")) and c not in ("run_uuid", "value", "artifact_uri")]
            if keep:
                rows[table] = sorted(repr(r).replace(str(ws), "WS") for r in
                                     con.execute(f"SELECT {', '.join(keep)} FROM {table}"))
    return schema, rows


def _use(ws: Path) -> None:
    t = tracking.Tracker(f"sqlite:///{ws}/mlflow.db", "xp", artifact_root=ws / "mlartifacts", workspace=ws)
    run = t.start_run("r", params={"a": 1})
    t.log_metrics(run, {"m": 1.0})
    t.end_run(run)


def test_a_store_from_the_template_is_the_store_mlflow_makes(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fresh, copied = tmp_path / "fresh", tmp_path / "copied"
    fresh.mkdir(), copied.mkdir()
    with monkeypatch.context() as m:  # the code before the template: MLflow runs its migrations
        m.setattr(tracking, "new_store_from_template", lambda db, cache=None: False)
        _use(fresh)
    assert not (tmp_path / "cache").exists()
    _use(copied)
    template = tracking.store_template()
    assert template is not None and template.parent == tmp_path / "cache" / "xylent"
    assert _dump(fresh / "mlflow.db", fresh) == _dump(copied / "mlflow.db", copied)
    with sqlite3.connect(copied / "mlflow.db") as con:  # MLflow added its Default experiment where it opened it
        assert con.execute("SELECT name FROM experiments ORDER BY experiment_id").fetchall() == [("Default",), ("xp",)]
    with sqlite3.connect(template) as con:
        assert con.execute("SELECT count(*) FROM experiments").fetchone() == (0,), "the template holds nothing"
    assert not [p for p in copied.iterdir() if p.name.endswith(".tmp")]


def test_the_template_never_replaces_an_existing_store(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"someone else's")
    assert tracking.new_store_from_template(db) is False and db.read_bytes() == b"someone else's"
    assert tracking.new_store_from_template(tmp_path / "no" / "such" / "folder" / "mlflow.db") is False


def test_concurrent_first_creations_leave_one_whole_store(tmp_path):
    """Three processes at once, on a machine without a template, open the same new workspace."""
    ws = tmp_path / "ws"
    ws.mkdir()
    code = ("import sys; from pathlib import Path; import xylent.tracking as t; ws = Path(sys.argv[1]); "
            "t.Tracker(f'sqlite:///{ws}/mlflow.db', 'xp', artifact_root=ws / 'mlartifacts', workspace=ws)")
    env = {**__import__("os").environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(ws)], env=env, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 3, errors
    with sqlite3.connect(ws / "mlflow.db") as con:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert sorted(con.execute("SELECT name FROM experiments")) == [("Default",), ("xp",)]
    templates = list((tmp_path / "cache" / "xylent").iterdir())
    assert [p.name for p in templates] == [tracking.store_template(tmp_path / "cache" / "xylent").name]
    _use(ws)  # and MLflow goes on using it


def test_a_workspace_path_with_url_characters_is_refused_before_anything_runs(tmp_path, run_cli):
    """``?`` would start the store URI's query and ``%41`` decode to ``A``: the store would land
    outside the workspace.  A configured store is not affected."""
    from conftest import write_spec

    (tmp_path / "en.txt").write_text("a sentence\n")
    spec = write_spec(tmp_path / "spec.yaml", {"name": "u", "languages": ["en"], "sources": [
        {"name": "loc", "kind": "local", "format": "text", "lang": "en", "path": str(tmp_path / "en.txt")}]})
    for bad in ("runs?v=1", "a%41b", "x#y"):
        rc, _, err = run_cli("run", "download", "--spec", spec, "--workspace", tmp_path / bad / "ws")
        assert rc == 2 and "which the URI of its MLflow store" in err and "tracking.tracking_uri" in err, err
        assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["en.txt", "spec.yaml"], "nothing was written"
    from xylent.tracking import tracking_uri_for

    assert tracking_uri_for(tmp_path / "a?b", "sqlite:////elsewhere/mlflow.db") == "sqlite:////elsewhere/mlflow.db"


def test_links_use_the_public_ui_address_when_one_is_set(monkeypatch):
    """In compose every container reaches MLflow as http://mlflow:5000, a name no browser resolves:
    the links in Prefect's artifacts and the CLI use XYLENT_MLFLOW_UI_URL when it is set."""
    from xylent.tracking import how_to_view, ui_base

    monkeypatch.delenv("XYLENT_MLFLOW_UI_URL", raising=False)
    assert ui_base("http://mlflow:5000/") == "http://mlflow:5000"
    assert ui_base("sqlite:////ws/mlflow.db") == "http://127.0.0.1:5000"
    monkeypatch.setenv("XYLENT_MLFLOW_UI_URL", "https://mlflow.team.example/")
    assert ui_base("http://mlflow:5000") == ui_base("sqlite:////ws/mlflow.db") == "https://mlflow.team.example"
    assert how_to_view("http://mlflow:5000") == "open https://mlflow.team.example"
    page = "https://mlflow.team.example/#/experiments/1/runs/abc?workflowType=machine_learning"
    assert how_to_view("http://mlflow:5000", page) == f"open {page}"
    assert how_to_view("sqlite:////ws/mlflow.db", page) == \
        f"run `mlflow ui --backend-store-uri sqlite:////ws/mlflow.db` first, then open {page}"


def test_a_runs_owner_is_its_process_not_its_pid(tmp_path):
    """A later run marks an earlier one KILLED only when the process its xylent.owner tag names
    has ended: a live process with the same pid but another start time (a reused pid) counts as
    ended; the owner itself, or one on another host, does not."""
    import socket

    import psutil

    from xylent.process_identity import mark

    me = tracking.owner()
    since_boot = psutil.Process().create_time() - psutil.boot_time()  # a clock step moves the boot time, not this
    assert abs(float(me.rsplit(":", 1)[1]) - since_boot) < 0.05, me
    assert me.startswith(f"{socket.gethostname()}:") and not tracking.owner_is_gone(me)
    host, pid, start = me.rsplit(":", 2)
    assert tracking.owner_is_gone(f"{host}:{pid}:{float(start) - 5:.3f}"), "the same pid, started earlier: reused"
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    tag = f"{host}:{mark(child.pid)}"
    written_before = f"{host}:{child.pid}:{psutil.Process(child.pid).create_time():.3f}"  # the wall-clock form
    assert not tracking.owner_is_gone(tag) and not tracking.owner_is_gone(written_before)
    child.wait()
    assert tracking.owner_is_gone(tag) and tracking.owner_is_gone(written_before), "its process has ended"
    assert not tracking.owner_is_gone(f"elsewhere.example:{child.pid}:0.000"), "another host: unknowable, kept"
    assert not tracking.owner_is_gone("not a tag")


def test_a_cached_models_new_name_tells_a_lost_version_from_a_refusing_registry(tmp_path):
    """pretrain.register_name on a cache hit registers the cached model again: a first version the
    registry no longer has asks for --force (export again); a registry that refuses (a loopback server
    answering 403, as a server with auth does) is not told to retrain, which would cost hours."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import pytest
    from mlflow import MlflowClient

    from xylent.tasks.pretrain.publish import register_cached
    from xylent.errors import XylentError

    tracker = tracking.Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "xylent-test")
    manifest = {"registered_model": "xylent-gone", "registered_version": 1}
    assert register_cached(tracker, {"registered_model": "team"}, "team") == {}, "the same name: nothing to do"
    with pytest.raises(XylentError, match="no longer has") as lost:
        register_cached(tracker, manifest, "team")
    assert "--force" in lost.value.fix

    class Refuses(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"error_code": "PERMISSION_DENIED", "message": "user may not read models"}).encode()
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuses)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tracker.uri = f"http://127.0.0.1:{server.server_address[1]}"
        tracker.client = MlflowClient(tracking_uri=tracker.uri)
        with pytest.raises(XylentError, match="the registry answered PERMISSION_DENIED") as refused:
            register_cached(tracker, manifest, "team")
    finally:
        server.shutdown()
        server.server_close()
    assert "--force" not in refused.value.fix and "stays cached" in refused.value.fix


def test_evaluations_tag_every_registration_of_the_same_model(tmp_path):
    """A cached pretrain registered again under a new pretrain.register_name is the same model: evaluate's
    headline tags reach both names' versions, and no other model's."""
    from xylent.flows.evaluate import tag_registrations

    tracker = tracking.Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "xylent-test")
    client = tracker.client
    run = client.create_run(tracker.experiment_id).info.run_id
    for name in ("xylent-demo", "team-encoder", "other"):
        client.create_registered_model(name)
    first = client.create_model_version("xylent-demo", "file:///ws/pretrain/abc/model", run_id=run)
    again = client.create_model_version("team-encoder", first.source, run_id=run)
    other = client.create_model_version("other", "file:///ws/pretrain/def/model", run_id=run)
    tagged = tag_registrations(client, "xylent-demo", str(first.version), {"eval.xnli": "0.61"})
    assert tagged == [("xylent-demo", "1"), ("team-encoder", "1")]
    assert client.get_model_version("team-encoder", str(again.version)).tags["eval.xnli"] == "0.61"
    assert "eval.xnli" not in client.get_model_version("other", str(other.version)).tags


def test_the_window_means_are_charted_after_the_per_step_curves():
    stage = {"first.trtd/discriminator_loss": 0.6, "final.embeddings/top_pc_share": 0.2,
             "init.embeddings/top_pc_share": 0.02, "steps": 150.0, "final_loss": 1.0, "init/exact": 3.0}
    logged = tracking.charted_after_curves(stage)
    assert logged == {"window/first.trtd/discriminator_loss": 0.6, "window/final.embeddings/top_pc_share": 0.2,
                      "window/init.embeddings/top_pc_share": 0.02, "steps": 150.0, "final_loss": 1.0,
                      "init/exact": 3.0}
    # MLflow's run page: a section per name up to its last "/", in name order; the per-step curves' sections
    # (what the trainer logs each step) now all come before any one-point summary's
    per_step = ["embeddings/top_pc_share", "mrtd/generator_loss", "trtd/discriminator_loss", "system/cpu"]
    sections = sorted({k.rsplit("/", 1)[0] for k in [*per_step, *logged] if "/" in k and not k.startswith("init/")})
    assert sections[:4] == ["embeddings", "mrtd", "system", "trtd"]
    assert all(s.startswith("window/") for s in sections[4:]) and len(sections) == 7
