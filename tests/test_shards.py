"""shards and the training loader, on the demo pipeline's real output."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
import sentencepiece as spm
from scipy.stats import chisquare

from tasks.shards import TrainingLoader, truncate_pair
from tasks.shards.loader import BOS, EOS
from xylent.errors import XylentError


@pytest.fixture(scope="module")
def dirs(demo_run):
    res, _ = demo_run
    return {k: Path(v["output_dir"]) for k, v in res["stages"].items()}


def _sequences(shards: Path, lang: str) -> list[np.ndarray]:
    index = json.loads((shards / "index.json").read_text())
    seqs = []
    for sh in index["mrtd"][lang]["shards"]:
        table = ipc.open_file(pa.memory_map(str(shards / sh["path"]))).read_all()
        seqs += [np.array(x, dtype=np.int32) for x in table.column("input_ids").to_pylist()]
    return seqs


def test_packing_fills_sequences_and_decodes_to_the_input(dirs):
    shards, vocab, dedup = dirs["shards"], dirs["vocab"], dirs["dedup"]
    seq_len = json.loads((shards / "index.json").read_text())["seq_len"]
    sp = spm.SentencePieceProcessor(model_file=str(vocab / "spm.model"))
    for lang in ("de", "zh", "th"):
        seqs = _sequences(shards, lang)
        assert all(len(s) == seq_len for s in seqs[:-1]) and 2 < len(seqs[-1]) <= seq_len
        assert all(s[0] == BOS and s[-1] == EOS for s in seqs)
        stream = np.concatenate([s[1:-1] for s in seqs])
        docs = np.split(stream, np.flatnonzero(stream == EOS))
        decoded = [sp.decode(d[d != EOS].tolist()) for d in docs]
        texts = pl.read_parquet(dedup / "mono" / f"lang={lang}" / "*.parquet")["text"].to_list()
        expected = [sp.normalize(t).replace("\u2581", " ").strip() for t in texts]
        assert decoded == expected, f"{lang}: decoding the shards gives the normalised input back"


def test_truncation_rule():
    a, b = np.arange(10), np.arange(100, 103)
    s, t, cut = truncate_pair(a, b, 8)
    assert cut and len(s) == 5 and len(t) == 3 and list(s) == list(range(5))
    s, t, cut = truncate_pair(np.arange(6), np.arange(6), 8)
    assert (len(s), len(t)) == (4, 4)
    assert truncate_pair(a, b, 20)[2] is False


def test_language_and_pair_frequencies_follow_the_tables(dirs):
    mono = TrainingLoader(dirs["shards"], dirs["sampling"], task="mrtd", batch_size=32, seed=3)
    counts = Counter(lang for batch in mono.batches(400) for lang in batch["langs"])
    table = pl.read_parquet(dirs["sampling"] / "mono_sampling.parquet")
    langs = table["lang"].to_list()
    observed = np.array([counts[lang] for lang in langs])
    expected = table["p"].to_numpy() * observed.sum()
    assert chisquare(observed, expected).pvalue > 0.001

    pairs = TrainingLoader(dirs["shards"], dirs["sampling"], task="trtd", max_tokens=2048, seed=3)
    seen, flips = Counter(), []
    for batch in pairs.batches(300):
        seen.update(batch["pairs"])
        flips += list(batch["flipped"])
    bt = pl.read_parquet(dirs["sampling"] / "bitext_sampling.parquet")
    names = [f"{a}-{b}" for a, b in zip(bt["lang_a"], bt["lang_b"])]
    obs = np.array([seen[n] for n in names])
    assert chisquare(obs, bt["p"].to_numpy() * obs.sum()).pvalue > 0.001
    assert abs(np.mean(flips) - 0.5) < 0.03 and len(flips) > 3000


@pytest.mark.parametrize("task", ["mrtd", "trtd"])
def test_resume_mid_epoch_is_exact(dirs, task):
    def loader():
        return TrainingLoader(dirs["shards"], dirs["sampling"], task=task, batch_size=4, max_tokens=512, seed=11)

    whole = [b["input_ids"] for b in loader().batches(40)]
    first = loader()
    head = [b["input_ids"] for b in first.batches(15)]
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint file
    resumed = loader()
    resumed.load_state_dict(state)
    tail = [b["input_ids"] for b in resumed.batches(25)]
    assert all(np.array_equal(a, b) for a, b in zip(whole, head + tail)) and len(head + tail) == 40
    other = TrainingLoader(dirs["shards"], dirs["sampling"], task=task, batch_size=4, max_tokens=512, seed=11)
    other.set_epoch(1)
    assert not all(np.array_equal(a, b) for a, b in zip(whole, [b["input_ids"] for b in other.batches(40)]))


@pytest.mark.parametrize("task", ["mrtd", "trtd"])
def test_ranks_are_disjoint_and_cover_the_global_batch(dirs, task):
    ranks = [TrainingLoader(dirs["shards"], dirs["sampling"], task=task, rank=r, world_size=2, batch_size=8,
                            max_tokens=1024, seed=5) for r in range(2)]
    single = TrainingLoader(dirs["shards"], dirs["sampling"], task=task, world_size=1, batch_size=16,
                            max_tokens=2048, seed=5)
    for b0, b1, whole in zip(ranks[0].batches(20), ranks[1].batches(20), single.batches(20)):
        e0, e1 = set(b0["examples"]), set(b1["examples"])
        assert not e0 & e1, "ranks never see the same example in a step"
        assert e0 | e1 == set(whole["examples"])


def test_corrupt_or_missing_shard_is_a_clear_error(dirs, tmp_path):
    copy = tmp_path / "shards"
    shutil.copytree(dirs["shards"], copy)
    victim = next((copy / "mrtd" / "lang=de").glob("*.arrow"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(XylentError) as err:
        TrainingLoader(copy, dirs["sampling"], task="mrtd")
    assert "checksum mismatch" in str(err.value) and victim.name in str(err.value)
    victim.unlink()
    with pytest.raises(XylentError, match="missing"):
        TrainingLoader(copy, dirs["sampling"], task="mrtd")


def test_documents_spanning_chunks_and_parts_stay_whole(dirs, tmp_path):
    from tasks.shards import pack_language

    sp = spm.SentencePieceProcessor(model_file=str(dirs["vocab"] / "spm.model"))
    words = pl.read_parquet(dirs["dedup"] / "mono" / "lang=de" / "*.parquet")["text"].to_list()
    rng = np.random.default_rng(0)
    paragraphs = [words[i] for i in rng.integers(0, len(words), size=9000)]  # > one 8192-paragraph chunk
    doc_ids = [f"d{i // 3}" for i in range(len(paragraphs))]
    cut = 4501  # document d1500 continues into the second part
    parts = []
    for k, (lo, hi) in enumerate([(0, cut), (cut, len(paragraphs))]):
        path = tmp_path / f"part-{k}.parquet"
        pl.DataFrame({"doc_id": doc_ids[lo:hi], "text": paragraphs[lo:hi]}).write_parquet(path)
        parts.append(path)
    result = pack_language(parts, sp, tmp_path / "out", 64, 1 << 20)
    shards = result.pop("shards").finish(tmp_path)
    assert result["documents"] == 3000 and result["paragraphs"] == 9000
    seqs = []
    for sh in shards:
        table = ipc.open_file(pa.memory_map(str(tmp_path / sh["path"]))).read_all()
        seqs += [np.array(x, dtype=np.int32) for x in table.column("input_ids").to_pylist()]
    assert all(len(s) == 64 for s in seqs[:-1])
    stream = np.concatenate([s[1:-1] for s in seqs])
    docs = np.split(stream, np.flatnonzero(stream == EOS))
    decoded = [sp.decode(d[d != EOS].tolist()) for d in docs]
    expected = [" ".join(sp.normalize(p).replace("\u2581", " ").strip() for p in paragraphs[i: i + 3])
                for i in range(0, len(paragraphs), 3)]
    assert decoded == expected
