"""``scorecard.md`` and the plots of the evaluate stage, from its ``scores.json``
(:mod:`xylent.tasks.evaluate.contract`, the file other tools read).  The scorecard puts every model side by side per
task (trivial baselines included: the random-init encoder, the probe's
majority class), the transfer gaps, the retrieval score of every layer, and
the papers' published numbers for reading a full-scale run against them.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import yaml

from xylent.tasks.evaluate import curve, paper_refs
from xylent.tasks.evaluate.contract import write_scores
from xylent.markdown import markdown_table, score

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

REFERENCES_FILE = Path(__file__).with_name("references.yaml")
PRIMARY = {"tatoeba": "accuracy", "bucc": "f1", "probe": "accuracy", "classification": "accuracy", "qa": "f1",
           "tagging": "f1"}
FINETUNED = ("classification", "qa", "tagging")
MAJORITY = ("probe", "classification", "tagging")  # kinds whose trivial baseline is the commonest label


def references() -> list[dict]:
    return yaml.safe_load(REFERENCES_FILE.read_text()) if REFERENCES_FILE.is_file() else []


def mlflow_metrics(result: dict) -> dict[str, float]:
    """One model's results as ``eval/<task>/<lang>/<metric>`` and ``eval/<task>/avg``."""
    out = {}
    for task, r in result.items():
        for lang, metrics in r["languages"].items():
            for m, v in metrics.items():
                if m != "n":
                    out[f"eval/{task}/{lang}/{m}"] = v
        if r["avg"] is not None:
            out[f"eval/{task}/avg"] = r["avg"]
        if "avg_sd" in r:
            out[f"eval/{task}/avg_sd"] = r["avg_sd"]
        if "transfer_gap" in r:
            out[f"eval/{task}/transfer_gap"] = r["transfer_gap"]
        for layer, v in r.get("by_layer", {}).items():
            out[f"eval/{task}/layer_{layer}/avg"] = v
        if "surface_overlap" in r:
            out[f"eval/{task}/surface_overlap"] = r["surface_overlap"]
        if "stripped" in r:
            out[f"eval/{task}/stripped/avg"] = r["stripped"]["avg"]
            for lang, metrics in r["stripped"]["languages"].items():
                out[f"eval/{task}/stripped/{lang}/accuracy"] = metrics["accuracy"]
        for k, v in r.get("diagnostics", {}).items():
            out[f"eval/{task}/diagnostics/{k}"] = v
    return out


def _cell(vals: dict, metric: str) -> str:
    """A score, with its sd over seeds when it was fine-tuned with several."""
    if vals.get(f"{metric}_sd"):
        return f"{vals[metric]:.1f} ± {vals[f'{metric}_sd']:.1f}"
    return score(vals.get(metric))


def _finetune_notes(scores: dict, name: str, models: list[str]) -> list[str]:
    lines = []
    for m in models:
        r = scores["models"][m][name]
        if r.get("not_applicable"):
            lines.append(f"- {m}: not applicable ({r['not_applicable']}).")
            continue
        seeds = ", ".join(f"seed {s}: avg {score(v['avg'])}, epoch {v['selected_epoch']} kept (dev {score(v['dev'])})"
                          for s, v in r["per_seed"].items())
        xtreme = (f"; the XTREME scorer's avg_metric over all its languages: {score(r['xtreme_avg_metric'])}"
                  if "xtreme_avg_metric" in r else "")
        lines.append(f"- {m}: {score(r['avg'])} ± {score(r.get('avg_sd'))} over seeds ({seeds}){xtreme}.")
        if "grid" in r:  # every point's mean dev (what chose) and test average (what it would have scored)
            points = "; ".join(f"{tag}{' (kept)' if tag == r['grid']['kept'] else ''}: dev {score(p['dev'])}, "
                               f"test {score(p['avg'])}" for tag, p in r["grid"]["points"].items())
            lines.append(f"  - grid of {len(r['grid']['points'])} points, kept by {r['grid']['by']}: {points}.")
    first = next((scores["models"][m][name] for m in models if "hyperparameters" in scores["models"][m][name]), None)
    if first:
        hp, grid = first["hyperparameters"], any("grid" in scores["models"][m][name] for m in models)
        skip = ("protocol", "lr", "epochs") if grid else ("protocol",)  # a grid: each model's kept point, above
        lines.append(f"- protocol {first['protocol']}; " + ", ".join(f"{k} {v}" for k, v in hp.items()
                                                                      if v is not None and k not in skip) + ".")
    return ["Fine-tuning (mean ± sd over seeds; selected on the train language's dev set only):", "", *lines, ""]


