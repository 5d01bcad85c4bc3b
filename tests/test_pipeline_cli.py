"""The CLI end to end on a loopback 'internet': caching, --force, per-source
recomputation, MLflow runs, exit codes, kill -9 recovery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from mlflow import MlflowClient

from conftest import cc100_xz, kill_9_when, moses_zip, write_spec
from xylent.spec import load_spec
from xylent.workspace import Workspace

SW_DOCS = [["Habari ya asubuhi.", "Leo ni siku nzuri."], ["Watoto wanacheza mpira."]]
DE_DOCS = [["Guten Morgen.", "Heute ist ein schöner Tag."], ["Kinder spielen Fußball."], ["Ende."]]


def serve_corpus(corpus) -> dict:
    corpus.files["/cc100/sw.txt.xz"] = cc100_xz(SW_DOCS)
    corpus.files["/cc100/de.txt.xz"] = cc100_xz(DE_DOCS)
    corpus.files["/opus/CCMatrix/v1/moses/de-sw.txt.zip"] = moses_zip(
        "CCMatrix", "de", "sw", ["Guten Morgen.", "Danke."], ["Habari ya asubuhi.", "Asante."]
    )
    corpus.opus[("CCMatrix", "v1")] = [{"source": "de", "target": "sw"}, {"source": "en", "target": "fr"}]
    corpus.files["/extra/en-sw.tsv"] = "Thank you.\tAsante.\nGood morning.\tHabari ya asubuhi.\n".encode()
    return {
        "name": "loopback",
        "languages": ["de", "en", "sw"],
        "sources": [
            {"name": "cc100", "kind": "cc100", "languages": ["de", "sw"],
             "url_template": corpus.base + "/cc100/{file}.txt.xz"},
            {"name": "ccmatrix", "kind": "opus", "corpus": "CCMatrix", "version": "v1",
             "url_template": corpus.base + "/opus/{corpus}/{version}/moses/{pair}.txt.zip",
             "api_url": corpus.base + "/opusapi/"},
            {"name": "extra", "kind": "url", "url": corpus.base + "/extra/en-sw.tsv", "format": "tsv",
             "pair": "en-sw"},
        ],
        "tracking": {"experiment": "loopback"},
        "download": {"backoff_s": 0.01},
        # de-sw and en-sw only: every pair contains sw, so the Sinkhorn table is
        # infeasible at T != 1 and the loader follows the smoothed table
        "sampling": {"pair_method": "smoothed"},
        # a handful of sentences per language: only tiny vocabularies can be learned
        "vocab": {"grid": [20, 22, 24], "budget": 60, "character_coverage": 0.98},
    }


@pytest.fixture()
def loopback(http_corpus, tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", serve_corpus(http_corpus))
    return spec, tmp_path / "ws", http_corpus


def run_json(run_cli, *args):
    rc, out, err = run_cli(*args, "--json")
    assert rc == 0, err
    return json.loads(out)


def test_pipeline_caches_forces_and_recomputes_only_the_edited_branch(run_cli, loopback):
    spec, ws, corpus = loopback
    first = run_json(run_cli, "run", "pipeline", "--spec", spec, "--workspace", ws, "--until", "shards")
    assert [first["stages"][s]["cached"] for s in ("download", "prepare", "dedup", "sampling")] == [False] * 4
    assert first["stages"]["vocab"]["cached"] is False
    out = Path(first["stages"]["prepare"]["output_dir"])
    mono = pl.scan_parquet(out / "mono" / "**" / "*.parquet", hive_partitioning=True).collect()
    assert sorted(mono["lang"].unique()) == ["de", "sw"]
    assert mono.filter(pl.col("lang") == "de")["doc_id"].n_unique() == 3
    bitext = pl.scan_parquet(out / "bitext" / "**" / "*.parquet", hive_partitioning=True).collect()
    assert sorted(bitext["pair"].unique()) == ["de-sw", "en-sw"]
    assert ("Danke.", "Asante.") in bitext.select("src", "tgt").rows()
    stats = pl.read_parquet(out / "stats.parquet")
    assert set(stats["source"]) == {"cc100", "ccmatrix", "extra"}
    fetched = len(corpus.requests)

    again = run_json(run_cli, "run", "pipeline", "--spec", spec, "--workspace", ws, "--until", "shards")
    assert all(s["cached"] for s in again["stages"].values())
    assert {k: v["fingerprint"] for k, v in again["stages"].items()} == \
        {k: v["fingerprint"] for k, v in first["stages"].items()}
    assert len(corpus.requests) == fetched, "a cached stage asks nothing of the network"

    forced = run_json(run_cli, "run", "prepare", "--spec", spec, "--workspace", ws, "--force")
    assert forced["stages"]["prepare"]["cached"] is False and forced["stages"]["download"]["cached"] is True
    assert forced["stages"]["prepare"]["mlflow_run_id"] != first["stages"]["prepare"]["mlflow_run_id"]

    units_before = json.loads((out / "_manifest.json").read_text())["units"]
    edited = run_json(run_cli, "run", "prepare", "--spec", spec, "--workspace", ws,
                      "--set", "sources.0.max_lines=1")
    assert edited["stages"]["download"]["cached"] is True, "max_lines does not change what is downloaded"
    assert edited["stages"]["prepare"]["cached"] is False
    new_out = Path(edited["stages"]["prepare"]["output_dir"])
    units_after = json.loads((new_out / "_manifest.json").read_text())["units"]
    assert len(set(units_before) & set(units_after)) == 2, "ccmatrix and extra units are reused"
    assert len(set(units_after) - set(units_before)) == 2, "the two cc100 files are prepared again"
    assert pl.read_parquet(new_out / "mono" / "lang=de" / "*.parquet")["text"].to_list() == ["Guten Morgen."]

    status = run_json(run_cli, "status", "--spec", spec, "--workspace", ws)
    assert status["stages"]["prepare"]["cached"] is True
    assert status["stages"]["prepare"]["fingerprint"] == first["stages"]["prepare"]["fingerprint"]


def test_changing_one_url_refetches_only_that_file(run_cli, loopback):
    spec, ws, corpus = loopback
    run_json(run_cli, "run", "download", "--spec", spec, "--workspace", ws)
    counts = {p: corpus.count(p) for p in corpus.files}
    corpus.files["/extra/en-sw-v2.tsv"] = "Yes.\tNdiyo.\n".encode()
    res = run_json(run_cli, "run", "pipeline", "--spec", spec, "--workspace", ws, "--until", "shards",
                   "--set", f"sources.2.url={corpus.base}/extra/en-sw-v2.tsv")
    assert res["stages"]["download"]["cached"] is False
    assert {p: corpus.count(p) for p in counts} == counts, "unchanged files are not fetched again"
    assert corpus.count("/extra/en-sw-v2.tsv") == 1


def test_mlflow_has_parent_and_nested_stage_runs(run_cli, loopback):
    spec, ws, _ = loopback
    res = run_json(run_cli, "run", "pipeline", "--spec", spec, "--workspace", ws, "--until", "shards")
    client = MlflowClient(tracking_uri=f"sqlite:///{ws}/mlflow.db")
    exp = client.get_experiment_by_name("loopback")
    parent = client.get_run(res["mlflow_parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert res["mlflow_parent_run_url"] == (f"http://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs/"
                                            f"{parent.info.run_id}?workflowType=machine_learning"), \
        "the run's page in MLflow's machine-learning view: its GenAI view lists runs under Evaluations"
    assert parent.data.tags["prefect.flow_run_id"] == res["prefect_flow_run_id"]
    children = client.search_runs([exp.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    by_stage = {r.data.tags["xylent.stage"]: r for r in children}
    assert set(by_stage) == {"download", "prepare", "dedup", "vocab", "sampling", "shards"}
    prep = by_stage["prepare"]
    assert prep.info.run_id == res["stages"]["prepare"]["mlflow_run_id"]
    assert prep.data.params["prepare.normalization"] == "NFC"
    assert prep.data.params["sources.cc100.url_template"].endswith("/cc100/{file}.txt.xz")
    assert prep.data.metrics["mono.rows"] == 7 and prep.data.metrics["bitext.rows"] == 4
    assert prep.data.metrics["mono.rows.de"] == 4
    assert by_stage["download"].data.metrics["files"] == 4
    arts = {a.path for a in client.list_artifacts(prep.info.run_id)}
    assert {"_manifest.json", "stats.parquet", "stats.md"} <= arts
    assert prep.data.tags["xylent.fingerprint"] == res["stages"]["prepare"]["fingerprint"]


def test_prefect_artifacts_link_the_mlflow_run(run_cli, loopback):
    import asyncio
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter,
                                                FlowRunFilterParentFlowRunId)

    spec, ws, _ = loopback
    res = run_json(run_cli, "run", "pipeline", "--spec", spec, "--workspace", ws, "--until", "shards")
    pipeline_run = UUID(res["prefect_flow_run_id"])
    prep = res["stages"]["prepare"]
    run_id = prep["mlflow_run_id"]

    async def read():
        async with get_client() as client:
            subflows = await client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[pipeline_run])))
            by_stage = {}
            for fr in subflows:
                by_stage.setdefault((await client.read_flow(fr.flow_id)).name, []).append(fr)
            ids = [fr.id for runs in by_stage.values() for fr in runs]
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=ids)))
            return by_stage, arts

    by_stage, arts = asyncio.run(read())
    assert set(by_stage) == {"download", "prepare", "dedup", "vocab", "sampling", "shards"}, \
        "every stage ran as a subflow of this pipeline run"
    assert all(len(runs) == 1 for runs in by_stage.values())
    spec_name = load_spec(spec).name
    slug = Workspace(ws).slug
    assert by_stage["prepare"][0].name == f"prepare {prep['fingerprint'][:8]} {spec_name}", \
        "a run's name says what ran, its fingerprint, on what spec: as its MLflow run is named"
    assert {"xylent", "cli", f"spec:{spec_name}", f"workspace:{slug}"} <= set(by_stage["prepare"][0].tags), \
        "a CLI run is found by its tags, this workspace's runs apart from every other checkout's"

    async def pipeline_flow_run():
        async with get_client() as client:
            return await client.read_flow_run(pipeline_run)

    top = asyncio.run(pipeline_flow_run())
    assert top.name == f"pipeline→shards {res['stages']['shards']['fingerprint'][:8]} {spec_name}", top.name
    assert "until:shards" in top.tags and "force" not in top.tags, top.tags
    prepare_run = by_stage["prepare"][0].id
    manifest = json.loads((Path(prep["output_dir"]) / "_manifest.json").read_text())
    assert manifest["prefect_flow_run_id"] == str(prepare_run), "the output records the flow run that made it"
    assert MlflowClient(tracking_uri=f"sqlite:///{ws}/mlflow.db").get_run(run_id).data.tags[
        "prefect.flow_run_id"] == str(prepare_run), "and so does the MLflow run"

    progress = {a.key: float(a.data) for a in arts if a.type == "progress"}
    assert {f"{slug}-download-progress", f"{slug}-prepare-progress"} <= set(progress), progress
    assert set(progress.values()) == {100.0}, f"every stage's progress bar in the UI ends full: {progress}"
    mine = [a for a in arts if a.flow_run_id == prepare_run]
    keys = sorted(a.key.removeprefix(f"{slug}-") for a in mine)
    assert keys == ["prepare-mlflow", "prepare-progress", "prepare-stats", "prepare-summary"], \
        "each key is this workspace's: its versions are one workspace's history"
    mine = {a.key.removeprefix(f"{slug}-"): a for a in mine}
    assert float(mine["prepare-progress"].data) == 100.0, "the progress bar in the UI ends full"
    link = mine["prepare-mlflow"]
    assert link.type == "markdown" and link.data.startswith(f"[MLflow run {run_id}](")
    assert link.data.endswith(f"/runs/{run_id}?workflowType=machine_learning)"), \
        "a link to the MLflow run page, in the UI's machine-learning view (its default is GenAI's)"
    summary = str(mine["prepare-summary"].data)
    assert f"# prepare `{prep['fingerprint']}`" in summary and f"[{run_id}](" in summary
    assert prep["output_dir"] in summary
    assert "7 monolingual rows in 2 languages, 4 sentence pairs in 2 pairs." in summary
    assert mine["prepare-stats"].type == "table"
    table = json.loads(mine["prepare-stats"].data)
    stats = pl.read_parquet(Path(prep["output_dir"]) / "stats.parquet").to_dicts()
    assert table == stats, "the table artifact is the stage's stats.parquet, row for row"
    assert {r["source"] for r in table} == {"cc100", "ccmatrix", "extra"}
    assert sum(r["rows_out"] for r in table if r["kind"] == "mono") == 7
    stage_of = {fr.id: name for name, runs in by_stage.items() for fr in runs}
    assert all(a.key.removeprefix(f"{slug}-").split("-")[0] == stage_of[a.flow_run_id] for a in arts), \
        "every stage's artifacts hang on that stage's own flow run"
    assert {stage_of[a.flow_run_id] for a in arts if a.key.endswith("-mlflow")} == set(by_stage)

    # the same run again, every stage cached: each cached flow run still says where its output is and
    # links the MLflow run that built it
    again = run_json(run_cli, "run", "pipeline", "--spec", spec, "--workspace", ws, "--until", "shards")
    pipeline_run = UUID(again["prefect_flow_run_id"])
    by_stage, arts = asyncio.run(read())
    cached = {a.key.removeprefix(f"{slug}-"): a for a in arts if a.flow_run_id == by_stage["prepare"][0].id}
    assert sorted(cached) == ["prepare-mlflow", "prepare-summary"], sorted(cached)
    assert by_stage["prepare"][0].name == f"cached prepare {prep['fingerprint'][:8]} {spec_name}"
    rerun_top = asyncio.run(pipeline_flow_run())
    assert rerun_top.name.startswith("cached pipeline→shards "), "a cached rerun reads apart"
    assert {"until:shards", f"workspace:{slug}"} <= set(rerun_top.tags), "and keeps its tags when renamed"
    text = str(cached["prepare-summary"].data)
    assert "(cached)" in text and prep["output_dir"] in text
    assert cached["prepare-mlflow"].data.endswith(f"/runs/{run_id}?workflowType=machine_learning)"), \
        "the link goes to the run that built it"

    # MLflow's runs read apart the same way: a partial run, a cached rerun, a forced rebuild
    store = MlflowClient(tracking_uri=f"sqlite:///{ws}/mlflow.db")
    partial, rerun = (store.get_run(r["mlflow_parent_run_id"]) for r in (res, again))
    assert partial.info.run_name == top.name and partial.data.tags["xylent.until"] == "shards", partial.info.run_name
    assert rerun.info.run_name == f"cached {top.name}"
    forced = run_json(run_cli, "run", "download", "--spec", spec, "--workspace", ws, "--force")
    parent = store.get_run(forced["mlflow_parent_run_id"])
    assert parent.info.run_name.startswith("forced download ") and parent.data.tags["xylent.force"] == "true"


def test_mlflow_tracking_uri_from_the_environment(run_cli, loopback, tmp_path, monkeypatch):
    spec, ws, _ = loopback
    uri = f"sqlite:///{tmp_path}/elsewhere.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    res = run_json(run_cli, "run", "download", "--spec", spec, "--workspace", ws)
    assert MlflowClient(tracking_uri=uri).get_run(res["mlflow_parent_run_id"]).info.status == "FINISHED"
    assert not (ws / "mlflow.db").exists()
    # a scheme MLflow has no store for (a KeyError inside MLflow) or a folder: said before any stage runs
    for bad, said in (("foo://host/x", "scheme 'foo'"), (f"file://{tmp_path}/mlruns", "file store")):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", bad)
        rc, _, err = run_cli("run", "download", "--spec", spec, "--workspace", ws)
        assert rc == 2 and said in err and "MLFLOW_TRACKING_URI" in err and "Traceback" not in err, err


def test_truncated_xz_from_the_server_fails_prepare_clearly(run_cli, loopback):
    spec, ws, corpus = loopback
    whole = corpus.files["/cc100/sw.txt.xz"]
    corpus.files["/cc100/sw.txt.xz"] = whole[: len(whole) // 2]
    rc, _, err = run_cli("run", "pipeline", "--spec", spec, "--workspace", ws, "--until", "shards")
    assert rc == 2 and "truncated" in err and "sw.txt.xz" in err and "Traceback" not in err
    assert not [p for p in (ws / "prepare").iterdir() if p.name != "_units"], "no prepare output was published"


def test_user_errors_exit_2_without_traceback(run_cli, loopback, tmp_path):
    spec, ws, corpus = loopback
    rc, out, err = run_cli("run", "pipeline", "--spec", spec, "--workspace", ws, "--set", "sources.0.languages=[de,en]")
    assert rc == 2
    assert "404" in err and "/cc100/en.txt.xz" in err and "what to do" in err
    assert "Traceback" not in err

    rc, _, err = run_cli("run", "pipeline", "--spec", spec, "--set", "prepare.min_chrs=3")
    assert rc == 2 and "prepare.min_chrs" in err and "unknown field" in err and "Traceback" not in err

    rc, _, err = run_cli("run", "pipeline", "--spec", spec, "--set", "languages=[de,en,sw,xx]")
    assert rc == 2 and "unknown language code 'xx'" in err

    rc, _, err = run_cli("run", "nosuchstage", "--spec", spec)
    assert rc == 2 and "unknown stage" in err
    rc, _, err = run_cli("run", "pipeline", "--spec", spec, "--until", "")  # ran the whole pipeline before
    assert rc == 2 and "unknown stage ''" in err, err

    rc, _, err = run_cli("run", "pipeline", "--spec", tmp_path / "missing.yaml")
    assert rc == 2 and "missing.yaml does not exist" in err


def test_stages_lists_the_pipeline_in_order(run_cli):
    rc, out, _ = run_cli("stages")
    assert rc == 0
    assert [line.split()[0] for line in out.strip().splitlines()] == \
        ["download", "prepare", "dedup", "vocab", "sampling", "shards", "pretrain", "audit", "evaluate"]


HEAVY = ("torch", "faiss", "deepspeed", "mlflow", "prefect", "transformers", "sklearn", "pyarrow", "polars")


@pytest.mark.costs(cli=2)
def test_commands_that_run_no_stage_import_nothing_heavy(tmp_path):
    """--help, stages, status (nothing built, then one stage published) and user errors load no
    Prefect, MLflow or stage code (torch, faiss, ...): in a fresh process, what they imported."""
    root = Path(__file__).resolve().parents[1]
    spec, ws = root / "data_specs" / "demo.yaml", tmp_path / "ws"
    commands = [["--help"], ["stages"], ["status", "--spec", spec, "--workspace", ws],
                ["run", "nosuch", "--spec", spec], ["run", "pipeline", "--spec", spec, "--set", "prepare.min_chrs=3"],
                ["status", "--spec", spec, "--workspace", ws, "--set", "sampling.temperature=x"]]

    def run(argvs) -> dict:
        code = ("import contextlib, io, json, sys\nfrom xylent.cli import main\nrcs, outs = [], []\n"
                f"for argv in {[[str(a) for a in c] for c in argvs]!r}:\n"
                "    out = io.StringIO()\n"
                "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):\n"
                "        try:\n            rcs.append(main(argv))\n"
                "        except SystemExit as exc:\n            rcs.append(exc.code)\n"
                "    outs.append(out.getvalue())\n"
                "print(json.dumps({'rcs': rcs, 'outs': outs, "
                "'modules': sorted({m.split('.')[0] for m in sys.modules})}))\n")
        r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    before = run(commands)
    assert before["rcs"] == [0, 0, 0, 2, 2, 2]
    # one stage published with its manifest: status reads it (its MLflow run id, its metrics)
    from xylent.flows.registry import STAGES
    from xylent.spec import load_spec
    from xylent.stage import stage_fingerprints
    from xylent.workspace import Workspace

    w = Workspace(str(ws))
    fp = stage_fingerprints(STAGES, load_spec(spec), w)["download"]
    out = w.output_dir("download", fp)
    with w.building(out) as tmp:
        (tmp / "records.json").write_text("[]")
        w.publish(tmp, out, {"stage": "download", "fingerprint": fp, "mlflow_run_id": "0" * 32,
                             "metrics": {"files": 1.0, "bytes": 2.0}, "seconds": 0.1})
    after = run([commands[2], [*commands[2], "--json"]])
    assert after["rcs"] == [0, 0]
    assert json.loads(after["outs"][1])["stages"]["download"] == {
        "output_dir": str(out), "fingerprint": fp, "cached": True, "mlflow_run_id": "0" * 32}
    for result in (before, after):
        assert not set(HEAVY) & set(result["modules"]), sorted(set(HEAVY) & set(result["modules"]))


def test_the_cli_starts_its_temporary_server_before_importing_prefect_only_when_nothing_names_an_api(
        tmp_path, monkeypatch):
    """The guess read without Prefect (the environment, the active profile, the working folder's
    settings files); Prefect's own settings overrule it before the first flow."""
    from xylent.flows.kit.processes import _no_api_configured

    for k in [k for k in os.environ if k.startswith("PREFECT_")]:
        monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))
    assert _no_api_configured(), "no profiles file: Prefect's shipped profile 'ephemeral' is active"
    (tmp_path / "home").mkdir()
    profiles = tmp_path / "home" / "profiles.toml"
    profiles.write_text('active = "team"\n[profiles.team]\nPREFECT_API_URL = "http://prefect:4200/api"\n'
                        '[profiles.solo]\nPREFECT_LOGGING_LEVEL = "INFO"\n'
                        '[profiles.mine]\nPREFECT_SERVER_EPHEMERAL_ENABLED = "true"\n')
    assert not _no_api_configured(), "the active profile names a server"
    monkeypatch.setenv("PREFECT_PROFILE", "solo")
    assert not _no_api_configured(), "ephemeral mode is off unless a profile or the environment turns it on"
    monkeypatch.setenv("PREFECT_PROFILE", "ephemeral")
    assert _no_api_configured(), "the user's file keeps Prefect's shipped profiles"
    monkeypatch.setenv("PREFECT_PROFILE", "mine")
    assert _no_api_configured()
    monkeypatch.setenv("PREFECT_SERVER_ALLOW_EPHEMERAL_MODE", "off")  # the old name, a false Prefect accepts
    assert not _no_api_configured(), "the environment turns ephemeral mode off"
    monkeypatch.delenv("PREFECT_SERVER_ALLOW_EPHEMERAL_MODE")
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    assert not _no_api_configured()
    monkeypatch.delenv("PREFECT_API_URL")
    (tmp_path / "pyproject.toml").write_text('[tool.prefect]\napi.url = "http://prefect:4200/api"\n')
    assert not _no_api_configured(), "a settings file only Prefect reads right: no guess"
    (tmp_path / "pyproject.toml").unlink()
    profiles.write_text("active = [not toml")
    assert not _no_api_configured(), "a broken profiles file: Prefect says what is wrong with it"


