"""What every spec section is: a pydantic model that refuses unknown keys and non-finite numbers
(``.inf`` or ``.nan`` for a learning rate trains to NaN; for a vocabulary weight it silently gives
every language the smallest grid): a field that means to take one says ``allow_inf_nan=True``.

A field renamed keeps working under its old name: a section's ``RENAMED`` ({new name: old name})
reads the old key as the new one and :func:`renamed_keys` reports it, and fingerprints keep the old
name (xylent.stage.section_identity), so a rename recomputes no output."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, PrivateAttr, model_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, allow_inf_nan=False)

    RENAMED: ClassVar[dict[str, str]] = {}
    _old_keys: list[str] = PrivateAttr(default_factory=list)  # the old names this section was given

    @model_validator(mode="wrap")
    @classmethod
    def _read_old_names(cls, data: Any, handler):
        given = []
        if cls.RENAMED and isinstance(data, dict):
            data = dict(data)
            for new, old in cls.RENAMED.items():
                if old in data:
                    if new in data:
                        raise ValueError(f"{old} and {new} are one setting ({old} is its old name): keep {new} only")
                    data[new] = data.pop(old)
                    given.append(old)
        model = handler(data)
        if given and isinstance(model, Strict):
            model._old_keys = given
        return model


def renamed_keys(section: Any, path: str = "") -> list[str]:
    """``"pretrain.tasks is now pretrain.batch_kinds"`` for every old name a spec was written with."""
    out = []
    if isinstance(section, Strict):
        out += [f"{path}{old} is now {path}{new}" for new, old in type(section).RENAMED.items()
                if old in section._old_keys]
        for name in type(section).model_fields:
            out += renamed_keys(getattr(section, name), f"{path}{name}.")
    elif isinstance(section, list):
        for i, item in enumerate(section):
            out += renamed_keys(item, f"{path[:-1]}[{i}].")
    return out
