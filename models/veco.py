"""VECO's cross-attention MLM (CA-MLM; Luo et al. 2021, METHODS.md "VECO").

Every layer is self-attention → cross-attention → FFN, each sublayer post-LN
like xylent.models.encoder.Layer.  The cross-attention sublayers are a *plug-in*:

- plug-out pass: the layers without cross-attention, i.e. exactly the
  MaskedLMModel encoder (same parameter names, same ``encoder_state_dict``,
  so an export is an ordinary ``PretrainedEncoder``);
- plug-in pass: the same layers, with each layer's cross-attention querying
  from the stream and attending to sg(H^L), the plug-out pass's final states
  of the paired sentence.

A TRTD row ``<s> x </s> y </s>`` is masked on the pair row at
``pair_mask_prob`` (25 %, VECO Table 8; BERT 80/10/10 per side, the same noise
planes as MaskedLMModel), then split into ``<s> x̂ </s>`` and ``<s> ŷ </s>``
(xylent.models.pairs).  VECO §4: "the overall objective is the sum of TLM and the
proposed CA-MLM objectives", so a pair trains five terms through the one tied
LM head: TLM, −log P(x, y | x̂ ŷ) on the joined masked row (``tlm``), and
CA-MLM's Eq. 1, −log P(x|x̂) − log P(x|ŷ,x̂) − log P(y|ŷ) − log P(y|x̂,ŷ).
Every masked token counts once per term in the ``g`` slot (so the logged
generator loss stays a per-token mean); ``combine: sum`` (the paper adds the
terms) multiplies that mean by the terms per token (3, or 2 without TLM) in
:meth:`VecoModel.loss`.
MRTD rows: plain MLM at ``pretrain.mask_prob`` (15 %), plug-out.  The paper
trains CA-MLM on two adjacent monolingual segments too; xylent's MRTD rows are
packed sentences without segment ids, so they do not (docs/recipes.md).

Choices where the paper is silent:

- x̂ and ŷ run as one batch of 2B rows (padded to the longer side) and the
  plug-in memory is that batch with its halves swapped: one plug-out and one
  plug-in pass per micro-batch instead of four.
- The stop-gradient is applied inside :meth:`VecoModel.plug_in`, where H^L is
  consumed, so no caller can forget it (and H^L of a side is the same tensor
  its plug-out MLM term is computed from: no extra pass).
- Cross-attention has no relative position bias (queries and keys are
  different sequences: j − i means nothing) and its own q / kv / out
  projections per layer, initialised N(0, 0.02) like everything else: after
  the post-LN the sublayer starts close to the identity, so a model
  initialised from an encoder starts with plug-in ≈ plug-out.
- Two-phase schedule (``freeze_body_steps``): the model only says which
  parameters are the body (:meth:`is_cross`) and whether they are frozen at a
  step (:meth:`body_frozen`).  The trainer should freeze by an lr-0 parameter
  group or by dropping the body's gradients, not by flipping ``requires_grad``
  after DeepSpeed has built its (ZeRO-partitioned) optimizer.
- The plug-in mode of fine-tuning (attending to [H; S]) is not part of
  pretraining and is not here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from xylent.models.config import EncoderConfig
from xylent.models.electra import MaskedLMModel
from xylent.models.masking import bert_corrupt, choose_masked
from xylent.models.pairs import split_pair
from xylent.models.stats import Norms, Stats, all_ranks_sum, row_sums, zero
from xylent.models.weight_init import init_weights

CROSS = "cross."


@dataclass(frozen=True, kw_only=True)
class VecoOptions:
    """train.json's ``objective_options`` of a VECO run, typed.  No defaults: the spec's
    ``pretrain.veco`` (xylent.spec.VecoConfig) is their one home."""
    freeze_body_steps: int  # first steps train the cross-attention only (init from an existing encoder)
    pair_mask_prob: float   # translation pairs' masking rate (VECO Table 8)
    tlm: bool               # TLM on the joined row beside CA-MLM (VECO §4)
    combine: str            # sum: the terms' means added (the paper); mean: averaged


class CrossAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.head_dim, self.dropout = heads, hidden // heads, dropout
        self.q = nn.Linear(hidden, hidden)
        self.kv = nn.Linear(hidden, 2 * hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_pad: torch.Tensor) -> torch.Tensor:
        """x: (B, L, D) queries; memory: (B, M, D); memory_pad: (B, M) True where padding."""
        b, n, dim = x.shape
        q = self.q(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(memory).view(b, memory.shape[1], 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=~memory_pad[:, None, None, :],
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(b, n, dim))


class CrossSublayer(nn.Module):
    """Cross-attention, residual, dropout, post-LN: the shape of the encoder's sublayers."""

    def __init__(self, cfg: EncoderConfig, dropout: float):
        super().__init__()
        self.attn = CrossAttention(cfg.hidden, cfg.heads, dropout)
        self.ln = nn.LayerNorm(cfg.hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, memory, memory_pad):
        return self.ln(x + self.drop(self.attn(x, memory, memory_pad)))


