"""What pretraining XLM-E Base and XY-LENT Base at the papers' budgets costs in GPU-hours, projected
from the measured GPU rows, never typed: the lent GPU's checks (benchmarks/results/gpu_results.json,
written by gpu_results.py) and pretrain.json's GPU section where a run measured one.

    .venv/bin/python benchmarks/projection.py     # writes benchmarks/results/projection.json
    .venv/bin/python benchmarks/render.py         # then its block in docs/records/benchmarks.md

Rerun it after gpu_results.py brings rows back: tests/test_benchmarks.py's derived-result test fails while
the committed projection.json is not what the committed rows give.

GPU-hours = the budget's tokens / (tokens/s measured on one GPU) / 3600. On N GPUs the wall-clock is
tokens / (tokens/s x N) / 3600: linear data-parallel scaling, the one assumption that takes one measured
GPU to 8 and 64 (the rows are world size 1; no all-reduce across GPUs or nodes was measured), so the
GPU-hours do not depend on N.

The projected step is the whole ELECTRA step (``electra``: generator, sampling, discriminator, update),
which is what pretraining runs; the discriminator-only rows are not a training step. Every side of the
newest rows is projected, whatever its name ("xylent", "xylent, no relative bias", a fast-path side, the
transformers peer), bare and under the DeepSpeed engine at the ZeRO stage the spec picks; a side that
has no row says "not measured". Row shapes read (benchmarks/pretrain.py's GPU section):
``{device, batch, seq_len, model: {vocab_size}, rows: {step: {side: {tokens_per_s_median, ...}}},
zero_stages: {world_size, stages: {N: row | {side: row}}}}``; an engine row names its side with
``side`` (else it is the benchmark's own model, ``xylent``); a row's own ``vocab_size`` overrides its
group's, and a group nested anywhere below with its own ``model`` (say V = 250 002 rows) is read as well.
One table per measured (device, vocabulary); an H100 table appears only when an H100 row exists.

The budgets are the papers' own words, each quoted with its section or table; ``check_quotes`` finds
every quote in ../shared/papers/ before a result is written.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

import harness  # noqa: E402

RESULT = "projection"
PAPERS = REPO.parent / "shared" / "papers"
GPUS = (8, 64)
STEP = "electra"  # the whole ELECTRA step: what a pretraining step runs
ENGINE_SIDE = "xylent"  # pretrain.py's engine rows wrap the benchmark's own model unless a row names a side
ENGINE = "engine, ZeRO {stage}"
BARE = "step alone"
XY_LENT_SPEC = REPO / "data_specs" / "xy-lent-base.yaml"


def _cite(what: str, as_written: str, where: str, quote: str, value: float | None = None) -> dict:
    """One number from a paper: what it is, how the paper writes it, where, and the sentence or table row."""
    return {"what": what, "value": value, "as_written": as_written, "where": where, "quote": quote}


# The papers' Base budgets. MRTD rows are fixed at the sequence length; TRTD rows are as long as their pair
# (dynamic batches), and both papers give the same tokens per task, which XLM-E's Appendix B shows is the
# MRTD batch's (2,048 x 512 = 2^20 tokens is its "1M"): the TRTD tokens of a step are taken equal to MRTD's.
BUDGETS = (
    {"name": "XLM-E Base", "paper": "Chi et al., XLM-E: Cross-lingual Language Model Pre-training via ELECTRA",
     "file": "xlm-e.txt", "steps": 125_000, "mrtd_sequences": 2048, "seq_len": 512, "vocab": 250_000,
     "reported": {"days": 1.7, "gpus": 64, "gpu": "A100"},
     "quotes": [
         _cite("steps", "125K", "§4.1 (Training)", "optimizer for 125K training steps", 125_000),
         _cite("steps", "125K", "Appendix B, Table 10", "Training steps\t125K", 125_000),
         _cite("MRTD sequences a step", "2,048", "Appendix B",
               "In multilingual replaced token detection, a batch is constructed by 2,048 length-512 input "
               "sequences", 2048),
         _cite("sequence length", "512", "Appendix B", "a batch is constructed by 2,048 length-512 input sequences",
               512),
         _cite("tokens a task a step (MRTD and TRTD alike)", "1M", "§4.1 (Training)",
               "We use dynamic batching of approximately 1M tokens for each pre-training task."),
         _cite("tokens a task a step", "1M", "Appendix B, Table 10", "Batch tokens per task\t1M"),
         _cite("vocabulary", "250K", "Appendix A",
               "For the Base-size model, we use the same vocabulary with XLM-R (Conneau et al., 2020) that "
               "consists of 250K subwords", 250_000),
         _cite("the paper's own compute", "1.7 days on 64", "§4.1 (Training)",
               "The whole pre-training procedure takes about 1.7 days on 64 Nvidia A100 GPU cards.")]},
    {"name": "XY-LENT Base",
     "paper": "Patra et al., Beyond English-Centric Bitexts for Better Multilingual Language Representation "
              "Learning", "file": "xy-lent.txt", "steps": 125_000, "mrtd_sequences": 8192, "seq_len": 512,
     "vocab": 500_000, "reported": {"days": None, "gpus": 128, "gpu": "A100-40GB"},
     "quotes": [
         _cite("steps", "125k", "§5 (Pretraining Setup)",
               "For the base model, we train for 125k steps with a batch size of 8192 for MRTD task", 125_000),
         _cite("MRTD sequences a step", "8192", "§5 (Pretraining Setup)",
               "For the base model, we train for 125k steps with a batch size of 8192 for MRTD task", 8192),
         _cite("steps", "125K", "Appendix A, Table 9 (Base column)", "Training steps\t125K", 125_000),
         _cite("sequence length", "512", "Appendix A",
               "For multilingual replace token detection task we work with a fixed input sequence length of 512",
               512),
         _cite("tokens a task a step (MRTD and TRTD alike)", "4M", "Appendix A, Table 9 (Base column)",
               "Batch tokens per task\t4M"),
         _cite("TRTD batches", "dynamic", "§5 (Pretraining Setup)",
               "We use a dynamic batch size for TRTD task which is based on original length of the translated "
               "bi-text pair."),
         _cite("vocabulary", "500K", "Appendix A", "All the models are trained with a vocabulary size of 500K",
               500_000),
         _cite("the paper's own compute", "128", "Appendix A (no training time given)",
               "For the base and large models, we train on 128 Nvidia A100-40GB GPU cards")]},
)


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def check_quotes(papers: Path = PAPERS) -> list[str]:
    """What does not hold: a quote missing from its paper's text, a number not written as quoted, a typed
    budget figure that no quote gives. Empty where every quote is found (or the papers are not here: [])."""
    bad = []
    for b in BUDGETS:
        path = papers / b["file"]
        if not path.is_file():
            continue
        text = _norm(path.read_text())
        for q in b["quotes"]:
            if _norm(q["quote"]) not in text:
                bad.append(f"{b['name']}: quote not in {path.name}: {q['quote']!r}")
            if q["as_written"] not in q["quote"]:
                bad.append(f"{b['name']}: {q['as_written']!r} is not in its quote {q['quote']!r}")
        for field, what in (("steps", "steps"), ("mrtd_sequences", "MRTD sequences a step"),
                            ("seq_len", "sequence length"), ("vocab", "vocabulary")):
            if b[field] not in [q["value"] for q in b["quotes"] if q["what"] == what]:
                bad.append(f"{b['name']}: {field} {b[field]} is given by no quote")
    return bad


# ---------------------------------------------------------------- the measured rows

def _is_row(x) -> bool:
    return isinstance(x, dict) and isinstance(x.get("tokens_per_s_median"), (int, float))


def _is_step_rows(x) -> bool:
    """{step: {side: row}}, as pretrain.py's GPU section writes its ``rows``."""
    return isinstance(x, dict) and any(isinstance(s, dict) and any(_is_row(r) for r in s.values())
                                       for s in x.values())


