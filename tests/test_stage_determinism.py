"""vocab and shards write the same bytes whatever runs them (threads or processes,
a --force rerun, a rerun after kill -9 mid-stage), and the shards decode back to
exactly what dedup kept.

All on the real demo corpus (Django's catalogs) cut down to four languages and a
small vocabulary grid; the pipeline runs --until dedup once per module and every
scenario starts from a copy of that workspace.

Only ``_manifest.json`` differs between two runs (start time, duration, MLflow and
Prefect run ids, the worker processes that ran the tasks and each phase's seconds);
every other file, the tokenizers and ``index.json`` included, is compared byte for
byte.  (The tokenizers used to embed the stage's temporary build
path and ``index.json`` the workspace's absolute path:
``test_tokenizer_files_do_not_embed_the_temporary_build_path`` keeps them out.)
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
import sentencepiece as spm
import yaml

from conftest import kill_9_when

ROOT = Path(__file__).resolve().parents[1]
LANGS = ["en", "de", "ru", "ja"]  # Latin, Cyrillic and a script without spaces (character shingles, many pieces)


def cli(*args) -> dict:
    """The real CLI in-process (as the run_cli fixture, usable from module fixtures too)."""
    from xylent.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args] + ["--json"])
    assert rc == 0, err.getvalue()[-3000:]
    return json.loads(out.getvalue())


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def raw_digests(out: Path) -> dict[str, str]:
    """sha256 of every file of a stage output but its manifest."""
    return {p.relative_to(out).as_posix(): sha256(p.read_bytes())
            for p in sorted(out.rglob("*")) if p.is_file() and p.name != "_manifest.json"}


def check_index(out: Path, ws: Path) -> None:
    """index.json names the tokenizer it used, inside its own workspace."""
    if (out / "index.json").exists():
        index = json.loads((out / "index.json").read_text())
        tok = ws / index["tokenizer"]["path"]
        assert index["tokenizer"]["sha256"] == sha256(tok.read_bytes()), "index.json names the model it used"
        assert tok.parent.parent.name == "vocab" and tok.name == "spm.model"


def assert_same_output(stage: str, a: Path, ws_a: Path, b: Path, ws_b: Path) -> None:
    raw_a, raw_b = raw_digests(a), raw_digests(b)
    assert sorted(raw_a) == sorted(raw_b), f"{stage}: the same files"
    differ = sorted(k for k in raw_a if raw_a[k] != raw_b[k])
    assert not differ, f"{stage}: files with different bytes: {differ}"
    check_index(a, ws_a)
    check_index(b, ws_b)


def stage_files(out: Path) -> set[str]:
    return set(raw_digests(out))


# -- the workspaces -------------------------------------------------------------


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> Path:
    data = yaml.safe_load((ROOT / "data_specs" / "demo.yaml").read_text())
    data.pop("workspace", None)
    data["languages"] = LANGS
    data.pop("evaluate")  # its tasks name all 20 languages; these tests stop at shards
    data["vocab"].update({"grid": [200, 400, 600], "budget": 1500})
    data["tracking"]["experiment"] = "determinism"
    path = tmp_path_factory.mktemp("spec") / "demo-small.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


@pytest.fixture(scope="module")
def dedup_ws(tmp_path_factory, spec, prefect_server) -> Path:
    """The pipeline --until dedup, once: every scenario copies this workspace."""
    ws = tmp_path_factory.mktemp("dedup") / "ws"
    res = cli("run", "pipeline", "--spec", spec, "--workspace", ws, "--until", "dedup")
    assert set(res["stages"]) == {"download", "prepare", "dedup"}
    return ws


@pytest.fixture(scope="module")
def threads_run(tmp_path_factory, spec, dedup_ws) -> dict:
    """vocab and shards with the spec's runner (threads, 2 workers)."""
    ws = tmp_path_factory.mktemp("threads") / "ws"
    shutil.copytree(dedup_ws, ws)
    res = cli("run", "shards", "--spec", spec, "--workspace", ws)
    assert not res["stages"]["vocab"]["cached"] and not res["stages"]["shards"]["cached"]
    dirs = {k: Path(v["output_dir"]) for k, v in res["stages"].items()}
    files = stage_files(dirs["shards"])
    assert {"index.json", "shards_stats.parquet"} <= files
    assert len([f for f in files if f.startswith("mrtd/") and f.endswith(".arrow")]) >= len(LANGS)
    n_pairs = len(LANGS) * (len(LANGS) - 1) // 2
    assert len([f for f in files if f.startswith("trtd/") and f.endswith(".arrow")]) >= n_pairs
    assert {"spm.model", "spm.vocab", "joint.model", "allocation.parquet"} <= stage_files(dirs["vocab"])
    return {"ws": ws, **dirs}


