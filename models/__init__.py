"""PyTorch models: the encoder with gated relative position bias, ELECTRA
generator/discriminator, the DeepSpeed trainer, export and loading."""


def load_pretrained(path, map_location="cpu"):
    """See :func:`models.pretrained.load_pretrained` (imported lazily: ``import models`` stays cheap)."""
    from models.pretrained import load_pretrained as _load

    return _load(path, map_location)
