"""What a pretraining model's forward pass returns: *sums and counts*
(:class:`Stats`), never means, so the trainer can add them over every rank
and normalise by global counts — the loss is the mean over the global batch
whatever its split into ranks (xylent.models.training.trainer).

Three loss slots, each with its own count: ``g`` (a masked-LM loss: ELECTRA's
generator, MLM/TLM, VECO's four CA-MLM terms), ``d`` (ELECTRA's replaced-token
detection) and ``c`` (a sentence-level contrast: InfoXLM's XLCo).  A model
leaves the slots it does not train at zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist


def zero(ref: torch.Tensor) -> torch.Tensor:
    return ref.new_zeros((), dtype=torch.float32)


@dataclass
class Stats:
    """Per-micro-batch sums (tensors, so they can be all-reduced in one call)."""

    g_loss: torch.Tensor          # Σ cross-entropy over masked tokens (with grad)
    d_loss: torch.Tensor          # Σ BCE over non-pad tokens (with grad)
    g_count: torch.Tensor         # masked tokens
    g_correct: torch.Tensor       # argmax == original at masked tokens
    d_count: torch.Tensor         # non-pad tokens
    d_correct: torch.Tensor
    d_true_pos: torch.Tensor      # predicted replaced and replaced
    d_pred_pos: torch.Tensor      # predicted replaced
    d_pos: torch.Tensor           # replaced
    tokens: torch.Tensor          # non-pad tokens in the input
    rows: torch.Tensor | None = None  # per_row=True: (ROW_FIELDS, B), no grad
    c_loss: torch.Tensor | None = None     # Σ InfoNCE over contrasted rows (with grad)
    c_count: torch.Tensor | None = None    # contrasted rows
    c_correct: torch.Tensor | None = None  # rows whose positive key scores above every negative
    extra: dict[str, float] = field(default_factory=dict)  # rank 0's per-step gauges (e.g. queue fill)

    SUMS = ("g_loss", "d_loss", "c_loss")
    COUNTS = ("g_count", "g_correct", "d_count", "d_correct", "d_true_pos", "d_pred_pos", "d_pos", "tokens",
              "c_count", "c_correct")

    def _get(self, name: str) -> torch.Tensor:
        v = getattr(self, name)
        return self.tokens.new_zeros((), dtype=torch.float32) if v is None else v.detach().float()

    def sums(self) -> torch.Tensor:
        return torch.stack([self._get(k) for k in self.SUMS])

    def counts(self) -> torch.Tensor:
        return torch.stack([self._get(k) for k in self.COUNTS])

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """The names of ``torch.cat([st.sums(), st.counts()])``, in order."""
        return cls.SUMS + cls.COUNTS


@dataclass(frozen=True)
class Norms:
    """The global counts (summed over ranks, divided by the world size) each loss
    slot is divided by; a slot with no count anywhere is divided by 1."""

    g: float | torch.Tensor = 1.0
    d: float | torch.Tensor = 1.0
    c: float | torch.Tensor = 1.0

    @classmethod
    def from_reduced(cls, reduced: torch.Tensor, world: int) -> "Norms":
        """0-dim fp32 tensors on ``reduced``'s device: reading them would make the step wait on it.
        In float64 first, then fp32, as the Python floats they replaced were divided and then cast."""
        names = Stats.fields()
        def get(n): return (reduced[names.index(n)].double().clamp(min=1.0) / world).float()
        return cls(get("g_count"), get("d_count"), get("c_count"))


ROW_FIELDS = ("g_loss", "g_count", "d_loss", "d_count", "d_pos")  # Stats.rows, per row of the batch


def row_sums(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Sum per row of token values selected by the boolean (B, T) mask ``where`` (row-major order,
    as boolean indexing returns them).  A scatter into a dense tensor, not index_add_: CUDA's
    atomic adds would make the sums, hence the audit's q and the batches, differ run to run."""
    dense = torch.zeros(where.shape, dtype=torch.float32, device=values.device)
    dense[where] = values.float()
    return dense.sum(1)


def row_sums_at(values: torch.Tensor, at: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """:func:`row_sums` of values at the distinct flat positions ``at`` of a (B, T) batch: a scatter
    of a known size, no boolean mask (whose size only the device knows)."""
    dense = torch.zeros(shape.numel(), dtype=torch.float32, device=values.device)
    return dense.scatter(0, at, values.float()).view(shape).sum(1)


def distributed() -> bool:
    """True inside a process group of more than one rank (the trainer's DeepSpeed ranks)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_ranks_sum(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over every rank (a gauge logged by rank 0 must describe the global batch)."""
    t = t.detach().clone()
    if distributed():
        dist.all_reduce(t)
    return t


def gather_rows(x: torch.Tensor) -> torch.Tensor:
    """Every rank's rows of ``x`` in global row order.  Rank r holds global rows r, r + W,
    r + 2W, … (the loaders deal rows out that way), possibly one fewer than rank 0."""
    if not distributed():
        return x.detach()
    parts, sizes = gather_uneven(x.detach())
    out = []
    for k in range(max(sizes)):
        out += [part[k] for part, size in zip(parts, sizes) if k < size]
    return torch.stack(out) if out else x.detach()[:0]


def gather_uneven(x: torch.Tensor) -> tuple[list[torch.Tensor], list[int]]:
    """(each rank's ``x``, padded to the longest; each rank's row count): all_gather needs one shape."""
    world = dist.get_world_size()
    n = torch.tensor([x.shape[0]], device=x.device)
    counts = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(counts, n)
    sizes = [int(c.item()) for c in counts]
    padded = x.new_zeros((max(1, *sizes), *x.shape[1:]))
    padded[: x.shape[0]] = x
    parts = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return parts, sizes