PEERS = ("random-init", "bag-of-subwords")  # the trivial models every encoder is read against
COLLAPSE_MARGIN = 0.5  # a fine-tuning seed within this many points of the majority class learned nothing


def verdict_score(r: dict) -> tuple[float | None, str]:
    """The average a task's verdict reads, and what to call it: a retrieval task's stripped variant
    where it has one (the surface a translator copies cannot win it), its plain average otherwise."""
    if "stripped" in r:
        return r["stripped"]["avg"], " stripped"
    return r.get("avg"), ""


def verdict(scores: dict) -> list[str]:
    """One line per evaluated encoder: on which tasks it does not beat a trivial peer
    (random-init, bag-of-subwords, the majority class), at the precision shown, reading each
    retrieval task's stripped variant; then every fine-tuning seed that collapsed to the
    majority class."""
    lines, collapsed = [], []
    for m, results in scores["models"].items():
        if m in PEERS:
            continue
        short, n = [], 0
        for task, r in results.items():
            avg, variant = verdict_score(r)
            if avg is None:
                continue
            n += 1
            peers = {p: verdict_score(scores["models"][p][task])[0] for p in PEERS
                     if task in scores["models"].get(p, {})}
            peers["majority class"] = r.get("majority_baseline")
            lost = [f"{p} {v:.1f}" for p, v in peers.items() if v is not None and round(avg, 1) <= round(v, 1)]
            if lost:
                short.append(f"{task}{variant} {avg:.1f} (≤ {', '.join(lost)})")
            for seed, v in (r.get("per_seed") or {}).items():
                majority = r.get("majority_baseline")
                if majority is not None and v.get("avg") is not None and v["avg"] <= majority + COLLAPSE_MARGIN:
                    # said by the numbers: a seed 7 points under the majority class is not "within 0.5" of it
                    gap = v["avg"] - majority
                    where = f"{-gap:.1f} below" if round(gap, 1) < 0 else f"within {COLLAPSE_MARGIN} of"
                    collapsed.append(f"- {m} / {task}, seed {seed}: {v['avg']:.1f}, {where} always answering the "
                                     f"majority class ({majority:.1f}): this seed scored no better than one "
                                     "label would")
        if n:
            lines.append(f"- **{m}**: " + (f"above every trivial peer on all {n} tasks." if not short else
                                            f"at or below a trivial peer on {len(short)} of {n} tasks: "
                                            + "; ".join(short) + "."))
    if not lines:
        return []
    return ["## Verdict", "", *lines, *(["", "Fine-tuning seeds no better than the majority class:", "", *collapsed]
                                       if collapsed else []), ""]


def headline_tags(scores: dict, model: str = "pipeline") -> dict[str, str]:
    """The registered version's evaluation, as the registry's page shows it: per task the model's
    average beside its trivial peers' (``eval.<task>``), and the verdict's line (``eval.verdict``)."""
    tags = {}
    for task, r in scores["models"][model].items():
        if r.get("avg") is None:
            continue
        peers = [f"{p} {scores['models'][p][task]['avg']:.1f}" for p in PEERS
                 if scores["models"].get(p, {}).get(task, {}).get("avg") is not None]
        if r.get("majority_baseline") is not None:
            peers.append(f"majority class {r['majority_baseline']:.1f}")
        tags[f"eval.{task}"] = f"{r['avg']:.1f}" + (f" ({', '.join(peers)})" if peers else "")
        if "stripped" in r:
            tags[f"eval.{task}.stripped"] = f"{r['stripped']['avg']:.1f}" + "".join(
                f", {p} {scores['models'][p][task]['stripped']['avg']:.1f}" for p in PEERS
                if "stripped" in scores["models"].get(p, {}).get(task, {}))
    line = next((ln for ln in verdict(scores) if ln.startswith(f"- **{model}**: ")), None)
    if line is not None:
        tags["eval.verdict"] = line.removeprefix(f"- **{model}**: ")
    return tags


def _recipe(scores: dict) -> list[str]:
    """What `pipeline` was trained with: its objective, and where it departs from the paper's settings."""
    if "pipeline" not in scores:  # scores written before 2026-11-27
        return []
    obj, variant = scores["pipeline"]["objective"], scores["pipeline"]["variant"]
    if not variant:
        return [f"`pipeline` is trained with `objective: {obj}` in the paper's settings.", ""]
    knobs = ", ".join(f"{k} {ours} (paper: {'its default' if paper is None else paper})"
                      for k, (paper, ours) in variant.items())
    return [f"`pipeline` is trained with `objective: {obj}` in a **variant** of the paper's settings "
            f"(`pretrain.{obj}`): {knobs}. Its scores are the variant's, not the paper's method's.", ""]


