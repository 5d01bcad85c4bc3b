"""The audit's side of a training step, inside every rank: the DRO adversary over the TRTD
pairs (xylent.models.training.audit.adversary) and the forward passes that measure its baselines.

The trainer holds one object, :class:`PairAudit` in an audit run and :data:`NO_AUDIT` in a
plain pretrain run (every hook does nothing), and calls the same hooks either way:

    resample before a step → a baseline pass over monolingual sentences (baseline language,
    larger, partner-larger, heldout-larger) and over the rows held out of training (heldout,
    heldout-larger: as they are and beside other rows' partners) → per TRTD micro-batch: its
    sides alone (baseline sides, larger) or its rows beside other rows' partners (partner,
    partner-larger), and the per-row losses of the training pass → fold the step into the EMAs

Every per-pair or per-language sum is all-reduced once, at the step's end, so all ranks hold the
same state; each measurement draws its masking noise from a stream of its own, so the training passes' masks
never move.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from xylent.models.training.audit.adversary import HELDOUT, PAIRED, PARTNER, USES_LANGUAGES
from xylent.models.masking import row_noise
from xylent.models.pairs import split_pair
from xylent.models.training.run_config import TrainConfig, task_plan
from xylent.models.stats import ROW_FIELDS, gather_rows
from xylent.data.loader import TrainingLoader  # the shard contract: all models take from tasks

LANGUAGE_BASELINE = "language-baseline"  # its loader's key among the trainer's loaders (and in a checkpoint)
BASELINE_NOISE = 1 << 20  # far above any micro-batch index: a baseline's noise never repeats a training pass's
BASELINE_ROWS = 1 << 30   # far above any global row index
LANGUAGE_NOISE = BASELINE_NOISE + 1
HELDOUT_NOISE = BASELINE_NOISE + 2
BASELINE_SEED = 1 << 16
SENTENCES_PER_PACK = 1 << 10
# the language baseline's padded widths, one forward each: 4, not 9 (8 … 128), cut its cost by 38 % on the
# tiny model, where each forward's fixed cost counts, and moved no sentence's loss by more than 4e-6 (2026-12-02)
BUCKET_WIDTHS = (16, 32, 64, 128)


class NoAudit:
    """A plain pretrain run: no re-sampling, nothing measured per row."""

    schedule: list[int] = []

    def loaders(self) -> dict:
        return {}

    def due(self, step: int) -> bool:
        return False

    def begin(self, step: int, iters: dict) -> None:
        pass

    def wants_rows(self, task: str) -> bool:
        return False

    def before_pass(self, *args) -> None:
        pass

    def after_pass(self, *args) -> None:
        pass

    def end(self, step: int) -> None:
        pass

    def batches(self, a: int, b: int) -> dict:
        return {}

    def state(self) -> dict:
        return {}

    def restore(self, client: dict) -> None:
        pass

    def finish(self, rank: int) -> None:
        pass


NO_AUDIT = NoAudit()


class PairAudit(NoAudit):
    def __init__(self, cfg: TrainConfig, trtd: TrainingLoader, engine, rank: int, world: int, device):
        from xylent.models.training.audit.adversary import PairAdversary

        self.cfg, self.dro, self.engine, self.trtd = cfg, cfg.dro, engine, trtd
        self.rank, self.world, self.device = rank, world, device
        self.mono = language_baseline_loader(cfg, rank, world) if self.dro.baseline in USES_LANGUAGES else None
        self.adversary = PairAdversary(trtd.names, trtd.prior, rho=self.dro.rho, min_ratio=self.dro.min_ratio,
                                       ema=self.dro.ema, weights=tuple(self.dro.weights), steps=cfg.steps,
                                       resamples=self.dro.resamples, baseline=self.dro.baseline,
                                       languages=self.mono.names if self.mono is not None else None,
                                       updates_per_base=trtd_steps_per_measurement(cfg, pairs_due) * cycle(trtd, cfg),
                                       updates_per_language=trtd_steps_per_measurement(cfg, language_due))
        self.schedule = self.adversary.schedule
        self._pair = self._base = self._lang = self._paired = self._kept = None
        self.store = PartnerStore() if self.dro.baseline in PARTNER else None
        if self.dro.baseline in HELDOUT and 2 * trtd.heldout_pairs_per_batch() < world:
            raise SystemExit(f"xylent: audit.baseline {self.dro.baseline} measures {trtd.heldout_pairs_per_batch()} "
                             f"pair(s) of 2 held-out rows at a time, fewer rows than the {world} ranks: raise "
                             "pretrain.trtd_max_tokens, or run the audit on fewer ranks")

    def loaders(self) -> dict:
        """Loaders whose state a checkpoint keeps beside the training ones."""
        return {LANGUAGE_BASELINE: self.mono} if self.mono is not None else {}

    def batches(self, a: int, b: int) -> dict:
        """The monolingual batches steps a..b-1 measure (exactly those, as the training loaders)."""
        if self.mono is None:
            return {}
        return {LANGUAGE_BASELINE: self.mono.batches(sum(language_due(self.cfg, s) for s in range(a, b)))}

    def due(self, step: int) -> bool:
        return self.adversary.due(step)

    def resample(self, step: int):
        return self.adversary.resample(step)

    def metrics(self) -> dict[str, float]:
        return self.adversary.metrics()

    def begin(self, step: int, iters: dict) -> None:
        n, due = len(self.adversary.pairs), baseline_due(self.cfg, step)
        self._pair = torch.zeros(n, len(ROW_FIELDS) + 1, dtype=torch.float64)  # this rank's, until end()
        near = due and self.dro.baseline in ("sides", "larger", "partner", "partner-larger")  # on the training rows
        self._base = torch.zeros_like(self._pair) if near else None
        self._paired = torch.zeros_like(self._pair) if near and self.dro.baseline in PAIRED else None
        self._lang = None
        if self.mono is not None and language_due(self.cfg, step):
            self._lang = languages_alone(self.engine, next(iters[LANGUAGE_BASELINE]), self.mono,
                                         self.adversary.languages, self.cfg.seed, step, self.rank, self.world,
                                         self.device)
        if self.dro.baseline in HELDOUT and pairs_due(self.cfg, step):
            # passes of their own, on any step (TRTD trained or not): measurement m = step // N, every m in turn
            batch = self.trtd.heldout_batch(step // self.dro.baseline_every)
            self._paired, self._base = heldout_help(self.engine, batch, self.adversary.index, self.cfg.seed, step,
                                                    self.rank, self.world, self.device)

    def wants_rows(self, task: str) -> bool:
        return task == "trtd"

    def before_pass(self, ids, pad, seg, noise, batch: dict, step: int, micro: int, rows: list[int]) -> None:
        """Before the pair's own pass: a model may keep state from it.  ``noise``: the training pass's."""
        if self._base is None or self.dro.baseline in HELDOUT:  # held-out rows are measured in begin()
            return
        if self._paired is None:
            self._base += pair_totals(sides_alone(self.engine, ids, pad, seg, self.cfg.seed, step, micro, rows),
                                      batch["pairs"], self.adversary.index)
            return
        swapped, self._kept = partners_swapped(self.engine, ids, pad, seg, noise,
                                               directed(batch["pairs"], batch["flipped"], self.adversary.index),
                                               self.rank, self.world, store=self.store)
        self._base += pair_totals(swapped, [batch["pairs"][i] for i in self._kept], self.adversary.index)

    def after_pass(self, st, batch: dict) -> None:
        self._pair += pair_totals(st.rows, batch["pairs"], self.adversary.index)
        if self._kept is not None:
            self._paired += pair_totals(st.rows[:, self._kept], [batch["pairs"][i] for i in self._kept],
                                        self.adversary.index)
            self._kept = None

    def end(self, step: int) -> None:
        sums = [self._pair, self._base, self._lang, self._paired]
        if self.world > 1:
            sums = summed_over_ranks(sums, self.device)
        self.adversary.observe(step, *(None if t is None else t.numpy() for t in sums))

    def state(self) -> dict:
        return {"adversary": self.adversary.state_dict(),
                **({"partner_store": self.store.state()} if self.store is not None else {})}

    def restore(self, client: dict) -> None:
        self.adversary.load_state_dict(client["adversary"])
        if self.store is not None:
            self.store.restore(client.get("partner_store", {}))  # none before the store: rows borrow from here on

    def finish(self, rank: int) -> None:
        from pathlib import Path

        from xylent.atomic import write_json_atomic

        if rank == 0:
            write_json_atomic(Path(self.dro.state_file), self.adversary.state_dict())


def baseline_due(cfg: TrainConfig, step: int) -> bool:
    """Whether step ``step`` measures the excess loss's baselines: the first step of each
    audit.baseline_every-step period that trains TRTD (with the alternate schedule a period can
    start on an MRTD step, where no pair is seen)."""
    if cfg.dro is None or cfg.dro.baseline is None:
        return False
    start = step - step % cfg.dro.baseline_every
    return step == next((s for s in range(start, step + 1) if "trtd" in task_plan(cfg, s)), None)


def pairs_due(cfg: TrainConfig, step: int) -> bool:
    """Whether step ``step`` measures the pairs' baselines: the held-out rows on every
    audit.baseline_every-th step (passes of their own, TRTD trained or not), the training rows on
    :func:`baseline_due`'s steps."""
    return step % cfg.dro.baseline_every == 0 if cfg.dro.baseline in HELDOUT else baseline_due(cfg, step)