def test_the_temporary_server_keeps_its_shutdown_noise_off_the_terminal_and_says_why_it_failed(capfd):
    """Stopping the server cancels its services mid-query, and they print tracebacks then: not
    after a command that succeeded (a CI run saw one under load).  A server that fails on its
    own says why, in the error."""
    import time

    from xylent.flows.kit.processes import _TemporaryServer

    def server(script: str) -> _TemporaryServer:
        out = object.__new__(_TemporaryServer)  # its own program, in place of uvicorn's
        out._args, out._env = [sys.executable, "-c", script], dict(os.environ)
        out._spawn()
        return out

    noisy = server("import signal, sys, time\n"
                   "def bye(*_):\n"
                   "    sys.stderr.write('Traceback (most recent call last):\\nasyncio.exceptions.CancelledError\\n')\n"
                   "    sys.exit(0)\n"
                   "signal.signal(signal.SIGTERM, bye)\n"
                   "print('ready', file=sys.stderr, flush=True)\n"
                   "time.sleep(60)\n")
    while "ready" not in noisy.said():
        time.sleep(0.05)
    noisy.stop()
    noisy.stop()  # again, at exit: quiet
    assert "Traceback" not in capfd.readouterr().err

    broken = server("import sys; sys.stderr.write('sqlite3.OperationalError: database is locked'); sys.exit(1)")
    with pytest.raises(RuntimeError, match=r"exited with code 1; it said:\nsqlite3.OperationalError: database is locked"):
        broken.wait()
    broken.stop()


