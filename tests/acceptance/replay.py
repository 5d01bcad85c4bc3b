"""Refactors without the acceptance tier's hours (issue 62, item 8): a change to code that an
acceptance claim hashes (tests/acceptance/claims.py) but that alters no arithmetic proves it
with a short replay on the machine that measured the claim, and the claim's result then stands
for the new tree.

For every stale result: the base is the commit it records (or the first commit after it on
HEAD's first-parent history whose files are the ones it hashed), checked out in a git worktree
under a temporary folder.  Both trees run the same short workloads with their own code (the CLI
with cwd and PYTHONPATH the tree), side by side:

- ``electra``: data_specs/demo.yaml's pretraining (ELECTRA, MRTD + TRTD) for N steps, a
  checkpoint at the end;
- ``audit``: the demo's audit (DRO) for N steps from that pretraining;
- ``infoxlm``: data_specs/recipes/infoxlm.yaml's pretraining for N steps;
- ``evaluate``: the evaluate stage on each model trained above (the demo's tasks, its fine-tuning cut
  to one epoch of one seed; the recipe's as they are),

and every number they leave must be the same bits: each metrics.jsonl line (but its
wall-clock fields, :data:`TIMING_FIELDS`), every tensor and value of the final DeepSpeed
checkpoint (model states, optimizer states, client state, RNG states; not the DeepSpeed config
it records, :data:`CHECKPOINT_SETTINGS`), the published model's
tensors, the audit's tables and adversary state where they are numbers, every number of the
evaluate stage's scores.json (a number only the tree has is new, not a change: counted, allowed).  Then each stale
result keeps its figures, thresholds, pass or fail, machine and run time, takes the tree's
code hashes and records the replay (:func:`tests.acceptance.claims.carry`), and
docs/acceptance.md is re-rendered.  Any difference refuses (exit 1) naming the first differing
field or tensor and by how much: the arithmetic changed, run `make acceptance`.

    python -m tests.acceptance.replay [--base COMMIT] [--steps N] [--check] [--work DIR]

What it proves: the N replayed steps compute the same bits as the measured code, on this CPU
model, at this thread count (``OMP_NUM_THREADS`` as given, else DeepSpeed's launcher's
default, as `make acceptance` runs), and the same scores from the evaluate stage on those models.
What it does not: the later steps of a change that only acts late (a schedule past step N), an
evaluate change that acts only on the measured models (it scores N-step ones), the planted audit's
corpus builder (never run here: it may change only in comments, docstrings and the names of moved
modules, compared as parsed Python), or a change of the specs' values (data_specs/ is compared as
parsed YAML: comments may change, values may not).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import datetime as _dt
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.acceptance import claims
from xylent import SUBPACKAGES  # tasks.x in a base tree from before 2026-12-06 is xylent.tasks.x

# metrics.jsonl fields that measure the clock, not the arithmetic: never compared
TIMING_FIELDS = frozenset({"step_seconds", "tokens_per_second", "mfu", "peak_memory_gb"})
# what a checkpoint holds that is a setting, not a result: DeepSpeed's config as the engine saw it (a key added that
# does nothing, torch_autocast off, is no arithmetic; one that does something shows in the tensors)
CHECKPOINT_SETTINGS = ("ds_config",)
# the audit's files compared as numbers, beside every parquet table (train.json and _manifest.json hold paths and times)
NUMERIC_JSON = ("adversary.json",)
DATA_STAGES = ("download", "prepare", "dedup", "vocab", "sampling", "shards")
# what the data stages run: the same in both trees, they are built once (by the base) and read by both.  Not the
# shards' reader and the launch (training's, replayed), nor the spec's code: a change there that reaches a data
# stage changes its fingerprint, and the tree whose fingerprint differs builds that stage itself
DATA_CODE = ["tasks/__init__.py", "tasks/versions.py", *(f"tasks/{s}/" for s in DATA_STAGES),
             ":(exclude)xylent/data/loader.py", "xylent/", ":(exclude)xylent/spec/", ":(exclude)xylent/launch.py",
             "flows/", "data_specs/demo.yaml", "pyproject.toml"]
DEMO, INFOXLM = "data_specs/demo.yaml", "data_specs/recipes/infoxlm.yaml"
WORKLOADS = ("electra", "audit", "infoxlm", "evaluate")
# what only the evaluate workload runs, and what the claims hash that no workload runs (a change there needs
# `make acceptance`)
EVALUATE_CODE = ("tasks/evaluate/", "xylent/spec/evaluate.py", "xylent/spec/finetune_hparams.yaml")
NOT_REPLAYED = ("tests/audit_planted.py",)
DEFAULT_STEPS = 60  # each training workload's: the three, both trees side by side, about 4 minutes on 2 cores (2026-12-06)


class Refused(Exception):
    """The replay cannot stand for the claim: its message says why and what to run instead."""


# -- the base tree ------------------------------------------------------------------------------


def _git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd or claims.ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def _diff(a: dict, b: dict) -> list[str]:
    return sorted(p for p in set(a) | set(b) if a.get(p) != b.get(p))


def base_commit(claim: str, result: dict, forced: str | None = None) -> str:
    """The commit whose files are exactly those ``result`` hashed: ``forced`` (--base), else the
    recorded commit, else the first of its descendants on HEAD's first-parent history that has them
    (a result carried by a replay hashes the tree it was carried to, committed later).  The files
    compared are those the claim hashes now and those the result hashed, so a claim whose list moved
    on (a file moved to another folder) still finds the tree it was measured on."""
    want = result["code_files"]
    paths = [*claims.CLAIMS[claim]["code"], *want]
    if forced:
        sha = _git("rev-parse", "--verify", f"{forced}^{{commit}}")
        found = claims.files_at(sha, paths)
        if found != want:
            raise Refused(f"{claim}: --base {forced} does not hold the files its result hashed "
                          f"({', '.join(_diff(found, want)[:6])} differ)")
        return sha
    recorded = result.get("commit", "")
    try:
        recorded = _git("rev-parse", "--verify", f"{recorded}^{{commit}}")
    except subprocess.CalledProcessError:
        raise Refused(f"{claim}: its result records commit {recorded!r}, which this repository does not have: "
                      "run `make acceptance`") from None
    later = _git("rev-list", "--first-parent", "--reverse", "--ancestry-path", f"{recorded}..HEAD").split()
    for sha in [recorded, *later]:
        if claims.files_at(sha, paths) == want:
            return sha
    raise Refused(f"{claim}: neither {recorded[:10]} nor any later commit on HEAD's first-parent history holds the "
                  "files its result hashed (recorded on a tree with uncommitted changes?): run `make acceptance`, "
                  "or name the base with --base")


# modules moved inside the namespace, the old name to the new (a move is no arithmetic): 2026-12-06, what trains a
# model went below models/training/
MOVED = {f"models.{m}": f"models.training.{m}"
         for m in ("trainer", "run_config", "optim", "rank", "step_inputs", "step_metrics", "audit")}


def _same_program(old: str | None, new: str | None) -> bool:
    """True when two Python sources differ at most in comments, docstrings and the names of modules that
    moved: into the xylent namespace (``from tasks.x import f`` and ``from xylent.tasks.x import f``, the
    string ``"tasks.x"`` and ``"xylent.tasks.x"``), or inside it (:data:`MOVED`): the same statements on
    the same objects."""
    def unprefixed(name: str) -> str:
        head, _, rest = name.partition(".")
        name = rest if head == "xylent" and rest.split(".")[0] in SUBPACKAGES else name
        for was, now in MOVED.items():
            if name == was or name.startswith(was + "."):
                return now + name[len(was):]
        return name

    def tree(text: str):
        module = ast.parse(text)
        for node in ast.walk(module):
            body = getattr(node, "body", None)
            if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                    and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]
            if isinstance(node, ast.ImportFrom) and node.module:
                node.module = unprefixed(node.module)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    alias.name = unprefixed(alias.name)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                node.value = " ".join(unprefixed(w) for w in node.value.split(" "))
        return ast.dump(module)

    if old is None or new is None:
        return old == new
    try:
        return tree(old) == tree(new)
    except SyntaxError:
        return False


def _unprovable(claim: str, sha: str, then: dict[str, str], now: dict[str, str]) -> list[str]:
    """The claim's changed files whose effect a short replay cannot show: code it never runs (unless
    only its comments and docstrings changed), and specs whose values changed (it overrides the steps,
    so 1500 steps or an lr changed are not its to prove; a comment is)."""
    import yaml

    from xylent.spec.loading import current_path

    def parsed(text: str | None):
        """The YAML's values under the fields' current names (a field renamed: the same value, moved)."""
        data = None if text is None else yaml.safe_load(text)
        for name, section in (data.items() if isinstance(data, dict) else ()):
            if isinstance(section, dict):
                data[name] = {current_path(f"{name}.{k}").split(".", 1)[1]: v for k, v in section.items()}
        return data

    def at_base(p: str) -> str | None:
        try:
            return _git("show", f"{sha}:{p}")
        except subprocess.CalledProcessError:
            return None

    out = []
    evaluated = "evaluate" in claims.CLAIMS[claim].get("replay", WORKLOADS)
    for p in _diff(then, now):
        if p.startswith(EVALUATE_CODE) and evaluated:
            continue  # the evaluate workload runs it
        if p.startswith(NOT_REPLAYED + EVALUATE_CODE):
            new = (claims.ROOT / p).read_text() if (claims.ROOT / p).exists() else None
            if not (p.endswith(".py") and _same_program(at_base(p), new)):
                out.append(f"{p} (the replay never runs it)")
        elif p.endswith((".yaml", ".yml")):
            new = (claims.ROOT / p).read_text() if (claims.ROOT / p).exists() else None
            if parsed(at_base(p)) != parsed(new):
                out.append(f"{p} (its values changed)")
    return out


# -- running a tree ------------------------------------------------------------------------------


@dataclass
class Run:
    """One tree's replay: where it runs, with what, and the output folders of the stages it trained."""
    name: str
    tree: Path
    home: Path
    api: str  # the Prefect server both trees' runs report to
    outputs: dict[str, Path] = field(default_factory=dict)  # "electra pretrain" -> the stage's output folder
    calls: int = 0
    cli_module: str = "xylent.cli"  # own_code finds the tree's

    @property
    def ws(self) -> Path:
        return self.home / "ws"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "XYLENT_"))}
        # the tree's own code: PYTHONPATH is searched before the venv's editable finder (checked by own_code);
        # the ranks get the tree on theirs from xylent/launch.py, which finds it from its own __file__
        env.update(PYTHONPATH=str(self.tree), PYTHONHASHSEED="0", PREFECT_API_URL=self.api)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # two trees side by side: idle threads sleep, same bits
        return env

    def own_code(self) -> None:
        """Refuse unless this tree's processes import this tree's packages -- as ``xylent.flows``, ... (the
        namespace since 2026-12-06), or as top-level ``flows``, ... in a base tree from before it."""
        for prefix in ("xylent.", ""):
            mods = [f"{prefix}{m}" for m in ("flows", "models", "tasks")] + ["xylent"]
            probe = ("import importlib, json\n"
                     f"print(json.dumps({{m: importlib.import_module(m).__file__ for m in {mods!r}}}))")
            r = subprocess.run([sys.executable, "-c", probe], cwd=self.tree, env=self.env(), capture_output=True,
                               text=True)
            if r.returncode != 0:
                continue
            wrong = {k: v for k, v in json.loads(r.stdout).items()
                     if not Path(v).resolve().is_relative_to(self.tree.resolve())}
            if not wrong:
                # the command line's module where this tree keeps it: xylent/cli.py, before that flows/kit/cli.py
                self.cli_module = ("xylent.cli" if (self.tree / "xylent" / "cli.py").is_file()
                                   else f"{prefix}flows.kit.cli")
                return
        raise Refused(f"the {self.name} tree's processes import its packages from outside {self.tree} "
                      "(the venv's editable install wins over PYTHONPATH): the replay would compare one tree "
                      "with itself")

    def cli(self, *args: str) -> dict:
        self.calls += 1
        self.home.mkdir(parents=True, exist_ok=True)
        log = self.home / f"cli-{self.calls}"
        cmd = [sys.executable, "-m", self.cli_module, *args, "--workspace", str(self.ws), "--json"]
        with open(f"{log}.out", "w") as out, open(f"{log}.err", "w") as err:
            rc = subprocess.run(cmd, cwd=self.tree, env=self.env(), stdout=out, stderr=err).returncode
        if rc != 0:
            tail = Path(f"{log}.err").read_text()[-3000:]
            raise RuntimeError(f"{self.name} tree: `xylent {' '.join(args)}` exited {rc}:\n{tail}")
        return json.loads(Path(f"{log}.out").read_text())

    def link_data(self, source: Path) -> None:
        """Each published data-stage output of ``source`` linked into this workspace, one by one: a
        stage this tree fingerprints differently is built here, beside the links, never into ``source``."""
        for stage in DATA_STAGES:
            (self.ws / stage).mkdir(parents=True, exist_ok=True)
            for out in (source / stage).resolve().iterdir():
                if (out / "_manifest.json").exists():
                    (self.ws / stage / out.name).symlink_to(out, target_is_directory=True)

    def train(self, workloads: tuple[str, ...], steps: int, log) -> None:
        """Each workload's stages, forced; the stages compared must be computed here."""
        sets = ["--set", f"pretrain.steps={steps}", "--set", f"pretrain.checkpoint_every={steps}"]
        calls = []
        if "audit" in workloads:  # trains the demo's pretraining first, in the same call: one CLI start fewer
            calls.append((DEMO, "audit", [*sets, "--set", f"audit.steps={steps}"],
                          {"pretrain": "electra pretrain", "audit": "audit"}))
        elif "electra" in workloads:
            calls.append((DEMO, "pretrain", sets, {"pretrain": "electra pretrain"}))
        if "infoxlm" in workloads:
            calls.append((INFOXLM, "pretrain", sets, {"pretrain": "infoxlm pretrain"}))
        if "evaluate" in workloads:  # after the training calls: their stages are the ones it reads, cached
            for spec, name in ((DEMO, "electra"), (INFOXLM, "infoxlm")):
                if name in workloads or (name == "electra" and "audit" in workloads):
                    calls.append((spec, "evaluate", [*sets, "--set", f"audit.steps={steps}",
                                                     *_short_finetuning(self.tree / spec)],
                                  {"evaluate": f"{name} evaluate"}))
        for spec, stage, extra, names in calls:
            force = ["--force"] if stage != "evaluate" else []  # evaluate: on the model just trained, not a new one
            got = self.cli("run", stage, "--spec", str(self.tree / spec), *force, *extra)["stages"]
            if stage == "evaluate" and not got["pretrain"]["cached"]:
                raise RuntimeError(f"{self.name} tree: evaluate trained a model of its own, not the replayed one")
            for st, name in names.items():
                if got[st]["cached"]:
                    raise RuntimeError(f"{self.name} tree: {name} was reused from an earlier run, not trained")
                self.outputs[name] = Path(got[st]["output_dir"])
            rebuilt = [s for s in DATA_STAGES if s in got and not got[s]["cached"]]
            if rebuilt:
                log(f"replay: the {self.name} tree built {', '.join(rebuilt)} itself (not linked, or fingerprinted "
                    "differently from the linked data)")


