"""PyTorch models: the encoder with gated relative position bias, ELECTRA
generator/discriminator, the DeepSpeed trainer, export and loading."""


def load_pretrained(path, map_location="cpu"):
    """See :func:`xylent.models.pretrained.load_pretrained` (imported lazily: ``import models`` stays cheap)."""
    from xylent.models.pretrained import load_pretrained as _load

    return _load(path, map_location)


def load_plug_in(path, map_location="cpu"):
    """See :func:`xylent.models.veco_plug_in.load_plug_in`: a VECO model in plug-in mode (tasks with translations)."""
    from xylent.models.veco_plug_in import load_plug_in as _load

    return _load(path, map_location)