def copy_ws(src: Path, dst: Path, *, without: tuple[str, ...] = ()) -> Path:
    shutil.copytree(src, dst, ignore=lambda d, names: [n for n in names if Path(d) == src and n in without])
    return dst


def status(spec: Path, ws: Path) -> dict:
    return cli("status", "--spec", spec, "--workspace", ws)["stages"]


def published(stage_dir: Path) -> list[str]:
    return sorted(p.name for p in stage_dir.iterdir() if ".tmp-" not in p.name) if stage_dir.exists() else []


# -- 1. the same bytes however the stage is run ----------------------------------


def test_processes_runner_writes_the_same_vocab_and_shards(threads_run, spec, dedup_ws, tmp_path):
    from xylent.tasks.shards.run import work_items

    ws = copy_ws(dedup_ws, tmp_path / "ws")
    res = cli("run", "shards", "--spec", spec, "--workspace", ws, "--set", "runner.kind=processes")
    assert not res["stages"]["vocab"]["cached"] and not res["stages"]["shards"]["cached"]
    for stage in ("vocab", "shards"):
        out = Path(res["stages"][stage]["output_dir"])
        assert out.name == threads_run[stage].name, "the runner is not part of the fingerprint"
        assert_same_output(stage, threads_run[stage], threads_run["ws"], out, ws)
    # which process ran each task: the parent's threads in one, the pool's worker processes in the other
    spreads = {kind: json.loads((d / "_manifest.json").read_text()) for kind, d in
               (("threads", threads_run["shards"]), ("processes", Path(res["stages"]["shards"]["output_dir"])))}
    # dedup's parts batched into at most 4 x runner.max_workers (2) tasks
    tokenize_tasks = min(8, len(work_items(Path(res["stages"]["dedup"]["output_dir"]))))
    for kind, manifest in spreads.items():
        phases = manifest["workers"]["phases"]
        assert set(phases) == {"tokenize", "pack"}
        assert set(manifest["phase_seconds"]) == {"tokenize", "pack", "assemble"}
        assert sum(phases["pack"]["tasks"].values()) == len(LANGS), f"{kind}: one pack task per language"
        assert sum(phases["tokenize"]["tasks"].values()) == tokenize_tasks, f"{kind}: every tokenise task counted"
        assert 1 <= phases["tokenize"]["largest_group_workers"] <= phases["tokenize"]["workers"] <= 2
    pids = {kind: {w.rsplit(":", 1)[1] for p in m["workers"]["phases"].values() for w in p["tasks"]}
            for kind, m in spreads.items()}
    assert pids["threads"] == {str(os.getpid())}, "threads: this process (the CLI runs in it here)"
    assert spreads["threads"]["workers"]["phases"]["tokenize"]["workers"] == 1
    assert str(os.getpid()) not in pids["processes"], "processes: the pool's, never the CLI's"


def test_force_rerun_writes_the_same_vocab_and_shards(threads_run, spec, tmp_path):
    ws = copy_ws(threads_run["ws"], tmp_path / "ws")
    vocab, shards = ws / "vocab" / threads_run["vocab"].name, ws / "shards" / threads_run["shards"].name
    raw_before = {"vocab": raw_digests(vocab), "shards": raw_digests(shards)}
    started = {s: json.loads((d / "_manifest.json").read_text())["started"] for s, d in
               (("vocab", vocab), ("shards", shards))}
    cached = cli("run", "shards", "--spec", spec, "--workspace", ws)["stages"]
    assert cached["vocab"]["cached"] and cached["shards"]["cached"], "without --force nothing is rebuilt"
    for stage in ("vocab", "shards"):
        res = cli("run", stage, "--spec", spec, "--workspace", ws, "--force")["stages"][stage]
        out = Path(res["output_dir"])
        assert not res["cached"] and out == (vocab if stage == "vocab" else shards)
        assert json.loads((out / "_manifest.json").read_text())["started"] > started[stage], "rebuilt"
        assert not list(out.parent.glob("*.tmp-*")), "no temporary or replaced output is left"
        assert raw_digests(out) == raw_before[stage], f"{stage}: the same files, byte for byte"
        check_index(out, ws)