def language_due(cfg: TrainConfig, step: int) -> bool:
    """Whether step ``step`` measures the language baseline: the first TRTD step of each window of
    audit.language_every × audit.baseline_every steps (a baseline step too; by the window, not by the
    period's number, whose multiples a sparse TRTD schedule may never reach).  Each language's
    monolingual loss moves slowly and its EMA spans as many steps either way; measuring it every
    period cost 8.7 % of an audit's loop (py-spy on the demo, 2026-12-02), more than the pairs' own
    baselines."""
    if not baseline_due(cfg, step):
        return False
    window = cfg.dro.baseline_every * cfg.dro.language_every
    start = step - step % window
    return step == next(s for s in range(start, step + 1) if "trtd" in task_plan(cfg, s))


def trtd_steps_per_measurement(cfg: TrainConfig, due, enough: int = 50) -> float:
    """The loss EMA's updates (TRTD steps) per measurement that ``due(cfg, step)`` schedules: the TRTD
    steps from the first measurement up to the one after both counts reach ``enough`` (or the run's end),
    over the measurements; exactly 1 when every TRTD step measures.  Until both, not ``enough`` windows:
    a held-out measurement on every step of a sparse TRTD schedule (trtd_ratio 0.01) meets no TRTD step
    in its first 50."""
    trained = measured = 0
    for s in range(cfg.steps):
        if due(cfg, s):
            if measured >= enough and trained >= enough:
                break
            measured += 1
        trained += measured > 0 and "trtd" in task_plan(cfg, s)
    return trained / measured if measured and trained and trained != measured else 1.0


