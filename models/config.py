"""Model size bands (XLM-E Table 8 / XY-LENT) as presets; every field can be overridden.

Discriminator sizes: Base 12×768 (FFN 3072, 12 heads), Large 24×1024 (4096, 16),
XL 48×1536 (6144, 24).  The generator shares the token and position embeddings
and has the discriminator's hidden size with fewer layers: 4 / 6 / 8 for Base /
Large / XL.  ``tiny`` (tests, demo) and ``small`` (CPU benchmarks, ELECTRA-Small
shaped) are ours.  Relative-position buckets / max distance are unpublished
for XLM-E: 32 / 128 is our guess, kept configurable.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace


@dataclass(frozen=True)
class EncoderConfig:
    vocab_size: int = 250_002
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    ffn: int = 3072
    generator_layers: int = 4
    max_position: int = 512
    rel_buckets: int = 32
    rel_max_distance: int = 128
    dropout: float = 0.1
    relative_bias: bool = True  # False: plain attention (the benchmark's "what does the bias cost" row)
    gate: str = "xlm-e"  # the bias gate's form (models/attention.py): XLM-E's equations, or "wavlm"
    # the kernel that adds the bias (models/attention.py): auto = flex on CUDA, materialised elsewhere
    attention: str = "auto"
    # ELECTRA's generator output layer: "tied" to the shared token embeddings (XLM-E, ELECTRA), or "untied", a
    # matrix of its own, so the token embeddings move only by the tokens a step inputs (issue 63's collapse)
    generator_output: str = "tied"
    # the tokenizer's special ids (unk, bos, eos, pad, mask), copied from it when the model is
    # configured (xylent.tasks.pretrain.train_json); models read them from here, never from a constant
    specials: dict[str, int] = field(default_factory=dict)

    def __post_init__(self):
        if self.gate not in ("xlm-e", "wavlm"):
            raise ValueError(f"gate {self.gate!r} is not 'xlm-e' (XLM-E §3.3) or 'wavlm' (WavLM's code)")
        if self.attention not in ("auto", "flex", "materialised"):
            raise ValueError(f"attention {self.attention!r} is not 'auto', 'flex' or 'materialised'")
        if self.generator_output not in ("tied", "untied"):
            raise ValueError(f"generator_output {self.generator_output!r} is not 'tied' or 'untied'")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")

    def special(self, name: str) -> int:
        try:
            return self.specials[name]
        except KeyError:
            raise ValueError(f"the encoder config has no {name!r} id (specials={self.specials}); configure the "
                             "model with its tokenizer's special ids (xylent.tasks.vocab.specials.special_ids)") from None

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Ids that are never masked and never a random replacement."""
        return tuple(sorted(self.special(k) for k in ("unk", "bos", "eos", "pad", "mask")))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_export(cls, meta: dict) -> "EncoderConfig":
        """The encoder config of an export's config.json.  Exports written before the
        ``gate`` field (and before ``specials`` moved into ``encoder``) were trained
        with WavLM's gate."""
        enc = meta["encoder"]
        return cls(**{"gate": "wavlm", **enc, "specials": enc.get("specials") or meta["specials"]})


PRESETS: dict[str, EncoderConfig] = {
    "tiny": EncoderConfig(hidden=64, layers=2, heads=2, ffn=256, generator_layers=1, max_position=512),
    "small": EncoderConfig(hidden=256, layers=12, heads=4, ffn=1024, generator_layers=4),
    "base": EncoderConfig(hidden=768, layers=12, heads=12, ffn=3072, generator_layers=4),
    "large": EncoderConfig(hidden=1024, layers=24, heads=16, ffn=4096, generator_layers=6),
    "xl": EncoderConfig(hidden=1536, layers=48, heads=24, ffn=6144, generator_layers=8),
}


def preset(size: str, **overrides) -> EncoderConfig:
    if size not in PRESETS:
        raise ValueError(f"unknown model size {size!r}; choose one of {', '.join(PRESETS)}")
    return replace(PRESETS[size], **overrides)