def _stripped_section(scores: dict, name: str, models: list[str]) -> list[str]:
    """The task's stripped variant beside its surface-overlap share (xylent.tasks.evaluate.surface)."""
    results = {m: scores["models"][m][name] for m in models}
    first = next((r for r in results.values() if "surface_overlap" in r), None)
    if first is None:  # scores written before 2026-12-06
        return []
    lines = [f"Surface overlap: {first['surface_overlap']:.1f} % of the pairs share a placeholder, number, URL, "
             "markup or code name with their translation. Stripped of those (and of punctuation), with the pairs "
             "left empty, identical or repeated dropped, acc@1 reads (the verdict's number):", ""]
    langs = sorted({lang for r in results.values() for lang in r.get("stripped", {}).get("languages", {})})
    if not langs:
        return lines[:1] + ["No language kept enough pairs after stripping to score.", ""]
    rows = []
    for lang in langs:
        cells = {m: r.get("stripped", {}).get("languages", {}).get(lang) for m, r in results.items()}
        kept = next(c for c in cells.values() if c)
        rows.append({"language": lang, "pairs kept / dropped": f"{kept['n']} / {kept['dropped']}",
                     **{m: score(c["accuracy"] if c else None) for m, c in cells.items()}})
    rows.append({"language": "**average**", "pairs kept / dropped": "",
                 **{m: score(r.get("stripped", {}).get("avg")) for m, r in results.items()}})
    return lines + [markdown_table(rows), ""]


def render(scores: dict) -> str:
    models, tasks = list(scores["models"]), scores["tasks"]
    figures = plots(scores)
    lines = ["# Scorecard", "",
             "Scores are 0–100. `random-init` is the pipeline's architecture and tokenizer with untrained weights "
             "and `bag-of-subwords` the tokenizer's piece counts with no model at all: a pretrained encoder that "
             "does not beat them has not learned what the task measures.", "", *_recipe(scores), *verdict(scores)]
    for name, t in tasks.items():
        metric = PRIMARY[t["kind"]]
        lines += [f"## {name} ({t['kind']}, {metric})", ""]
        langs = sorted({lang for m in models for lang in scores["models"][m][name]["languages"]})
        rows = []
        for lang in langs:
            row = {"language": lang}
            for m in models:
                row[m] = _cell(scores["models"][m][name]["languages"].get(lang, {}), metric)
            if t["kind"] in MAJORITY:
                first = next((scores["models"][m][name]["languages"][lang] for m in models
                              if lang in scores["models"][m][name]["languages"]), {})
                row["majority class"] = score(first.get("majority_baseline"))
            rows.append(row)
        avg = {"language": "**average**", **{m: score(scores["models"][m][name]["avg"]) for m in models}}
        if t["kind"] in MAJORITY:
            avg["majority class"] = score(next((scores["models"][m][name].get("majority_baseline") for m in models
                                               if scores["models"][m][name].get("majority_baseline") is not None),
                                              None))
        rows.append(avg)
        lines += [markdown_table(rows), ""]
        if t.get("excluded_seen"):
            ex = t["excluded_seen"]
            lines += [f"Left out because the pretraining corpus holds one side: {sum(ex.values())} pairs ("
                      + ", ".join(f"{k} {v}" for k, v in sorted(ex.items()) if v) + ").", ""]
        if t["kind"] == "qa":
            lines += ["Exact match (average): " + ", ".join(
                f"{m} {score(_mean([v.get('exact_match') for v in scores['models'][m][name]['languages'].values()]))}"
                for m in models) + ".", ""]
        if t["kind"] in FINETUNED:
            lines += _finetune_notes(scores, name, models)
        if t["kind"] == "tatoeba":
            lines += ["en→xx acc@1 (average): " + ", ".join(
                f"{m} {score(scores['models'][m][name].get('avg_en_to_xx'))}" for m in models) + ".", ""]
            published = [r for r in scores.get("references") or [] if "tatoeba" in r["scores"]]
            if published:
                lines += ["Published Tatoeba acc@1, xx→en / en→xx (full-scale models on Tatoeba's own languages, "
                          "not comparable to this run's numbers; sources in `tasks/evaluate/references.yaml`): "
                          + ", ".join(f"{r['model']} {score(r['scores']['tatoeba'].get('accuracy'))} / "
                                      f"{score(r['scores']['tatoeba'].get('accuracy_en_to_xx'))}"
                                      for r in published) + ".", ""]
            lines += _stripped_section(scores, name, models)
        if any("by_layer" in scores["models"][m][name] for m in models):
            layer_rows = []
            for m in models:
                r = scores["models"][m][name]
                layer_rows.append({"model": m, "layer used": r.get("layer"),
                                   **{f"layer {k}": score(v) for k, v in sorted(r["by_layer"].items(), key=lambda x:
                                                                                 int(x[0]))}})
            lines += ["Average over languages by hidden-state index (0 = embeddings). Unless a task names its "
                      "layer, the layer used is XTREME's: its layer 7 of 12 for MLM encoders and XLM-E's layer 9 "
                      "for ELECTRA ones, counted after the embeddings, so hidden-state index 8 and 10 (scaled to "
                      "other depths):", "",
                      markdown_table(layer_rows), ""]
        if any("diagnostics" in scores["models"][m][name] for m in models):
            diag = [{"model": m, "mean cosine (anisotropy)": f"{d['mean_cosine']:.3f}",
                     "acc@1 after per-language centring": score(d["accuracy_centred"])}
                    for m in models if (d := scores["models"][m][name].get("diagnostics"))]
            lines += ["Diagnostics at the layer used (not scores; see docs/stages/evaluate.md):", "",
                      markdown_table(diag), ""]
        gaps = {m: scores["models"][m][name].get("transfer_gap") for m in models}
        if any(v is not None for v in gaps.values()):
            lines += ["Transfer gap (train language − mean of the others): " +
                      ", ".join(f"{m} {score(v)}" for m, v in gaps.items()) + ".", ""]
        protocol = (t.get("finetune") or {}).get("protocol") or "zero-shot"
        lines += paper_refs.task_section(name, t.get("xtreme_task"), metric, protocol, scores)
        lines += _plot_links(figures.get(name, []))
    if scores.get("curve"):
        lines += curve.section(scores["curve"])
    lines += _plot_links(figures.get(None, []))
    # Tatoeba's rows stand beside each retrieval task above; the rest here, a model only with its numbers
    refs = [r for r in scores.get("references") or [] if set(r["scores"]) - {"tatoeba"}]
    if refs:
        cols = sorted({f"{task} {metric}" for r in refs for task, ms in r["scores"].items() for metric in ms
                       if task != "tatoeba"})
        rows = [{"model": r["model"], **{c: score(r["scores"].get(c.split()[0], {}).get(c.split()[1]))
                                          for c in cols}} for r in refs]
        lines += ["## Published reference scores", "",
                  "What full-scale models reach on the XTREME tasks (fine-tuned where the task needs it; sources in "
                  "`tasks/evaluate/references.yaml`). The demo's tiny model and data are not comparable to these.", "",
                  markdown_table(rows), ""]
    lines += paper_refs.table1_section()
    return "\n".join(lines)


