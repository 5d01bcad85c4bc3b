"""The contract of a pretraining objective: every call the trainer, the audit, the optimizer's
setup and the MFU count make on the model they train, declared here with what it must do.
The objectives (xylent.objectives.OBJECTIVES) name their class; xylent.models.objectives builds
it.  A hook an objective does not need keeps the default below, so the trainer calls every
hook unconditionally.

A forward pass returns *sums and counts* (xylent.models.stats.Stats), never means: the trainer adds
them over ranks and divides by the global counts (``loss(st, norms)``), so the loss is the
global batch's mean whatever its split.
"""

from __future__ import annotations

import torch
from torch import nn

from xylent.models.config import EncoderConfig
from xylent.models.stats import Norms, Stats


class ObjectiveModel(nn.Module):
    objective: str                      # its name in xylent.objectives.OBJECTIVES
    loss_weights: dict[str, float]      # the logged "loss": Σ weight × the task's metric of that name, per task
    embeddings: nn.Module               # xylent.models.encoder.Embeddings, shared (see token_embedding)

    @classmethod
    def from_options(cls, cfg: EncoderConfig, disc_weight: float, mask_prob: float,
                     options: dict) -> "ObjectiveModel":
        """The model a run trains: ``options`` is the objective's own spec section as a train.json
        holds it (``objective_options``; empty for an objective without one)."""
        raise NotImplementedError

    def forward(self, ids: torch.Tensor, pad: torch.Tensor, segments: torch.Tensor | None, noise: torch.Tensor,
                per_row: bool = False, **host_counts: int) -> Stats:
        """One micro-batch: token ids (B, T), their padding, segment ids (TRTD rows; None for MRTD),
        the rows' uniforms (xylent.models.masking.row_noise: every random choice comes from them).
        ``per_row``: also Stats.rows, each row's losses and counts (the audit's per-pair losses).
        ``host_counts``: what :meth:`host_counts` gave for this batch."""
        raise NotImplementedError

    def loss(self, st: Stats, norms: Norms) -> torch.Tensor:
        """The loss to backpropagate from this rank's sums and the global counts."""
        raise NotImplementedError

    def encoder_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights downstream tasks load: ``embeddings.*`` and ``discriminator.*`` (the encoder)."""
        raise NotImplementedError

    # -- optional hooks ---------------------------------------------------------------------
    def token_embedding(self) -> torch.Tensor:
        """The shared token embedding matrix (V, H), whose health the trainer logs
        (xylent.models.embedding_health)."""
        return self.embeddings.tokens.weight

    def host_counts(self, ids, segments, real) -> dict[str, int]:
        """Sizes the forward would otherwise read from the device, counted on the host from the numpy
        batch (ids, segments or None, non-pad mask) in the loader's thread; passed to forward."""
        return {}

    def attach(self, device: torch.device) -> None:
        """Build state kept outside the trained module (InfoXLM's key encoder and queue), once the
        weights of step 0 are final (DeepSpeed's engine built)."""

    def after_step(self) -> None:
        """After each optimizer step (InfoXLM: the key encoder follows the updated weights)."""

    def objective_state(self) -> dict | None:
        """What a checkpoint must keep beyond the weights and the optimizer; None: nothing."""
        return None

    def load_objective_state(self, state: dict) -> None:
        raise ValueError(f"objective {self.objective} keeps no state beside its weights, yet the checkpoint holds "
                         "some: it was written by another objective")

    def generated_input(self) -> torch.Tensor | None:
        """The input the last forward's encoder read when the model made it itself (ELECTRA's generator
        samples): a pass over the same rows with their partners swapped must replay it.  None when the
        corruption follows from the noise alone."""
        return None

    def freezes_body(self) -> bool:
        """True when the body's parameters sit still for a while (their own optimizer groups)."""
        return False

    def body_frozen(self, step: int) -> bool:
        return False

    @classmethod
    def layer_passes(cls, cfg: EncoderConfig) -> float:
        """Encoder layers a token passes through per forward, for the MFU's FLOPs count
        (xylent.models.training.optim.flops_per_token)."""
        return cfg.layers

    @classmethod
    def extra_head_flops(cls, cfg: EncoderConfig) -> float:
        """Forward FLOPs per token of heads beyond the masked-LM head (ELECTRA's discriminator head)."""
        return 0.0