def test_hub_centric_bitexts_fail_sinkhorn_clearly_and_fall_back(run_cli, loopback):
    spec, ws, _ = loopback
    rc, _, err = run_cli("run", "sampling", "--spec", spec, "--workspace", ws, "--set", "sampling.pair_method=sinkhorn")
    assert rc == 2 and "every pair contains 'sw'" in err and "pair_method: smoothed" in err
    assert "Traceback" not in err
    res = run_json(run_cli, "run", "sampling", "--spec", spec, "--workspace", ws)
    out = Path(res["stages"]["sampling"]["output_dir"])
    table = pl.read_parquet(out / "bitext_sampling.parquet")
    assert sorted(zip(table["lang_a"], table["lang_b"])) == [("de", "sw"), ("en", "sw")]
    assert table["p_star"].null_count() == 2 and abs(table["p"].sum() - 1) < 1e-12
    notes = json.loads((out / "_manifest.json").read_text())["notes"]
    assert any("every pair contains 'sw'" in n for n in notes)
    rc, _, err = run_cli("run", "sampling", "--spec", spec, "--workspace", ws, "--set", "sampling.temperature=0")
    assert rc == 2 and "sampling.temperature" in err


def _big_local_spec(tmp_path: Path) -> Path:
    import lzma
    import random

    rng = random.Random(0)
    words = ["maji", "mti", "kitabu", "shule", "nyumba", "gari", "mtoto", "chakula", "safari", "habari"]
    with lzma.open(tmp_path / "sw.txt.xz", "wt", preset=0) as f:
        for d in range(40_000):
            for _ in range(rng.randint(1, 6)):
                f.write(" ".join(rng.choice(words) for _ in range(rng.randint(5, 40))) + "\n")
            f.write("\n")
    return write_spec(tmp_path / "big.yaml", {
        "name": "big", "languages": ["sw"],
        "sources": [{"name": "big", "kind": "local", "path": "sw.txt.xz", "format": "text-xz", "lang": "sw"}],
        "prepare": {"part_rows": 5000},
        "tracking": {"experiment": "big"},
    })


