"""The pretraining models: ELECTRA generator + discriminator (XLM-E / XY-LENT) and
the MLM/TLM ablation.

- Masking: 15 % of the non-special tokens of each segment, uniformly (not
  spans); <s>, </s>, <pad> are never masked.  TRTD masks each side separately.
- Generator G (no dropout, as XY-LENT following COCO-LM): MLM on the masked
  input, output layer tied to the shared token embeddings (a matrix of its own
  with `model.generator_output: untied`, issue 63) and evaluated only at
  the masked positions.  Its prediction is *sampled* (temperature 1, no gradient
  through the sample) to corrupt the input.
- Discriminator D: replaced-token detection on the corrupted input, over every
  non-pad token; a sample equal to the original counts as original.
- Loss = L_G + λ·L_D, λ = 50.  Token and position embeddings are shared.
- ``objective: mlm`` trains one encoder with BERT's 80/10/10 corruption: MLM on
  MRTD batches, TLM (both sides of the pair masked) on TRTD batches.

Forward passes return *sums and counts* (xylent.models.stats.Stats), not means; the
objectives are built by name in xylent.models.objectives.

ELECTRA's step never makes the host wait on the device (issue 61): the masked and the real
positions are gathered by sorts to sizes the host counts from the numpy batch
(``host_counts``), in the row-major order boolean indexing gave, and the generator's
output layer runs over the vocabulary in chunks when its logits would not fit whole
(xylent.models.vocab_head), so no (masked × V) fp32 copy exists at V = 250 002.  Below that
size it is the step it replaced, bit for bit on the CPU (tests/test_electra_step.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xylent.models.config import EncoderConfig
from xylent.models.encoder import Embeddings, Encoder
from xylent.models.objective import ObjectiveModel
from xylent.models.weight_init import init_weights
from xylent.models.masking import bert_corrupt, choose_masked, corrupt, masked_count, positions
from xylent.models.stats import Norms, Stats, row_sums, row_sums_at, zero
from xylent.models.vocab_head import generator_outputs


class TiedLMHead(nn.Module):
    """dense → GELU → LayerNorm → logits with the (shared) token embedding matrix."""

    def __init__(self, hidden: int, vocab_size: int):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.ln = nn.LayerNorm(hidden)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(F.gelu(self.dense(x)))

    def forward(self, x: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        return F.linear(self.hidden(x), embedding, self.bias)


class RTDHead(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.dense(x))).squeeze(-1)


class ElectraModel(ObjectiveModel):
    objective = "electra"

    @classmethod
    def from_options(cls, cfg: EncoderConfig, disc_weight: float, mask_prob: float, options: dict) -> "ElectraModel":
        return cls(cfg, disc_weight, mask_prob)

    @classmethod
    def layer_passes(cls, cfg: EncoderConfig) -> float:
        return cfg.layers + cfg.generator_layers

    @classmethod
    def extra_head_flops(cls, cfg: EncoderConfig) -> float:
        return 2 * cfg.hidden * cfg.hidden  # the discriminator head's dense layer, at every token

    def __init__(self, cfg: EncoderConfig, disc_weight: float = 50.0, mask_prob: float = 0.15):
        super().__init__()
        self.cfg, self.disc_weight, self.mask_prob = cfg, disc_weight, mask_prob
        self.loss_weights = {"generator_loss": 1.0, "discriminator_loss": disc_weight}  # the logged "loss"
        self.embeddings = Embeddings(cfg)
        self.generator = Encoder(cfg, cfg.generator_layers, dropout=0.0)
        self.generator_head = TiedLMHead(cfg.hidden, cfg.vocab_size)
        self.discriminator = Encoder(cfg, cfg.layers, dropout=cfg.dropout)
        self.discriminator_head = RTDHead(cfg.hidden)
        if cfg.generator_output == "untied":  # registered last: the tied model's parameters keep their order
            self.generator_output = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.special_ids, self.mask_id = cfg.special_ids, cfg.special("mask")
        self.apply(init_weights)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor, segments: torch.Tensor | None,
                noise: torch.Tensor, per_row: bool = False, replay: torch.Tensor | None = None,
                n_masked: int | None = None, n_real: int | None = None) -> Stats:
        """``per_row``: also the losses and counts of each row (Stats.rows), for the audit's
        per-pair losses; the totals are then the sums of the per-token losses.  ``replay``: a
        discriminator input whose tokens at the masked positions are taken instead of the generator's
        samples (the audit's partner-swapped pass reads the replacements its rows got as they are).
        ``n_masked``, ``n_real``: how many positions the noise masks and how many are not padding
        (:meth:`host_counts` of the numpy batch); without them they are read from the device, a wait
        each.  With them the host never waits on the device: the masked and real positions are
        gathered by sorts of sizes the host knows, counts stay on the device (tests/test_electra_step.py:
        one graph, no break).  The input the discriminator read is kept as ``self.corrupted``."""
        masked = choose_masked(ids, segments, self.mask_prob, noise[0], self.special_ids)
        real = ~pad
        at = positions(masked, int(masked.sum()) if n_masked is None else n_masked)
        at_real = positions(real, int(real.sum()) if n_real is None else n_real)
        g_hidden = self.generator_states(ids.masked_fill(masked, self.mask_id), pad)
        target = ids.flatten().index_select(0, at)
        (g_loss, g_tok), sampled, predicted = generator_outputs(
            self.generator_head, g_hidden.flatten(0, 1).index_select(0, at), self.output_embedding(), target,
            noise[1].flatten().index_select(0, at), sample=replay is None, per_token=per_row)
        with torch.no_grad():
            if replay is not None:
                sampled = replay.flatten().index_select(0, at)
            g_correct = (predicted == target).sum()
        corrupted, replaced = corrupt(ids, at, sampled)
        self.corrupted = corrupted
        d_logits = self.discriminator_logits(corrupted, pad)
        d_real = d_logits.flatten().index_select(0, at_real).float()
        y = replaced.flatten().index_select(0, at_real)
        d_tok = F.binary_cross_entropy_with_logits(d_real, y.float(), reduction="none" if per_row else "sum")
        d_loss = d_tok.sum() if per_row else d_tok
        with torch.no_grad():
            pred = d_real > 0
            rows = None
            if per_row:
                rows = torch.stack([row_sums_at(g_tok.detach(), at, masked.shape), masked.sum(1).float(),
                                    row_sums_at(d_tok.detach(), at_real, real.shape), real.sum(1).float(),
                                    replaced.sum(1).float()])
        return Stats(g_loss, d_loss, masked.sum(), g_correct, real.sum(), (pred == y).sum(), (pred & y).sum(),
                     pred.sum(), y.sum(), real.sum(), rows)

    def output_embedding(self) -> torch.Tensor:
        """The generator's output matrix (V, H): the token embeddings, unless ``generator_output: untied``."""
        untied = getattr(self, "generator_output", None)
        return self.token_embedding() if untied is None else untied.weight

    # the modules the step runs, one method each: a model built of other modules (xylent.models.transformers_electra)
    # overrides these and keeps the step
    def generator_states(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """The generator's last hidden states (B, T, H) of the masked input."""
        return self.generator(self.embeddings(ids), pad)

    def discriminator_logits(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """The replaced-token logit (B, T) of every position of the corrupted input."""
        return self.discriminator_head(self.discriminator(self.embeddings(ids), pad))

    def host_counts(self, ids, segments, real) -> dict[str, int]:
        """``n_masked`` and ``n_real`` of :meth:`forward` for the numpy batch ``ids`` (``segments``, and
        ``real``: its non-pad positions), counted on the host."""
        return {"n_masked": masked_count(ids, segments, self.mask_prob, self.special_ids), "n_real": int(real.sum())}

    def generated_input(self) -> torch.Tensor:
        return self.corrupted  # the generator's samples at the masked positions

    def loss(self, st: Stats, norms: Norms) -> torch.Tensor:
        return st.g_loss / norms.g + self.disc_weight * st.d_loss / norms.d

    def encoder_state_dict(self) -> dict[str, torch.Tensor]:
        """What downstream tasks use: the shared embeddings and the discriminator."""
        return _prefixed(self, ("embeddings.", "discriminator."))


class MaskedLMModel(ObjectiveModel):
    """The MLM/TLM ablation: one encoder, BERT's 80/10/10 corruption."""

    objective = "mlm"

    @classmethod
    def from_options(cls, cfg: EncoderConfig, disc_weight: float, mask_prob: float, options: dict) -> "MaskedLMModel":
        return cls(cfg, mask_prob)

    def __init__(self, cfg: EncoderConfig, mask_prob: float = 0.15):
        super().__init__()
        self.cfg, self.mask_prob = cfg, mask_prob
        self.loss_weights = {"generator_loss": 1.0}
        self.embeddings = Embeddings(cfg)
        self.encoder = Encoder(cfg, cfg.layers, dropout=cfg.dropout)
        self.head = TiedLMHead(cfg.hidden, cfg.vocab_size)
        self.special_ids, self.mask_id = cfg.special_ids, cfg.special("mask")
        self.apply(init_weights)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor, segments: torch.Tensor | None,
                noise: torch.Tensor, per_row: bool = False) -> Stats:
        masked = choose_masked(ids, segments, self.mask_prob, noise[0], self.special_ids)
        corrupted = bert_corrupt(ids, masked, noise, self.cfg.vocab_size, self.mask_id, max(self.special_ids) + 1)
        self.corrupted = corrupted  # the input this step read (InfoXLM contrasts it)
        hidden = self.encoder(self.embeddings(corrupted), pad)
        logits = self.head(hidden[masked], self.embeddings.tokens.weight)
        target = ids[masked]
        tok = F.cross_entropy(logits.float(), target, reduction="none" if per_row else "sum")
        loss = tok.sum() if per_row else tok
        with torch.no_grad():
            correct = (logits.argmax(-1) == target).sum()
            rows = None
            if per_row:
                zeros = torch.zeros(ids.shape[0], device=ids.device)
                rows = torch.stack([row_sums(tok.detach(), masked), masked.sum(1).float(), zeros, zeros, zeros])
        z = zero(ids)
        return Stats(loss, z, masked.sum(), correct, z, z, z, z, z, (~pad).sum(), rows)

    def loss(self, st: Stats, norms: Norms) -> torch.Tensor:
        return st.g_loss / norms.g

    def encoder_state_dict(self) -> dict[str, torch.Tensor]:
        sd = _prefixed(self, ("embeddings.", "encoder."))
        return {("discriminator." + k[len("encoder."):] if k.startswith("encoder.") else k): v for k, v in sd.items()}


def _prefixed(model: nn.Module, prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if k.startswith(prefixes)}