class VecoModel(MaskedLMModel):
    """The MLM encoder (plug-out, parameters as MaskedLMModel's) + ``cross.<i>`` sublayers.
    ``loss`` and ``encoder_state_dict`` are MaskedLMModel's (``st.g_loss / norms.g``; ``cross.``
    is not exported)."""

    objective = "veco"

    @classmethod
    def from_options(cls, cfg: EncoderConfig, disc_weight: float, mask_prob: float, options: dict) -> "VecoModel":
        return cls(cfg, mask_prob, VecoOptions(**options))

    @classmethod
    def layer_passes(cls, cfg: EncoderConfig) -> float:
        # a plug-in pass with cross-attention (about 4/3 of a layer) on top of the plug-out pass, per token
        # of the pair rows, approximately
        return cfg.layers * (1 + 4 / 3)

    def __init__(self, cfg: EncoderConfig, mask_prob: float = 0.15, options: VecoOptions | None = None):
        """``options``: pretrain.veco's; None for a model that only encodes (an export plugged in,
        xylent.models.veco_plug_in), which cannot train."""
        super().__init__(cfg, mask_prob)
        self.options = options
        self.cross = nn.ModuleList(CrossSublayer(cfg, cfg.dropout) for _ in range(cfg.layers))
        self.bos_id, self.pad_id = cfg.special("bos"), cfg.special("pad")
        self._terms = 1  # loss terms per masked token in the last forward (loss() needs it)
        self.apply(init_weights)

    # -- parameters --------------------------------------------------------------------------
    @staticmethod
    def is_cross(name: str) -> bool:
        """True for the plug-in (cross-attention) parameters; everything else is the body."""
        return name.startswith(CROSS)

    def freezes_body(self) -> bool:
        return self._training_options().freeze_body_steps > 0

    def body_frozen(self, step: int) -> bool:
        return step < self._training_options().freeze_body_steps

    def _training_options(self) -> VecoOptions:
        if self.options is None:
            raise RuntimeError("this VecoModel was built to encode, without pretrain.veco's options: build it "
                               "with xylent.models.objectives.build_model and the run's objective_options to train it")
        return self.options

    def plug_in_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if self.is_cross(k)}

    # -- the two passes ----------------------------------------------------------------------
    def plug_out(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """H^L: final states without cross-attention (what the exported encoder computes)."""
        return self.encoder(self.embeddings(ids), pad)

    def plug_in(self, ids: torch.Tensor, pad: torch.Tensor, memory: torch.Tensor,
                memory_pad: torch.Tensor) -> torch.Tensor:
        """Final states of ``ids`` with every layer cross-attending to sg(``memory``)."""
        memory = memory.detach()  # VECO's stop-gradient: the paired side is not trained through this pass
        enc = self.encoder
        x = enc.drop(enc.ln(self.embeddings(ids)))
        n = x.shape[1]
        x, pad, rel = enc.attention_inputs(x, pad)
        for layer, cross in zip(enc.layers, self.cross):  # xylent.models.encoder.Layer, cross-attention in between
            x = layer.ln1(x + layer.drop(layer.attn(x, rel, pad)))
            x = cross(x, memory, memory_pad)
            x = layer.ln2(x + layer.drop(layer.ffn(x)))
        return x[:, :n]

    def pair_terms(self, ids: torch.Tensor, pad: torch.Tensor, segments: torch.Tensor, noise: torch.Tensor):
        """The TRTD row's four terms, per masked token: (plug-out tok, plug-in tok, masked, logits,
        target).  Sides are stacked x̂ rows then ŷ rows, so ``masked`` is (2B, W) and each tok
        vector lists the x tokens then the y tokens, in ``masked``'s row-major order."""
        masked = choose_masked(ids, segments, self._training_options().pair_mask_prob, noise[0], self.special_ids)
        corrupted = bert_corrupt(ids, masked, noise, self.cfg.vocab_size, self.mask_id, max(self.special_ids) + 1)
        self._pair = (corrupted, masked)  # TLM reads the joined row with the same masks
        src = self._sides(corrupted, pad, segments, self.bos_id, self.pad_id)
        tgt = self._sides(ids, pad, segments, self.bos_id, self.pad_id)
        m = self._sides(masked.long(), pad, segments, 0, 0).bool()  # <s> of y and padding: not masked
        side_pad = tgt == self.pad_id
        b = ids.shape[0]
        def swap(t): return torch.cat([t[b:], t[:b]])  # x's memory is y's H^L and vice versa
        h_out = self.plug_out(src, side_pad)
        h_in = self.plug_in(src, side_pad, swap(h_out), swap(side_pad))
        logits = self.head(torch.cat([h_out[m], h_in[m]]), self.embeddings.tokens.weight)
        target = tgt[m].repeat(2)
        tok = F.cross_entropy(logits.float(), target, reduction="none").view(2, -1)
        return tok[0], tok[1], m, logits, target

    @staticmethod
    def _sides(t: torch.Tensor, pad, segments, bos: int, fill: int) -> torch.Tensor:
        x, _, y, _ = split_pair(t, pad, segments, bos, fill)
        w = max(x.shape[1], y.shape[1])
        return torch.cat([F.pad(x, (0, w - x.shape[1]), value=fill), F.pad(y, (0, w - y.shape[1]), value=fill)])

    def forward(self, ids: torch.Tensor, pad: torch.Tensor, segments: torch.Tensor | None,
                noise: torch.Tensor, per_row: bool = False) -> Stats:
        if segments is None:
            self._terms = 1
            return super().forward(ids, pad, segments, noise, per_row)  # MRTD: plain MLM, plug-out
        tok_out, tok_in, m, logits, target = self.pair_terms(ids, pad, segments, noise)
        loss = tok_out.sum() + tok_in.sum()
        n = m.sum()  # the pair row's masked tokens, x's and y's
        terms = 2  # per masked token: plug-out and plug-in
        if self._training_options().tlm:
            corrupted, masked = self._pair
            h = self.encoder(self.embeddings(corrupted), pad)
            tlm_logits = self.head(h[masked], self.embeddings.tokens.weight)
            tlm = F.cross_entropy(tlm_logits.float(), ids[masked], reduction="none")
            loss, terms = loss + tlm.sum(), 3
        self._terms = terms
        with torch.no_grad():
            correct = (logits.argmax(-1) == target).sum()
            if self._training_options().tlm:  # its predictions count too: accuracy is over every (token,
                # term), as the count
                correct = correct + (tlm_logits.argmax(-1) == ids[masked]).sum()
            # rank 0's gauge of the global batch: does the translation help (plug-in below plug-out)?
            gauge = all_ranks_sum(torch.stack([tok_out.sum(), tok_in.sum(), n.float()]))
            rows = None
            if per_row:
                b = ids.shape[0]
                def fold(t): return t[:b] + t[b:]  # a pair row's x and y sides
                zeros = torch.zeros(b, device=ids.device)
                g_row = fold(row_sums(tok_out.detach(), m) + row_sums(tok_in.detach(), m))
                if self._training_options().tlm:
                    g_row = g_row + row_sums(tlm.detach(), masked)
                rows = torch.stack([g_row, terms * fold(m.sum(1).float()), zeros, zeros, zeros])
        z = zero(ids)
        st = Stats(loss, z, terms * n, correct, z, z, z, z, z, (~pad).sum(), rows)  # each token once per term
        out_sum, in_sum, count = gauge.tolist()
        st.extra.update({"trtd/plug_out_loss": out_sum / max(count, 1), "trtd/plug_in_loss": in_sum / max(count, 1)})
        return st

    def loss(self, st: Stats, norms: Norms) -> torch.Tensor:
        """The mean over (masked token, term); with ``combine: sum`` times the terms per token,
        i.e. Σ of every term / masked tokens, as the paper adds its log-likelihoods (fairseq's
        per-token normalisation).  MRTD micro-batches have one term, MLM."""
        mean = st.g_loss / norms.g
        if self._training_options().combine == "sum" and self._terms > 1:
            return mean * self._terms
        return mean
