"""InfoXLM: MMLM on monolingual rows + TLM on translation pairs + XLCo, the
cross-lingual contrast (Chi et al. 2021; METHODS.md "InfoXLM").

XLCo is MoCo over translation pairs.  For a TRTD row ``<s> x </s> y </s>``
(the loader flips the order of the two languages half the time, so both
directions are trained) the query is the ``<s>`` state of layer ``layer`` of
the *uncorrupted* ``x`` through the trained encoder and a bias-free linear
projection; the positive key is the same for ``y`` through the momentum key
encoder (an EMA of the query side, m = ``momentum``, no gradient); the
negatives are the last ``queue_size`` keys of earlier batches.  Loss: InfoNCE
with temperature τ, no L2 normalisation unless ``normalize`` (the reference
code has none).

Mixup contrast (``mixup`` > 0): a share of the global batch's pairs is merged two
by two into one pair, ``x_i ⊕ x_j`` against ``y_i ⊕ y_j``, each side's order
drawn on its own, so neither the position nor the language of a half tells the
positive apart.  InfoXLM takes the second pair from another parallel corpus; here
it is another row of the same global batch (the pair table spreads rows over
every language pair, so it is nearly always another pair).  A merged pair is one
example: neither half is contrasted alone in that batch, so no negative holds
half of a positive.  Which rows merge, with whom and in which order comes from
each row's noise (``row_noise``'s last plane), so 1 and 2 ranks and a resumed
run merge the same rows.

Where the momentum side lives, and why: DeepSpeed casts the module it trains
to bf16 on GPU, and an EMA with m = 0.999 in bf16 loses every update (0.1 % of
a difference is below bf16's resolution).  So the key encoder and the queue
are fp32 tensors kept *outside* the module's parameters and buffers; the
trainer checkpoints them through :meth:`objective_state` /
:meth:`load_objective_state` and calls :meth:`after_step` once per optimizer
step.  Keys are gathered from every rank in global row order before they are
enqueued, so the queue (and the loss) is the same on any number of ranks.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from xylent.models.config import EncoderConfig
from xylent.models.electra import MaskedLMModel
from xylent.models.pairs import split_pair
from xylent.models.stats import Norms, Stats, distributed, gather_rows, gather_uneven


@dataclass(frozen=True, kw_only=True)
class XLCoConfig:
    """train.json's ``objective_options`` of an InfoXLM run, typed.  No defaults: the spec's
    ``pretrain.infoxlm`` (xylent.spec.InfoXLMConfig) is their one home, and a run's options are
    always its section whole."""
    layer: int | None              # None: InfoXLM's choice by depth (xlco_default_layer)
    queue_size: int
    temperature: float
    momentum: float
    weight: float                  # XLCo's weight next to MMLM/TLM (InfoXLM sums them)
    normalize: bool
    pool: str                      # cls: the <s> state (InfoXLM); mean: the mean over real tokens
    in_batch_negatives: bool       # also the other rows' keys of this global batch (same key-encoder version)
    mixup: float                   # share of rows that start a merged pair (InfoXLM's mixup contrast)
    scale: str                     # shared: one denominator, tokens + examples (InfoXLM's code); separate: two means
    masked_inputs: bool            # contrast the TLM-masked pair (InfoXLM's code masks XLCo's inputs)


def xlco_default_layer(layers: int) -> int:
    """InfoXLM contrasts layer 8 of 12 (Base) and 12 of 24 (Large); other depths two-thirds
    (at least 1)."""
    return {12: 8, 24: 12}.get(layers, max(1, round(layers * 2 / 3)))


class InfoXLMModel(MaskedLMModel):
    objective = "infoxlm"

    @classmethod
    def from_options(cls, cfg: EncoderConfig, disc_weight: float, mask_prob: float, options: dict) -> "InfoXLMModel":
        return cls(cfg, mask_prob, xlco=XLCoConfig(**options))

    @classmethod
    def layer_passes(cls, cfg: EncoderConfig) -> float:
        # the contrasted layers again on each side (the query with its backward, the key forward only):
        # about half the stack more per token, as counted per token of the pair rows
        return cfg.layers * 1.5

    def __init__(self, cfg: EncoderConfig, mask_prob: float = 0.15, *, xlco: XLCoConfig):
        super().__init__(cfg, mask_prob)
        self.xlco = xlco
        self.layer = self.xlco.layer or xlco_default_layer(cfg.layers)
        if not 1 <= self.layer <= cfg.layers:
            raise ValueError(f"pretrain.infoxlm.layer={self.layer} is not a layer of this {cfg.layers}-layer model; "
                             f"pick 1..{cfg.layers}")
        self.proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        nn.init.normal_(self.proj.weight, std=0.02)
        self.bos_id, self.pad_id = cfg.special("bos"), cfg.special("pad")
        self._key: dict | None = None  # built by attach(): fp32, outside the trained module
        self._mixup_share = 0.0
        self.loss_weights = {"generator_loss": 1.0, "contrast_loss": self.xlco.weight}

    # -- the momentum side -------------------------------------------------------------------
    def attach(self, device: torch.device) -> None:
        """Build the key encoder (a copy of the query side) and the empty queue on ``device``.
        Call after the weights are final for step 0 (init_from loaded, DeepSpeed initialised)."""
        key = nn.ModuleDict({"embeddings": copy.deepcopy(self.embeddings), "encoder": copy.deepcopy(self.encoder),
                             "proj": copy.deepcopy(self.proj)}).to(device=device, dtype=torch.float32)
        key.eval()  # MoCo's key encoder: no dropout
        for p in key.parameters():
            p.requires_grad_(False)
        self._key = {"module": key,
                     "queue": torch.zeros(self.xlco.queue_size, self.cfg.hidden, device=device),
                     "ptr": 0, "fill": 0}

    def _query_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        k = self._key["module"]
        return [*zip(k["embeddings"].parameters(), self.embeddings.parameters()),
                *zip(k["encoder"].parameters(), self.encoder.parameters()),
                *zip(k["proj"].parameters(), self.proj.parameters())]

    @torch.no_grad()
    def after_step(self) -> None:
        """key ← m·key + (1 − m)·query, once per optimizer step (in fp32)."""
        m = self.xlco.momentum
        for pk, pq in self._query_pairs():
            pk.mul_(m).add_(pq.detach().float(), alpha=1 - m)

    def objective_state(self) -> dict:
        k = self._key
        return {"key": {n: t.detach().cpu().clone() for n, t in k["module"].state_dict().items()},
                "queue": k["queue"].cpu().clone(), "ptr": k["ptr"], "fill": k["fill"]}

    def load_objective_state(self, state: dict) -> None:
        if state["queue"].shape != self._key["queue"].shape:
            raise ValueError(f"the checkpoint's XLCo queue holds {state['queue'].shape[0]} keys and this run's "
                             f"pretrain.infoxlm.queue_size is {self.xlco.queue_size}: resume with the same size")
        self._key["module"].load_state_dict(state["key"])
        self._key["queue"].copy_(state["queue"])
        self._key["ptr"], self._key["fill"] = int(state["ptr"]), int(state["fill"])

    # -- XLCo --------------------------------------------------------------------------------
    def _cls(self, emb: nn.Module, enc: nn.Module, proj: nn.Module, ids: torch.Tensor,
             pad: torch.Tensor) -> torch.Tensor:
        _, hidden = enc(emb(ids), pad, return_layers=True, upto=self.layer)
        h = hidden[self.layer]
        if self.xlco.pool == "mean":  # over the real tokens, as retrieval pools (XTREME's convention)
            real = (~pad).unsqueeze(-1).to(h.dtype)
            z = proj((h * real).sum(1) / real.sum(1).clamp(min=1))
        else:
            z = proj(h[:, 0])
        return F.normalize(z.float(), dim=-1) if self.xlco.normalize else z.float()

    def contrast(self, ids: torch.Tensor, pad: torch.Tensor, segments: torch.Tensor,
                 noise: torch.Tensor | None = None):
        """(Σ InfoNCE, examples contrasted, examples whose positive wins) of one TRTD
        micro-batch; then this batch's keys (all ranks') go into the queue.  An example
        is a row's pair, or with ``mixup`` two rows' pairs merged (``noise``: the rows'
        ``row_noise``, whose last plane decides the merging)."""
        if self._key is None:
            raise RuntimeError("InfoXLMModel.attach(device) must be called before training")
        x, x_pad, y, y_pad = split_pair(ids, pad, segments, self.bos_id, self.pad_id)
        rank, world = (dist.get_rank(), dist.get_world_size()) if distributed() else (0, 1)
        mine = None  # with mixup: where this rank's examples sit among all ranks' (global order)
        if self.xlco.mixup > 0:
            if noise is None:
                raise ValueError("mixup contrast needs the rows' noise to decide which pairs merge")
            x, y, mine, merged = self._mixed(x, y, noise[-1, :, :4], rank, world)
            x_pad, y_pad = x == self.pad_id, y == self.pad_id
            self._mixup_share = merged
        q = self._cls(self.embeddings, self.encoder, self.proj, x, x_pad)
        with torch.no_grad():
            key = self._key["module"]
            k = self._cls(key["embeddings"], key["encoder"], key["proj"], y, y_pad)
        fill = self._key["fill"]
        # all ranks' keys in global order: the in-batch negatives, then the queue's
        every = gather_rows(k) if mine is None else gather_examples(k, mine)
        if self.xlco.in_batch_negatives:
            positive = every
            target = (rank + world * torch.arange(q.shape[0], device=q.device) if mine is None  # this rank's rows
                      else mine.to(q.device))
        else:
            positive, target = k, torch.zeros(q.shape[0], dtype=torch.long, device=q.device)
        negatives = self._key["queue"][:fill].clone()  # the queue changes below; autograd keeps this copy
        candidates = positive.shape[0] if self.xlco.in_batch_negatives else 1
        # the trivial peer: a query that scores every candidate alike, log(candidates + negatives)
        self._chance = math.log(candidates + fill)
        if candidates + fill <= 1 or q.shape[0] == 0:  # nothing to tell the positive from
            loss, count, correct = q.sum() * 0, 0, 0
        else:
            first = q @ positive.T if self.xlco.in_batch_negatives else (q * k).sum(-1, keepdim=True)
            logits = torch.cat([first, q @ negatives.T], dim=1) / self.xlco.temperature
            loss = F.cross_entropy(logits, target, reduction="sum")
            count, correct = q.shape[0], int((logits.argmax(1) == target).sum())
        self._enqueue(every)
        t = ids.new_tensor
        return loss, t(count), t(correct)

    @torch.no_grad()
    def _mixed(self, x: torch.Tensor, y: torch.Tensor, u: torch.Tensor, rank: int, world: int):
        """(queries' ids, keys' ids, the global positions of this rank's examples, the share of
        all rows that were merged).  ``u``: 4 uniforms per local row (merge?, partner, order
        of x, order of y), gathered with the ids so that every rank sees the same global batch."""
        width = torch.tensor([x.shape[1], y.shape[1]], device=x.device)
        if distributed():
            dist.all_reduce(width, op=dist.ReduceOp.MAX)
        xs = gather_rows(F.pad(x, (0, int(width[0]) - x.shape[1]), value=self.pad_id))
        ys = gather_rows(F.pad(y, (0, int(width[1]) - y.shape[1]), value=self.pad_id))
        us = gather_rows(u.to(x.device)).cpu().tolist()
        groups = merge_groups(us, self.xlco.mixup)
        local = [(e, g) for e, g in enumerate(groups) if g[0] % world == rank]  # a group's first row owns it
        qs, ks = [], []
        for _, g in local:
            order_x = g if len(g) == 1 or us[g[0]][2] < 0.5 else g[::-1]
            order_y = g if len(g) == 1 or us[g[0]][3] < 0.5 else g[::-1]
            qs.append(self._joined([xs[r] for r in order_x]))
            ks.append(self._joined([ys[r] for r in order_y]))
        mine = torch.tensor([e for e, _ in local], dtype=torch.long)
        merged = sum(len(g) for g in groups if len(g) == 2) / max(1, len(us))
        return self._padded(qs, x), self._padded(ks, y), mine, merged

    def _joined(self, sides: list[torch.Tensor]) -> torch.Tensor:
        """``<s> a </s>`` and ``<s> b </s>`` → ``<s> a </s> b </s>`` (one side of a merged pair)."""
        real = [s[s != self.pad_id] for s in sides]
        return torch.cat([real[0], *(r[1:] for r in real[1:])])

    def _padded(self, seqs: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        width = max((len(s) for s in seqs), default=1)
        out = like.new_full((len(seqs), width), self.pad_id)
        for i, s in enumerate(seqs):
            out[i, : len(s)] = s
        return out

    @torch.no_grad()
    def _enqueue(self, keys: torch.Tensor) -> None:
        st, size = self._key, self.xlco.queue_size
        keys = keys[-size:]
        n = keys.shape[0]
        idx = (st["ptr"] + torch.arange(n, device=keys.device)) % size
        st["queue"][idx] = keys.float()
        st["ptr"], st["fill"] = (st["ptr"] + n) % size, min(size, st["fill"] + n)

    def queue_keys(self) -> torch.Tensor:
        """The keys in the queue, oldest first."""
        st = self._key
        if st["fill"] < self.xlco.queue_size:
            return st["queue"][: st["fill"]].clone()
        return torch.roll(st["queue"], -st["ptr"], dims=0).clone()

    # -- the training step ---------------------------------------------------------------------
    def forward(self, ids: torch.Tensor, pad: torch.Tensor, segments: torch.Tensor | None,
                noise: torch.Tensor, per_row: bool = False) -> Stats:
        st = super().forward(ids, pad, segments, noise, per_row)  # MMLM (MRTD rows) or TLM (TRTD rows)
        if segments is not None:
            seen = self.corrupted if self.xlco.masked_inputs else ids
            st.c_loss, st.c_count, st.c_correct = self.contrast(seen, pad, segments, noise)
            st.extra["trtd/contrast_queue_fill"] = self._key["fill"] / self.xlco.queue_size
            if self.xlco.mixup > 0:
                st.extra["trtd/contrast_mixup_share"] = self._mixup_share
            st.extra["trtd/contrast_chance_loss"] = self._chance
        return st

    def loss(self, st: Stats, norms: Norms) -> torch.Tensor:
        """InfoXLM's Eq. 7, L_MMLM + L_TLM + L_XLCo, normalised as ``scale`` says.  ``shared`` is
        its fairseq code: every loss is a sum and the gradient is divided by the summed sample
        sizes (masked tokens, plus contrasted examples); ``separate`` takes each term's mean."""
        if st.c_loss is None:
            return st.g_loss / norms.g
        if self.xlco.scale == "shared":
            return (st.g_loss + self.xlco.weight * st.c_loss) / (norms.g + norms.c)
        return st.g_loss / norms.g + self.xlco.weight * st.c_loss / norms.c


def merge_groups(u: list[list[float]], share: float) -> list[tuple[int, ...]]:
    """The examples of a global batch of ``len(u)`` rows, in order: row ``i`` not yet taken
    starts a merged pair when ``u[i][0] < share`` and a later row is still free, its partner
    the free row ``u[i][1]`` points at; otherwise it stays an example of its own."""
    taken, groups = [False] * len(u), []
    for i in range(len(u)):
        if taken[i]:
            continue
        taken[i] = True
        free = [j for j in range(i + 1, len(u)) if not taken[j]]
        if u[i][0] < share and free:
            j = free[min(len(free) - 1, int(u[i][1] * len(free)))]
            taken[j] = True
            groups.append((i, j))
        else:
            groups.append((i,))
    return groups


def gather_examples(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Every rank's rows of ``x`` placed at their global ``positions`` (each rank holds the
    examples whose first row it holds, so the pattern of gather_rows does not apply)."""
    if not distributed():
        return x.detach()
    parts, sizes = gather_uneven(x.detach())
    places, _ = gather_uneven(positions.to(x.device))
    out = x.new_zeros((sum(sizes), *x.shape[1:]))
    for part, place, size in zip(parts, places, sizes):
        out[place[:size]] = part[:size]
    return out
