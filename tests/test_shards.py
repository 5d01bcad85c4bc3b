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

from xylent.tasks.shards import truncate_pair
from xylent.data.loader import TrainingLoader
from xylent.tasks.vocab.specials import BOS, EOS  # the layout the vocab stage writes
from xylent.errors import XylentError

pytestmark = pytest.mark.demo_data  # reads the session demo only (pyproject.toml's markers)


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


# -- a sampling table deliberately far from the data's own proportions ------------
#
# The shards stage writes <name>: rows per language (MRTD) and per pair (TRTD); the
# sampling stage writes mono_sampling.parquet (lang, examples, tokens, p_raw, p) and
# bitext_sampling.parquet (lang_a, lang_b, pairs, q, p_star, ..., p).  The loader must
# draw languages/pairs by the column ``p`` (the α-smoothed / Sinkhorn table), not by
# how much data each one has.  Below, p is set far from the data: the smallest
# language (5% of the rows) gets 60% of the draws and the biggest pair (~79% of the
# rows) gets 2%.  A loader that ignored the table or the smoothing -- sampling rows
# uniformly, i.e. names in proportion to their row counts, or reading p_raw / q /
# examples / pairs instead of p -- would produce the raw proportions, 0.05 instead
# of 0.60 for "sw", and fail by > 100 binomial standard deviations.

MONO_ROWS = {"en": 1400, "de": 400, "fr": 100, "sw": 100}  # raw shares .70 .20 .05 .05
MONO_P = {"en": 0.10, "de": 0.25, "fr": 0.05, "sw": 0.60}
PAIR_ROWS = {("de", "en"): 2400, ("en", "fr"): 300, ("de", "fr"): 150, ("en", "sw"): 60, ("de", "sw"): 40,
             ("fr", "sw"): 100}  # de-en holds 79% of the sentence pairs
PAIR_P = {("de", "en"): 0.02, ("en", "fr"): 0.08, ("de", "fr"): 0.10, ("en", "sw"): 0.40, ("de", "sw"): 0.25,
          ("fr", "sw"): 0.15}
MONO_TAG, SRC_TAG, TGT_TAG = 100, 200, 300  # first token after <s> says where a row came from


