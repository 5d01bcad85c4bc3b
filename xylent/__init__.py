"""xylent: cross-lingual encoder pretraining, end to end.

Its stages, flows and models are ``xylent.tasks``, ``xylent.flows`` and ``xylent.models``.  An install
(``pip install .``, setup.py) puts them inside this package; a checkout keeps them at its top level
(tasks/, flows/, models/), and the finder below maps the names onto those folders -- the folders of
the checkout this package came from, so two checkouts side by side (a replay's worktrees) each run
their own code."""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

__version__ = "0.1.0"

SUBPACKAGES = ("flows", "tasks", "models")


class _CheckoutFinder:
    """Finds ``xylent.<sub>`` in ``<checkout>/<sub>``; everything below it follows the package's path."""

    def __init__(self, checkout: Path) -> None:
        self.homes = {f"{__name__}.{sub}": str(checkout / sub) for sub in SUBPACKAGES}

    def find_spec(self, fullname: str, path=None, target=None) -> ModuleSpec | None:
        home = self.homes.get(fullname)
        return None if home is None else PathFinder.find_spec(fullname, [str(Path(home).parent)])


def _install_checkout_finder() -> None:
    here = Path(__file__).resolve().parent
    if (here / SUBPACKAGES[0]).is_dir():
        return  # installed: the subpackages are inside this one
    checkout = here.parent
    if not all((checkout / sub / "__init__.py").is_file() for sub in SUBPACKAGES):
        return
    sys.meta_path.insert(0, _CheckoutFinder(checkout))


_install_checkout_finder()