def _short_finetuning(spec: Path) -> list[str]:
    """``--set evaluate.tasks=...``: the spec file's own tasks with fine-tuning cut to one epoch of its
    first seed (the code they run is the same; the demo's 3 seeds x 20 epochs would be most of the
    replay); nothing when the file lists no fine-tuned task."""
    import yaml

    tasks = (yaml.safe_load(spec.read_text()).get("evaluate") or {}).get("tasks") or []
    if not any(t.get("finetune") for t in tasks):
        return []
    short = [{**t, "finetune": {**t["finetune"], "epochs": 1, "seeds": t["finetune"].get("seeds", [1])[:1]}}
             if t.get("finetune") else t for t in tasks]
    return ["--set", f"evaluate.tasks={json.dumps(short)}"]


# -- comparing bits ------------------------------------------------------------------------------


@dataclass
class Compared:
    """What one part of the replay compared, and its first difference (None: the same bits)."""
    part: str
    counts: dict[str, int] = field(default_factory=dict)
    first: str | None = None
    differing: list[str] = field(default_factory=list)  # where, in order: the first few say what moved

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def differ(self, where: str, detail: str) -> None:
        if self.first is None:
            self.first = f"{self.part}: {where}: {detail}"
        self.differing.append(where)


def _ordered(bits: int, width: int) -> int:
    """A float's bits as an integer that counts ulps (sign-magnitude to two's complement)."""
    return bits if bits >= 0 else -(1 << (8 * width - 1)) - bits


