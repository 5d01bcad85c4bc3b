"""The dedup stage end to end: planted duplicates across parts, bitext rules with
evidence, threads vs Ray, kill -9 mid-stage."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import matplotlib
import matplotlib.colors
import matplotlib.image
import numpy as np
import polars as pl

from conftest import kill_9_when, write_spec

WORDS = ("river mountain village market teacher window garden bridge station letter coffee winter "
         "summer evening morning doctor kitchen forest island harbour castle library museum").split()


def _sentence(rng, n=12):
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def make_corpus(tmp: Path) -> Path:
    rng = random.Random(0)
    docs = [[_sentence(rng, rng.randint(20, 40)) for _ in range(3)] for _ in range(60)]
    docs[11][2] = _sentence(rng, 90)  # long enough that one changed word keeps Jaccard >= 0.8
    lines = []
    for i, d in enumerate(docs):
        lines += d + [""]
    lines += [docs[3][0], docs[3][1], ""]                        # a document of exact repeated paragraphs
    lines += [docs[7][0].upper().replace(".", "!!"), ""]          # exact after CCNet normalisation
    near = docs[11][2].split()
    near[5] = "zebra"
    lines += [" ".join(near), ""]                                # near-duplicate of one paragraph
    (tmp / "de.txt").write_text("\n".join(lines) + "\n")

    pairs = [(f"Satz Nummer {i} über den {rng.choice(WORDS)}.", f"Sentence number {i} about the {rng.choice(WORDS)}.")
             for i in range(200)]
    pairs += [pairs[0], pairs[1], pairs[1]]                      # 3 exact duplicate pairs
    pairs += [("Django administration", "Django administration")]  # a copy
    pairs += [("Ja.", "Yes, that is exactly what I wanted to say about the whole matter today.")]  # ratio
    pairs += [("Unbekannter Fehler.", f"Unknown error number {k}.") for k in range(6)]  # a hub on the de side
    (tmp / "de-en.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in pairs))
    return write_spec(tmp / "spec.yaml", {
        "name": "dedup-test", "languages": ["de", "en"],
        "sources": [
            {"name": "web", "kind": "local", "path": "de.txt", "format": "text", "lang": "de"},
            {"name": "mined", "kind": "local", "path": "de-en.tsv", "format": "tsv", "pair": "de-en"},
        ],
        "prepare": {"part_rows": 40},  # several parts: duplicates must be found across them
        "dedup": {"buckets": 3, "near_level": "line", "hub_min_partners": 5},
        "sampling": {"pair_method": "smoothed"},
        "vocab": {"grid": [40, 60, 80], "budget": 200},
        "shards": {"seq_len": 64},
        "tracking": {"experiment": "dedup-test"},
    })


REASONS = ["exact", "near", "copy", "ratio", "hub", "langid"]  # dedup_stats' columns, in the plot's stacking order


def stacked_bar_rows(png: Path) -> tuple[np.ndarray, list[dict]]:
    """The horizontal stacked bars of a matplotlib PNG, top to bottom: per bar, the
    width in pixels of each segment, keyed by its colour (an index in the colour cycle)."""
    img = matplotlib.image.imread(png)
    rgb = (img[..., :3] * 255).round().astype(int)
    palette = [tuple(round(v * 255) for v in matplotlib.colors.to_rgb(c["color"]))
               for c in matplotlib.rcParams["axes.prop_cycle"]]
    is_first = (rgb == palette[0]).all(-1)
    x0 = int(np.flatnonzero(is_first.any(0))[0])  # every bar starts at 0 with the first plotted reason
    column = np.r_[False, is_first[:, x0 + 1], False].astype(int)
    edges = np.flatnonzero(np.diff(column))
    bars = []
    for top, bottom in zip(edges[::2], edges[1::2]):
        row = rgb[(top + bottom) // 2]
        white = (row == 255).all(-1)
        end = next(x for x in range(x0, len(row) - 3) if white[x: x + 3].all())  # the bar ends in white space
        widths = {}
        for k, colour in enumerate(palette):
            n = int((row[x0:end] == colour).all(-1).sum())
            if n:
                widths[k] = n
        bars.append({"height": int(bottom - top), "widths": widths, "length": end - x0})
    return img, bars


def assert_removal_plot_shows(png: Path, stats: pl.DataFrame) -> None:
    """removal_reasons.png is a real picture of the table: one stacked bar per row
    (most removed first), one segment per reason, each as long as its share of rows."""
    img, bars = stacked_bar_rows(png)
    h, w = img.shape[:2]
    assert w >= 600 and h >= 250, f"a 9-inch figure at 100 dpi, not {w}x{h}"
    assert img[..., :3].std() > 0.1 and len(np.unique(img.reshape(-1, img.shape[-1]), axis=0)) > 50, "not blank"
    rows = stats.with_columns(removed=pl.sum_horizontal(REASONS)).sort("removed", descending=True).to_dicts()
    plotted = [r for r in REASONS if any(row[r] for row in rows)]  # each takes the next colour of the cycle
    assert len(bars) == len(rows) and all(b["height"] > 20 for b in bars)
    scale = bars[0]["length"] / (rows[0]["removed"] / rows[0]["in"])  # pixels per unit of "fraction removed"
    for bar, row in zip(bars, rows):
        expected = {plotted.index(r): scale * row[r] / row["in"] for r in plotted if row[r]}
        assert sorted(bar["widths"]) == sorted(expected), f"{row['name']}: one segment per reason it removed"
        for k, width in expected.items():
            assert abs(bar["widths"][k] - width) <= 3, (row["name"], plotted[k], bar["widths"][k], width)


def run_json(run_cli, *args):
    rc, out, err = run_cli(*args, "--json")
    assert rc == 0, err
    return json.loads(out)


def manifest_files(res, stage="dedup"):
    m = json.loads((Path(res["stages"][stage]["output_dir"]) / "_manifest.json").read_text())
    return sorted((f["path"], f["sha256"]) for f in m["files"])


def test_dedup_stage_removes_planted_duplicates_with_evidence(run_cli, tmp_path):
    spec = make_corpus(tmp_path)
    res = run_json(run_cli, "run", "pipeline", "--spec", spec, "--workspace", tmp_path / "ws", "--until", "shards")
    out = Path(res["stages"]["dedup"]["output_dir"])
    prep = Path(res["stages"]["prepare"]["output_dir"])
    assert len(list((prep / "mono" / "lang=de").glob("*.parquet"))) >= 4, "the input spans several parts"
    stats = {r["name"]: r for r in pl.read_parquet(out / "dedup_stats.parquet").to_dicts()}
    de = stats["de"]
    assert de["exact"] == 3 and de["near"] == 1 and de["out"] == 180
    pair = stats["de-en"]
    assert (pair["exact"], pair["copy"], pair["ratio"], pair["hub"]) == (3, 1, 1, 6)
    assert pair["out"] == 200
    kept = pl.read_parquet(out / "mono" / "**" / "*.parquet")
    assert kept["text"].n_unique() == len(kept) == 180
    samples = pl.read_parquet(out / "removed_samples.parquet")
    exact = samples.filter(pl.col("reason") == "exact")
    assert (exact["kept_text"].is_not_null()).all(), "evidence: the row that was kept"
    near = samples.filter(pl.col("reason") == "near").row(0, named=True)
    assert "zebra" in near["text"] and "zebra" not in near["kept_text"]
    hubs = pl.read_parquet(out / "top_hubs.parquet")
    assert hubs.row(0, named=True)["text"] == "Unbekannter Fehler." and hubs["partners"][0] == 6
    assert_removal_plot_shows(out / "removal_reasons.png", pl.read_parquet(out / "dedup_stats.parquet"))
    samp = Path(res["stages"]["sampling"]["output_dir"])
    table = pl.read_parquet(samp / "bitext_sampling.parquet")
    assert table["pairs"].to_list() == [200], "sampling counts what dedup kept"


def _spread(res) -> dict:
    """Per phase of the dedup run: how its tasks spread over the runner's worker processes."""
    m = json.loads((Path(res["stages"]["dedup"]["output_dir"]) / "_manifest.json").read_text())
    return m["workers"]["phases"]


