"""finetune: throughput (examples/s) of xylent's fine-tuning loop for the
classification head against transformers' ``Trainer``, same model, batch and
sequence length, in one run, at 1 thread and at all cores.

Both sides train the same Hugging Face encoder (an XLM-R-shaped
``XLMRobertaModel``, random weights, the same seed), the same RoBERTa-style
first-token head (dense -> tanh -> labels), AdamW with a linear schedule and
gradient clipping at 1.0, on the same synthetic batches: ``batch`` sequences of
exactly ``length`` tokens (no padding, so neither side saves on it), fp32 on the
CPU.  xylent: ``xylent.tasks.evaluate.finetune.train.train`` (its epoch-end dev pass is a no-op
here; its checkpoint writes are counted); peer: ``Trainer.train()`` with saving,
logging and evaluation off, ``dataloader_num_workers=0``.  Both use the same
torch thread count.  One warm-up run per side, then ``repeats`` runs
alternating sides; the statistic is examples/s of the whole ``train`` call,
best and median.  Target: xylent ≥ 1.0 × Trainer.

On a GPU (when torch sees one) a second section runs XNLI-sized batches (32 x
128) of the base model (12 x 768) in bf16 through xylent's loop and records
examples/s and peak memory.

    .venv/bin/python benchmarks/finetune.py            # about 3 minutes
    .venv/bin/python benchmarks/finetune.py --quick    # smoke run, ~20 s
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # run as a script from anywhere

import harness  # noqa: E402

from xylent.models.heads import Body, TaskModel  # noqa: E402
from xylent.tasks.evaluate.finetune.features import Feature  # noqa: E402
from xylent.tasks.evaluate.finetune.train import LoopConfig, train  # noqa: E402

SIZES = {"small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
         "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)}


def config(size: str, vocab: int = 8000, **extra):
    from transformers import XLMRobertaConfig

    return XLMRobertaConfig(vocab_size=vocab, max_position_embeddings=514, pad_token_id=1, bos_token_id=0,
                            eos_token_id=2, **SIZES[size], **extra)


def data(n: int, length: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, size=(n, length))
    ids[:, 0], ids[:, -1] = 0, 2  # <s> … </s>
    return ids, rng.integers(0, 3, size=n)


def run_xylent(size: str, ids, labels, batch: int, device: str = "cpu", bf16: bool = False) -> dict:
    from transformers import XLMRobertaModel

    torch.manual_seed(0)
    cfg = config(size)
    body = Body(XLMRobertaModel(cfg, add_pooling_layer=False), cfg.hidden_size, True)
    model = TaskModel(body, "classification", 3).to(device).train()
    feats = [Feature(ids=row.tolist(), target={"label": int(y)}, example=i) for i, (row, y) in
             enumerate(zip(ids, labels))]
    loop = LoopConfig(lr=2e-5, epochs=1, batch_size=batch, warmup=0.0, weight_decay=0.0, selection="last",
                      checkpoint_every=10**9, seed=1)
    with tempfile.TemporaryDirectory() as ck:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.synchronize()
        t = time.perf_counter()
        train(model, feats, lambda m: 0.0, loop, Path(ck), pad_id=1)
        if device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t
    out = {"seconds": wall, "examples_per_s": len(feats) / wall}
    if device == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def run_trainer(size: str, ids, labels, batch: int) -> dict:
    from transformers import Trainer, TrainingArguments, XLMRobertaForSequenceClassification

    torch.manual_seed(0)
    model = XLMRobertaForSequenceClassification(config(size, num_labels=3))
    # a plain list of examples is a map-style dataset to the Trainer (no `datasets` dependency)
    ds = [{"input_ids": torch.tensor(row), "attention_mask": torch.ones(len(row), dtype=torch.long),
           "labels": int(y)} for row, y in zip(ids, labels)]
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch, num_train_epochs=1,
                                 learning_rate=2e-5, lr_scheduler_type="linear", max_grad_norm=1.0,
                                 save_strategy="no", eval_strategy="no", logging_strategy="no", report_to=[],
                                 dataloader_num_workers=0, use_cpu=True, disable_tqdm=True, seed=1)
        trainer = Trainer(model=model, args=args, train_dataset=ds)
        t = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t
    return {"seconds": wall, "examples_per_s": len(ids) / wall}


def cpu_section(size: str, batch: int, length: int, steps: int, repeats: int, warmup: int) -> dict:
    ids, labels = data(batch * steps, length, 8000)
    warm_ids, warm_labels = ids[: batch * 2], labels[: batch * 2]
    for _ in range(warmup):  # the same warm-up for both sides
        run_xylent(size, warm_ids, warm_labels, batch)
        run_trainer(size, warm_ids, warm_labels, batch)
    runs = {"xylent": [], "trainer": []}
    for r in range(repeats):
        order = ("xylent", "trainer") if r % 2 == 0 else ("trainer", "xylent")  # alternate: drift hits both
        for side in order:
            fn = run_xylent if side == "xylent" else run_trainer
            runs[side].append(fn(size, ids, labels, batch))
            print(json.dumps({side: runs[side][-1]}), flush=True)
    # the timed call is train() alone (model building excluded), so the summary is built from its seconds
    timing = {side: harness.summary([r["seconds"] for r in rs]) for side, rs in runs.items()}
    stat = {side: {"best": max(r["examples_per_s"] for r in rs),
                   "median": statistics.median(r["examples_per_s"] for r in rs)} for side, rs in runs.items()}
    ratio = stat["xylent"]["median"] / stat["trainer"]["median"]
    return {"model": {"size": size, **SIZES[size], "vocab": 8000}, "batch": batch, "length": length,
            "steps": steps, "examples": batch * steps, "torch_threads": {"xylent": torch.get_num_threads(),
                                                                          "trainer": torch.get_num_threads()},
            "runs": runs, "timing": timing, "examples_per_s": stat, "ratio_median": ratio,
            "target": ">= 1.0 x Trainer", "pass": ratio >= 1.0}


def gpu_section(steps: int) -> dict:
    if not torch.cuda.is_available():
        return {"skipped": "no GPU was available to this run: not measured (never estimated)"}
    ids, labels = data(32 * steps, 128, 8000)
    run_xylent("base", ids[:64], labels[:64], 32, device="cuda")  # warm-up
    r = run_xylent("base", ids, labels, 32, device="cuda")
    return {"device": torch.cuda.get_device_name(0), "model": "base (12 x 768), bf16 autocast", "batch": 32,
            "length": 128, "steps": steps, **r}


def markdown(result: dict) -> str:
    sections = result.get("cpu_by_threads") or [result["cpu"]]
    m = sections[0]["model"]
    rows = []
    for cpu in sections:
        eps = cpu["examples_per_s"]
        threads = cpu["torch_threads"]
        threads = threads if isinstance(threads, dict) else {"xylent": threads, "trainer": threads}
        for side, side_name in (("xylent", "xylent loop"), ("trainer", "transformers `Trainer`")):
            ratio = (f"**{cpu['ratio_median']:.2f}×** ({'met' if cpu['pass'] else '**missed**'})"
                     if side == "xylent" else "")
            rows.append([threads[side], side_name, harness.num(eps[side]["best"]), harness.num(eps[side]["median"]),
                         " ".join(harness.num(r["examples_per_s"]) for r in cpu["runs"][side]), ratio])
    cpu = sections[0]
    out = [harness.table(["torch threads", "side", "examples/s, best", "median", "every run",
                          "xylent / Trainer, median (target ≥ 1.0×)"], rows), "",
           f"Model {m['num_hidden_layers']} × {m['hidden_size']} (FFN {m['intermediate_size']}, vocab {m['vocab']}), "
           f"{cpu['steps']} steps of {cpu['batch']} × {cpu['length']} tokens per run, the same torch thread count on "
           "both sides in each pair of rows. "
           + ("The target is met at every thread count." if all(c["pass"] for c in sections)
              else "The target is **missed** at " + ", ".join(
                  f"{c['torch_threads']['xylent'] if isinstance(c['torch_threads'], dict) else c['torch_threads']} "
                  "thread(s)" for c in sections if not c["pass"]) + ".")]
    gpu = result.get("gpu", {})
    if "skipped" in gpu:
        out += ["", f"GPU rows (base size, bf16, XNLI-sized batches): **{gpu['skipped']}**."]
    else:
        out += ["", harness.table(["GPU", "model", "batch", "examples/s", "peak memory"],
                                  [[gpu["device"], gpu["model"], f"{gpu['batch']} x {gpu['length']}",
                                    harness.num(gpu["examples_per_s"]), f"{gpu['peak_memory_gib']:.1f} GiB"]])]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--threads", type=int, nargs="+", default=None,
                    help="torch thread counts, each for both sides (default: 1 and all cores)")
    args = harness.finish_args(ap.parse_args(argv))
    cores = len(os.sched_getaffinity(0))
    sections = []
    for n in args.threads or sorted({1, cores}):
        torch.set_num_threads(n)
        sections.append(cpu_section("small", batch=32, length=128, steps=4 if args.quick else 20,
                                    repeats=args.repeats, warmup=args.warmup))
        print(json.dumps({"threads": n, "ratio_median": sections[-1]["ratio_median"]}), flush=True)
    report = {"cpu_by_threads": sections, "gpu": gpu_section(steps=10 if args.quick else 100)}
    harness.write_result("finetune", report, args)


if __name__ == "__main__":
    main()