def _float_detail(a: float, b: float) -> str:
    ua, ub = (_ordered(struct.unpack("<q", struct.pack("<d", x))[0], 8) for x in (a, b))
    rel = abs(a - b) / max(abs(a), abs(b)) if a != b and max(abs(a), abs(b)) > 0 else 0.0
    return f"{a!r} (base) vs {b!r} (this tree): |diff| {abs(a - b):.3g} (relative {rel:.2g}), {abs(ua - ub)} ulps " \
           "(float64)"


def _tensor_detail(a, b) -> str:
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype} {tuple(a.shape)} (base) vs {b.dtype} {tuple(b.shape)} (this tree)"
    if not a.is_floating_point():
        n = int((a != b).sum())
        return f"{n} of {a.numel()} elements differ, max |diff| {(a.long() - b.long()).abs().max().item()}"
    ia, ib = (t.contiguous().view(getattr(torch, f"int{8 * t.element_size()}")).long() for t in (a, b))
    lo = -(1 << (8 * a.element_size() - 1))
    oa, ob = (torch.where(i >= 0, i, lo - i) for i in (ia, ib))
    ulps = (oa - ob).abs()
    n = int((ulps != 0).sum())
    diff = (a.double() - b.double()).abs()
    return (f"{n} of {a.numel()} elements differ, max |diff| {diff.nan_to_num(float('inf')).max().item():.3g}, "
            f"max {ulps.max().item()} ulps ({a.dtype})")