def cycle(trtd: TrainingLoader, cfg: TrainConfig) -> float:
    """Measurements between two of one pair: the held-out batches visit P of the M pairs with held-out
    rows at a time, in turn (``TrainingLoader.heldout_batch``); the training rows' baselines, every one."""
    if cfg.dro.baseline not in HELDOUT:
        return 1.0
    measured = sum(len(h) > 0 for h in trtd.held)
    return max(1.0, measured / trtd.heldout_pairs_per_batch())


def make_audit(cfg: TrainConfig, loaders: dict, engine, rank: int, world: int, device) -> NoAudit:
    """The audit's adversary over the TRTD pairs (NO_AUDIT in a plain pretrain run); its prior
    is the loader's pair table, i.e. the sampling stage's pair_method column."""
    if cfg.dro is None:
        return NO_AUDIT
    if "trtd" not in loaders:
        raise SystemExit("xylent: the audit re-weights TRTD language pairs, but pretrain.batch_kinds has no 'trtd'")
    return PairAudit(cfg, loaders["trtd"], engine, rank, world, device)


def language_baseline_loader(cfg: TrainConfig, rank: int, world: int) -> TrainingLoader:
    """Monolingual (MRTD) rows of every language, drawn evenly, not by the sampling table: each
    language's baseline is measured as often as any other.  Its own seed: the rows it draws
    never follow a training loader's."""
    loader = TrainingLoader(cfg.shards_dir, cfg.sampling_dir, task="mrtd", seed=cfg.seed + BASELINE_SEED, rank=rank,
                            world_size=world, batch_size=max(1, cfg.batch_size // world), verify=rank == 0)
    loader.set_weights([1.0] * len(loader.names))
    return loader


@torch.no_grad()
def languages_alone(engine, batch: dict, loader: TrainingLoader, languages: list[str], seed: int, step: int,
                    rank: int, world: int, device) -> torch.Tensor:
    """The language baseline: forward passes (no backward) over sentences of each language's
    monolingual text, framed as a TRTD side is run alone (``<s> x </s>``: the loss of a 128-token
    pack is not comparable with a sentence's), their per-row losses summed per language over this
    rank's sentences (:func:`summed_over_ranks` adds the ranks' at the step's end)."""
    per_row, langs, _ = sentence_rows(engine, batch, loader, seed, step, rank, world, device)
    return pair_totals(per_row, langs, {x: i for i, x in enumerate(languages)})


def sentence_rows(engine, batch: dict, loader: TrainingLoader, seed: int, step: int, rank: int, world: int,
                  device, widths: tuple[int, ...] = BUCKET_WIDTHS) -> tuple[torch.Tensor, list[str], list[int]]:
    """The language baseline's per-row losses and counts (ROW_FIELDS × sentences), each sentence's
    language and its global key."""
    rows, langs, keys = [], [], []
    for k, (pack, lang) in enumerate(zip(batch["input_ids"], batch["langs"])):
        for j, piece in enumerate(sentences(pack, loader.bos, loader.eos, loader.pad)):
            rows.append(piece)
            langs.append(lang)
            keys.append((rank + world * k) * SENTENCES_PER_PACK + j)  # global: the same on any world size
    per_row = torch.zeros(len(ROW_FIELDS), len(rows), device=device)
    # one forward per width of BUCKET_WIDTHS, each sentence in the narrowest that holds it: a sentence's width is a
    # function of its own length, the same on any world size. One forward padded to the batch's longest sentence ran
    # 4.2-7.8x the real tokens on the demo, whose documents are mostly short and a few long; the language baseline
    # then cost more than a training step (py-spy, 2026-12-01)
    framed = [len(r) + 2 for r in rows]
    runs = bucket_widths(framed, widths, world, device)
    width_of = [next(w for w in runs if w >= n) for n in framed]
    for width in runs:
        bucket = [i for i, w in enumerate(width_of) if w == width]
        pieces = [[loader.bos, *rows[i].tolist(), loader.eos] for i in bucket] or [[loader.bos, loader.eos]]
        ids = torch.full((len(pieces), width), loader.pad, dtype=torch.long)
        for k, piece in enumerate(pieces):
            ids[k, : len(piece)] = torch.as_tensor(piece)
        ids = ids.to(device)
        pad = ids == loader.pad
        # each row's noise is its own stream's (by its key), whatever the bucket's width: the same masks
        noise = row_noise(seed, step, LANGUAGE_NOISE, [keys[i] for i in bucket] or [BASELINE_ROWS],
                          (~pad).sum(1).tolist(), width).to(device)
        out = engine(ids, pad, None, noise, per_row=True).rows
        if bucket:  # else a stand-in row: this rank runs the forward the others run, its loss is dropped
            per_row[:, torch.as_tensor(bucket, device=device)] = out
    return per_row, langs, keys


def bucket_widths(framed: list[int], widths: tuple[int, ...], world: int, device) -> list[int]:
    """The widths the language baseline runs a forward at this step, the same list on every rank
    (ZeRO-3 gathers the parameters in every forward, so each rank must run as many): each width of
    ``widths`` that a sentence of any rank needs (``framed``: lengths with ``<s>`` and ``</s>``), and
    one width for every longer sentence, the longest rounded up to a multiple of the last width."""
    top = widths[-1]
    need = torch.zeros(len(widths) + 1, dtype=torch.long)
    for n in framed:
        k = next((k for k, w in enumerate(widths) if w >= n), None)
        if k is None:
            need[-1] = max(int(need[-1]), -(-n // top) * top)
        else:
            need[k] = 1
    if world > 1:
        need = need.to(device)
        dist.all_reduce(need, op=dist.ReduceOp.MAX)
        need = need.cpu()
    return [w for w, k in zip(widths, need[:-1].tolist()) if k] + ([int(need[-1])] if need[-1] else [])


def sentences(pack, bos: int, eos: int, pad: int, window: int = 32) -> list:
    """The whole documents inside one MRTD pack (``<s> d1 </s> d2 </s> … </s>``; the first and the
    last may be cut by the frame, so they are left out).  A pack that is one long document gives
    ``window``-token stretches of it instead."""
    body = pack[pack != pad][1:-1]
    cuts = [int(i) for i in (body == eos).nonzero()[0]]
    whole = [body[a + 1: b] for a, b in zip(cuts, cuts[1:]) if b > a + 1]
    if whole or not len(body):
        return whole
    return [body[i: i + window] for i in range(0, len(body) - window + 1, window)] or [body]


@torch.no_grad()
def sides_alone(engine, ids: torch.Tensor, pad: torch.Tensor, seg: torch.Tensor, seed: int, step: int, micro: int,
                rows: list[int]) -> torch.Tensor:
    """The sides baseline: each TRTD row's two sentences run alone, as monolingual rows
    (``<s> x </s>``, ``<s> y </s>``; a forward pass, no backward), their per-row losses and
    counts added back into one column per pair row: the same loss without the translation's
    help."""
    module = engine.module
    pad_id, bos = module.cfg.special("pad"), module.cfg.special("bos")
    x, _, y, _ = split_pair(ids, pad, seg, bos, pad_id)
    width = max(x.shape[1], y.shape[1])
    alone = torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1]), value=pad_id),
                       torch.nn.functional.pad(y, (0, width - y.shape[1]), value=pad_id)])
    alone_pad = alone == pad_id
    both = [*rows, *(r + BASELINE_ROWS for r in rows)]  # y's rows: noise of their own
    noise = row_noise(seed, step, micro + BASELINE_NOISE, both, (~alone_pad).sum(1).tolist(), width).to(ids.device)
    st = engine(alone, alone_pad, None, noise, per_row=True)
    b = ids.shape[0]
    return st.rows[:, :b] + st.rows[:, b:]


