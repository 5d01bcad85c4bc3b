"""The model section's shape, checked when a run starts (the pretrain and audit stages'
identity, flows/registry.py), before any stage: light on purpose -- ``xylent status`` and
every other command that runs no stage computes fingerprints, and imports only this."""

from __future__ import annotations

from xylent.models.config import preset
from xylent.errors import XylentError
from xylent.spec import Spec


def check_model(spec: Spec) -> None:
    """The model section's shape, checked when a run starts, before any stage: a shape the
    encoder cannot have (hidden not a multiple of heads) would otherwise stop the run after
    the data stages, inside the training ranks."""
    try:
        preset(spec.model.size, **spec.model.overrides())
    except ValueError as exc:
        raise XylentError(f"the model section describes no encoder: {exc}", where="spec fields model.hidden and "
                          "model.heads", fix=f"pick heads that divide hidden (model.size {spec.model.size!r} has "
                          f"hidden {preset(spec.model.size).hidden}, heads {preset(spec.model.size).heads})") from None