def _same_tensor(a, b) -> bool:
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():  # bits, not values: NaN equals its own bits, -0.0 differs from 0.0
        kind = getattr(torch, f"int{8 * a.element_size()}")
        return torch.equal(a.contiguous().view(kind), b.contiguous().view(kind))
    return torch.equal(a, b)


def compare_values(a, b, where: str, out: Compared) -> None:
    """Walk two loaded objects (dicts, lists, tensors, arrays, numbers, objects' attributes) and
    note the first place their bits differ."""
    import numpy as np
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        out.count("tensors")
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or not _same_tensor(a, b):
            out.differ(where, _tensor_detail(a, b) if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                       else f"{type(a).__name__} (base) vs {type(b).__name__} (this tree)")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        compare_values(torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(np.ascontiguousarray(b)), where,
                       out)
    elif isinstance(a, dict) and isinstance(b, dict):
        for k in a:  # in the base's order, so that "first" is the first in the file
            if k in b:
                compare_values(a[k], b[k], f"{where}/{k}", out)
            else:
                out.differ(f"{where}/{k}", "in the base only")
        for k in b.keys() - a.keys():
            out.differ(f"{where}/{k}", "in this tree only")
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            out.differ(where, f"{len(a)} items (base) vs {len(b)} (this tree)")
        for i, (x, y) in enumerate(zip(a, b)):
            compare_values(x, y, f"{where}[{i}]", out)
    elif isinstance(a, float) and isinstance(b, float):
        out.count("values")
        if struct.pack("<d", a) != struct.pack("<d", b):
            out.differ(where, _float_detail(a, b))
    elif isinstance(a, (int, float, str, bytes, bool, type(None))) or isinstance(b, (int, float, str, bytes, bool)):
        out.count("values")
        if type(a) is not type(b) or a != b:
            out.differ(where, f"{a!r} (base) vs {b!r} (this tree)")
    elif type(a) is type(b) and hasattr(a, "__dict__"):  # e.g. DeepSpeed's LossScaler in the optimizer states
        compare_values(vars(a), vars(b), where, out)
    else:
        out.count("values")
        if repr(a) != repr(b):
            out.differ(where, f"{a!r} (base) vs {b!r} (this tree)")


