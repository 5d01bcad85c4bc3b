"""constraints.txt is the whole installed set (issue 65, item 5): every package `make install` puts in
.venv is pinned there at the version installed, the image's extras included, and every dependency in
pyproject.toml a user installs has an upper bound, so `make lock` resolves inside ranges the tests have seen."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
# installed but pinned elsewhere: the installers, this project, torch (TORCH_SPEC picks a CPU or CUDA
# build) and the CUDA packages a CUDA build of torch brings
NOT_PINNED = re.compile(r"^(pip|uv|setuptools|wheel|xylent|torch|triton|nvidia-.*|cuda-.*)$")
# calendar-versioned, released together: no major version to stay below; constraints.txt pins them
CALENDAR = {"fsspec", "s3fs", "gcsfs", "adlfs"}


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_constraints_pin_every_installed_package_at_its_installed_version():
    pins = _pins()
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in distributions()}
    unpinned = sorted(n for n in installed if n not in pins and not NOT_PINNED.match(n))
    assert not unpinned, f"installed, not in constraints.txt (run make lock): {unpinned}"
    differ = {n: (installed[n], pins[n]) for n in installed if n in pins and installed[n] != pins[n]}
    assert not differ, f"installed at another version than constraints.txt pins (make install): {differ}"


def test_every_extra_the_image_installs_is_pinned_and_every_dependency_has_an_upper_bound():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    image = re.search(r"ARG EXTRAS=(\S+)", (ROOT / "infra" / "docker" / "Dockerfile").read_text()).group(1)
    pins = _pins()
    for extra in image.split(","):
        for req in map(Requirement, extras[extra]):
            assert canonicalize_name(req.name) in pins, f"the image's extra {extra}: {req.name} is not pinned"
    # what a user installs (the test tools are pinned by constraints.txt alone)
    for spec in [*project["dependencies"], *(r for extra in image.split(",") for r in extras[extra])]:
        req = Requirement(spec)
        if req.name in CALENDAR:
            continue
        assert any(s.operator in ("<", "<=", "==", "~=") for s in req.specifier), \
            f"{spec}: no upper bound (a new major version would be installed untested)"
