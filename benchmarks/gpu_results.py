"""Back here after the GPU check (benchmarks/gpu_check.py): unpack the model it returned and
evaluate it with the held-out tasks of ``data_specs/gpu-check.yaml``, beside random-init and
bag-of-subwords of the same architecture and tokenizer.

    .venv/bin/python benchmarks/gpu_results.py OUT      # OUT: what the device tool brought back

The peers need the pipeline's pretrain output (its architecture and tokenizer), so this
machine trains the same spec for one step, which is random-init up to one update; the
GPU-trained encoder is evaluated as a model on disk (``evaluate.models``' path form), never
passed off as this machine's pretrain.  Writes benchmarks/results/gpu_check.json: the check's
own record (its device named) and the scores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

import harness  # noqa: E402
from xylent.tasks.evaluate.contract import read_scores  # noqa: E402

SPEC = REPO / "data_specs" / "gpu-check.yaml"


def unpack(out: Path, dest: Path) -> Path:
    """model.tar.part-* -> dest/model and dest/snapshots/ (the parts are one tar cut for the device tool's
    file size limit); returns dest/model."""
    parts = sorted(out.glob("model.tar.part-*"))
    if not parts:
        sys.exit(f"gpu_results: {out} holds no model.tar.part-*: the check exported no model (see gpu_check.json)")
    dest.mkdir(parents=True, exist_ok=True)
    tar = dest / "model.tar"
    with open(tar, "wb") as f:
        for p in parts:
            f.write(p.read_bytes())
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="data")
    tar.unlink()
    return dest / "model"


RESULT = "gpu_results"
# what each learning task's loss is read against: the loss a model with no learning gets
PEER_LOSS = {"discriminator_loss": ("discriminator_base_loss", "base rate"),
             "generator_loss": ("generator_unigram_loss", "unigram"),
             "contrast_loss": ("contrast_chance_loss", "chance"),
             "loss": ("unigram_loss", "unigram")}
TRAINED = "gpu-trained"


def merge(path: Path, run: dict) -> dict:
    """Every GPU check run so far, one entry per check (a rerun of gpu_results replaces its own entry)."""
    old = json.loads(path.read_text()) if path.is_file() else {}
    runs = [r for r in old.get("runs", []) if r["check"]["started"] != run["check"]["started"]]
    runs = sorted([*runs, run], key=lambda r: r["check"]["started"])
    return {"benchmark": RESULT, "quick": False, "runs": runs}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the folder the GPU check wrote (as brought back)")
    ap.add_argument("--spec", default=str(SPEC))
    ap.add_argument("--workspace", default=None, help="default: the spec's")
    ap.add_argument("--results", default=str(harness.RESULTS))
    ap.add_argument("--commit", default=None,
                    help="the commit the device ran (default: the bundle's, else this checkout's HEAD)")
    ap.add_argument("--device-command", default=None,
                    help="gpu_check.sh's arguments after OUT (default: as the check recorded them)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    check = json.loads((out / "gpu_check.json").read_text())
    model = unpack(out, REPO / "workspace-gpu-check" / "returned" / check["started"].replace(":", ""))
    models = json.dumps([{"name": TRAINED, "kind": "xylent", "path": str(model)}, "random-init",
                         "bag-of-subwords"])
    # the peers: this spec with the check's own --set overrides (the model's shape, say); the objective does not
    # change the encoder's architecture, so random-init is the same whichever recipe trained the returned model
    argv = check.get("argv", [])
    sets = [a for flag, a in zip(argv, argv[1:]) if flag == "--set"]
    cmd = [sys.executable, "-m", "xylent.cli", "run", "evaluate", "--spec", args.spec, "--json",
           *[x for s in sets for x in ("--set", s)],
           "--set", "pretrain.steps=1", "--set", "pretrain.checkpoint_every=1", "--set", "pretrain.warmup_steps=0",
           "--set", f"evaluate.models={models}", *(["--workspace", args.workspace] if args.workspace else [])]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"gpu_results: evaluate failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    evaluate_dir = Path(json.loads(done.stdout)["stages"]["evaluate"]["output_dir"])
    scores = read_scores(evaluate_dir)
    curve = snapshot_curve(check, model.parent / "snapshots", cmd, scores, Path(args.spec))
    command = args.device_command or " ".join(check.get("argv", ["?"])[1:])
    commit = args.commit or ((check.get("bundle") or {}).get("git") or harness.git_state())["commit"]
    run = {"commit": commit, "device_command": command, "evaluated": harness.environment(), "check": check,
           "evaluate": {"output_dir": str(evaluate_dir), "command": " ".join(cmd[2:]),
                        "averages": {m: {t: r["avg"] for t, r in tasks.items()}
                                     for m, tasks in scores["models"].items()},
                        # the retrieval tasks with the surface a translator copies stripped: what the verdict reads
                        "stripped": {m: {t: r["stripped"]["avg"] for t, r in tasks.items() if "stripped" in r}
                                     for m, tasks in scores["models"].items()},
                        # what each score is read against beyond the peers: the layer, every layer, the majority
                        "details": {m: {t: {k: r[k] for k in ("layer", "by_layer", "majority_baseline") if k in r}
                                        for t, r in tasks.items()} for m, tasks in scores["models"].items()},
                        **({"curve": curve} if curve else {})}}
    path = Path(args.results) / f"{RESULT}.json"
    path.write_text(json.dumps(merge(path, run), indent=1) + "\n")
    print(json.dumps(run["evaluate"]["averages"], indent=1))
    return run


def snapshot_curve(check: dict, snapshots: Path, cmd: list[str], scores: dict, spec_file: Path) -> dict | None:
    """The returned snapshots (pretrain.snapshot_tokens; bf16 weights) evaluated on the retrieval tasks, then
    xylent.tasks.evaluate.curve's curve with the final model and the peers of the main evaluation."""
    from xylent.spec import load_spec
    from xylent.tasks.evaluate.curve import KINDS, learning_curve

    found = sorted(((json.loads((d / "config.json").read_text())["snapshot"], d) for d in snapshots.glob("tokens-*")),
                   key=lambda x: x[0]["tokens"])
    if not found:
        return None
    sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set" and not cmd[i + 1].startswith("evaluate.")]
    spec = load_spec(spec_file, sets)
    tasks = [t.model_dump(mode="json", exclude_defaults=True) for t in spec.evaluate.tasks if t.kind in KINDS]
    names = {f"{TRAINED} at {info['tokens']} tokens": (info, d) for info, d in found}
    refs = [{"name": n, "kind": "xylent", "path": str(d)} for n, (_, d) in names.items()]
    drop = {i for i, a in enumerate(cmd) if a.startswith("evaluate.models=")}
    snap_cmd = [a for i, a in enumerate(cmd) if i not in drop and i + 1 not in drop]
    snap_cmd += ["--set", f"evaluate.models={json.dumps(refs)}", "--set", f"evaluate.tasks={json.dumps(tasks)}"]
    done = subprocess.run(snap_cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"gpu_results: evaluating the snapshots failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    snap_scores = read_scores(Path(json.loads(done.stdout)["stages"]["evaluate"]["output_dir"]))
    learn = check["learning"]
    final = {"step": learn["checkpoint_step"], "tokens": int(learn["metrics"]["tokens_total"])}
    models = {("pipeline" if m == TRAINED else m): r for m, r in scores["models"].items()}
    return learning_curve([(names[n][0], r) for n, r in snap_scores["models"].items()], final, models)


# ---------------------------------------------------------------- docs/records/benchmarks.md (benchmarks/render.py)

def _learned(metrics: dict) -> str:
    """Each task's final loss beside the loss of its no-learning peer."""
    parts = []
    for key, value in sorted(metrics.items()):
        if not key.startswith("final.") or "/" not in key:
            continue
        task, name = key[len("final."):].split("/", 1)
        if name in PEER_LOSS and f"final.{task}/{PEER_LOSS[name][0]}" in metrics:
            peer_key, peer = PEER_LOSS[name]
            parts.append(f"{task} {name.replace('_loss', '')} {value:.3f} vs {peer} "
                         f"{metrics[f'final.{task}/{peer_key}']:.3f}")
    return "; ".join(parts) or "–"


def _verdict(evaluate: dict) -> str:
    """Above which trivial peers: the untrained models and, for a classifier, the majority class
    (a retrieval task read on its stripped variant where the run has one)."""
    stripped = evaluate.get("stripped") or {}
    avg = {m: {**tasks, **stripped.get(m, {})} for m, tasks in evaluate["averages"].items()}
    trained = avg[TRAINED]
    peers = {m: avg[m] for m in avg if m != TRAINED}
    peers["majority class"] = {t: d.get("majority_baseline") for t, d in evaluate["details"][TRAINED].items()}
    tasks = [t for t, v in trained.items() if v is not None]
    above = [t for t in tasks if all(p.get(t) is None or trained[t] > p[t] for p in peers.values())]
    return (f"above every trivial peer ({', '.join(peers)}) on {len(above)} of {len(tasks)} tasks"
            + (f" ({', '.join(above)})" if above else ""))


def _label(i: int, run: dict) -> str:
    """'#2 infoxlm': runs of one objective stay apart in the tables (a failed learning part has none)."""
    learn = run["check"].get("learning") or {}
    return f"#{i + 1} {learn.get('objective', 'no learning run')}"


def markdown(result: dict) -> str:
    import pretrain

    runs = result["runs"]
    env = runs[0]["check"]["environment"]
    out = [f"Lent machine: {env.get('nvidia_smi') or env['device']}; torch {env['torch']} (CUDA {env['cuda']}), "
           f"Python {env['python']}, DeepSpeed {env['deepspeed']} from the bundle's wheel. {len(runs)} check "
           f"run{'s' if len(runs) != 1 else ''}.", ""]
    # the newest benchmark only: a later check measures more sides (e.g. "no relative bias") than an earlier one
    benched = [r for r in runs if (r["check"].get("benchmark") or {}).get("rows")]
    if benched:
        out += [f"Speed rows from the check of {benched[-1]['check']['started']}:", ""]
        out += pretrain._gpu_md({"gpu": benched[-1]["check"]["benchmark"]["rows"]})
    rows = []
    for i, r in enumerate(runs):
        learn = r["check"].get("learning") or {}
        m = learn.get("metrics") or {}
        shape = learn.get("model") or {}
        rows.append([_label(i, r), f"{shape.get('layers')} × {shape.get('hidden')}",
                     learn.get("precision", "–"), f"{learn.get('minutes_allowed')} min",
                     learn.get("checkpoint_step", "–"), harness.num(m.get("tokens_total")),
                     harness.num(m.get("tokens_per_second_median")), _learned(m),
                     learn.get("failure") or ""])
    out += ["**Learning runs**: the real trainer under the DeepSpeed launcher (NCCL, bf16, ZeRO 2, one rank) on "
            "the bundle's 40-language corpus, stopped by its time box; the last complete checkpoint is exported and "
            "evaluated back here. Final losses (mean of the last logged window) beside what a model that learned "
            "nothing scores:", "",
            harness.table(["run", "model", "precision", "time box", "steps reached", "tokens", "tokens/s",
                           "final loss vs its no-learning peer", "failure"], rows), ""]
    tasks = list(runs[0]["evaluate"]["averages"][TRAINED])
    header = ["task"] + [f"{_label(i, r)}: {m}" for i, r in enumerate(runs)
                         for m in r["evaluate"]["averages"]]
    table = [[t] + [harness.num(r["evaluate"]["averages"][m].get(t)) for r in runs
                    for m in r["evaluate"]["averages"]] for t in tasks]
    out += ["**Evaluated here** (`data_specs/gpu-check.yaml`'s evaluate tasks on text the shards never saw; "
            "averages over languages: accuracy for `django-topics` (probe) and `django-topics-ft` (fine-tuned), "
            "xx→en acc@1 for the two retrieval tasks, mean pooling at the default layer, XTREME's scaled to the "
            "depth: index 4 of 4 for ELECTRA, 3 for MLM-family encoders); the peers have the same architecture and "
            "tokenizer:", "", harness.table(header, table), ""]
    stripped = [r for r in runs if any((r["evaluate"].get("stripped") or {}).values())]
    if stripped:
        header = ["task"] + [f"{_label(runs.index(r), r)}: {m}" for r in stripped for m in r["evaluate"]["stripped"]]
        names = sorted({t for r in stripped for v in r["evaluate"]["stripped"].values() for t in v})
        out += ["The retrieval tasks stripped of placeholders, numbers, URLs, markup, code names and punctuation "
                "(`xylent.tasks.evaluate.surface`; what the verdict below reads):", "",
                harness.table(header, [[t] + [harness.num(r["evaluate"]["stripped"][m].get(t)) for r in stripped
                                              for m in r["evaluate"]["stripped"]] for t in names]), ""]
    majority = {t: d["majority_baseline"] for t, d in runs[0]["evaluate"]["details"][TRAINED].items()
                if "majority_baseline" in d}
    if majority:
        out += ["Majority class (a probe that answers one label everywhere): "
                + ", ".join(f"{t} {harness.num(v)}" for t, v in majority.items()) + ".", ""]
    layers = [[f"{_label(i, r)}: {m}", t]
              + [harness.num(v) for _, v in sorted(d["by_layer"].items(), key=lambda kv: int(kv[0]))]
              for i, r in enumerate(runs) for m, tasks in r["evaluate"]["details"].items() if m != "bag-of-subwords"
              for t, d in tasks.items() if d.get("by_layer")]
    if layers:
        width = max(len(row) for row in layers) - 2
        out += ["Retrieval at every hidden-state index (0 = the embeddings):", "",
                harness.table(["model", "task", *map(str, range(width))], layers), ""]
    for i, r in enumerate(runs):
        if r["evaluate"].get("curve"):
            from xylent.tasks.evaluate.curve import section

            out += [f"{_label(i, r)}, learning against tokens:", "", *section(r["evaluate"]["curve"])[2:]]
    out += [f"- {_label(i, r)}: the GPU-trained encoder is "
            f"{_verdict(r['evaluate'])}." for i, r in enumerate(runs)]
    faiss = runs[-1]["check"].get("faiss") or {}
    out += ["", f"GPU faiss: {'present' if faiss.get('present') else 'not measured: ' + faiss.get('why', '?')}."]
    return "\n".join(out)


def provenance(result: dict) -> str:
    runs = result["runs"]
    commits = sorted({(r.get("commit") or "unknown")[:7] for r in runs})
    ev = runs[-1]["evaluated"]["machine"]
    started = ", ".join(r["check"]["started"] for r in runs)
    cmds = "; ".join(f"`gpu_check.sh OUT {r['device_command']}`".replace(" `", "`") for r in runs)
    return (f"*Run on the lent GPU at {started} (commit {', '.join(commits)}), each once, in one command: {cmds}; "
            f"evaluated here on {ev.get('usable_cpus', '?')} CPUs with `gpu_results.py`; file "
            f"`benchmarks/results/{RESULT}.json`.*")


if __name__ == "__main__":
    main()