def compare_metrics(a: Path, b: Path, out: Compared) -> None:
    """metrics.jsonl, line by line, every field but the wall-clock ones."""
    la, lb = a.read_text().splitlines(), b.read_text().splitlines()
    if len(la) != len(lb):
        out.differ("metrics.jsonl", f"{len(la)} lines (base) vs {len(lb)} (this tree)")
    for n, (x, y) in enumerate(zip(la, lb), 1):
        x, y = json.loads(x), json.loads(y)
        out.count("metrics lines")
        compare_values({k: v for k, v in x.items() if k not in TIMING_FIELDS},
                       {k: v for k, v in y.items() if k not in TIMING_FIELDS},
                       f"metrics.jsonl line {n} (step {x.get('step')})", out)


def compare_table(a: Path, b: Path, out: Compared) -> None:
    """A parquet table's numeric and boolean columns, row by row, bit for bit (text is the report's)."""
    import polars as pl

    ta, tb = pl.read_parquet(a), pl.read_parquet(b)
    numeric = [c for c, t in ta.schema.items() if t.is_numeric() or t == pl.Boolean]
    if ta.height != tb.height:
        out.differ(a.name, f"{ta.height} rows (base) vs {tb.height} (this tree)")
    for c in numeric:
        if c not in tb.columns:
            out.differ(f"{a.name}[{c}]", "in the base only")
            continue
        out.count("table cells", ta.height)
        x, y = ta[c], tb[c]
        same = x.dtype == y.dtype and x.is_null().equals(y.is_null())
        if same:
            xs, ys = x.to_numpy(), y.to_numpy()
            same = xs.dtype == ys.dtype and xs.tobytes() == ys.tobytes()
        if not same:
            rows = [i for i, (p, q) in enumerate(zip(x.to_list(), y.to_list()))
                    if not (p == q or (p != p and q != q))]
            at = rows[0] if rows else 0
            p, q = x[at], y[at]
            detail = _float_detail(float(p), float(q)) if isinstance(p, float) and isinstance(q, float) else \
                f"{p!r} (base) vs {q!r} (this tree)"
            out.differ(f"{a.name}[{c}] row {at}", f"{detail}; {len(rows)} rows differ")
    for c in set(tb.columns) - set(ta.columns):
        if tb.schema[c].is_numeric():
            out.differ(f"{a.name}[{c}]", "in this tree only")