def _groups(node, ctx: dict, when: str, source: str, out: list) -> None:
    """Every measured group below node, each with the device, vocabulary and shape it inherits."""
    if isinstance(node, list):
        for x in node:
            _groups(x, ctx, when, source, out)
        return
    if not isinstance(node, dict):
        return
    ctx = {**ctx, **{k: node[k] for k in ("device", "batch", "seq_len") if k in node}}
    vocab = (node.get("model") or {}).get("vocab_size", node.get("vocab_size"))
    if vocab is not None:
        ctx["vocab_size"] = vocab
    rows, zero = node.get("rows"), node.get("zero_stages")
    if _is_step_rows(rows) or (isinstance(zero, dict) and zero.get("stages")):
        out.append({**ctx, "when": when, "source": source, "rows": rows if _is_step_rows(rows) else {},
                    "zero_stages": zero or {}})
    for k, v in node.items():
        if k not in ("model", "zero_stages") and not (k == "rows" and _is_step_rows(v)):
            _groups(v, ctx, when, source, out)


def _engine_rows(zero: dict):
    """(stage, side, row) for each engine row: a stage holds one row (the benchmark's model) or one per side."""
    for key, val in (zero.get("stages") or {}).items():
        if _is_row(val):
            yield int(val.get("stage", key)), val.get("side") or zero.get("side") or ENGINE_SIDE, val
        elif isinstance(val, dict):
            for side, row in val.items():
                if _is_row(row):
                    yield int(key), side, row


