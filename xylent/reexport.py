"""Re-export a stage package's names on first use.

A stage's ``__init__.py`` names where each public name lives and imports nothing else, so importing one
module of the package (as the training ranks and the readers of an output contract do) loads no other.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def on_first_use(package: str, home: dict[str, str]) -> tuple[Callable[[str], Any], list[str]]:
    """``__getattr__`` and ``__all__`` for ``package``: ``home`` maps each name to its module."""
    def __getattr__(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(home[name]), name)

    return __getattr__, sorted(home)
