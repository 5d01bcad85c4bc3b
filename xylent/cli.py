"""The ``xylent`` command line: the top of the stack (it runs flows; nothing imports it, and no module of
xylent/ but this one reaches up into flows/).

Exit codes: 0 success, 2 a user error (bad spec, bad input, unreachable URL:
the message says what, where and what to do), 1 a bug (with its traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shlex
import sys
import tempfile
import traceback
from pathlib import Path

from xylent.flows.kit.processes import quiet_console, quiet_user_errors

quiet_console(sys.argv)  # before Prefect is imported: its console handler reads its level once

from xylent.flows.registry import STAGE_NAMES, STAGES  # noqa: E402  (declarations only: no Prefect, no torch)
from xylent.errors import XylentError, environment_error  # noqa: E402
from xylent.stage import find_stage, stage_fingerprints, workspace_for  # noqa: E402
from xylent.tracking import tracking_source, tracking_uri_for  # noqa: E402
from xylent.workspace import read_manifest  # noqa: E402


class _SpecSet(argparse.Action):
    """compare's ``--set``: an override of the ``--spec`` before it (that spec's runs were made with it)."""

    def __call__(self, parser, namespace, value, option_string=None):
        if not namespace.specs:
            parser.error("--set overrides the --spec before it: write --spec FILE --set KEY=VALUE")
        sets = dict(getattr(namespace, self.dest) or {})  # a new dict: argparse's default is shared
        i = len(namespace.specs) - 1
        sets[i] = [*sets.get(i, []), value]
        setattr(namespace, self.dest, sets)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xylent", description="Cross-lingual encoder pretraining pipeline.")
    sub = p.add_subparsers(dest="command", required=True)

    def spec_args(sp):
        sp.add_argument("--spec", required=True, help="YAML spec, e.g. data_specs/demo.yaml")
        sp.add_argument("--workspace", help="output folder or s3:// / gs:// / az://bucket/prefix "
                        "(default: the spec's 'workspace', else ./workspace)")
        sp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a spec field, e.g. --set prepare.min_chars=5 (repeatable)")
        sp.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
        sp.add_argument("--verbose", "-v", action="store_true",
                        help="also print Prefect's and MLflow's INFO logs (a line per task) on the console")

    run = sub.add_parser("run", help="run one stage (and whatever it needs) or the whole pipeline")
    run.add_argument("target", metavar="STAGE|pipeline", help=f"one of {', '.join(STAGE_NAMES)}, or pipeline")
    spec_args(run)
    run.add_argument("--force", action="store_true",
                     help="recompute the named stage (with 'pipeline': every stage) even if cached")
    run.add_argument("--until", metavar="STAGE", help="with 'pipeline': stop after this stage (e.g. shards)")
    sub.add_parser("stages", help="list the stages in pipeline order")
    status = sub.add_parser("status", help="per stage: fingerprint, cached or not, output folder, MLflow run")
    spec_args(status)
    verify = sub.add_parser("verify", help="check every published stage output against its manifest "
                            "(each file's size and sha256); exit 2 naming what changed")
    spec_args(verify)
    cmp = sub.add_parser("compare", help="several specs' published runs side by side: every task score beside "
                         "random-init's, and how pretraining ended against its trivial peers (Markdown)")
    cmp.add_argument("--spec", dest="specs", action="append", required=True, metavar="SPEC",
                     help="a spec whose evaluate stage has run (repeat for each run to compare)")
    cmp.add_argument("--set", dest="spec_sets", action=_SpecSet, default=None, metavar="KEY=VALUE",
                     help="an override the --spec before it ran with (repeatable; {seed} is each seed of --seeds), "
                     "e.g. --spec metaxlm-phase2.yaml --set 'pretrain.init.from=models:/phase1-seed{seed}/latest'")
    cmp.add_argument("--workspace", help="for every spec (default: each spec's own 'workspace')")
    cmp.add_argument("--seeds", type=int, nargs="+", metavar="N",
                     help="compare over these seeds: each spec's runs under --set seed=N; mean ± sd per task and "
                     "every claim's paired difference with its interval (tasks/evaluate/paired.py)")
    cmp.add_argument("--claim", dest="claims", action="append", default=[], metavar="A:B",
                     help="with --seeds: also measure run A's encoder minus run B's (names: the spec files "
                     "without .yaml); each run is always measured against its peers and the first --spec")
    cmp.add_argument("--out", help="also write the table to this file")
    cmp.add_argument("--json", action="store_true", help="print the numbers as JSON instead")
    worker = sub.add_parser("worker", help="Prefect's process worker for the deployments (checks PREFECT_API_URL "
                            "first; XYLENT_HOME defaults to this checkout)")
    worker.add_argument("--pool", default=os.environ.get("XYLENT_POOL", "xylent"), help="work pool (default xylent)")
    worker.epilog = "Any other option is passed to `prefect worker start` (e.g. --limit 2, --run-once)."
    hf = sub.add_parser("export-hf", help="write an exported xylent model/ dir as a Hugging Face transformers dir "
                        "(AutoModel & co. with trust_remote_code=True; fast tokenizer)")
    hf.add_argument("model_dir", help="an xylent model/ dir, e.g. workspace/pretrain/<fingerprint>/model")
    hf.add_argument("out_dir", help="the folder to write: new, empty, or an earlier export (replaced whole)")
    hf.add_argument("--replace", action="store_true", help="replace out_dir even when it holds something else")
    return p


def _check_export_target(out: Path, replace: bool) -> None:
    """export-hf replaces its folder whole: never a published stage output (or a folder inside
    one), and a folder holding anything but an earlier export only when asked."""
    out = out.resolve()
    for folder in (out, *out.parents):
        if (folder / "_manifest.json").is_file():
            raise XylentError("the Hugging Face dir would replace part of a published stage output",
                              where=str(folder), fix="choose a folder outside the workspace's stage outputs")
    if out.exists() and not out.is_dir():
        raise XylentError("the Hugging Face dir is a file", where=str(out), fix="choose a new or empty folder")
    if replace or not out.is_dir() or not any(out.iterdir()):
        return
    try:
        earlier = json.loads((out / "config.json").read_text(encoding="utf-8")).get("model_type") == "xylent"
    except (OSError, ValueError, AttributeError):
        earlier = False
    if not earlier:
        raise XylentError("the folder holds files and is not an earlier Hugging Face export of an xylent model; "
                          "export-hf replaces the folder whole", where=str(out),
                          fix="choose a new or empty folder, or add --replace to replace it and everything in it")


def _outputs(spec_file: str, overrides: list[str], workspace: str | None, fetch: bool = True):
    """(stage, fingerprint, output folder, manifest or None) for every stage of the spec."""
    from xylent.spec import load_spec

    spec = load_spec(spec_file, overrides)
    ws = workspace_for(spec, workspace)
    for name, fp in stage_fingerprints(STAGES, spec, ws).items():
        out = ws.output_dir(name, fp)
        yield name, fp, out, ws.manifest(out, fetch=fetch)


def _compare(args) -> dict:
    from xylent.tasks.evaluate.compare import read_run, seed_table, table

    def run_of(spec: str, overrides: list[str], label: str, rerun: str) -> dict:
        outputs = {name: (out, manifest) for name, _, out, manifest in _outputs(spec, overrides, args.workspace)}
        if outputs["evaluate"][1] is None:  # not published (absent, or never finished): not read
            raise XylentError(f"{label}: the evaluate stage has no published scores for this spec",
                              where=str(outputs["evaluate"][0]), fix=f"run it first: {rerun}")
        published = {name: out if manifest is not None else None for name, (out, manifest) in outputs.items()}
        return read_run(label, published["evaluate"], published.get("pretrain"), rerun)

    if args.claims and not args.seeds:
        raise XylentError("--claim needs --seeds: a claim is measured over seeds", fix="add --seeds 0 1 2")

    def given(i: int, seed: int | None) -> list[str]:
        sets = (args.spec_sets or {}).get(i, [])
        if seed is None:
            return sets
        return [o.replace("{seed}", str(seed)) for o in sets] + [f"seed={seed}"]

    def command(spec: str, sets: list[str]) -> str:
        return " ".join([f"xylent run evaluate --spec {spec}", *(f"--set {shlex.quote(o)}" for o in sets)])

    if args.seeds:
        if len(set(args.seeds)) != len(args.seeds):
            raise XylentError(f"--seeds must be distinct, got {args.seeds}", fix="name each seed once")
        groups = []
        for i, spec in enumerate(args.specs):
            runs = {s: run_of(spec, given(i, s), f"{Path(spec).stem} (seed {s})", command(spec, given(i, s)))
                    for s in args.seeds}
            groups.append({"label": Path(spec).stem, "objective": next(iter(runs.values()))["objective"],
                           "runs": runs})
        claims = []
        for claim in args.claims:
            a, sep, b = claim.partition(":")
            if not (sep and a and b):
                raise XylentError(f"--claim {claim!r} is not A:B", fix="e.g. --claim infoxlm:mlm (A minus B)")
            claims.append((a, b))
        markdown, differences = seed_table(groups, claims)
        result = {"groups": groups, "differences": differences, "markdown": markdown}
    else:
        runs = [run_of(spec, given(i, None), Path(spec).stem, command(spec, given(i, None)))
                for i, spec in enumerate(args.specs)]
        result = {"runs": runs, "markdown": table(runs)}
    if args.out:
        Path(args.out).write_text(result["markdown"], encoding="utf-8")
    return result


def _status(args) -> dict:
    return {"stages": {name: {"output_dir": str(out), "fingerprint": fp, "cached": manifest is not None,
                              "mlflow_run_id": manifest.get("mlflow_run_id") if manifest else None}
                       for name, fp, out, manifest in _outputs(args.spec, args.overrides, args.workspace,
                                                               fetch=False)}}


def _verify(args) -> dict:
    from xylent.manifest import MANIFEST
    from xylent.workspace import check_files

    def problems(name: str, out: Path, manifest: dict | None) -> list[str]:
        if manifest is not None:
            return check_files(out, manifest, full=True)
        if (out / MANIFEST).exists():  # there, but not a manifest ([] or {} or garbage): never trusted
            return [f"{MANIFEST}: not a manifest (damaged or replaced); the output is not used: rebuild it with "
                    f"xylent run {name} --force"]
        return []

    return {"stages": {name: {"output_dir": str(out), "published": manifest is not None,
                              "files": len(manifest.get("files", [])) if manifest else 0,
                              "problems": problems(name, out, manifest)}
                       for name, _, out, manifest in _outputs(args.spec, args.overrides, args.workspace)}}


def _run(args) -> dict:
    target = args.target
    if target != "pipeline":
        find_stage(STAGES, target)
        if args.until is not None:
            raise XylentError("--until only goes with 'pipeline'", fix=f"xylent run pipeline --until {target}")
    elif args.until is not None:  # '' too: an empty name is a mistake, not "run everything"
        find_stage(STAGES, args.until)
    from xylent.spec import load_spec

    spec = load_spec(args.spec, args.overrides)
    root = workspace_for(spec, args.workspace).root  # a bad spec stops here
    store = tracking_uri_for(root, spec.tracking.tracking_uri)  # and a workspace its store cannot live in
    from xylent.flows.kit.preflight import check_run_environment, check_workspace

    where = tracking_source(spec.tracking.tracking_uri)
    check_workspace(Path(root), tuple(STAGE_NAMES), own_store=where is None)
    check_run_environment(store, where)
    from xylent.flows.kit.progress import console, say

    with console():  # a line per stage as it starts and ends, heartbeats in long work: ours come first
        say(f"run {target}{f' --until {args.until}' if args.until else ''}: spec {spec.name}, workspace {root}")
        return _run_flows(args, target, root, store)


def _run_flows(args, target: str, root: Path, store: str) -> dict:
    from xylent.flows.kit.processes import run_log, start_prefect_server

    server_ready = start_prefect_server()
    # while the server starts: the flow, and MLflow's store that every stage's tracker opens
    if target == "pipeline":
        from xylent.flows.pipeline import pipeline as run
    else:
        from xylent.flows.registry import stage_flow_of

        run = stage_flow_of(target)
    from xylent.tracking import import_store

    import_store(store)
    server_ready()
    kwargs = {"spec_file": args.spec, "workspace": args.workspace, "overrides": args.overrides, "force": args.force}
    from prefect import tags
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

    # Prefect pickles every failed flow's exception into its result storage (~/.prefect/storage by default),
    # outside the workspace and never cleaned: a CLI run's go to a folder that ends with the run (or, after a
    # kill -9, with the next run)
    _remove_results_of_dead_runs()
    with run_log(root, target) as log, tags("xylent", "cli"), \
            tempfile.TemporaryDirectory(prefix=f"{_RESULTS_PREFIX}{os.getpid()}-") as results, \
            temporary_settings({PREFECT_LOCAL_STORAGE_PATH: results}):  # a CLI run: found by its tag
        try:
            result = run(**kwargs, **({"until": args.until} if target == "pipeline" else {}))
        except BaseException as exc:  # a failed run is when its task lines are wanted: main() names the file
            if log is not None and log.exists():
                with contextlib.suppress(Exception):  # an exception type without attributes: no log line
                    exc.xylent_log_file = str(log)
            raise
    return {**result, "log_file": str(log) if log is not None and log.exists() else None}


_RESULTS_PREFIX = "xylent-prefect-results-"


def _remove_results_of_dead_runs() -> None:
    """The result folders of CLI runs killed with -9 (named by their process, which is gone)."""
    import shutil

    import psutil

    for folder in Path(tempfile.gettempdir()).glob(f"{_RESULTS_PREFIX}*"):
        pid = folder.name.removeprefix(_RESULTS_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _print_summary(result: dict, *, ran: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    from xylent.flows.kit.run_record import headline_text

    console = Console()
    table = Table("stage", "state", "time", "headline", "fingerprint")
    for name, r in result["stages"].items():
        manifest = read_manifest(Path(r["output_dir"])) or {}
        state = "cached" if r["cached"] else ("done" if ran else "missing")
        took = f"{manifest['seconds']:.1f} s" if manifest.get("seconds") is not None and not r["cached"] else "-"
        numbers = headline_text(name, manifest.get("metrics", {}), _short)
        table.add_row(name, state, took, numbers or "-", r["fingerprint"][:16])
    console.print(table)
    # what a user copies is printed whole, below the table, never cut to the terminal's width
    for name, r in result["stages"].items():
        run = r.get("mlflow_run_id") or "-"
        console.print(f"  {name:<9} {r['output_dir']}  (MLflow run {run})", highlight=False, soft_wrap=True)
    for name, r in result["stages"].items():
        for w in r.get("warnings", []):
            console.print(f"[bold yellow]warning[/] ({name}): {w}", highlight=False, soft_wrap=True)
    if ran:
        for line in result.get("where", []):
            console.print(line, highlight=False, soft_wrap=True)


def _short(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v / 1e6:.1f}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.0f}k"
    return f"{v:.4g}"


def _where(result: dict, args) -> list[str]:
    from xylent.spec import load_spec
    from xylent.tracking import how_to_view, tracking_uri_for

    spec = load_spec(args.spec, args.overrides)
    ws = workspace_for(spec, args.workspace)
    uri = tracking_uri_for(ws.root, spec.tracking.tracking_uri)
    lines = [f"outputs:  {ws.location}" + (f" (this machine's copy: {ws.root})" if ws.remote else "")]
    lines.append(f"MLflow:   parent run {result['mlflow_parent_run_id']} in experiment '{spec.tracking.experiment}' "
                 f"({uri}); to see it, {how_to_view(uri, result.get('mlflow_parent_run_url'))}")
    if result.get("log_file"):
        lines.append(f"log:      {result['log_file']} (Prefect's lines per task; --verbose prints them here)")
    fr = result.get("prefect_flow_run_id")
    if fr:
        url = result.get("prefect_flow_run_url")
        lines.append(f"Prefect:  flow run {fr}" + (f" at {url}" if url else
                     " (recorded in the local Prefect database; `prefect server start` shows it in the UI)"))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "worker":  # only the worker passes options on (to Prefect's)
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    # Prefect's telemetry heartbeat phones home and, on the ephemeral server,
    # races the first flow run for the sqlite database ("database is locked").
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # third parties' tqdm bars (DeepSpeed's "Loading checkpoint shards" at every publish) would land
    # between the console's own lines; tqdm reads this when first imported, which the CLI has not done yet
    os.environ.setdefault("TQDM_DISABLE", "1")
    quiet_user_errors()
    try:
        if args.command == "stages":
            width = max(len(s.name) for s in STAGES)
            for s in STAGES:
                print(f"{s.name:<{width}}  {s.description}")
            return 0
        if args.command == "status":
            result = _status(args)
            if args.json:
                print(json.dumps(result, indent=2))
            else:
                _print_summary(result, ran=False)
            return 0
        if args.command == "verify":
            result = _verify(args)
            bad = {k: v for k, v in result["stages"].items() if v["problems"]}
            if args.json:
                print(json.dumps(result, indent=2))
            else:
                for name, r in result["stages"].items():
                    state = ("not built" if not r["published"] else
                             f"{len(r['problems'])} problem(s)" if r["problems"] else f"ok ({r['files']} files)")
                    print(f"{name:<9} {state}")
                    for problem in r["problems"]:
                        print(f"          {problem}")
            if bad:
                raise XylentError(f"{len(bad)} stage output(s) changed after they were published: "
                                  f"{', '.join(bad)}", where=", ".join(r["output_dir"] for r in bad.values()),
                                  fix="rebuild each: xylent run <stage> --force (same --spec/--workspace)")
            return 0
        if args.command == "compare":
            result = _compare(args)
            numbers = result.get("runs") or {k: v for k, v in result.items() if k != "markdown"}
            print(json.dumps(numbers, indent=2) + "\n" if args.json else result["markdown"], end="")
            return 0
        if args.command == "worker":
            from xylent.flows.kit.worker import start_worker

            start_worker(args.pool, extra)
        if args.command == "export-hf":
            from xylent.models.hf_export import export_hf

            _check_export_target(Path(args.out_dir), args.replace)

            print(export_hf(args.model_dir, args.out_dir))
            return 0
        result = _run(args)
        if args.json:
            print(json.dumps({"stages": result["stages"], "mlflow_parent_run_id": result["mlflow_parent_run_id"],
                              "mlflow_parent_run_url": result.get("mlflow_parent_run_url"),
                              "prefect_flow_run_id": result.get("prefect_flow_run_id"),
                              "log_file": result.get("log_file")}, indent=2))
        else:
            result["where"] = _where(result, args)
            _print_summary(result, ran=True)
        return 0
    except XylentError as exc:
        print(f"xylent: error: {exc.render()}", file=sys.stderr)
        _name_log_file(exc)
        return 2
    except KeyboardInterrupt as exc:
        print("xylent: interrupted; nothing half-written is kept (rerun to continue)", file=sys.stderr)
        _name_log_file(exc)
        return 130
    except Exception as exc:
        env = environment_error(exc, getattr(args, "workspace", None))
        if env is not None:
            print(f"xylent: error: {env.render()}", file=sys.stderr)
            _name_log_file(exc)
            return 2
        traceback.print_exc()
        print("xylent: internal error (a bug): please report it with the traceback above", file=sys.stderr)
        _name_log_file(exc)
        return 1


def _name_log_file(exc: BaseException) -> None:
    if log := getattr(exc, "xylent_log_file", None):
        print(f"  log: {log} (every task's lines of this run)", file=sys.stderr)


def entry() -> None:
    """The console script.  A run leaves an interpreter holding Prefect, MLflow and SQLAlchemy:
    the full garbage collections of Python's teardown walk all of it (~0.9 s on 2 cores) and
    free nothing a user needs; frozen objects are left out of them.  Every exit
    handler still runs."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