def directed(pairs: list[str], flipped, index: dict[str, int]) -> list[int]:
    """Each row's pair and direction as one key: a row borrows a second sentence only from a row
    whose second side is the same language (a flipped row's second sentence is the other side)."""
    return [2 * index[p] + int(f) for p, f in zip(pairs, flipped)]


def partner_rotation(pairs: list[int]) -> dict[int, int]:
    """Row -> the row whose second sentence it borrows: the next row of the same key (pair and
    direction, :func:`directed`) in the global micro-batch, cyclically, so no row keeps its own.
    A row alone of its key has none."""
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(pairs):
        groups.setdefault(p, []).append(i)
    partner = {}
    for rows in groups.values():
        if len(rows) > 1:
            partner.update(zip(rows, rows[1:] + rows[:1]))
    return partner


class PartnerStore:
    """The last second sentence seen of each key (pair and direction, :func:`directed`), with its
    noise and its discriminator input (the tokens themselves unless replayed): a row alone of its
    key in a micro-batch borrows it, so a sparse pair, rarely twice in one micro-batch (the demo's
    190 pairs), is measured too.  Filled from the gathered micro-batch, so every rank, whatever the
    world size, holds the same; kept in each checkpoint.  The borrowed sentence was trained on once
    more recently than a sentence of the same micro-batch, so it reads a little easier (the help a
    little smaller), and sparse pairs borrow more often than dense ones (docs/stages/audit.md)."""

    def __init__(self):
        self.last: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def lend(self, keys: list[int], partner: dict[int, int], ids: torch.Tensor, second: torch.Tensor,
             noise: torch.Tensor, corrupted: torch.Tensor) -> dict[int, tuple]:
        """Row -> the stored second sentence it borrows (rows with no partner in ``partner`` whose key
        was seen before, unless the stored sentence is the row's own text: a pair with a few rows draws
        a row again, and a hub's repeated target is refused alike), then each key's last row in the
        micro-batch leaves its own.  ``ids``, ``second``
        (its mask), ``noise`` (rows first) and ``corrupted``: the gathered micro-batch."""
        # one copy to the host for the micro-batch, not one a row: on a GPU each .cpu() waits for the device
        ids, second, noise, corrupted = (t.cpu() for t in (ids, second, noise, corrupted))
        borrowed = {}
        for g, k in enumerate(keys):
            if g not in partner and k in self.last and not torch.equal(self.last[k][0], ids[g][second[g]]):
                borrowed[g] = self.last[k]
        for k, g in {k: g for g, k in enumerate(keys)}.items():  # each key's last row
            m = second[g]
            self.last[k] = (ids[g][m], noise[g][:, m], corrupted[g][m])
        return borrowed

    def state(self) -> dict:
        return dict(self.last)

    def restore(self, state: dict) -> None:
        self.last = dict(state)