def _last_checkpoint(output: Path) -> Path:
    """The newest complete checkpoint of a stage's run: ``<ws>/<stage>/_checkpoints/<fingerprint>/``."""
    done = sorted(output.parent.glob(f"_checkpoints/{output.name}/**/step-*/COMPLETE"))
    if not done:
        raise RuntimeError(f"no complete checkpoint under {output.parent / '_checkpoints' / output.name}")
    return max((p.parent for p in done), key=lambda p: p.name)


def compare_scores(part: str, a: Path, b: Path) -> Compared:
    """Every number of the base's scores.json, the same bits in this tree's; what only this tree
    scores (a new task, a new field) is counted as added, not a difference."""
    out = Compared(part)
    base, tree = (json.loads((d / "scores.json").read_text()) for d in (a, b))

    def known(x, y):  # y pruned to x's keys, wherever both are dicts
        if isinstance(x, dict) and isinstance(y, dict):
            out.count("added values", sum(1 for k in y if k not in x))
            return {k: known(x[k], v) for k, v in y.items() if k in x}
        if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            return [known(p, q) for p, q in zip(x, y)]
        return y

    compare_values(base, known(base, tree), "scores.json", out)
    return out


def compare_stage(part: str, a: Path, b: Path) -> Compared:
    """Every number a trained stage leaves: metrics, the final checkpoint, the published model, and
    (the audit's) tables and adversary state."""
    import torch
    from safetensors.torch import load_file

    out = Compared(part)
    if (a / "metrics.jsonl").exists() or (b / "metrics.jsonl").exists():
        compare_metrics(a / "metrics.jsonl", b / "metrics.jsonl", out)
    ca, cb = _last_checkpoint(a), _last_checkpoint(b)
    if ca.name != cb.name:
        out.differ("checkpoint", f"{ca.name} (base) vs {cb.name} (this tree)")
    files = sorted({p.name for p in ca.glob("*.pt")} | {p.name for p in cb.glob("*.pt")})
    for name in files:
        load = [torch.load(d / name, map_location="cpu", weights_only=False) if (d / name).exists() else None
                for d in (ca, cb)]
        for state in load:
            for key in CHECKPOINT_SETTINGS if isinstance(state, dict) else ():
                state.pop(key, None)
        out.count("checkpoint files")
        compare_values(load[0], load[1], f"{ca.name}/{name}", out)
    for rel in sorted({p.relative_to(a) for p in a.glob("**/*.safetensors")} |
                      {p.relative_to(b) for p in b.glob("**/*.safetensors")}):
        if not ((a / rel).exists() and (b / rel).exists()):
            out.differ(str(rel), "in one tree only")
            continue
        out.count("model files")
        compare_values(load_file(a / rel), load_file(b / rel), str(rel), out)
    for rel in sorted({p.relative_to(a) for p in a.glob("*.parquet")}):
        out.count("tables")
        if not (b / rel).exists():
            out.differ(str(rel), "in the base only")
            continue
        compare_table(a / rel, b / rel, out)
    for name in NUMERIC_JSON:
        if (a / name).exists() or (b / name).exists():
            out.count("json files")
            compare_values(*(json.loads((d / name).read_text()) if (d / name).exists() else None for d in (a, b)),
                           name, out)
    return out


# -- the replay ------------------------------------------------------------------------------------


def stale_claims() -> dict[str, dict]:
    """claim -> its committed result, for every result whose code hash is not the tree's."""
    out = {}
    for claim in claims.CLAIMS:
        path = claims.RESULTS / f"{claim}.json"
        if path.exists():
            result = json.loads(path.read_text())
            if result.get("code_hash") != claims.code_hash(claims.code_files(claim)):
                out[claim] = result
    return out


def _machine_problems(stale: dict[str, dict]) -> list[str]:
    here = claims.cpu_model()
    return [f"{claim} was measured on {r['machine'].get('cpu', 'an unrecorded CPU')!r} and this machine is {here!r}: "
            "training's bits are the same on one CPU model only, so a replay here proves nothing about that "
            "measurement; replay on that machine, or run `make acceptance`"
            for claim, r in stale.items() if r.get("machine", {}).get("cpu") != here]