def _mean(vals: list) -> float | None:
    vals = [v for v in vals if v is not None]
    return float(np.mean(vals)) if vals else None


def plot_languages(scores: dict, task: str, path: Path) -> None:
    """Per-language bars, one colour per model; languages down the page, so twenty of them
    make a readable figure rather than a 3000-pixel strip."""
    models = list(scores["models"])
    metric = PRIMARY[scores["tasks"][task]["kind"]]
    langs = sorted({lang for m in models for lang in scores["models"][m][task]["languages"]})
    fig, ax = plt.subplots(figsize=(7, max(3.0, 0.18 * len(langs) * len(models) + 1.2)))
    height = 0.8 / len(models)
    y = np.arange(len(langs))
    spread = False
    for i, m in enumerate(models):
        cells = [scores["models"][m][task]["languages"].get(lang, {}) for lang in langs]
        sds = [c.get(f"{metric}_sd") for c in cells]
        spread |= any(v is not None for v in sds)
        ax.barh(y + i * height, [c.get(metric, np.nan) for c in cells], height, label=m,
                xerr=[v or 0.0 for v in sds] if any(v is not None for v in sds) else None,
                error_kw={"elinewidth": 0.8, "capsize": 2})
    centre = y + height * (len(models) - 1) / 2
    majority = [next((scores["models"][m][task]["languages"][lang]["majority_baseline"] for m in models
                      if scores["models"][m][task]["languages"].get(lang, {}).get("majority_baseline") is not None),
                     np.nan) for lang in langs]
    if not np.all(np.isnan(majority)):  # always answering the most frequent label: the floor a classifier must pass
        ax.scatter(majority, centre, marker="|", s=400, color="black", zorder=3, label="majority class")
    ax.set_yticks(centre, langs)
    ax.invert_yaxis()  # the first language at the top
    ax.set_xlabel(metric + (" (error bars: sd over fine-tuning seeds)" if spread else ""))
    ax.set_title(f"{task}: {metric} per language")
    ax.legend(fontsize=8)
    _save(fig, path)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_curve(curve_: dict, path: Path) -> None:
    """Retrieval against tokens (xylent.tasks.evaluate.curve): per task, the pipeline stripped (solid) and as
    given (dotted), each peer's stripped number a dashed line."""
    tasks = sorted({t for p in curve_["points"] for t in p["tasks"]})
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.2), squeeze=False)
    xs = [p["tokens"] for p in curve_["points"]]
    for ax, t in zip(axes[0], tasks):
        for key, style, label in (("stripped", "-", "stripped"), ("avg", ":", "as given")):
            ax.plot(xs, [p["tasks"][t][key] for p in curve_["points"]], style, marker="o", color="C0",
                    label=f"pipeline ({label})")
        for i, (m, r) in enumerate(curve_["peers"].items(), 1):
            if (r.get(t) or {}).get("stripped") is not None:
                ax.axhline(r[t]["stripped"], ls="--", color=f"C{i}", label=f"{m} (stripped)")
        ax.set_xscale("log")
        ax.set_xlabel("tokens trained on")
        ax.set_ylabel("average acc@1")
        ax.set_title(f"{t}: retrieval against tokens")
        ax.legend(fontsize=7)
    _save(fig, path)