@torch.no_grad()
def partners_swapped(engine, ids: torch.Tensor, pad: torch.Tensor, seg: torch.Tensor, noise: torch.Tensor,
                     keys: list[int], rank: int, world: int, corrupted: torch.Tensor | None = None,
                     store: PartnerStore | None = None) -> tuple[torch.Tensor, list[int]]:
    """The partner baseline: each TRTD row ``<s> x_i </s> y_i </s>`` rebuilt as
    ``<s> x_i </s> y_j </s>``, y_j the second sentence of another row of the same pair and direction
    (``keys``: :func:`directed`; :func:`partner_rotation` over the global micro-batch, so any world
    size pairs the same rows),
    every token keeping the noise it had in the training pass (the same tokens are masked and
    sampled, segment by segment), run forward (no backward).  Returns the per-row losses and counts
    (ROW_FIELDS × kept rows) and this rank's kept rows: summed over a pair, the very tokens of the
    training pass's rows, each beside another translation.  A row without a partner runs as it is
    (every rank runs one forward of its own size) and is not kept, unless ``store`` (:class:`PartnerStore`)
    holds a second sentence of its key from an earlier micro-batch: it borrows that one.
    ``corrupted``: the discriminator's
    input of the rows as they were (ELECTRA), swapped with them and replayed: the generator's
    replacements depend on the partner, so sampled again they would differ between the two passes
    by more than the translation's help (on the planted corpus a shuffled pair read as helped by
    0.8 of a loss of 23), and only the partner would not be what moved."""
    width = torch.tensor([ids.shape[1]], device=ids.device)
    if world > 1:
        dist.all_reduce(width, op=dist.ReduceOp.MAX)
    grow = int(width[0]) - ids.shape[1]
    pad_id = engine.module.cfg.special("pad")
    all_ids, all_seg, all_noise, all_pairs = (gather_rows(t) for t in (
        F.pad(ids, (0, grow), value=pad_id), F.pad(seg.long(), (0, grow)),
        F.pad(noise, (0, grow), value=2.0).transpose(0, 1).contiguous(),
        torch.as_tensor(keys, dtype=torch.long, device=ids.device)))
    replay = corrupted is not None  # the same on every rank (the objective decides): so is the gather
    all_corrupted = gather_rows(F.pad(corrupted, (0, grow), value=pad_id)) if replay else all_ids
    keys_all = all_pairs.tolist()
    partner = partner_rotation(keys_all)
    real = all_ids != pad_id
    first, second = real & (all_seg == 0), real & (all_seg == 1)

    def second_of(j: int) -> tuple[torch.Tensor, ...]:
        return all_ids[j][second[j]], all_noise[j][:, second[j]], all_corrupted[j][second[j]]

    borrowed = store.lend(keys_all, partner, all_ids, second, all_noise, all_corrupted) if store is not None else {}
    mine = [rank + world * k for k in range(ids.shape[0])]
    rows = []
    for g in mine:
        y_ids, y_noise, y_corrupted = (t.to(ids.device) for t in borrowed[g]) if g in borrowed \
            else second_of(partner.get(g, g))
        rows.append((torch.cat([all_ids[g][first[g]], y_ids]), int(first[g].sum()),
                     torch.cat([all_noise[g][:, first[g]], y_noise], 1),
                     torch.cat([all_corrupted[g][first[g]], y_corrupted])))
    width = max(len(r[0]) for r in rows)
    out = torch.full((len(rows), width), pad_id, dtype=ids.dtype, device=ids.device)
    out_seg = torch.zeros((len(rows), width), dtype=seg.dtype, device=ids.device)
    out_noise = torch.full((noise.shape[0], len(rows), width), 2.0, dtype=noise.dtype, device=noise.device)
    out_corrupted = torch.full_like(out, pad_id)
    for k, (row, nx, rn, rc) in enumerate(rows):
        out[k, : len(row)] = row
        out_seg[k, nx: len(row)] = 1
        out_noise[:, k, : len(row)] = rn
        out_corrupted[k, : len(row)] = rc
    kept = [k for k, g in enumerate(mine) if g in partner or g in borrowed]
    replayed = {"replay": out_corrupted} if replay else {}
    return engine(out, out == pad_id, out_seg, out_noise, per_row=True, **replayed).rows[:, kept], kept