def _base_run_key(sha: str, workloads: tuple[str, ...], steps: int, data: Path | None) -> dict:
    return {"commit": sha, "workloads": list(workloads), "steps": steps, "data": str(data) if data else "own",
            "threads": os.environ.get("OMP_NUM_THREADS", "launcher"), "cpu": claims.cpu_model(),
            "python": sys.executable}


@contextlib.contextmanager
def _prefect_api():
    """The Prefect server the runs report to: the environment's, else one for the replay's length
    (each CLI would start its own, two at a time on a fresh database: slow, and under load late)."""
    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # its heartbeat, and the errors it logs
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


def replay_base(sha: str, current: Path, work: Path, workloads: tuple[str, ...], steps: int,
                data: Path | None, api: str, log=print) -> tuple[list[Compared], dict]:
    """Run the workloads in a worktree of ``sha`` and in ``current``, side by side, and compare.  The
    base's run is kept in ``work`` and reused by a later call with the same key (the current tree's
    never is)."""
    base = Run("base", work / f"tree-{sha[:12]}", work / f"base-{sha[:12]}", api)
    cur = Run("current", current, work / "current", api)
    key = _base_run_key(sha, workloads, steps, data)
    done = base.home / "DONE.json"
    reuse = done.exists() and json.loads(done.read_text())["key"] == key
    shutil.rmtree(cur.home, ignore_errors=True)
    if not reuse:
        shutil.rmtree(base.home, ignore_errors=True)
    if base.tree.exists():  # a replay killed before it removed its worktree
        subprocess.run(["git", "worktree", "remove", "--force", str(base.tree)], cwd=claims.ROOT, capture_output=True)
        shutil.rmtree(base.tree, ignore_errors=True)
    _git("worktree", "add", "--detach", "--force", str(base.tree), sha)
    try:
        for run in (base, cur):
            run.own_code()
        shared = data is None and claims.tree_files(DATA_CODE, base.tree) == claims.tree_files(DATA_CODE, current)
        how = f"from {data}" if data else "built once, shared" if shared else "built in each tree (their code differs)"
        log(f"replay: base {sha[:10]} ({f'its run in {base.home} reused' if reuse else 'trained now'}), this tree "
            f"{current}; {steps} steps of {', '.join(workloads)}; data stages {how}")
        ready = threading.Event()

        def run_base():
            try:
                if reuse:
                    base.outputs = {k: Path(v) for k, v in json.loads(done.read_text())["outputs"].items()}
                    return
                if data:
                    base.link_data(data)
                else:
                    base.cli("run", "pipeline", "--until", "shards", "--spec", str(base.tree / DEMO))
                ready.set()
                base.train(workloads, steps, log)
                done.write_text(json.dumps({"key": key, "outputs": {k: str(v) for k, v in base.outputs.items()}}))
            finally:
                ready.set()

        def run_current():
            if data or shared:
                ready.wait()
                if not (base.ws / "shards").exists():
                    raise RuntimeError("the base tree's data stages did not build")
                cur.link_data(data or base.ws)
            else:
                cur.cli("run", "pipeline", "--until", "shards", "--spec", str(current / DEMO))
            cur.train(workloads, steps, log)

        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            jobs = [pool.submit(run_base), pool.submit(run_current)]
            for job in jobs:
                job.result()
        log(f"replay: trained in {time.monotonic() - start:.0f} s")
        parts = [(compare_scores if name.endswith(" evaluate") else compare_stage)(
            name, base.outputs[name], cur.outputs[name]) for name in cur.outputs]
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base.tree)], cwd=claims.ROOT, capture_output=True)
        subprocess.run(["git", "worktree", "prune"], cwd=claims.ROOT, capture_output=True)
    return parts, {"threads": key["threads"]}


def _to_commit(claim: str, files: dict[str, str]) -> tuple[str, str]:
    head = _git("rev-parse", "HEAD")
    return (head if claims.files_at(head, claims.CLAIMS[claim]["code"]) == files else "working tree"), head


