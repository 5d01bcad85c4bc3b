"""Tokenised, packed Arrow shards.

MRTD (monolingual): each language's documents are tokenised and concatenated,
documents separated by ``</s>``, and cut into sequences of exactly ``seq_len``
tokens framed as ``<s> … </s>``; only a language's last sequence is shorter.
TRTD (bitext): one row per pair, ``src_ids`` and ``tgt_ids`` kept apart so the
loader can build ``<s> e </s> f </s>`` with a fresh 50 % order flip every epoch.
A pair longer than ``seq_len − 3`` is truncated: the longer side is cut first,
down to the shorter side's length, then both are cut alternately (counted).

Shards are Arrow IPC files (memory-mappable) of at most ``shard_mb``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import sentencepiece as spm

from xylent.workspace import sha256_file


MRTD_SCHEMA = pa.schema([("input_ids", pa.list_(pa.int32()))])
TRTD_SCHEMA = pa.schema([("src_ids", pa.list_(pa.int32())), ("tgt_ids", pa.list_(pa.int32()))])


class ShardWriter:
    """Arrow IPC files ``shard-NNNNN.arrow`` under ``root``, rolled at ``max_bytes``."""

    def __init__(self, root: Path, schema: pa.Schema, max_bytes: int, prefix: str = "shard"):
        self.root, self.schema, self.max_bytes, self.prefix = root, schema, max_bytes, prefix
        self.shards: list[dict] = []
        self._writer = None
        self._bytes = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if self._writer is None or self._bytes + batch.nbytes > self.max_bytes and self._bytes > 0:
            self.close()
            self.root.mkdir(parents=True, exist_ok=True)
            path = self.root / f"{self.prefix}-{len(self.shards):05d}.arrow"
            self._writer = ipc.new_file(path, self.schema)
            self.shards.append({"path": path, "rows": 0, "tokens": 0})
            self._bytes = 0
        self._writer.write_batch(batch)
        self._bytes += batch.nbytes
        cur = self.shards[-1]
        cur["rows"] += batch.num_rows
        cur["tokens"] += sum(len(c.values) for c in batch.columns)  # fresh arrays: values are exactly the rows' ids

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def finish(self, root_for_paths: Path) -> list[dict]:
        self.close()
        return [{"path": s["path"].relative_to(root_for_paths).as_posix(), "rows": s["rows"], "tokens": s["tokens"],
                 "sha256": sha256_file(s["path"])} for s in self.shards]


def encode_chunks(sp: spm.SentencePieceProcessor, texts: list[str], chunk: int = 8192):
    """Yield (first index, token ids as one int32 array, per-text lengths) chunk by chunk.

    SentencePiece segments without the GIL but returns Python lists, whose
    conversion (and freeing) costs half as much again as the segmentation; so
    the next chunk is segmented on a helper thread while the caller converts,
    packs and writes this one.
    """
    if not texts:
        return
    starts = list(range(0, len(texts), chunk))
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(sp.encode, texts[0:chunk], num_threads=1)
        for k, lo in enumerate(starts):
            ids = pending.result()
            if k + 1 < len(starts):
                pending = pool.submit(sp.encode, texts[starts[k + 1]: starts[k + 1] + chunk], num_threads=1)
            lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
            flat = np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum()))
            del ids
            yield lo, flat, lengths


def _list_array(seqs: list[np.ndarray]) -> pa.Array:
    lengths = np.fromiter(map(len, seqs), dtype=np.int32, count=len(seqs))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(seqs).astype(np.int32) if seqs else np.empty(0, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


class Packer:
    """Cuts a language's token stream into ``<s> … </s>`` sequences of exactly
    seq_len tokens, documents separated by ``</s>``; fed chunk by chunk."""

    def __init__(self, out: Path, seq_len: int, max_bytes: int, bos: int, eos: int):
        self.seq_len, self.body, self.bos, self.eos = seq_len, seq_len - 2, bos, eos
        self.writer = ShardWriter(out, MRTD_SCHEMA, max_bytes)
        self.carry = np.empty(0, dtype=np.int32)
        self.started = False
        self.stats = {"documents": 0, "paragraphs": 0, "text_tokens": 0, "sequences": 0}

    def add(self, flat: np.ndarray, lengths: np.ndarray, new_doc: np.ndarray) -> None:
        """``new_doc[i]``: paragraph i starts a document (i = 0 included: the caller knows
        whether the previous chunk's last document goes on)."""
        if not len(lengths):
            return
        sep = new_doc.copy()
        sep[0] &= self.started  # nothing before the very first document: no separator
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        tokens = np.concatenate([self.carry, np.insert(flat, starts[sep], self.eos)])
        self.started = True
        self.stats["documents"] += int(new_doc.sum())
        self.stats["paragraphs"] += len(lengths)
        self.stats["text_tokens"] += len(flat)
        n_full = len(tokens) // self.body
        if n_full:
            framed = np.empty((n_full, self.seq_len), dtype=np.int32)
            framed[:, 0], framed[:, -1] = self.bos, self.eos
            framed[:, 1:-1] = tokens[: n_full * self.body].reshape(n_full, self.body)
            offsets = pa.array(np.arange(0, n_full * self.seq_len + 1, self.seq_len, dtype=np.int32))
            self.writer.write(pa.record_batch([pa.ListArray.from_arrays(offsets, pa.array(framed.ravel()))],
                                              schema=MRTD_SCHEMA))
            self.stats["sequences"] += n_full
        self.carry = tokens[n_full * self.body:]

    def finish(self) -> dict:
        if self.carry.size:  # the language's last, shorter sequence
            last = np.concatenate([[self.bos], self.carry, [self.eos]]).astype(np.int32)
            self.writer.write(pa.record_batch([_list_array([last])], schema=MRTD_SCHEMA))
            self.stats["sequences"] += 1
        return {**self.stats, "shards": self.writer}


def _doc_starts(docs: np.ndarray, previous_last) -> np.ndarray:
    return np.r_[docs[0] != previous_last, docs[1:] != docs[:-1]]


def pack_language(parts: list[Path], sp: spm.SentencePieceProcessor, out: Path, seq_len: int,
                  max_bytes: int) -> dict:
    """Tokenise and pack one language in one process (segmentation of the next
    chunk overlaps packing and writing of this one)."""
    packer = Packer(out, seq_len, max_bytes, sp.bos_id(), sp.eos_id())
    last_doc = None
    for part in parts:
        df = pl.read_parquet(part, columns=["doc_id", "text"])
        if not len(df):
            continue
        docs = df["doc_id"].to_numpy()
        for lo, flat, lengths in encode_chunks(sp, df["text"].to_list()):
            doc = docs[lo: lo + len(lengths)]
            packer.add(flat, lengths, _doc_starts(doc, last_doc))
            last_doc = doc[-1]
    return packer.finish()


def tokenize_part(part: Path, sp: spm.SentencePieceProcessor, dest: Path) -> dict:
    """One part's paragraphs as token ids (``dest``: flat ids, lengths, the rows within the part that start
    a document), so the parts of one language tokenise in parallel.  The document starts go in the file, not
    in the result: results travel through the runner and wait for the language's packing, so a list there
    made the stage's memory follow the corpus's documents."""
    df = pl.read_parquet(part, columns=["doc_id", "text"])
    docs = df["doc_id"].to_numpy()
    chunks = list(encode_chunks(sp, df["text"].to_list()))
    flat = np.concatenate([f for _, f, _ in chunks]) if chunks else np.empty(0, dtype=np.int32)
    lengths = np.concatenate([n for _, _, n in chunks]) if chunks else np.empty(0, dtype=np.int64)
    starts = np.flatnonzero(_doc_starts(docs, docs[0])[1:]) + 1 if len(docs) else np.empty(0, dtype=np.int64)
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.savez(dest, flat=flat, lengths=lengths, doc_starts=starts)
    return {"file": str(dest), "first_doc": str(docs[0]) if len(docs) else None,
            "last_doc": str(docs[-1]) if len(docs) else None}


def pack_tokens(tokenized: list[dict], out: Path, seq_len: int, max_bytes: int, bos: int, eos: int) -> dict:
    """Pack the parts ``tokenize_part`` wrote, in order."""
    packer = Packer(out, seq_len, max_bytes, bos, eos)
    last_doc = None
    for t in tokenized:
        if t["first_doc"] is None:
            continue
        data = np.load(t["file"])
        new_doc = np.zeros(len(data["lengths"]), dtype=bool)
        new_doc[data["doc_starts"]] = True
        new_doc[0] = t["first_doc"] != last_doc
        packer.add(data["flat"], data["lengths"], new_doc)
        last_doc = t["last_doc"]
    return packer.finish()


def truncate_pair(src: np.ndarray, tgt: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """Cut the longer side first, then both alternately, until len(src) + len(tgt) <= budget."""
    if len(src) + len(tgt) <= budget:
        return src, tgt, False
    s, t = len(src), len(tgt)
    while s + t > budget:
        if s >= t:
            s -= 1
        else:
            t -= 1
    return src[:s], tgt[:t], True


PAIR_CHUNK = 8192  # pairs encoded at once: SentencePiece's Python lists of a whole part cost ~2 KB a pair


def encode_pairs(parts: list[Path], sp: spm.SentencePieceProcessor, out: Path, seq_len: int,
                 max_bytes: int, prefix: str = "shard") -> dict:
    """Pairs carry nothing across rows, so each part can be its own task (``prefix`` keeps names apart).
    A part is encoded ``PAIR_CHUNK`` rows at a time, a record batch each, so memory follows the chunk."""
    writer = ShardWriter(out, TRTD_SCHEMA, max_bytes, prefix)
    budget = seq_len - 3  # <s> e </s> f </s>
    stats = {"pairs": 0, "truncated": 0, "text_tokens": 0}
    for part in parts:
        df = pl.read_parquet(part, columns=["src", "tgt"])
        for chunk in df.iter_slices(PAIR_CHUNK):
            src_ids, tgt_ids = sp.encode(chunk["src"].to_list()), sp.encode(chunk["tgt"].to_list())
            srcs, tgts = [], []
            for a, b in zip(src_ids, tgt_ids):
                a, b, cut = truncate_pair(np.asarray(a, dtype=np.int32), np.asarray(b, dtype=np.int32), budget)
                stats["truncated"] += cut
                srcs.append(a)
                tgts.append(b)
            del src_ids, tgt_ids
            stats["pairs"] += len(chunk)
            stats["text_tokens"] += sum(map(len, srcs)) + sum(map(len, tgts))
            writer.write(pa.record_batch([_list_array(srcs), _list_array(tgts)], schema=TRTD_SCHEMA))
    return {**stats, "shards": writer}
