"""Packages for an install: xylent/ as it is, and the checkout's top-level flows/, tasks/ and models/
as xylent.flows, xylent.tasks and xylent.models (metadata: pyproject.toml)."""

from setuptools import find_packages, setup

SUBPACKAGES = ("flows", "tasks", "models")  # as xylent/__init__.py's finder maps them in a checkout

setup(
    packages=find_packages(include=["xylent", "xylent.*"])
    + [f"xylent.{p}" for p in find_packages(include=[f"{s}{tail}" for s in SUBPACKAGES for tail in ("", ".*")])],
    package_dir={f"xylent.{s}": s for s in SUBPACKAGES},
)