def _cluster_tags(ws: Path) -> dict[str, str]:
    """stage -> the xylent.cluster tag of the run that built it."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{ws / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.`xylent.cached` = 'false'")
    return {r.data.tags["xylent.stage"]: r.data.tags.get("xylent.cluster") for r in runs}


@pytest.mark.costs(servers=1)
def test_cluster_runners_give_identical_output_on_one_cluster(run_cli, tmp_path):
    spec = make_corpus(tmp_path)
    threads = run_json(run_cli, "run", "dedup", "--spec", spec, "--workspace", tmp_path / "ws-threads")
    files = manifest_files(threads)
    paths = [p for p, _ in files]
    assert any(p.startswith("mono/lang=de/") for p in paths) and any(p.startswith("bitext/pair=de-en/") for p in paths)
    assert set(_cluster_tags(tmp_path / "ws-threads").values()) == {None}
    assert _spread(threads)["map"]["workers"] == 1, "threads: one process"
    timed = json.loads((Path(threads["stages"]["dedup"]["output_dir"]) / "_manifest.json").read_text())["phase_seconds"]
    assert set(timed) == {"map", "reduce", "resolve", "apply", "assemble"} and all(v >= 0 for v in timed.values())
    for kind in ("ray", "dask"):
        other = run_json(run_cli, "run", "dedup", "--spec", spec, "--workspace", tmp_path / f"ws-{kind}",
                         "--set", f"runner.kind={kind}", "--set", "runner.max_workers=2")
        assert files == manifest_files(other), kind
        spread = _spread(other)
        assert all(sum(p["tasks"].values()) == 8 for name, p in spread.items() if name != "resolve"), \
            "4 tasks per worker slot, each phase"
        assert spread["map"]["workers"] >= 2 and spread["map"]["largest_group_workers"] >= 2, \
            f"{kind}: the largest language's parts were mapped by both workers"
        walls = json.loads((Path(other["stages"]["dedup"]["output_dir"]) / "_manifest.json").read_text())["phase_seconds"]
        for name, p in spread.items():  # one task at a time per worker: its task bodies fit in the phase's time
            assert set(p["busy_s"]) == set(p["tasks"]) and 0 < p["busy_max_s"] <= walls[name], (kind, name, p, walls)
            assert p["busy_sum_s"] == pytest.approx(sum(p["busy_s"].values()), abs=0.01)
        clusters = _cluster_tags(tmp_path / f"ws-{kind}")
        assert set(clusters) == {"download", "prepare", "dedup"}
        assert len(set(clusters.values())) == 1 and None not in clusters.values(), f"one {kind} cluster: {clusters}"
    import ray

    assert not ray.is_initialized(), "the invocation's Ray instance is shut down with it"


def test_dask_runner_joins_the_cluster_at_runner_address(run_cli, tmp_path):
    from distributed import Client, LocalCluster

    spec = make_corpus(tmp_path)
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster:
        run_json(run_cli, "run", "dedup", "--spec", spec, "--workspace", tmp_path / "ws",
                 "--set", "runner.kind=dask", "--set", f"runner.address={cluster.scheduler_address}")
        assert set(_cluster_tags(tmp_path / "ws").values()) == {cluster.scheduler_address}
        with Client(cluster) as client:  # a cluster the user runs is theirs: still up afterwards
            assert client.submit(sum, [1, 2]).result() == 3


def _hold(i: int) -> tuple[int, float, float]:
    import os
    import time

    start = time.monotonic()  # one clock for every process of this machine
    time.sleep(0.4)
    return os.getpid(), start, time.monotonic()


def test_max_workers_caps_the_tasks_a_dask_runner_runs_at_once_outside_an_invocation():
    """A flow run outside the CLI (no invocation cluster) gets a local Dask cluster of its own:
    runner.max_workers is the number of tasks that run at once there too (the stages' memory bounds
    count on it), not worker processes of cores / max_workers threads each."""
    from prefect import flow, task

    from xylent.flows.kit.runners import make_task_runner, run_tasks
    from xylent.spec import RunnerConfig

    hold = task(_hold, name="hold")

    @flow
    def spread(workers: int) -> list:
        with make_task_runner(RunnerConfig(kind="dask", max_workers=workers)) as runner:
            return list(run_tasks(hold, [{"i": i} for i in range(4)], runner=runner))

    def overlaps(runs: list) -> int:  # the most tasks running at one moment
        return max(sum(s <= t < e for _, s, e in runs) for _, t, _ in runs)

    one = spread(1)
    assert overlaps(one) == 1 and len({pid for pid, _, _ in one}) == 1
    two = spread(2)
    assert overlaps(two) == 2 and len({pid for pid, _, _ in two}) == 2, "2 workers: two tasks at once, one each"


def _big_spec(tmp: Path) -> Path:
    rng = random.Random(1)
    with open(tmp / "big.txt", "w") as f:
        for d in range(6000):
            for _ in range(rng.randint(1, 4)):
                f.write(_sentence(rng, rng.randint(10, 60)) + "\n")
            f.write("\n")
    return write_spec(tmp / "big.yaml", {
        "name": "big", "languages": ["de"],
        "sources": [{"name": "big", "kind": "local", "path": "big.txt", "format": "text", "lang": "de"}],
        "prepare": {"part_rows": 1500},
        "dedup": {"buckets": 8},
        "tracking": {"experiment": "big-dedup"},
    })


def test_the_spread_counts_each_workers_tasks_and_the_seconds_in_their_bodies():
    from xylent.flows.kit.runners import Ran, ran, worker_spread

    done = ran(sorted, [3, 1, 2])
    assert isinstance(done, Ran) and done.value == [1, 2, 3] and done.seconds >= 0 and ":" in done.worker
    items = [{"kind": "mono", "name": "en", "idx": i} for i in range(3)] + [{"kind": "mono", "name": "de", "idx": 0}]
    calls = {"map": [{"items": items[0::2]}, {"items": items[1::2]}, {"items": []}]}
    spread = worker_spread(items, calls, {"map": [("h:1", 2.0), ("h:2", 1.5), ("h:1", 0.25)], "resolve": []},
                           split=("map",))
    m = spread["phases"]["map"]
    assert m["tasks"] == {"h:1": 2, "h:2": 1} and m["busy_s"] == {"h:1": 2.25, "h:2": 1.5}
    assert (m["busy_max_s"], m["busy_sum_s"], m["largest_group_workers"]) == (2.25, 3.75, 2)
    assert spread["phases"]["resolve"] == {"tasks": {}, "workers": 0, "tasks_max": 0, "tasks_min": 0, "busy_s": {},
                                           "busy_max_s": 0.0, "busy_sum_s": 0.0}
    assert spread["largest_group"] == {"kind": "mono", "name": "en", "parts": 3}


@pytest.mark.costs(cli=1)
def test_kill_9_during_dedup_then_rerun(run_cli, tmp_path):
    spec = _big_spec(tmp_path)
    ws = tmp_path / "ws"
    run_json(run_cli, "run", "prepare", "--spec", spec, "--workspace", ws)

    def mapping() -> bool:  # the map phase is writing its buckets
        work = list((ws / "dedup").glob("*.tmp-*/_work/mono/de/near")) if (ws / "dedup").exists() else []
        return bool(work and list(work[0].rglob("*.arrows")))

    kill_9_when("dedup", spec, ws, mapping)
    assert not [p for p in (ws / "dedup").iterdir() if ".tmp-" not in p.name], "nothing was published"
    rerun = run_json(run_cli, "run", "dedup", "--spec", spec, "--workspace", ws)
    assert not list((ws / "dedup").glob("*.tmp-*"))
    clean = run_json(run_cli, "run", "dedup", "--spec", spec, "--workspace", tmp_path / "ws-clean")
    files = manifest_files(rerun)
    assert files == manifest_files(clean)
    kept = pl.read_parquet(Path(rerun["stages"]["dedup"]["output_dir"]) / "mono" / "lang=de" / "*.parquet")
    assert len(kept) > 10_000 and kept["text"].n_unique() == len(kept), "the rerun's output is whole and deduplicated"


def test_joining_a_token_cluster_without_the_token_is_one_clear_error(tmp_path):
    """RAY_AUTH_MODE=token (as the join error advises) on a machine the token was never copied
    to: Ray raises AuthenticationError, which reaches the user as the same clear error."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_TOKEN")}
    env.update(HOME=str(tmp_path), RAY_AUTH_MODE="token", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    code = ("from xylent.flows.kit.runners import shared_cluster\nfrom xylent.spec import RunnerConfig\n"
            "with shared_cluster(RunnerConfig(kind='ray', address='127.0.0.1:1')): pass")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "XylentError: cannot join the Ray cluster at 127.0.0.1:1: Token authentication is enabled but no " \
           "authentication token was found" in proc.stderr, proc.stderr[-3000:]
    assert "RAY_AUTH_TOKEN or ~/.ray/auth_token" in proc.stderr


@pytest.mark.costs(servers=1)
def test_ray_runner_joins_the_cluster_at_runner_address(run_cli, tmp_path, monkeypatch):
    """A Ray cluster the user started (``ray start --head``, with token authentication, as
    Ray does when it finds a token): every stage runs on it, and it is still up afterwards,
    even in a process whose earlier local Ray instance used another token (Ray caches the
    first token it reads), and Ray's INFO lines and opt-out notice stay off the terminal."""
    import os
    import socket
    import subprocess
    import sys

    import ray

    from xylent.flows.kit.runners import shared_cluster
    from xylent.spec import RunnerConfig

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)  # undone after the test, whatever Ray sets
    (tmp_path / "old-token").write_text("b" * 64 + "\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "old-token"))
    with shared_cluster(RunnerConfig(kind="ray", max_workers=1)):  # a local runner's own instance: token mode
        assert ray.is_initialized()
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    (tmp_path / "token").write_text("a" * 64 + "\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"{ray.util.get_node_ip_address()}:{port}"  # what `ray start` tells its users to connect to
    ray_cli = [sys.executable, "-m", "ray.scripts.scripts"]
    subprocess.run([*ray_cli, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                    "--disable-usage-stats"], env=dict(os.environ), check=True, capture_output=True, timeout=120)
    try:
        spec = make_corpus(tmp_path)
        rc, _, err = run_cli("run", "dedup", "--spec", spec, "--workspace", tmp_path / "ws",
                             "--set", "runner.kind=ray", "--set", f"runner.address={address}", "--json")
        assert rc == 0, err
        assert "Connecting to existing Ray cluster" not in err and "Token authentication" not in err, err
        assert set(_cluster_tags(tmp_path / "ws").values()) == {address}
        assert not ray.is_initialized(), "disconnected"
        alive = subprocess.run([*ray_cli, "status", f"--address={address}"], env=dict(os.environ),
                               capture_output=True, text=True, timeout=60)
        assert alive.returncode == 0, "the user's cluster is still up: " + alive.stderr[-2000:]
    finally:
        subprocess.run([*ray_cli, "stop", "--force"], capture_output=True, timeout=120)
