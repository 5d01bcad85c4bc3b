"""transformers' ELECTRA as a pretraining objective: the reference peer of issue 63.

``objective: transformers-electra`` trains ``ElectraForMaskedLM`` (the generator) and
``ElectraForPreTraining`` (the discriminator) from transformers, as its code builds and
initialises them, in xylent's trainer: the same shards, loader, batches, masking noise,
optimizer, schedule and DeepSpeed engine as ``objective: electra``.  What differs is what
transformers' classes are: plain attention (no XLM-E gated relative bias, so the spec
must say ``model.relative_bias: false``), one embedding LayerNorm shared by both models,
token-type embeddings, transformers' own weight init, and the generator's output layer a
``Linear`` tied to the shared word embeddings (``tie_word_embeddings``).  One setting departs
from transformers' defaults: LayerNorm ε is 1e-5 (torch's, xylent's) rather than 1e-12, so
the exported encoder computes what was trained (at init the embeddings' variance is ~8e-4,
where the two ε differ by a percent).
Masking and the generator's sample follow xylent's ELECTRA exactly (the same functions
of the same noise), so a difference in what the two learn comes from the model.

The export is xylent's encoder format, so one evaluate code reads both encoders: the
discriminator's weights under xylent's names (:func:`encoder_weights`), with
``model.relative_bias: false`` it computes what ``ElectraModel`` computes for token type 0
(tests/test_transformers_electra.py holds the two to float rounding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xylent.models.config import EncoderConfig
from xylent.models.electra import ElectraModel
from xylent.models.objective import ObjectiveModel

LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's, as xylent.models.encoder uses (transformers' default: 1e-12)


def electra_configs(cfg: EncoderConfig):
    """(generator, discriminator) ElectraConfigs of xylent's sizes: the generator has the
    discriminator's width and ``generator_layers`` layers, no dropout (as xylent's)."""
    from transformers import ElectraConfig

    common = dict(vocab_size=cfg.vocab_size, embedding_size=cfg.hidden, hidden_size=cfg.hidden,
                  num_attention_heads=cfg.heads, intermediate_size=cfg.ffn, max_position_embeddings=cfg.max_position,
                  type_vocab_size=2, hidden_act="gelu", layer_norm_eps=LAYER_NORM_EPS,
                  pad_token_id=cfg.special("pad"), tie_word_embeddings=True)
    generator = ElectraConfig(num_hidden_layers=cfg.generator_layers, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0, **common)
    discriminator = ElectraConfig(num_hidden_layers=cfg.layers, hidden_dropout_prob=cfg.dropout,
                                  attention_probs_dropout_prob=cfg.dropout, **common)
    return generator, discriminator


class TransformersElectraModel(ElectraModel):
    """xylent's ELECTRA step (xylent.models.electra.ElectraModel.forward: masking, sampling, losses,
    sums and counts) over transformers' modules."""

    objective = "transformers-electra"

    def __init__(self, cfg: EncoderConfig, disc_weight: float = 50.0, mask_prob: float = 0.15):
        ObjectiveModel.__init__(self)  # not ElectraModel's: it would build xylent's modules
        from transformers import ElectraForMaskedLM, ElectraForPreTraining

        if cfg.generator_output != "tied":
            raise ValueError("objective transformers-electra is ELECTRA as transformers ties it: its generator's output "
                             "layer is the word embeddings (model.generator_output: tied)")
        if cfg.relative_bias:
            raise ValueError("objective transformers-electra trains transformers' plain attention, which has no "
                             "relative position bias: set model.relative_bias: false")
        self.cfg, self.disc_weight, self.mask_prob = cfg, disc_weight, mask_prob
        self.loss_weights = {"generator_loss": 1.0, "discriminator_loss": disc_weight}
        gen_cfg, disc_cfg = electra_configs(cfg)
        self.discriminator = ElectraForPreTraining(disc_cfg)
        self.generator = ElectraForMaskedLM(gen_cfg)
        # ELECTRA's sharing: one embedding module (words, positions, types, LayerNorm) for both, the
        # generator's output layer tied to its words (what transformers' ELECTRA pretraining scripts do)
        self.generator.electra.embeddings = self.discriminator.electra.embeddings
        self.generator.generator_lm_head.weight = self.discriminator.electra.embeddings.word_embeddings.weight
        self.generator_head = _GeneratorHead(self.generator)
        self.special_ids, self.mask_id = cfg.special_ids, cfg.special("mask")

    def token_embedding(self) -> torch.Tensor:
        return self.discriminator.electra.embeddings.word_embeddings.weight

    def generator_states(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        return self.generator.electra(ids, attention_mask=(~pad).long()).last_hidden_state

    def discriminator_logits(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        return self.discriminator(ids, attention_mask=(~pad).long()).logits

    def encoder_state_dict(self) -> dict[str, torch.Tensor]:
        return encoder_weights(self.discriminator.electra.state_dict(), self.cfg.layers)


class _GeneratorHead:
    """transformers' generator head as xylent.models.vocab_head reads one (``hidden``, ``bias``, called with
    the tied matrix): ``generator_predictions`` then ``generator_lm_head``.  Not a module: its modules are
    the generator's, registered there."""

    def __init__(self, generator):
        self.predictions, self.bias = generator.generator_predictions, generator.generator_lm_head.bias

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        return self.predictions(x)

    def __call__(self, x: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        return F.linear(self.hidden(x), embedding, self.bias)


def encoder_weights(electra: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """``ElectraModel``'s state dict under xylent's encoder names (xylent.models.init_from reads every
    BERT-shaped encoder so): what it computes for token type 0, the only kind evaluation gives."""
    from xylent.models.init_from import from_bert_names

    out, unused = from_bert_names(electra, layers)
    if any(not k.endswith(("position_ids", "token_type_ids")) for k in unused):  # buffers, not weights
        raise ValueError(f"ElectraModel weights the export does not carry: {unused}")
    return {k: v.detach().clone() for k, v in out.items()}