def replay(*, base: str | None = None, steps: int = DEFAULT_STEPS, check: bool = False, work: Path | None = None,
           workloads: tuple[str, ...] = WORKLOADS, data: Path | None = None, log=print) -> int:
    """The whole replay (see the module's doc); 0 when every stale result was carried (or would be,
    with ``check``) or none is stale, 1 when refused or the bits differ."""
    stale = stale_claims()
    if not stale:
        log("replay: every committed acceptance result is current; nothing to replay")
        return 0
    try:
        problems = _machine_problems(stale)
        if problems:
            raise Refused("\n".join(problems))
        files = {claim: claims.code_files(claim) for claim in stale}  # the tree as the replay runs it
        bases: dict[str, list[str]] = {}
        blockers = []  # what no replay can carry: refused before training, or with --check reported after it
        for claim, result in stale.items():
            sha = base_commit(claim, result, base)
            cannot = _unprovable(claim, sha, result["code_files"], files[claim])
            if cannot:
                blockers.append(f"{claim}: {'; '.join(cannot)}: run `make acceptance`")
            # which workloads exercise the claim (all three unless it says: the test's toy claim trains one);
            # --check may try fewer, a result is carried only by all of its own
            needs = set(claims.CLAIMS[claim].get("replay", WORKLOADS)) - set(workloads)
            if needs:
                blockers.append(f"{claim}: carrying its result needs the workloads {', '.join(sorted(needs))} too")
            bases.setdefault(sha, []).append(claim)
        if blockers and not check:
            raise Refused("\n".join(blockers))
        keep = work is not None
        work = Path(work or tempfile.mkdtemp(prefix="xylent-replay-")).resolve()
        work.mkdir(parents=True, exist_ok=True)
        try:
            verdicts = {}
            with _prefect_api() as api:
                for sha, group in bases.items():
                    log(f"replay: {', '.join(group)} (measured at {stale[group[0]]['commit'][:10]}, base {sha[:10]})")
                    verdicts[sha] = replay_base(sha, claims.ROOT, work, workloads, steps, data, api, log)
        finally:
            if not keep:
                shutil.rmtree(work, ignore_errors=True)
    except Refused as exc:
        log(f"replay refused: {exc}")
        return 1
    differ = False
    for sha, (parts, _) in verdicts.items():
        for p in parts:
            counts = ", ".join(f"{n} {what}" for what, n in p.counts.items())
            log(f"  {p.part}: {'the same bits' if p.first is None else 'DIFFERS'} ({counts})")
            if p.first:
                some = ", ".join(dict.fromkeys(w.rsplit("/", 1)[-1] for w in p.differing))
                log(f"    first difference: {p.first}\n    {len(p.differing)} differ in all; by name: {some[:600]}")
            differ |= p.first is not None
    if differ:
        log("replay: the arithmetic changed; the results stay as they are: run `make acceptance`")
    if blockers:  # only with --check: without, they refused before training
        log(f"replay --check: {'and ' if differ else 'the same bits, but '}it would refuse:\n" + "\n".join(blockers))
    if differ or blockers:
        return 1
    moved = [c for c in stale if claims.code_files(c) != files[c]]
    if moved:
        log(f"replay refused: {', '.join(_diff(claims.code_files(moved[0]), files[moved[0]])[:6])} changed while "
            "the replay ran: replay again on a tree nobody edits")
        return 1
    if check:
        log(f"replay --check: the same bits; `make replay` would carry {', '.join(stale)} to this tree")
        return 0
    date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    for sha, group in bases.items():
        parts, extra = verdicts[sha]
        for claim in group:
            to, head = _to_commit(claim, files[claim])
            claims.carry(claim, files[claim], {
                "from_commit": sha, "to_commit": to, "head": head, "date": date,
                "machine": {"cpus": os.cpu_count(), "cpu": claims.cpu_model(), "threads": extra["threads"]},
                "steps": steps, "workloads": list(workloads),
                "compared": {p.part: p.counts for p in parts}})
            log(f"replay: {claim} carried to {to if to == 'working tree' else to[:10]}")
    claims.DOC.write_text(claims.rendered_doc())
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", help="the commit to replay against (default: the one each stale result records, "
                                   "or its first descendant holding the files it hashed)")
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                    help=f"steps of each workload (default {DEFAULT_STEPS})")
    ap.add_argument("--check", action="store_true", help="compare only: write no result and no doc")
    ap.add_argument("--work", type=Path, help="keep the runs here (default: a temporary folder, removed); a later "
                                              "replay with the same base and settings reuses the base's run")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help=f"comma-separated, of {', '.join(WORKLOADS)} (default: all)")
    ap.add_argument("--data", type=Path, help="a workspace whose data stages both trees read (default: built here)")
    args = ap.parse_args(argv)
    workloads = tuple(w for w in args.workloads.split(",") if w)
    unknown = set(workloads) - set(WORKLOADS)
    if unknown or not workloads:
        ap.error(f"--workloads: {', '.join(unknown) or 'none given'}; choose from {', '.join(WORKLOADS)}")
    return replay(base=args.base, steps=args.steps, check=args.check, work=args.work, workloads=workloads,
                  data=args.data, log=lambda s: print(s, flush=True))


if __name__ == "__main__":
    sys.exit(main())