@torch.no_grad()
def heldout_help(engine, batch: dict, index: dict[str, int], seed: int, step: int, rank: int, world: int,
                 device) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out baselines: one measurement batch of rows held out of training
    (``TrainingLoader.heldout_batch``), run forward as it is and with each row's second sentence
    swapped for another row's of the same pair (:func:`partners_swapped`: the same tokens under the
    same noise, and with ELECTRA the same replacements).  Returns this rank's per-pair sums of the rows that had a partner, as they
    are (``paired``) and swapped (``base``): paired − base is the help of a translation the model
    never trained on."""
    ids = torch.from_numpy(batch["input_ids"]).long().to(device)
    pad = ids == engine.module.cfg.special("pad")
    seg = torch.from_numpy(batch["segment_ids"]).to(device)
    rows = [rank + world * k for k in range(ids.shape[0])]
    noise = row_noise(seed, step, HELDOUT_NOISE, rows, (~pad).sum(1).tolist(), ids.shape[1]).to(device)
    own = engine(ids, pad, seg, noise, per_row=True).rows
    # ELECTRA's replacements come from its generator, which reads the partner: replayed in the swapped pass
    corrupted = engine.module.generated_input()
    swapped, kept = partners_swapped(engine, ids, pad, seg, noise, directed(batch["pairs"], batch["flipped"], index),
                                     rank, world, corrupted)
    names = [batch["pairs"][i] for i in kept]
    return pair_totals(own[:, kept], names, index), pair_totals(swapped, names, index)


def pair_totals(rows: torch.Tensor, names: list[str], index: dict[str, int]) -> torch.Tensor:
    """This rank's per-pair (or per-language) sums of a micro-batch's per-row losses and counts
    (+ a row count), in float64 on the CPU."""
    # on the CPU (a few rows): index_add_ on CUDA adds atomically, in no fixed order
    per = torch.cat([rows.detach().cpu().double(), torch.ones(1, rows.shape[1], dtype=torch.float64)]).T
    idx = torch.tensor([index[p] for p in names], dtype=torch.long)
    return torch.zeros(len(index), per.shape[1], dtype=torch.float64).index_add_(0, idx, per)


def summed_over_ranks(sums: list[torch.Tensor | None], device) -> list[torch.Tensor | None]:
    """A step's per-pair and per-language sums (each rank's own share: a batch mixes pairs) added
    over all ranks in one all-reduce: one a step, not one a micro-batch and measurement.  Every
    rank holds the same sums (``None`` where the step measured nothing) in the same order."""
    flat = torch.cat([t.flatten() for t in sums if t is not None]).to(device)
    dist.all_reduce(flat)
    flat, out, at = flat.cpu(), [], 0
    for t in sums:
        out.append(None if t is None else flat[at: at + t.numel()].view_as(t))
        at += 0 if t is None else t.numel()
    return out