def measurements(results: Path) -> list[dict]:
    """Every measured tokens/s of the whole ELECTRA step, bare and under the engine, flat."""
    groups: list[dict] = []
    gpu_runs = harness.load_result("gpu_results", results) or {}
    for run in gpu_runs.get("runs", []):
        check = run["check"]
        # the benchmark's rows record (its outer record names the device "cuda"; the rows name the GPU)
        _groups((check.get("benchmark") or {}).get("rows") or {},
                {"device": check.get("environment", {}).get("device")},
                check["started"], f"gpu_results.json, check {check['started']}", groups)
    pre = harness.load_result("pretrain", results) or {}
    if "skipped" not in (pre.get("gpu") or {"skipped": "none"}):
        _groups(pre["gpu"], {}, pre["date"], f"pretrain.json, {pre['date']}", groups)
    out = []
    for g in groups:
        base = {k: g.get(k) for k in ("device", "vocab_size", "batch", "seq_len", "when", "source")}
        for side, row in (g["rows"].get(STEP) or {}).items():
            if _is_row(row):
                out.append({**base, "vocab_size": row.get("vocab_size", g.get("vocab_size")), "side": side,
                            "engine_stage": None, "world_size": 1, **_speed(row)})
        for stage, side, row in _engine_rows(g["zero_stages"]):
            out.append({**base, "vocab_size": row.get("vocab_size", g.get("vocab_size")), "side": side,
                        "engine_stage": stage, "world_size": g["zero_stages"].get("world_size"), **_speed(row)})
    return out


def _speed(row: dict) -> dict:
    return {"tokens_per_s": row["tokens_per_s_median"], "tokens_per_s_best": row.get("tokens_per_s_best"),
            "mfu": row.get("mfu_median", row.get("mfu")), "peak_memory_gib": row.get("peak_memory_gib")}


def _newest(rows: list[dict]) -> dict | None:
    return max(rows, key=lambda r: r["when"]) if rows else None


# ---------------------------------------------------------------- the spec and the budget

def spec_choice(budget: dict) -> dict:
    """The ZeRO stage the spec trains this budget with: XY-LENT Base has its own spec
    (data_specs/xy-lent-base.yaml); XLM-E Base has none, so pretrain.zero_stage's default."""
    from xylent.spec.pretrain import PretrainConfig

    if budget["name"] != "XY-LENT Base":
        return {"zero_stage": PretrainConfig.model_fields["zero_stage"].default, "spec": None,
                "from": "`pretrain.zero_stage`'s default (`xylent/spec/pretrain.py`): no spec in `data_specs/` "
                        "trains XLM-E Base"}
    import yaml

    cfg = PretrainConfig.model_validate(yaml.safe_load(XY_LENT_SPEC.read_text())["pretrain"])
    rel = XY_LENT_SPEC.relative_to(REPO).as_posix()
    spec = {"steps": cfg.steps, "batch_size": cfg.batch_size, "trtd_max_tokens": cfg.trtd_max_tokens,
            "batch_schedule": cfg.batch_schedule, "ranks": cfg.ranks}
    return {"zero_stage": cfg.zero_stage, "spec": {"file": rel, **spec},
            "from": f"`pretrain.zero_stage` in `{rel}`"}