@pytest.mark.costs(cli=1)
def test_kill_9_mid_vocab_then_rerun(threads_run, spec, dedup_ws, tmp_path):
    ws = copy_ws(dedup_ws, tmp_path / "ws")
    fp = status(spec, ws)["vocab"]["fingerprint"]
    assert fp == threads_run["vocab"].name

    def training_grid() -> bool:  # per-language models are landing in the build folder
        return bool(list((ws / "vocab").glob("*.tmp-*/_grid/*.model"))) if (ws / "vocab").exists() else False

    kill_9_when("vocab", spec, ws, training_grid)
    assert published(ws / "vocab") == [], "nothing was published"
    assert not (ws / "vocab" / fp).exists() and not status(spec, ws)["vocab"]["cached"]
    assert list((ws / "vocab").glob(f"{fp}.tmp-*")), "the killed run's half-built folder is there"
    res = cli("run", "vocab", "--spec", spec, "--workspace", ws)["stages"]["vocab"]
    assert not res["cached"] and Path(res["output_dir"]) == ws / "vocab" / fp
    assert published(ws / "vocab") == [fp] and not list((ws / "vocab").glob("*.tmp-*")), "left-overs removed"
    assert_same_output("vocab", threads_run["vocab"], threads_run["ws"], ws / "vocab" / fp, ws)


@pytest.mark.costs(cli=1)
def test_kill_9_mid_shards_then_rerun(threads_run, spec, tmp_path):
    ws = copy_ws(threads_run["ws"], tmp_path / "ws", without=("shards",))
    fp = threads_run["shards"].name
    st = status(spec, ws)
    assert st["vocab"]["cached"] and not st["shards"]["cached"] and st["shards"]["fingerprint"] == fp

    def tokenizing() -> bool:  # token files or shards are landing in the build folder
        d = ws / "shards"
        return d.exists() and bool(list(d.glob("*.tmp-*/_tokens/*/*.npz")) or list(d.glob("*.tmp-*/**/*.arrow")))

    kill_9_when("shards", spec, ws, tokenizing)
    assert published(ws / "shards") == [], "nothing was published"
    assert not status(spec, ws)["shards"]["cached"]
    assert list((ws / "shards").glob(f"{fp}.tmp-*")), "the killed run's half-built folder is there"
    res = cli("run", "shards", "--spec", spec, "--workspace", ws)["stages"]
    assert res["vocab"]["cached"] and not res["shards"]["cached"]
    assert published(ws / "shards") == [fp] and not list((ws / "shards").glob("*.tmp-*")), "left-overs removed"
    assert_same_output("shards", threads_run["shards"], threads_run["ws"], ws / "shards" / fp, ws)


def test_tokenizer_files_do_not_embed_the_temporary_build_path(threads_run):
    for name in ("spm.model", "joint.model"):
        data = (threads_run["vocab"] / name).read_bytes()
        assert b".tmp-" not in data and str(threads_run["ws"]).encode() not in data, name


# -- 2. the shards decode back to dedup's text -----------------------------------


def _rows(path: Path, columns: list[str]) -> list[list[np.ndarray]]:
    table = ipc.open_file(pa.memory_map(str(path))).read_all()
    return [[np.asarray(x, dtype=np.int32) for x in table.column(c).to_pylist()] for c in columns]


def _text(sp: spm.SentencePieceProcessor, s: str) -> str:
    """What decoding a text's ids gives back: the text under the model's normalisation."""
    return sp.normalize(s).replace("\u2581", " ").strip()


def _truncated(a: list[int], b: list[int], budget: int) -> tuple[tuple, tuple]:
    """The documented rule (tasks/shards/build.py), written out independently: the longer
    side is cut first down to the shorter side's length, then both alternately (the
    source side first when they are equal)."""
    if len(a) + len(b) <= budget:
        return tuple(a), tuple(b)
    short = min(len(a), len(b))
    if budget - short >= short:  # cutting the longer side is enough
        la, lb = (budget - short, short) if len(a) > len(b) else (short, budget - short)
    else:
        la, lb = budget // 2, budget - budget // 2
    return tuple(a[:la]), tuple(b[:lb])


@pytest.fixture(scope="module", params=[16, 128, 1024], ids=lambda n: f"seq_len={n}")
def shards_at(request, threads_run, spec) -> dict:
    """Shards at one seq_len in the threads workspace (128 is the demo's: cached)."""
    n = request.param
    res = cli("run", "shards", "--spec", spec, "--workspace", threads_run["ws"], "--set", f"shards.seq_len={n}")
    assert res["stages"]["shards"]["cached"] == (n == 128)
    shards = Path(res["stages"]["shards"]["output_dir"])
    index = json.loads((shards / "index.json").read_text())
    assert index["seq_len"] == n
    sp = spm.SentencePieceProcessor(model_file=str(threads_run["ws"] / index["tokenizer"]["path"]))
    return {"seq_len": n, "shards": shards, "index": index, "dedup": threads_run["dedup"], "sp": sp}


