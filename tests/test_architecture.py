"""The layering holds (docs/architecture.md): flows -> tasks, models -> xylent's core.

- ``xylent/`` (the core) imports neither ``flows`` nor Prefect, nor tasks/models -- but its command line
  (``xylent/cli.py``, the top of the stack, and ``xylent/__main__.py``), which runs the flows;
- ``tasks/`` and ``models/`` never import ``flows`` or Prefect;
- ``models/`` imports nothing from ``tasks``: what the ranks read of the data stages' outputs
  (the loader, the shards' and sampling tables' contracts) is ``xylent/data/``, below both;
- no import cycle inside ``tasks/`` or ``models/``, and no stage imports a stage that
  runs after it in the pipeline;
- nothing imports the CLI (``xylent/cli.py`` is the top of the stack);
- no module patches ``sys.path``;
- flows/, tasks/ and models/ are imported as ``xylent.flows``, ``xylent.tasks`` and ``xylent.models`` only
  (an install puts them inside the xylent package; tests/test_install.py).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from xylent import SUBPACKAGES  # flows, tasks, models: xylent.flows, xylent.tasks, xylent.models

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("xylent", "tasks", "models", "flows")


def _top(name: str) -> str:
    """The layer of a module: flows, tasks or models for xylent.<that>, else its top-level package."""
    parts = name.split(".")
    return parts[1] if parts[0] == "xylent" and len(parts) > 1 and parts[1] in SUBPACKAGES else parts[0]


def _imports(path: Path) -> list[str]:
    return [name for name, _ in _imports_at(path)]


def _imports_at(path: Path) -> list[tuple[str, int]]:
    """Every module a file imports, at module level or inside a function (a deferred import is
    still a dependency), with its line; ``from a import b`` gives ``a.b`` where ``a.b`` is a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno))
            out += [(f"{node.module}.{a.name}", node.lineno) for a in node.names
                    if f"{node.module}.{a.name}" in _MODULES]
    return out


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("xylent",) * (parts[0] in SUBPACKAGES) + parts).removesuffix(".__init__")