def _cost(tokens: int, tps: float, row: dict) -> dict:
    gpu_hours = tokens / tps / 3600
    return {"tokens_per_s": tps, "gpu_hours": gpu_hours,
            "by_gpus": {str(n): {"hours": tokens / (tps * n) / 3600, "days": tokens / (tps * n) / 3600 / 24}
                        for n in GPUS},
            "row": {k: row[k] for k in ("source", "when", "device", "vocab_size", "batch", "seq_len", "side",
                                        "engine_stage", "world_size", "tokens_per_s_best", "mfu",
                                        "peak_memory_gib")}}


def _table(budget: dict, tokens: int, stage: int, device: str, vocab: int, rows: list[dict],
           sides: list[str]) -> dict:
    here = [r for r in rows if r["device"] == device and r["vocab_size"] == vocab]
    lines = []
    for side in sides:
        for st, mode in ((stage, ENGINE.format(stage=stage)), (None, BARE)):
            row = _newest([r for r in here if r["side"] == side and r["engine_stage"] == st])
            line = {"side": side, "mode": mode, "engine_stage": st, "measured": row is not None}
            if row is not None:
                line.update(_cost(tokens, row["tokens_per_s"], row))
            lines.append(line)
    peer = next((x for x in lines if x["side"].startswith("transformers") and x["engine_stage"] is None
                 and x["measured"]), None)
    for x in lines:
        if x["measured"] and peer is not None:
            x["vs_transformers"] = x["gpu_hours"] / peer["gpu_hours"]
    batch, seq = (here[0]["batch"], here[0]["seq_len"]) if here else (None, None)
    micro = ({str(n): tokens / budget["steps"] / n / (batch * seq) for n in GPUS} if batch and seq else None)
    return {"device": device, "vocab_size": vocab, "paper_vocab": budget["vocab"],
            # XLM-R's 250 002 (its specials on top) is the 250K XLM-E writes
            "at_paper_vocab": vocab is not None and abs(vocab - budget["vocab"]) < 100,
            "measured_batch": batch, "measured_seq_len": seq, "micro_steps_per_gpu": micro,
            "peer": peer["side"] if peer else None, "lines": lines}


