"""The training data loader: batches for MRTD and TRTD that follow the sampling
tables, deterministic from (seed, epoch), rank-aware, resumable mid-epoch.

Every step draws one *global* batch from an RNG seeded by (seed, epoch, step);
rank r takes its share, so ranks never see the same example in a step and any
world size sees the same data.  Within a language (or pair) examples are read
in a permutation seeded by (seed, epoch, language, pass), through a cursor.
``state_dict()`` is (epoch, step, cursors, passes) after the last batch the
caller received — prefetching does not move it — and ``load_state_dict``
makes the following batches identical to an uninterrupted run.

An audit holds a few rows of every TRTD pair out of training (``holdout``, a fixed split
that no seed moves) and measures them with :meth:`TrainingLoader.heldout_batch`.

Shards are memory-mapped (nothing is copied into memory up front) and checked
against the sha256 in index.json when first opened; ``shards_dir`` may also be the
object-store URL (``s3://``, ``gs://``, ``az://``) of a shards output, read straight from the bucket into memory.
"""

from __future__ import annotations

import copy
import queue
import threading
import zlib
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from xylent.errors import XylentError

from xylent.data.sampling import language_table, pair_table
from xylent.data.shards import is_url, open_shard, read_index


class _Rows:
    """Rows of one language/pair across its shards: zero-copy numpy views."""

    def __init__(self, root: str | Path, shards: list[dict], columns: list[str], verify: bool):
        self.chunks: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in columns]
        starts = [0]
        for sh in shards:
            table = open_shard(root, sh["path"], sh["sha256"] if verify else None)
            for batch in table.to_batches():
                for k, name in enumerate(columns):
                    arr = batch.column(name)
                    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset: arr.offset + len(arr) + 1]
                    values = np.frombuffer(arr.values.buffers()[1], dtype=np.int32)
                    self.chunks[k].append((offsets, values))
                starts.append(starts[-1] + batch.num_rows)
        self.starts = np.array(starts, dtype=np.int64)
        self.n = int(self.starts[-1])

    def lengths(self, rows: np.ndarray, column: int = 0) -> np.ndarray:
        """The token counts of ``rows`` in ``column``, from the offsets alone (one pass per chunk)."""
        chunk = np.searchsorted(self.starts, rows, side="right") - 1
        out = np.empty(len(rows), dtype=np.int64)
        for c in np.unique(chunk):
            offsets, sel = self.chunks[column][c][0], chunk == c
            j = rows[sel] - self.starts[c]
            out[sel] = offsets[j + 1] - offsets[j]
        return out

    def get(self, i: int, column: int = 0) -> np.ndarray:
        c = int(np.searchsorted(self.starts, i, side="right") - 1)
        offsets, values = self.chunks[column][c]
        j = i - int(self.starts[c])
        return values[offsets[j]: offsets[j + 1]]


HOLDOUT_SEED = 0x48454C44  # the split's own stream: every training seed holds out the same rows


def heldout_rows(name: str, n: int, share: float) -> np.ndarray:
    """The rows of group ``name`` (``n`` rows) held out of training, sorted: those whose draw from a
    stream keyed by the name falls below ``share`` (one pass, 4 bytes a row), or the two lowest
    draws where fewer fall below it (a pair is measured two rows at a time); none when ``share`` is
    0 or that would hold out more than half."""
    if share <= 0 or n < 4:
        return np.empty(0, dtype=np.int64)
    u = np.random.default_rng([HOLDOUT_SEED, zlib.crc32(name.encode())]).random(n, dtype=np.float32)
    held = np.flatnonzero(u < share)
    if len(held) < 2:
        held = np.sort(np.argpartition(u, 2)[:2])
    return held if 2 * len(held) <= n else np.empty(0, dtype=np.int64)


def _cdf(p: np.ndarray) -> np.ndarray:
    cdf = np.cumsum(p / p.sum())
    cdf[-1] = 1.0
    return cdf