def _write_group(root: Path, sub: str, schema, columns: list[list[np.ndarray]]) -> dict:
    from xylent.tasks.shards.build import ShardWriter

    writer = ShardWriter(root / sub, schema, max_bytes=2000)  # small: several shards per group
    n = len(columns[0])
    for lo in range(0, n, 64):
        arrays = [pa.array([c.tolist() for c in col[lo: lo + 64]], type=pa.list_(pa.int32())) for col in columns]
        writer.write(pa.RecordBatch.from_arrays(arrays, schema=schema))
    shards = writer.finish(root)
    return {"rows": sum(s["rows"] for s in shards), "tokens": sum(s["tokens"] for s in shards), "shards": shards}


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    """Shards written by the shards stage's writer, and sampling tables built by the
    sampling stage (build_tables) from the same counts, with ``p`` then overridden."""
    from xylent.tasks.sampling import build_tables
    from xylent.tasks.shards.build import MRTD_SCHEMA, TRTD_SCHEMA
    from xylent.spec import SamplingConfig

    root = tmp_path_factory.mktemp("skewed")
    shards, sampling = root / "shards", root / "sampling"
    sampling.mkdir()
    langs = sorted(MONO_ROWS)
    index = {"seq_len": 8, "specials": {"unk": 0, "bos": BOS, "eos": EOS, "pad": 3, "mask": 4},
             "mrtd": {}, "trtd": {}}
    for g, lang in enumerate(langs):
        rows = [np.array([BOS, MONO_TAG + g, 10 + i // 100, 10 + i % 100, EOS]) for i in range(MONO_ROWS[lang])]
        index["mrtd"][lang] = _write_group(shards, f"mrtd/lang={lang}", MRTD_SCHEMA, [rows])
    pairs = sorted(PAIR_ROWS)
    for g, (a, b) in enumerate(pairs):
        n = PAIR_ROWS[(a, b)]
        src = [np.array([SRC_TAG + g, 10 + i // 100, 10 + i % 100]) for i in range(n)]
        tgt = [np.array([TGT_TAG + g, 10 + i // 100, 10 + i % 100]) for i in range(n)]
        index["trtd"][f"{a}-{b}"] = _write_group(shards, f"trtd/pair={a}-{b}", TRTD_SCHEMA, [src, tgt])
    (shards / "index.json").write_text(json.dumps(index))

    t = build_tables(MONO_ROWS, PAIR_ROWS, SamplingConfig(pair_method="smoothed"))
    mono = t.mono.with_columns(pl.Series("p", [MONO_P[lang] for lang in t.mono["lang"]]))
    bitext = t.bitext.with_columns(pl.Series("p", [PAIR_P[(a, b)] for a, b in zip(t.bitext["lang_a"],
                                                                                    t.bitext["lang_b"])]))
    mono.write_parquet(sampling / "mono_sampling.parquet")
    bitext.write_parquet(sampling / "bitext_sampling.parquet")
    return shards, sampling, langs, pairs


def _far_from_the_data(names, observed, table_p, raw_p):
    """Observed counts match the table (chi-square and a 5-sd binomial band) and are
    nowhere near the raw data shares."""
    n = observed.sum()
    freq = observed / n
    sd = np.sqrt(table_p * (1 - table_p) / n)
    assert np.all(np.abs(freq - table_p) < 5 * sd), dict(zip(names, freq.round(4)))
    assert chisquare(observed, table_p * n).pvalue > 1e-3
    assert chisquare(observed, raw_p * n).pvalue < 1e-100, "indistinguishable from the raw data shares"
    return freq, sd


def test_frequencies_follow_a_skewed_table_not_the_data(skewed):
    shards, sampling, langs, pairs = skewed
    mono_table = pl.read_parquet(sampling / "mono_sampling.parquet")
    # the table as the stage wrote it: p_raw is the data's share, p is the (overridden) sampling probability
    assert dict(zip(mono_table["lang"], mono_table["p_raw"])) == pytest.approx(
        {lang: n / 2000 for lang, n in MONO_ROWS.items()})

    mono = TrainingLoader(shards, sampling, task="mrtd", batch_size=32, seed=3)
    counts = Counter()
    for batch in mono.batches(400):
        ids = batch["input_ids"]
        assert ids.shape == (32, 8)
        drawn = [langs[t - MONO_TAG] for t in ids[:, 1]]  # where the rows really came from
        assert drawn == batch["langs"]
        for row, (lang, i) in zip(ids, batch["examples"]):
            assert (row[2] - 10) * 100 + (row[3] - 10) == i, "the example index is the row read"
        counts.update(drawn)
    observed = np.array([counts[lang] for lang in langs])
    raw = np.array([MONO_ROWS[lang] for lang in langs]) / 2000
    freq, sd = _far_from_the_data(langs, observed, np.array([MONO_P[lang] for lang in langs]), raw)
    sw = langs.index("sw")
    # measured (12800 draws): sw 0.606 (data share 0.05), en 0.096 (data share 0.70); a loader
    # reading p_raw instead of p gives sw 0.054, en 0.698 and fails the band above
    assert abs(freq[sw] - raw[sw]) > 100 * sd[sw]

    loader = TrainingLoader(shards, sampling, task="trtd", max_tokens=512, seed=3)
    seen, flips, total = Counter(), 0, 0
    for batch in loader.batches(300):
        first = batch["input_ids"][:, 1]
        flipped = first >= TGT_TAG
        assert np.array_equal(flipped, batch["flipped"]), "a flipped pair really starts with the target side"
        drawn = [pairs[t - (TGT_TAG if f else SRC_TAG)] for t, f in zip(first, flipped)]
        assert [f"{a}-{b}" for a, b in drawn] == batch["pairs"]
        seen.update(drawn)
        flips += int(flipped.sum())
        total += len(first)
    observed = np.array([seen[p] for p in pairs])
    raw = np.array([PAIR_ROWS[p] for p in pairs]) / sum(PAIR_ROWS.values())
    freq, sd = _far_from_the_data(pairs, observed, np.array([PAIR_P[p] for p in pairs]), raw)
    big = pairs.index(("de", "en"))
    # measured (16800 draws): de-en 0.022 (data share 0.79), en-sw 0.400 (data share 0.02)
    assert raw[big] > 0.75 and abs(freq[big] - raw[big]) > 100 * sd[big]
    assert total > 10_000 and abs(flips / total - 0.5) < 5 * np.sqrt(0.25 / total)


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
    from xylent.tasks.shards import pack_language

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


def test_pairs_encoded_in_chunks_are_the_pairs_encoded_at_once(dirs, tmp_path, monkeypatch):
    """A bitext part is encoded PAIR_CHUNK rows at a time (memory follows the chunk, not the part):
    the shard's rows are those of one encode over the whole part, truncation included."""
    from xylent.tasks.shards import build

    sp = spm.SentencePieceProcessor(model_file=str(dirs["vocab"] / "spm.model"))
    words = pl.read_parquet(dirs["dedup"] / "mono" / "lang=de" / "*.parquet")["text"].to_list()
    rng = np.random.default_rng(1)
    src = [" ".join(words[i] for i in rng.integers(0, len(words), size=k)) for k in rng.integers(1, 12, size=50)]
    tgt = [" ".join(words[i] for i in rng.integers(0, len(words), size=k)) for k in rng.integers(1, 12, size=50)]
    part = tmp_path / "part-0.parquet"
    pl.DataFrame({"src": src, "tgt": tgt}).write_parquet(part)

    def rows(chunk: int, out: Path):
        monkeypatch.setattr(build, "PAIR_CHUNK", chunk)
        result = build.encode_pairs([part], sp, out, 24, 1 << 20)
        shards = result.pop("shards").finish(out)
        table = pa.concat_tables(ipc.open_file(pa.memory_map(str(out / sh["path"]))).read_all() for sh in shards)
        return result, table.to_pylist()

    whole, chunked = rows(10_000, tmp_path / "whole"), rows(7, tmp_path / "chunked")
    assert whole == chunked and whole[0]["pairs"] == 50 and whole[0]["truncated"] > 0


def test_set_weights_redirects_pair_sampling_and_survives_a_checkpoint(skewed):
    """The audit's re-sampling: after set_weights the pairs follow the new weights (a zero
    weight is never drawn), and a loader restored from the state draws the same batches."""
    shards, sampling, _, pairs = skewed

    def loader():
        return TrainingLoader(shards, sampling, task="trtd", max_tokens=512, seed=3)

    first = loader()
    names = first.names  # the sampling table's order
    assert sorted(names) == sorted(f"{a}-{b}" for a, b in pairs)
    assert first.prior == pytest.approx([PAIR_P[tuple(n.split("-"))] / sum(PAIR_P.values()) for n in names])
    head = [b["pairs"] for b in first.batches(5)]
    w = np.array([0.5, 0.0, 0.1, 0.1, 0.2, 0.1])
    first.set_weights(w)
    state = json.loads(json.dumps(first.state_dict()))
    after = [b for b in first.batches(300)]
    seen = Counter(p for b in after for p in b["pairs"])
    assert seen[names[1]] == 0, "a pair with weight 0 is never drawn"
    observed = np.array([seen[n] for n in names])
    freq = observed / observed.sum()
    sd = np.sqrt(w * (1 - w) / observed.sum())
    assert np.all(np.abs(freq - w) < 5 * sd + 1e-12), dict(zip(names, freq.round(3)))

    resumed = loader()
    resumed.load_state_dict(state)
    again = [b for b in resumed.batches(300)]
    assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(after, again))
    assert head and len(again) == 300
    with pytest.raises(XylentError, match="sampling weights"):
        first.set_weights([1.0, float("nan"), 0, 0, 0, 0])


def test_held_out_rows_never_train_and_are_measured_two_at_a_time(skewed):
    """The audit's holdout: a fixed share of each pair's rows (2 at least) leaves the training draws
    and is measured instead, two rows of a pair at a time, the pairs in turn, both directions, the
    same on any world size; without a holdout the batches are the ones they always were."""
    from xylent.data.loader import heldout_rows

    shards, sampling, _, _ = skewed

    def loader(**kw):
        return TrainingLoader(shards, sampling, task="trtd", seed=3, **{"max_tokens": 512, **kw})

    assert all(np.array_equal(a["input_ids"], b["input_ids"])
               for a, b in zip(loader().batches(30), loader(holdout=0.0).batches(30)))
    assert len(heldout_rows("a-b", 3, 0.05)) == 0, "a pair too small to hold 2 out with as many left"
    held = loader(holdout=0.05)
    out = {n: set(h.tolist()) for n, h in zip(held.names, held.held)}
    assert all(2 <= len(out[n]) <= r.n / 2 and abs(len(out[n]) - 0.05 * r.n) < 5 * (0.05 * r.n) ** 0.5 + 2
               for n, r in zip(held.names, held.rows)), {n: len(h) for n, h in out.items()}
    assert out["de-en"] == set(heldout_rows("de-en", held.rows[held.names.index("de-en")].n, 0.05).tolist())
    assert not [e for b in held.batches(300) for e in b["examples"] if e[1] in out[e[0]]], "held-out rows train"

    narrow = loader(holdout=0.05, max_tokens=40)  # two pairs of 9-token rows, two rows each, per measurement
    assert narrow.heldout_pairs_per_batch() == 2
    batches = [narrow.heldout_batch(m) for m in range(6)]
    assert np.array_equal(batches[0]["input_ids"], narrow.heldout_batch(0)["input_ids"]), "a pure function of m"
    assert all(sorted(Counter(b["pairs"]).values()) == [2, 2] for b in batches)
    assert {p for b in batches[:3] for p in b["pairs"]} == set(narrow.names), "every pair in turn"
    assert all(e[1] in out[e[0]] for b in batches for e in b["examples"])
    assert [bool(b["flipped"].all()) for b in batches] == [False] * 3 + [True] * 3, "both directions"
    first, again = ({e for b in bs for e in b["examples"] if len(out[e[0]]) >= 4} for bs in (batches[:3], batches[3:]))
    assert first and not first & again, "the next visit measures the pair's next two held-out rows"
    ranks = [loader(holdout=0.05, max_tokens=20, rank=r, world_size=2) for r in range(2)]
    for m in range(6):
        halves = [set(r.heldout_batch(m)["examples"]) for r in ranks]
        assert not halves[0] & halves[1] and halves[0] | halves[1] == set(batches[m]["examples"])