_MODULES = {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _graph(packages: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """module -> {module of ours it imports: line}, for the modules of ``packages``."""
    out: dict[str, dict[str, int]] = {}
    for name, path in _MODULES.items():
        if _top(name) not in packages:
            continue
        deps = out.setdefault(name, {})
        for imported, line in _imports_at(path):
            while imported and imported not in _MODULES:  # ``a.b.func`` -> ``a.b``
                imported = imported.rpartition(".")[0]
            if imported and imported != name and _top(imported) in packages and not name.startswith(imported + "."):
                deps.setdefault(imported, line)
    return out


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


RANKS_READ = {"sampling", "shards"}  # stages whose output contract is xylent/data/<stage>.py: the ranks read it
FORBIDDEN = {
    "xylent": {"flows", "tasks", "models", "prefect", "prefect_ray", "prefect_dask"},
    "tasks": {"flows", "prefect", "prefect_ray", "prefect_dask"},
    "models": {"flows", "tasks", "prefect", "prefect_ray", "prefect_dask"},
}


COMMAND_LINE = ("xylent/cli.py", "xylent/__main__.py")  # the top of the stack, in the core's folder (DESIGN.md)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_upper_ones(package):
    bad = [f"{p.relative_to(ROOT)} imports {name}" for p in _modules(package) for name in _imports(p)
           if _top(name) in FORBIDDEN[package] and str(p.relative_to(ROOT)) not in COMMAND_LINE]
    assert not bad, "\n".join(bad)


def test_no_import_cycle_inside_tasks_or_models():
    """A deferred import inside a function counts: it only hides the cycle from Python."""
    graph = _graph(("tasks", "models"))
    found = _cycles(graph)
    assert not found, "\n".join(
        "import cycle: " + ", ".join(f"{a} imports {b} ({_MODULES[a].relative_to(ROOT)}:{graph[a][b]})"
                                     for a in comp for b in comp if b in graph[a]) for comp in found)


def test_no_stage_imports_a_downstream_stage():
    """``tasks/<stage>/`` may read the stages before it in the pipeline (their data contracts),
    never one after it; shared code lives below the stages (``xylent/``, ``models/``)."""
    from xylent.flows.registry import STAGE_NAMES

    order = {name: i for i, name in enumerate(STAGE_NAMES)}
    stage_of = {name: name.split(".")[2] for name in _MODULES if _top(name) == "tasks" and name.count(".") >= 2}
    bad = []
    for module, deps in _graph(("tasks",)).items():
        me = stage_of.get(module)
        for dep, line in deps.items():
            them = stage_of.get(dep)
            if me in order and them in order and order[them] > order[me]:
                bad.append(f"{_MODULES[module].relative_to(ROOT)}:{line} imports {dep}: stage '{them}' runs after "
                           f"'{me}'")
    assert not bad, "\n".join(bad)
    assert set(stage_of.values()) <= set(order) | {"versions"}, "every folder of tasks/ is a stage"


def _task_modules_imported(path: Path) -> list[tuple[str, int]]:
    """The modules of tasks/ a file imports: ``from xylent.tasks.x import run`` is ``xylent.tasks.x.run``, a name
    that is not a module (``from xylent.tasks.x.run import f``) is its module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if _top(a.name) == "tasks"]
        elif isinstance(node, ast.ImportFrom) and node.module and _top(node.module) == "tasks":
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in _MODULES]
            out += [(m, node.lineno) for m in subs or [node.module]]
    return out


def test_a_stage_flow_enters_its_stage_through_run_and_reads_others_through_their_contract():
    """flows/<stage>.py calls its stage through ``tasks/<stage>/run.py`` (which holds, or imports from a
    sibling, every name the flow calls) and reads an upstream stage's output through that stage's
    ``contract.py``: a stage's other modules can be split or renamed without touching its flow."""
    from xylent.flows.registry import STAGE_NAMES

    bad = []
    for stage in STAGE_NAMES:
        for module, line in _task_modules_imported(ROOT / "flows" / f"{stage}.py"):
            if module == f"xylent.tasks.{stage}.run" or module.endswith(".contract"):
                continue
            bad.append(f"flows/{stage}.py:{line} imports {module}: call it through tasks/{stage}/run.py"
                       + ("" if module.startswith(f"xylent.tasks.{stage}.") else " (another stage's output: its contract.py)"))
    assert not bad, "\n".join(bad)


def test_model_code_never_imports_the_training_package():
    """models/ holds what is trained and exported; models/training/ what trains it (the trainer, its
    settings, optimizer, per-step inputs and metrics, the audit's DRO side): the arrow points one way."""
    bad = [f"{p.relative_to(ROOT)} imports {name}" for p in _modules("models")
           if "training" not in p.relative_to(ROOT).parts for name in _imports(p)
           if name.startswith("xylent.models.training")]
    assert not bad, "\n".join(bad)


def test_only_the_training_stages_and_evaluate_use_models_and_evaluate_only_loads_exports():
    uses = {(str(p.relative_to(ROOT)), name) for p in _modules("tasks") for name in _imports(p)
            if _top(name) == "models"}
    assert uses and all(u.startswith(("tasks/pretrain/", "tasks/audit/", "tasks/evaluate/")) for u, _ in uses), uses
    # the audit: its adversary's settings and state, and the χ² solver the adversary runs in the ranks
    audit = {name for u, name in uses if u.startswith("tasks/audit/")}
    assert audit <= {"xylent.models.training.audit.adversary", "xylent.models.training.audit.dro",
                     "xylent.models.training.run_config"}, audit
    finetune = {name for u, name in uses if u.startswith("tasks/evaluate/finetune/")}
    evaluate = {name for u, name in uses if u.startswith("tasks/evaluate/")} - finetune
    # exports only: the plug-out encoder, and VECO's plug-in model read back from the same folder
    assert evaluate and evaluate <= {"xylent.models.pretrained", "xylent.models.config", "xylent.models.veco_plug_in"}, evaluate
    # evaluate's fine-tuning: the task heads, and the rank conventions its DeepSpeed ranks share with pretrain's
    assert finetune and finetune <= {"xylent.models.heads", "xylent.models.training.rank"}, finetune


def test_nothing_imports_the_cli_and_nobody_patches_sys_path():
    for package in PACKAGES:
        for p in _modules(package):
            text = p.read_text(encoding="utf-8")
            assert "sys.path.insert" not in text and "sys.path.append" not in text, p
            if p not in (ROOT / "xylent" / "cli.py", ROOT / "xylent" / "__main__.py"):
                assert "xylent.cli" not in _imports(p), p


def test_flows_tasks_and_models_are_imported_only_inside_the_xylent_namespace():
    """``import models`` would work from a checkout's root and load a second copy of every module
    beside ``xylent.models``'s (and a user's own ``models`` would shadow it once installed)."""
    tracked = subprocess.run(["git", "ls-files", "*.py", "*.sh"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    bad = []
    for rel in tracked:
        path = ROOT / rel
        if path.suffix == ".py":
            names = _imports_at(path)
        else:  # shell scripts run python -c / heredocs
            names = [(m.split()[1], i) for i, line in enumerate(path.read_text().splitlines(), 1)
                     for m in [line.strip()] if m.startswith(("from ", "import ")) and len(m.split()) > 1]
        bad += [f"{rel}:{line} imports {name}" for name, line in names if name.split(".")[0] in SUBPACKAGES]
    assert not bad, "\n".join(bad)


def test_core_tasks_and_models_import_without_prefect():
    """Importing every module below the flows layer loads no Prefect at all."""
    mods = [_module_name(p) for pkg in ("xylent", "tasks", "models") for p in _modules(pkg)
            if str(p.relative_to(ROOT)) not in COMMAND_LINE]
    code = ("import importlib, sys\n"
            f"for m in {mods!r}:\n    importlib.import_module(m)\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'prefect' or m.startswith('xylent.flows'))\n"
            "print(len(bad), bad[:5])\nsys.exit(1 if bad else 0)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]


def test_a_training_rank_imports_no_polars_spec_tracking_or_orchestration():
    """What a rank program imports must exist on a bare GPU image (issue 37's check carries
    DeepSpeed and pydantic as wheels; polars would not fit the bundle): the loader's table
    readers (xylent/data/) use pyarrow."""
    code = ("import os, sys\nos.environ['DS_ACCELERATOR'] = 'cpu'\nimport xylent.models.training.trainer\n"
            "bad = sorted({m.split('.')[0] if m.split('.')[0] != 'xylent' else m for m in sys.modules\n"
            "              if m.split('.')[0] in ('polars', 'mlflow', 'prefect', 'flows', 'matplotlib')\n"
            "              or m.startswith(('xylent.spec', 'xylent.flows'))})\n"
            "print(bad)\nsys.exit(1 if bad else 0)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]


def test_every_stage_is_declared_once_with_a_callable_body_and_a_docs_page():
    from xylent.flows.registry import STAGE_FLOWS, STAGES

    assert [f.stage for f in STAGE_FLOWS] == STAGES
    for flow_obj, stage in zip(STAGE_FLOWS, STAGES):
        assert callable(stage.body) and flow_obj.name == stage.name
        assert stage.version and stage.reads and stage.description
        page = ROOT / "docs" / "stages" / f"{stage.name}.md"
        assert page.exists(), f"{stage.name} has no docs page"
        assert "architecture.md" in page.read_text(), f"{page.name} does not link the stage contract"


def test_every_stage_has_what_the_adding_a_stage_checklist_asks_for():
    """docs/architecture.md's "How to add a stage", item by item, for every declared stage: its
    logic folder, its flow file, its Prefect deployment, its spec section when it reads one of
    its own name, its docs page, its row in the data-contract table naming files that exist.  And
    every stage folder has one shape: ``run.py`` (the stage's logic), ``contract.py`` (file names,
    schemas, readers: the row's first file; ``xylent/data/<stage>.py`` for the outputs the training
    ranks read) and an ``__init__.py`` that only re-exports."""
    import re

    import yaml

    from xylent.flows.registry import STAGES
    from xylent.spec import Spec

    deployments = {d["entrypoint"] for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]}
    contracts = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        if m := re.match(r"^\| (\w+) \| .* \| (.*) \|$", line):
            contracts[m.group(1)] = re.findall(r"`((?:tasks|models|xylent)/[\w/]+\.py)`", m.group(2))
    for stage in STAGES:
        name = stage.name
        assert (ROOT / "tasks" / name / "__init__.py").exists(), f"{name}: no tasks/{name}/ folder"
        assert (ROOT / "flows" / f"{name}.py").exists(), f"{name}: no flows/{name}.py"
        assert f"flows/{name}.py:{name}" in deployments, f"{name}: no deployment in prefect.yaml"
        if name in stage.reads:
            assert name in Spec.model_fields, f"{name} reads a spec section '{name}' that Spec does not have"
        assert (ROOT / "docs" / "stages" / f"{name}.md").exists(), f"{name}: no docs/stages/{name}.md"
        assert contracts.get(name), f"{name}: no row in docs/architecture.md's data-contract table"
        missing = [f for f in contracts[name] if not (ROOT / f).exists()]
        assert not missing, f"{name}'s contract names files that do not exist: {missing}"
        home = f"xylent/data/{name}.py" if name in RANKS_READ else f"tasks/{name}/contract.py"
        assert contracts[name][0] == home, f"{name}: its row names {contracts[name][0]} first, not {home}"
        assert (ROOT / "tasks" / name / "run.py").exists(), f"{name}: no tasks/{name}/run.py"
        init = ast.parse((ROOT / "tasks" / name / "__init__.py").read_text())
        defined = [n.name for n in init.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert not defined, f"tasks/{name}/__init__.py defines {defined}: move them to a module and re-export them"