class TrainingLoader:
    def __init__(self, shards_dir: str | Path, sampling_dir: str | Path, *, task: str = "mrtd", seed: int = 0,
                 rank: int = 0, world_size: int = 1, batch_size: int = 8, max_tokens: int = 4096,
                 prefetch: int = 4, verify: bool = True, holdout: float = 0.0):
        if task not in ("mrtd", "trtd"):
            raise XylentError(f"unknown task {task!r}", fix="use 'mrtd' or 'trtd'")
        if not 0 <= rank < world_size:
            raise XylentError(f"rank {rank} is outside world_size {world_size}")
        self.root = shards_dir if is_url(shards_dir) else Path(shards_dir)
        self.index = read_index(self.root)
        self.task, self.seed, self.rank, self.world = task, seed, rank, world_size
        self.batch_size, self.max_tokens, self.prefetch = batch_size, max_tokens, prefetch
        self.seq_len = self.index["seq_len"]
        specials = self.index["specials"]  # the tokenizer's, recorded by the shards stage
        self.pad, self.bos, self.eos = specials["pad"], specials["bos"], specials["eos"]
        groups = self.index["mrtd" if task == "mrtd" else "trtd"]
        table = self._table(Path(sampling_dir))
        self.names = [n for n in table if n in groups and groups[n]["rows"] > 0]
        if not self.names:
            raise XylentError(f"no {task.upper()} data shares a name with the sampling table",
                              where=str(sampling_dir), fix="build shards and sampling from the same pipeline run")
        self.prior = np.array([table[n] for n in self.names], dtype=np.float64)
        self.prior /= self.prior.sum()
        self.cdf = _cdf(self.prior)
        cols = ["input_ids"] if task == "mrtd" else ["src_ids", "tgt_ids"]
        self.rows = [_Rows(self.root, groups[n]["shards"], cols, verify) for n in self.names]
        # each TRTD pair's held-out rows (heldout_batch), sorted; empty: none held out
        self.held = [heldout_rows(n, r.n, holdout if task == "trtd" else 0.0) for n, r in zip(self.names, self.rows)]
        # the k-th row left to train on is k + (held rows at or before it): held[j] - j kept rows precede held[j]
        self._kept_before = [h - np.arange(len(h)) if len(h) else None for h in self.held]
        self._heldout_per: int | None = None  # heldout_pairs_per_batch, computed once
        self.set_epoch(0)

    def _table(self, sampling_dir: Path) -> dict[str, float]:
        return language_table(sampling_dir) if self.task == "mrtd" else pair_table(sampling_dir)

    # -- state ---------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        self._state = {"epoch": int(epoch), "step": 0, "cursors": [0] * len(self.names),
                       "passes": [0] * len(self.names)}
        self._perms: dict[tuple[int, int], np.ndarray] = {}

    def state_dict(self) -> dict:
        return copy.deepcopy(self._state)

    def load_state_dict(self, state: dict) -> None:
        self._state = copy.deepcopy(state)
        self._perms = {}
        self.cdf = _cdf(np.asarray(state["weights"])) if state.get("weights") is not None else _cdf(self.prior)

    def set_weights(self, weights) -> None:
        """Sample groups (languages or pairs, in ``self.names`` order) by ``weights`` from the
        next batch on, instead of the sampling table (the audit's re-sampling).  Part of the
        state, so a resumed run draws the same batches.  Call it between ``batches()`` runs:
        batches already prefetched were drawn with the old weights."""
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != self.prior.shape or not np.all(np.isfinite(w)) or (w < 0).any() or w.sum() <= 0:
            raise XylentError(f"sampling weights must be {len(self.names)} finite non-negative numbers, not all 0",
                              where=f"{self.task} loader")
        self._state["weights"] = (w / w.sum()).tolist()
        self.cdf = _cdf(np.asarray(self._state["weights"]))  # exactly what a resumed run rebuilds

    # -- drawing ---------------------------------------------------------------
    def _next_row(self, g: int, st: dict) -> int:
        shift = self._kept_before[g]
        n = self.rows[g].n if shift is None else self.rows[g].n - len(shift)
        if st["cursors"][g] >= n:
            st["cursors"][g] = 0
            st["passes"][g] += 1
        key = (g, st["passes"][g])
        if key not in self._perms:
            self._perms = {k: v for k, v in self._perms.items() if k[0] != g}
            self._perms[key] = np.random.default_rng([self.seed, st["epoch"], g, key[1]]).permutation(n)
        i = int(self._perms[key][st["cursors"][g]])
        st["cursors"][g] += 1
        return i if shift is None else i + int(np.searchsorted(shift, i, side="right"))

    def _mrtd(self, st: dict, rng: np.random.Generator) -> dict:
        groups = np.searchsorted(self.cdf, rng.random(self.batch_size * self.world), side="right")
        seqs = [(g, self._next_row(int(g), st)) for g in groups]
        mine = seqs[self.rank:: self.world]
        ids = np.full((len(mine), self.seq_len), self.pad, dtype=np.int32)
        for k, (g, i) in enumerate(mine):
            row = self.rows[g].get(i)
            ids[k, : len(row)] = row
        return {"input_ids": ids, "attention_mask": (ids != self.pad).astype(np.int8),
                "langs": [self.names[g] for g, _ in mine], "examples": [(self.names[g], i) for g, i in mine]}

    def _trtd(self, st: dict, rng: np.random.Generator) -> dict:
        budget = self.max_tokens * self.world
        examples, longest = [], 0
        while True:
            g = int(np.searchsorted(self.cdf, rng.random(), side="right"))
            flip = bool(rng.random() < 0.5)
            i = self._next_row(g, st)
            src, tgt = self.rows[g].get(i, 0), self.rows[g].get(i, 1)
            if flip:
                src, tgt = tgt, src
            length = len(src) + len(tgt) + 3
            if examples and max(longest, length) * (len(examples) + 1) > budget:
                st["cursors"][g] -= 1  # not taken: it opens the next step's batch
                break
            longest = max(longest, length)
            examples.append((g, flip, i, src, tgt))
            if len(examples) >= 4 * budget:  # pathological tiny budgets
                break
        return self._pack(examples)

    def _pack(self, examples: list[tuple]) -> dict:
        """A TRTD micro-batch from (group, flipped, row, src, tgt): this rank's share, longest first
        (so every rank's rows are about as long), each row ``<s> src </s> tgt </s>``."""
        order = sorted(range(len(examples)), key=lambda k: (-(len(examples[k][3]) + len(examples[k][4])), k))
        mine = [examples[k] for k in order[self.rank:: self.world]]
        width = max((len(s) + len(t) + 3 for _, _, _, s, t in mine), default=3)
        ids = np.full((len(mine), width), self.pad, dtype=np.int32)
        seg = np.zeros((len(mine), width), dtype=np.int8)
        for k, (_, _, _, s, t) in enumerate(mine):
            row = np.concatenate([[self.bos], s, [self.eos], t, [self.eos]])
            ids[k, : len(row)] = row
            seg[k, len(s) + 2: len(row)] = 1
        return {"input_ids": ids, "attention_mask": (ids != self.pad).astype(np.int8), "segment_ids": seg,
                "pairs": [self.names[g] for g, _, _, _, _ in mine],
                "flipped": np.array([f for _, f, _, _, _ in mine], dtype=bool),
                "examples": [(self.names[g], i) for g, _, i, _, _ in mine]}

    # -- the audit's held-out rows ---------------------------------------------
    def heldout_pairs_per_batch(self) -> int:
        """How many pairs one :meth:`heldout_batch` measures: as many as fit the TRTD token budget of
        all ranks together with two of their longest held-out rows each, at least 1, at most all (no
        pair twice in a batch: its rows would borrow partners of the other direction).  The same
        on any world size."""
        if self._heldout_per is None:
            measured = [g for g, h in enumerate(self.held) if len(h)]
            longest = max((int((self.rows[g].lengths(self.held[g], 0) + self.rows[g].lengths(self.held[g], 1)).max())
                           + 3 for g in measured), default=1)
            self._heldout_per = min(len(measured), max(1, self.max_tokens * self.world // (2 * longest)))
        return self._heldout_per

    def heldout_batch(self, m: int) -> dict:
        """Measurement ``m`` of the held-out rows, a pure function of ``m`` (no state: the same on
        any world size and after a resume): the measured pairs in a fixed cycle, P of them
        (:meth:`heldout_pairs_per_batch`) from position m·P on, two held-out rows of each (the
        pair's next two in a cycle of its own), flipped on every other visit so both directions
        are measured."""
        measured = [g for g, h in enumerate(self.held) if len(h)]
        if not measured:
            raise XylentError("no TRTD pair has rows held out", fix="raise audit.holdout, or pick another "
                              "audit.baseline: every pair is too small to hold two rows out")
        per = self.heldout_pairs_per_batch()
        examples = []
        for slot in range(m * per, (m + 1) * per):
            g, visit = measured[slot % len(measured)], slot // len(measured)
            held, flip = self.held[g], visit % 2 == 1
            for t in range(2):
                i = int(held[(2 * visit + t) % len(held)])
                src, tgt = self.rows[g].get(i, 0), self.rows[g].get(i, 1)
                examples.append((g, flip, i, *((tgt, src) if flip else (src, tgt))))
        return self._pack(examples)

    def _produce(self, st: dict) -> tuple[dict, dict]:
        rng = np.random.default_rng([self.seed, st["epoch"], st["step"], 7])
        batch = self._mrtd(st, rng) if self.task == "mrtd" else self._trtd(st, rng)
        st["step"] += 1
        return batch, copy.deepcopy(st)

    def batches(self, steps: int, prepare: Callable[[int, dict], dict] | None = None) -> Iterator[dict]:
        """The next ``steps`` batches, prefetched by a background thread.  ``prepare(k, batch)``, run
        in that thread on the k-th batch of this call, gives what is yielded instead: host work a
        training step needs (its noise, its counts) done ahead, off the step's thread."""
        q: queue.Queue = queue.Queue(maxsize=max(1, self.prefetch))
        st = copy.deepcopy(self._state)
        stop = threading.Event()

        def work():
            try:
                for k in range(steps):
                    if stop.is_set():
                        return
                    batch, after = self._produce(st)
                    q.put((batch if prepare is None else prepare(k, batch), after))
                q.put(None)
            except BaseException as exc:  # surfaced in the consumer
                q.put(exc)

        t = threading.Thread(target=work, name="xylent-loader", daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                batch, after = item
                self._state = after
                yield batch
        finally:
            stop.set()
            while t.is_alive():
                try:
                    q.get_nowait()
                except queue.Empty:
                    t.join(timeout=0.05)