def plot_layers(scores: dict, task: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for i, (m, res) in enumerate(scores["models"].items()):
        by = sorted((int(k), v) for k, v in res[task].get("by_layer", {}).items())
        if by:
            ax.plot(*zip(*by), marker="o", color=f"C{i}", label=m)
        by = sorted((int(k), v) for k, v in res[task].get("stripped", {}).get("by_layer", {}).items())
        if by:  # the same model's stripped variant: same colour, dashed
            ax.plot(*zip(*by), marker=".", ls="--", color=f"C{i}", label=f"{m} (stripped)")
    ax.set_xlabel("hidden-state index (0 = embeddings)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole numbers
    ax.set_ylabel("average acc@1")
    ax.set_title(f"{task}: retrieval by layer")
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_transfer_gaps(scores: dict, path: Path) -> bool:
    rows = [(task, m, res[task]["transfer_gap"]) for m, res in scores["models"].items() for task in res
            if "transfer_gap" in res[task]]
    if not rows:
        return False
    tasks = sorted({t for t, _, _ in rows})
    models = list(scores["models"])
    fig, ax = plt.subplots(figsize=(5, 3.2))
    width = 0.8 / len(models)
    for i, m in enumerate(models):
        vals = [next((g for t, mm, g in rows if t == task and mm == m), np.nan) for task in tasks]
        ax.bar(np.arange(len(tasks)) + i * width, vals, width, label=m)
    ax.set_xticks(np.arange(len(tasks)) + width * (len(models) - 1) / 2, tasks)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel("gap (points)")
    ax.set_title("transfer gap per model (lower is better)")
    ax.legend(fontsize=8)
    _save(fig, path)
    return True


def plots(scores: dict) -> dict[str | None, list[tuple[str, str]]]:
    """Per task (None: the whole run), the figures the scorecard has: (file, what it shows).  The
    page links each under its task; the writer draws the same list."""
    out: dict[str | None, list[tuple[str, str]]] = {}
    for task in scores["tasks"]:
        out[task] = [(f"{task}_languages.png", "per language, every model")]
        if any("by_layer" in r[task] for r in scores["models"].values()):
            out[task].append((f"{task}_layers.png", "by layer"))
    out[None] = ([("transfer_gap.png", "transfer gap per model")]
                 if any("transfer_gap" in res[t] for res in scores["models"].values() for t in res) else [])
    if scores.get("curve"):
        out[None].append(("learning_curve.png", "held-out retrieval against tokens"))
    return out


def _plot_links(figures: list[tuple[str, str]]) -> list[str]:
    return [f"![{what}]({name})" for name, what in figures] + ([""] if figures else [])


def write_scorecard(out: Path, scores: dict) -> None:
    write_scores(out, scores)
    (out / "scorecard.md").write_text(render(scores))
    draw = {"languages": plot_languages, "layers": plot_layers}
    for task, figures in plots(scores).items():
        for name, _ in figures:
            if task is not None:
                draw[name.removeprefix(f"{task}_").removesuffix(".png")](scores, task, out / name)
    if scores.get("curve"):
        plot_curve(scores["curve"], out / "learning_curve.png")
    plot_transfer_gaps(scores, out / "transfer_gap.png")
