"""The layering holds (docs/architecture.md): flows -> tasks, models -> xylent.

- ``xylent/`` (the core) imports neither ``flows`` nor Prefect, nor tasks/models;
- ``tasks/`` and ``models/`` never import ``flows`` or Prefect;
- ``models/`` takes two things from ``tasks``: the shard loader contract and the
  audit's adversary (pure NumPy state that lives inside the training ranks);
- nothing imports the CLI (``flows/cli.py`` is the top of the stack);
- no module patches ``sys.path``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("xylent", "tasks", "models", "flows")


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append(node.module)
    return out


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _top(name: str) -> str:
    return name.split(".")[0]


MODELS_FROM_TASKS = {"tasks.shards.loader", "tasks.audit.adversary"}
FORBIDDEN = {
    "xylent": {"flows", "tasks", "models", "prefect", "prefect_ray", "prefect_dask"},
    "tasks": {"flows", "prefect", "prefect_ray", "prefect_dask"},
    "models": {"flows", "prefect", "prefect_ray", "prefect_dask"},
}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_upper_ones(package):
    bad = [f"{p.relative_to(ROOT)} imports {name}" for p in _modules(package) for name in _imports(p)
           if _top(name) in FORBIDDEN[package]
           and not (package == "models" and name in MODELS_FROM_TASKS)]
    assert not bad, "\n".join(bad)


def test_models_take_only_the_loader_and_the_adversary_from_tasks():
    used = {name for p in _modules("models") for name in _imports(p) if _top(name) == "tasks"}
    assert used <= MODELS_FROM_TASKS, used


def test_only_pretrain_and_evaluate_use_models_and_evaluate_only_loads_exports():
    uses = {(str(p.relative_to(ROOT)), name) for p in _modules("tasks") for name in _imports(p)
            if _top(name) == "models"}
    assert uses and all(u.startswith(("tasks/pretrain/", "tasks/evaluate/", "tasks/finetune/")) for u, _ in uses), uses
    evaluate = {name for u, name in uses if u.startswith("tasks/evaluate/")}
    # exports only: the plug-out encoder, and VECO's plug-in model read back from the same folder
    assert evaluate and evaluate <= {"models.pretrained", "models.config", "models.veco_plug_in"}, evaluate
    finetune = {name for u, name in uses if u.startswith("tasks/finetune/")}  # evaluate's fine-tuning: heads only
    assert finetune and finetune <= {"models.heads"}, finetune


def test_nothing_imports_the_cli_and_nobody_patches_sys_path():
    for package in PACKAGES:
        for p in _modules(package):
            text = p.read_text(encoding="utf-8")
            assert "sys.path.insert" not in text and "sys.path.append" not in text, p
            if p != ROOT / "flows" / "cli.py":
                assert "flows.cli" not in _imports(p), p


def test_core_tasks_and_models_import_without_prefect():
    """Importing every module below the flows layer loads no Prefect at all."""
    mods = [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for pkg in ("xylent", "tasks", "models") for p in _modules(pkg)]
    code = ("import importlib, sys\n"
            f"for m in {mods!r}:\n    importlib.import_module(m)\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('prefect', 'flows'))\n"
            "print(len(bad), bad[:5])\nsys.exit(1 if bad else 0)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]


def test_every_stage_is_declared_once_with_a_callable_body_and_a_docs_page():
    from flows.registry import STAGE_FLOWS, STAGES

    assert [f.stage for f in STAGE_FLOWS] == STAGES
    for flow_obj, stage in zip(STAGE_FLOWS, STAGES):
        assert callable(stage.body) and flow_obj.name == stage.name
        assert stage.version and stage.reads and stage.description
        page = ROOT / "docs" / "stages" / f"{stage.name}.md"
        assert page.exists(), f"{stage.name} has no docs page"
        assert "architecture.md" in page.read_text(), f"{page.name} does not link the stage contract"