@pytest.mark.costs(cli=1)
def test_kill_9_during_prepare_leaves_nothing_trusted(run_cli, tmp_path):
    spec = _big_local_spec(tmp_path)
    ws = tmp_path / "ws"
    run_json(run_cli, "run", "download", "--spec", spec, "--workspace", ws)
    units = ws / "prepare" / "_units"

    def mid_write() -> bool:  # a unit is being built and its second part file has been started
        tmp = list(units.glob("*.tmp-*")) if units.exists() else []
        return bool(tmp and list(tmp[0].rglob("part-*-00001.parquet")))

    kill_9_when("prepare", spec, ws, mid_write)
    assert list(units.glob("*.tmp-*")), "the kill left a half-written unit behind"
    assert not [p for p in (ws / "prepare").iterdir() if p.name != "_units" and "tmp" not in p.name]

    rerun = run_json(run_cli, "run", "prepare", "--spec", spec, "--workspace", ws)
    assert rerun["stages"]["prepare"]["cached"] is False
    assert not list((ws / "prepare").rglob("*.tmp-*")), "left-overs are cleaned up under the lock"
    clean = run_json(run_cli, "run", "prepare", "--spec", spec, "--workspace", tmp_path / "ws-clean")

    def files(res):
        m = json.loads((Path(res["stages"]["prepare"]["output_dir"]) / "_manifest.json").read_text())
        return sorted((f["path"], f["sha256"], f.get("rows")) for f in m["files"])

    assert files(rerun) == files(clean)
    assert sum(rows for path, _, rows in files(clean) if path.startswith("mono/")) > 40_000


def test_a_second_run_on_a_locked_workspace_is_refused(run_cli, loopback):
    spec, ws, _ = loopback
    ws.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(ws / '.xylent.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'pid other'); print('locked', flush=True); time.sleep(60)\n"
    )], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"locked"
        rc, _, err = run_cli("run", "download", "--spec", spec, "--workspace", ws)
        assert rc == 2 and "in use by another xylent run" in err and "pid other" in err
    finally:
        holder.kill()
        holder.wait()