def project(results: Path) -> dict:
    rows = [r for r in measurements(results) if r["device"]]
    sides: list[str] = []
    for r in sorted(rows, key=lambda r: r["when"], reverse=True):  # the newest check's order first
        if r["side"] not in sides:
            sides.append(r["side"])
    devices = sorted({r["device"] for r in rows}, key=lambda d: ("H100" not in d, d))
    budgets = []
    for b in BUDGETS:
        tokens_per_step = 2 * b["mrtd_sequences"] * b["seq_len"]  # MRTD + TRTD, the same tokens per task
        tokens = b["steps"] * tokens_per_step
        choice = spec_choice(b)
        rep = b["reported"]
        tables = []
        for d in devices:
            # the measured vocabulary nearest the paper's first: the output layers' cost grows with V
            vocabs = sorted({r["vocab_size"] for r in rows if r["device"] == d and r["vocab_size"]},
                            key=lambda v: abs(math.log(v / b["vocab"])))
            tables += [_table(b, tokens, choice["zero_stage"], d, v, rows, sides) for v in vocabs]
        spec = choice["spec"]
        budgets.append({
            "name": b["name"], "paper": b["paper"], "file": b["file"], "steps": b["steps"],
            "mrtd_sequences": b["mrtd_sequences"], "seq_len": b["seq_len"],
            "mrtd_tokens_per_step": b["mrtd_sequences"] * b["seq_len"],
            "trtd_tokens_per_step": b["mrtd_sequences"] * b["seq_len"], "tokens_per_step": tokens_per_step,
            "total_tokens": tokens, "vocab": b["vocab"], "quotes": b["quotes"],
            "reported": {**rep, "gpu_hours": rep["days"] * 24 * rep["gpus"] if rep["days"] else None},
            "zero_stage": choice["zero_stage"], "zero_from": choice["from"], "spec": spec,
            "spec_agrees": None if spec is None else (
                spec["steps"] == b["steps"] and spec["batch_size"] == b["mrtd_sequences"]
                and spec["trtd_max_tokens"] == b["mrtd_sequences"] * b["seq_len"] and spec["batch_schedule"] == "mix"),
            "tables": tables})
    return {"step": STEP, "gpus": list(GPUS), "devices": devices,
            "h100_measured": any("H100" in d for d in devices),
            # the checks whose rows a projection used (an older check's rows, replaced by a newer one's, are not)
            "inputs": sorted({x["row"]["source"] for b in budgets for t in b["tables"] for x in t["lines"]
                              if x["measured"]}), "budgets": budgets}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=str(harness.RESULTS), help="where the measured rows are")
    ap.add_argument("--out", default=None, help="where projection.json goes (default: --results)")
    ap.add_argument("--papers", default=str(PAPERS), help="the papers' text, to find every quote in")
    args = ap.parse_args(argv)
    bad = check_quotes(Path(args.papers))
    if bad:
        sys.exit("projection: a budget's quote does not hold:\n" + "\n".join(bad))
    payload = project(Path(args.results))
    harness.write_result(RESULT, payload, argparse.Namespace(out=args.out or args.results, quick=False,
                                                             repeats=None, warmup=None))
    return payload


# ---------------------------------------------------------------- docs/records/benchmarks.md (benchmarks/render.py)

def _days(x: dict, n: int) -> str:
    return harness.num(x["by_gpus"][str(n)]["days"])


def _table_md(b: dict, t: dict) -> list[str]:
    vocab = f"V = {harness.num(t['vocab_size'])}"
    head = (f"Measured on {t['device']}, {vocab}, {t['measured_batch']} × {t['measured_seq_len']} tokens per step "
            f"on one GPU")
    if not t["at_paper_vocab"]:
        head += (f"; the paper trains V = {harness.num(t['paper_vocab'])}: **not measured at the paper's "
                 "vocabulary**, and the larger vocabulary's extra work (the generator's output layer over the "
                 "masked positions, the embedding's gradient and optimizer update) is not in these hours")
    micro = t["micro_steps_per_gpu"]
    if micro:
        head += ("; a step of the budget is " + " and ".join(f"{harness.num(micro[str(n)])} measured steps per "
                                                             f"GPU on {n} GPUs" for n in micro)
                 + " (gradient accumulation)")
    rows = []
    for x in t["lines"]:
        if not x["measured"]:
            rows.append([x["side"], x["mode"], *["not measured"] * 4, "–", "–"])
            continue
        r = x["row"]
        rows.append([x["side"], x["mode"], harness.num(x["tokens_per_s"]), harness.num(x["gpu_hours"]),
                     _days(x, GPUS[0]), _days(x, GPUS[-1]),
                     f"{x['vs_transformers']:.2f}×" if "vs_transformers" in x else "–",
                     f"{r['source']}" + (f", {r['world_size']} rank" if r["engine_stage"] is not None else "")])
    return [head + ":", "",
            harness.table(["side", "row", "tokens/s on 1 GPU (median)",
                           f"GPU-hours ({' or '.join(map(str, GPUS))} GPUs)", f"days on {GPUS[0]} GPUs",
                           f"days on {GPUS[-1]} GPUs",
                           f"GPU-hours ÷ transformers' {BARE}", "measured row"], rows), ""]


