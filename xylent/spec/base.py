"""What every spec section is: a pydantic model that refuses unknown keys and non-finite numbers
(``.inf`` or ``.nan`` for a learning rate trains to NaN; for a vocabulary weight it silently gives
every language the smallest grid): a field that means to take one says ``allow_inf_nan=True``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, allow_inf_nan=False)