def test_trtd_rows_decode_to_the_dedup_bitext(shards_at):
    n, index, sp, dedup = shards_at["seq_len"], shards_at["index"], shards_at["sp"], shards_at["dedup"]
    bos, eos = index["specials"]["bos"], index["specials"]["eos"]
    pairs = sorted(p.name.removeprefix("pair=") for p in (dedup / "bitext").glob("pair=*"))
    assert sorted(index["trtd"]) == pairs and len(pairs) == len(LANGS) * (len(LANGS) - 1) // 2
    total_cut = 0
    for pair in pairs:
        df = pl.concat([pl.read_parquet(p, columns=["src", "tgt"])
                        for p in sorted((dedup / "bitext" / f"pair={pair}").glob("*.parquet"))])
        src, tgt = [], []
        for sh in index["trtd"][pair]["shards"]:
            s, t = _rows(shards_at["shards"] / sh["path"], ["src_ids", "tgt_ids"])
            src += s
            tgt += t
        assert len(src) == len(df) == index["trtd"][pair]["rows"] == index["trtd"][pair]["pairs"]
        assert all(len(s) + len(t) <= n - 3 for s, t in zip(src, tgt)), "room for <s> e </s> f </s>"
        assert not any(((x == bos) | (x == eos)).any() for x in src + tgt), "the loader adds the specials"
        full = list(zip(sp.encode(df["src"].to_list()), sp.encode(df["tgt"].to_list())))
        expected = Counter(_truncated(a, b, n - 3) for a, b in full)
        got = Counter((tuple(s.tolist()), tuple(t.tolist())) for s, t in zip(src, tgt))
        assert got == expected, f"{pair}: every row is its pair (prefixes where truncated), each once"
        cut = sum(len(a) + len(b) > n - 3 for a, b in full)
        assert index["trtd"][pair]["truncated"] == cut
        total_cut += cut
        if cut == 0:  # nothing cut: the rows decode to the text itself
            decoded = Counter((sp.decode(s.tolist()), sp.decode(t.tolist())) for s, t in zip(src, tgt))
            want = Counter((_text(sp, a), _text(sp, b)) for a, b in df.select("src", "tgt").iter_rows())
            assert decoded == want, f"{pair}: the multiset of (src, tgt) is dedup's"
    if n == 1024:
        assert total_cut == 0, "seq_len 1024 truncates nothing on this corpus"
    if n == 16:
        assert total_cut > 100, "seq_len 16 truncates many pairs"


def test_mrtd_sequences_decode_to_the_dedup_documents_in_order(shards_at):
    n, index, sp, dedup = shards_at["seq_len"], shards_at["index"], shards_at["sp"], shards_at["dedup"]
    bos, eos = index["specials"]["bos"], index["specials"]["eos"]
    assert sorted(index["mrtd"]) == sorted(LANGS)
    for lang in LANGS:
        seqs = []
        for sh in index["mrtd"][lang]["shards"]:
            seqs += _rows(shards_at["shards"] / sh["path"], ["input_ids"])[0]
        assert len(seqs) == index["mrtd"][lang]["rows"]
        assert all(len(s) == n for s in seqs[:-1]) and 2 < len(seqs[-1]) <= n, "packed full, only the last short"
        assert all(s[0] == bos and s[-1] == eos and bos not in s[1:-1] for s in seqs)
        stream = np.concatenate([s[1:-1] for s in seqs])
        docs = np.split(stream, np.flatnonzero(stream == eos))
        decoded = [sp.decode(d[d != eos].tolist()) for d in docs]
        df = pl.concat([pl.read_parquet(p, columns=["doc_id", "text"])
                        for p in sorted((dedup / "mono" / f"lang={lang}").glob("*.parquet"))])
        expected, last = [], None
        for doc, text in df.iter_rows():
            if doc != last:
                expected.append([])
                last = doc
            expected[-1].append(_text(sp, text))
        expected = [" ".join(t for t in paragraphs if t) for paragraphs in expected]
        assert len(expected) == index["mrtd"][lang]["documents"] > 100
        assert decoded == expected, f"{lang}: the documents in dedup's order, whole"