def _budget_md(b: dict) -> list[str]:
    per_task = harness.num(b["mrtd_tokens_per_step"])
    total = f"{b['total_tokens']:.3g}".replace("e+", "e")
    zero = f"ZeRO stage **{b['zero_stage']}**: {b['zero_from']}"
    spec = b["spec"]
    if spec is not None:
        zero += (f"; that spec trains {harness.num(spec['steps'])} steps of {harness.num(spec['batch_size'])} MRTD "
                 f"rows and {harness.num(spec['trtd_max_tokens'])} TRTD tokens, `{spec['batch_schedule']}` on "
                 f"{spec['ranks']} ranks: "
                 + ("the paper's budget" if b["spec_agrees"] else "**not the paper's budget**"))
    out = [f"**{b['name']}** ({b['paper']}; `../shared/papers/{b['file']}`): {harness.num(b['steps'])} steps × "
           f"(MRTD {harness.num(b['mrtd_sequences'])} × {b['seq_len']} = {per_task} tokens + TRTD {per_task} "
           f"tokens) = {harness.num(b['tokens_per_step'])} tokens a step, **{harness.num(b['total_tokens'])} "
           f"tokens** ({total}); vocabulary {harness.num(b['vocab'])}. {zero}.", ""]
    rep = b["reported"]
    out += ["The paper's words:", ""]
    out += [f"- {q['what']}: {q['where']}: “{_norm(q['quote'])}”" for q in b["quotes"]]
    out += ["", (f"The paper's own run: {harness.num(rep['days'])} days on {rep['gpus']} {rep['gpu']} = "
                 f"{harness.num(rep['gpu_hours'])} {rep['gpu']} GPU-hours (another GPU and code base; for scale, "
                 "not compared)." if rep["gpu_hours"] else
                 f"The paper's own run: {rep['gpus']} {rep['gpu']} GPUs; it gives no training time."), ""]
    if not b["tables"]:
        out += ["Projection: **not measured** (no GPU row of the whole ELECTRA step).", ""]
    for t in b["tables"]:
        out += _table_md(b, t)
    return out


def markdown(result: dict) -> str:
    devices = result["devices"]
    out = [f"GPU-hours = the budget's tokens ÷ (tokens/s of the whole ELECTRA step, `{result['step']}`, on one "
           "GPU) ÷ 3600; days on N GPUs = GPU-hours ÷ N ÷ 24. Each side is costed under the DeepSpeed engine at "
           "the ZeRO stage the spec picks (that row includes the engine's cost) and as the step alone.", ""]
    if result["h100_measured"]:
        out += [f"Devices measured: {', '.join(devices)}.", ""]
    else:
        out += [f"**H100: not measured.** Every row here ran on {', '.join(devices) or 'no GPU'}; the hours are "
                "that GPU's, and no H200-to-H100 factor is applied (none was measured).", ""]
    for b in result["budgets"]:
        out += _budget_md(b)
    out += ["Assumptions, each a reason the hours could be off:", "",
            f"- linear data-parallel scaling from the one measured GPU to {' and '.join(map(str, result['gpus']))}: "
            "the rows ran on one rank, so the gradients' all-reduce (within one node at 8 GPUs, across nodes at "
            "64) and the loaders at scale are not in the hours, which makes the GPU-hours the same at every count;",
            "- a TRTD token costs what a measured MRTD token costs (TRTD rows are as long as their pair, padded to "
            "the batch's longest; the measured rows are full-length);",
            "- both tasks every step, a batch of each (the papers' “batch tokens per task”; `batch_schedule: mix`);",
            "- the medians of the measured windows; transformers' peer has no engine row, so its hours leave out "
            "the engine's cost that the engine rows of xylent carry;",
            "- the measured step updates the weights once per measured batch; the budget's step does it once per "
            "accumulated step, so the update's share is overcounted here."]
    return "\n".join(out)


def provenance(result: dict) -> str:
    git = result.get("environment", {}).get("git", {})
    commit = (git.get("commit") or "unknown")[:10] + (" + local changes" if git.get("dirty") else "")
    inputs = "; ".join(result["inputs"]) or "no measured row"
    return (f"*Computed {result.get('date', '?')[:10]} by `projection.py` (commit {commit}; no timing of its "
            f"own) from {inputs}; file `benchmarks/results/{RESULT}.json`.*")


if __name__ == "__main__":
    main()
