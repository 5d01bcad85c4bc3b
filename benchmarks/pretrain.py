"""Pretraining throughput, side by side with Hugging Face transformers' ELECTRA.

Every side trains the same batches (B × L random token ids, 15 % masked) with
AdamW and is timed in windows of ``--steps`` full optimizer steps (forward +
backward + fused AdamW update, the same optimizer kernel on both sides, dropout
on), after the same warm-up windows; every window is kept, and the tables give
tokens/s of the median and of the best window. The sides of one comparison run
in the same process under the same ``torch.set_num_threads`` (1 thread, then
all cores), in alternating order:

- ``discriminator``: our discriminator stack + RTD head vs transformers'
  ``ElectraForPreTraining`` of the same size (replaced-token labels given);
- ``electra``: our whole XLM-E step (generator, sampling, discriminator,
  λ = 50) vs ``ElectraForMaskedLM`` + ``ElectraForPreTraining`` with shared
  embeddings composed the same way (the ELECTRA recipe);
- ``…, no relative bias``: ours with ``relative_bias: false``, to measure what
  the gated relative position bias costs;
- ``objective on TRTD rows``: one side per pretraining recipe (``electra``,
  ``mlm``, ``infoxlm``, ``veco``) on the same rows read as translation pairs
  ``<s> x </s> y </s>``, ELECTRA the reference (all cores).

GPU rows (when a GPU is visible, or ``--device cuda``): the ``--gpu-size``
model (base) in bf16 autocast, xylent vs transformers for both steps, with
tokens/s, MFU (FLOPs per token from ``xylent.models.training.optim.flops_per_token``, the same
count for both sides, over the GPU's dense bf16 peak) and each side's peak
memory (built alone); then one DeepSpeed engine per ZeRO stage
(``tasks/pretrain/deepspeed/zero<N>.json``, one rank, each in its own process) with its
tokens/s and peak memory. Without a GPU the result records why they were
skipped; nothing is estimated.

    .venv/bin/pip install -e '.[bench]'     # transformers, the peer
    .venv/bin/python benchmarks/pretrain.py           # small (12 x 256): ~5 min on 2 idle cores (+ GPU rows if seen)
    .venv/bin/python benchmarks/pretrain.py --quick   # 2 x 64, vocab 1 000, one 1-step window per side: ~15 s
    .venv/bin/python benchmarks/pretrain.py --device cuda   # GPU machine: + base/bf16 rows and ZeRO 0-3, ~5 min more
    .venv/bin/python benchmarks/pretrain.py --threads all --skip-hf   # narrower: all cores, our sides only

Writes benchmarks/results/pretrain.json (``--quick``: benchmarks/results/quick/).
"""

from __future__ import annotations

import math
import os
import socket
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import harness  # noqa: E402

SPECIALS = dict(zip(("unk", "bos", "eos", "pad", "mask"), range(5)))  # xylent.tasks.vocab.specials' layout
MASK_PROB = 0.15
DISC_WEIGHT = 50.0
OBJECTIVE_OPTIONS = {"electra": None, "mlm": None,
                     "infoxlm": {"queue_size": 4096, "pool": "mean", "normalize": True, "in_batch_negatives": True},
                     "veco": None}
HF_DISC = "transformers ElectraForPreTraining"
HF_ELECTRA = "transformers ElectraForMaskedLM + ElectraForPreTraining"
NO_BIAS = "xylent, no relative bias"
MATERIALISED = "xylent, materialised bias (eager)"
FLEX_EAGER = "xylent, flex (encoders eager)"


# ---------------------------------------------------------------- inputs and models

def batches(n: int, b: int, length: int, vocab: int, seed: int = 0) -> list:
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, vocab, (b, length), generator=g)
        ids[:, 0], ids[:, -1] = SPECIALS["bos"], SPECIALS["eos"]
        out.append(ids)
    return out


def n_params(*modules) -> int:
    """Distinct parameters (shared embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for m in modules for p in m.parameters()}.values())


# what a step reads besides its ids, made once per batch (the warm-up fills it): the trainer makes it ahead in
# the loader's thread (xylent.models.training.step_inputs), so no side's timed step pays for host work or its copy
_PREPARED: dict = {}


def _prepared(what: str, ids, k, make):
    key = (what, ids.data_ptr(), ids.device, tuple(ids.shape), k)
    if key not in _PREPARED:
        _PREPARED[key] = make()
    return _PREPARED[key]


def _noise(ids, k):
    from xylent.models.masking import row_noise

    return _prepared("noise", ids, k, lambda: row_noise(0, k, 0, list(range(len(ids))), [ids.shape[1]] * len(ids),
                                                        ids.shape[1]).to(ids.device))


def _rtd_labels(ids, k):
    import torch

    return _prepared("labels", ids, k, lambda: (torch.rand(ids.shape, generator=torch.Generator().manual_seed(k))
                                                < MASK_PROB).to(ids.device))


def _host_counts(model, cfg, ids, k):
    """ElectraModel.host_counts of the batch: with them the step never waits on the device."""
    def make():
        a = ids.cpu().numpy()
        return model.host_counts(a, None, a != cfg.special("pad"))
    return _prepared("counts", ids, k, make)


def _norms(st):
    """The loss's divisors left on the device (reading the counts would make the host wait)."""
    from xylent.models.stats import Norms

    return Norms(st.g_count.float().clamp(min=1), st.d_count.float().clamp(min=1))


def ours_discriminator(cfg, compile: bool = True):
    """(step(ids, k) -> loss, info): our discriminator stack + RTD head, one AdamW step."""
    import torch
    import torch.nn.functional as F

    from xylent.models.electra import RTDHead
    from xylent.models.encoder import Embeddings, Encoder
    from xylent.models.weight_init import init_weights
    from xylent.models.training.optim import make_optimizer

    class Discriminator(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings, self.encoder = Embeddings(cfg), Encoder(cfg, cfg.layers, cfg.dropout)
            self.head = RTDHead(cfg.hidden)
            self.apply(init_weights)

        def forward(self, ids, labels):
            logits = self.head(self.encoder(self.embeddings(ids), ids == cfg.special("pad")))
            return F.binary_cross_entropy_with_logits(logits, labels.float())

    model = Discriminator()
    compiled = compile and fast_path(model, cfg)
    opt = make_optimizer(model, lr=1e-4)

    def step(ids, k):
        opt.zero_grad(set_to_none=True)
        loss = model(ids, _rtd_labels(ids, k))
        loss.backward()
        opt.step()
        return loss.detach()
    return step, {"params": n_params(model), "compiled": compiled, "attention": cfg.attention}


def fast_path(model, cfg) -> bool:
    """The trainer's CUDA path: its encoders compiled (xylent.models.encoder.compile_encoders), unless the side
    is the materialised reference, which runs eager as the step did before FlexAttention."""
    from xylent.models.encoder import compile_encoders

    on_cuda = next(model.parameters()).is_cuda
    return bool(on_cuda and cfg.attention != "materialised" and compile_encoders(model))


def ours_electra(cfg, compile: bool = True):
    """Our whole XLM-E step: generator, sampled corruption, discriminator, λ = 50."""
    from xylent.models.electra import ElectraModel
    from xylent.models.training.optim import make_optimizer

    model = ElectraModel(cfg, DISC_WEIGHT, MASK_PROB)
    compiled = compile and fast_path(model, cfg)
    opt = make_optimizer(model, lr=1e-4)

    def step(ids, k):
        st = model(ids, ids == cfg.special("pad"), None, _noise(ids, k), **_host_counts(model, cfg, ids, k))
        opt.zero_grad(set_to_none=True)
        loss = model.loss(st, _norms(st))
        loss.backward()
        opt.step()
        return loss.detach()
    return step, {"params": n_params(model), "compiled": compiled, "attention": cfg.attention}


def objective_step(objective: str, options: dict | None):
    """A maker for one optimizer step of a recipe on TRTD rows ``<s> x </s> y </s>`` (x, y: half the row
    each): every objective on the same pair rows, ELECTRA the reference."""
    def make(cfg):
        import torch

        from xylent.models.objectives import build_model
        from xylent.models.training.optim import make_optimizer
        from xylent.models.stats import Norms

        from xylent.spec import PretrainConfig

        # the recipe's options over the spec's defaults for its section (pretrain.<objective>)
        whole = {**PretrainConfig(objective=objective).objective_options(), **(options or {})}
        model = build_model(objective, cfg, DISC_WEIGHT, MASK_PROB, whole)
        if hasattr(model, "attach"):
            model.attach(next(model.parameters()).device)
        opt = make_optimizer(model, lr=1e-4)

        def step(ids, k):
            ids = ids.clone()
            half = ids.shape[1] // 2
            ids[:, half - 1] = cfg.special("eos")
            seg = (torch.arange(ids.shape[1], device=ids.device) >= half).long().expand_as(ids)
            st = model(ids, ids == cfg.special("pad"), seg, _noise(ids, k))
            c = st.c_count.item() if st.c_count is not None else 1
            opt.zero_grad(set_to_none=True)
            loss = model.loss(st, Norms(max(st.g_count.item(), 1), max(st.d_count.item(), 1), max(c, 1)))
            loss.backward()
            opt.step()
            if hasattr(model, "after_step"):
                model.after_step()
            return loss.detach()
        info = {"params": n_params(model)}
        if objective == "infoxlm":
            info["contrasted_layer"] = model.layer
        return step, info
    return make


def hf_configs(cfg):
    from transformers import ElectraConfig

    common = dict(vocab_size=cfg.vocab_size, embedding_size=cfg.hidden, hidden_size=cfg.hidden,
                  num_attention_heads=cfg.heads, intermediate_size=cfg.ffn, max_position_embeddings=cfg.max_position,
                  hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout,
                  pad_token_id=cfg.special("pad"))
    disc = ElectraConfig(num_hidden_layers=cfg.layers, **common)
    gen = ElectraConfig(num_hidden_layers=cfg.generator_layers, **{**common, "hidden_dropout_prob": 0.0,
                                                                   "attention_probs_dropout_prob": 0.0})
    return gen, disc


def _hf_info(*models) -> dict:
    attn = getattr(models[-1].config, "_attn_implementation", None)
    return {"params": n_params(*models), "attn_implementation": attn}


def hf_discriminator(cfg):
    import torch
    from transformers import ElectraForPreTraining

    model = ElectraForPreTraining(hf_configs(cfg)[1])
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)  # the same optimizer kernel as ours

    def step(ids, k):
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, attention_mask=(ids != cfg.special("pad")).long(),
                     labels=_rtd_labels(ids, k).long()).loss
        loss.backward()
        opt.step()
        return loss.detach()
    return step, _hf_info(model)


def hf_electra(cfg):
    import torch
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    from xylent.models.masking import choose_masked, sample_tokens

    gen_cfg, disc_cfg = hf_configs(cfg)
    gen, disc = ElectraForMaskedLM(gen_cfg), ElectraForPreTraining(disc_cfg)
    disc.electra.embeddings = gen.electra.embeddings  # shared token + position embeddings, as ELECTRA does
    gen.train()
    disc.train()
    params = list({id(p): p for p in list(gen.parameters()) + list(disc.parameters())}.values())
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)

    def step(ids, k):
        mask = (ids != cfg.special("pad")).long()
        noise = _noise(ids, k)
        masked = choose_masked(ids, None, MASK_PROB, noise[0], cfg.special_ids)
        g = gen(input_ids=ids.masked_fill(masked, cfg.special("mask")), attention_mask=mask,
                labels=ids.masked_fill(~masked, -100))
        with torch.no_grad():
            sampled = sample_tokens(g.logits[masked], noise[1][masked])
        corrupted = ids.clone()
        corrupted[masked] = sampled
        d = disc(input_ids=corrupted, attention_mask=mask, labels=(corrupted != ids).long())
        opt.zero_grad(set_to_none=True)
        loss = g.loss + DISC_WEIGHT * d.loss
        loss.backward()
        opt.step()
        return loss.detach()
    return step, _hf_info(gen, disc)


# ---------------------------------------------------------------- FLOPs

def disc_flops_per_token(cfg, seq_len: int) -> float:
    """Training FLOPs per token of the discriminator stack alone (3 × forward), as flops_per_token counts."""
    return 3 * cfg.layers * (2 * (4 * cfg.hidden ** 2 + 2 * cfg.hidden * cfg.ffn) + 4 * seq_len * cfg.hidden)


def step_flops_per_token(what: str, cfg, seq_len: int) -> float:
    from xylent.models.training.optim import flops_per_token

    if what == "discriminator":
        return disc_flops_per_token(cfg, seq_len)
    return flops_per_token(cfg, seq_len, "electra" if what == "electra" else what, MASK_PROB)


# ---------------------------------------------------------------- timing

def _window(step, data, device, bf16: bool):
    """One timed unit: every batch of ``data`` once, synchronised; returns the last loss."""
    import torch

    def run():
        loss = None
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            for k, b in enumerate(data):
                loss = step(b, k)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return float(loss)
    return run


def compare(makers: dict, cfg: dict, data: list, device, args, *, bf16: bool = False) -> dict:
    """Build every side (seeded alike), then harness.side_by_side over windows; tokens/s per side.
    A side whose loss is not finite fails the run."""
    import torch

    steps, infos = {}, {}
    for name, (make, c) in makers.items():
        torch.manual_seed(0)
        with torch.device(device):
            step, infos[name] = make(c)
        steps[name] = _window(step, data, device, bf16)
    last, summ = harness.side_by_side(steps, repeats=args.repeats, warmup=args.warmup)
    tokens = sum(int(b.numel()) for b in data)
    out = {}
    for name, s in summ.items():
        if not math.isfinite(last[name]):
            raise SystemExit(f"pretrain benchmark: side {name!r} ended with a non-finite loss ({last[name]}); "
                             "no number is written")
        out[name] = {**s, **infos[name], "tokens_per_window": tokens, "last_loss": round(last[name], 4),
                     "tokens_per_s_best": round(tokens / s["best_s"], 1),
                     "tokens_per_s_median": round(tokens / s["median_s"], 1)}
    return out


def cpu_rows(args, cfg, cfg_nobias) -> dict:
    import torch

    data = batches(args.steps, args.batch, args.seq_len, args.vocab)
    dev = torch.device("cpu")
    out = {}
    for t in args.thread_counts:
        torch.set_num_threads(t)
        groups = {"discriminator": {"xylent": (ours_discriminator, cfg), NO_BIAS: (ours_discriminator, cfg_nobias)},
                  "electra": {"xylent": (ours_electra, cfg), NO_BIAS: (ours_electra, cfg_nobias)}}
        if not args.skip_hf:
            groups["discriminator"][HF_DISC] = (hf_discriminator, cfg)
            groups["electra"][HF_ELECTRA] = (hf_electra, cfg)
        out[str(t)] = {}
        for what, makers in groups.items():
            out[str(t)][what] = compare(makers, cfg, data, dev, args)
            for name, r in out[str(t)][what].items():
                print(f"{t} thread(s)  {what:14s} {name:58s} {r['tokens_per_s_median']:10,.0f} tokens/s (median)",
                      flush=True)
    torch.set_num_threads(max(args.thread_counts))
    objectives = compare({n: (objective_step(n, o), cfg) for n, o in OBJECTIVE_OPTIONS.items()}, cfg, data, dev,
                         args)
    for name, r in objectives.items():
        print(f"objective on TRTD rows {name:10s} {r['tokens_per_s_median']:10,.0f} tokens/s (median)", flush=True)
    return {"threads": args.thread_counts, "by_threads": out,
            "objectives": {"threads": max(args.thread_counts), "options": OBJECTIVE_OPTIONS, "sides": objectives}}


# ---------------------------------------------------------------- GPU

def _peak_memory_alone(make, cfg, data, device) -> float:
    """GiB: a side's peak CUDA allocation built alone (weights, grads, AdamW state, activations), 2 steps."""
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    torch.manual_seed(0)
    with torch.device(device):
        step, _ = make(cfg)
    _window(step, data[:2], device, True)()
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2**30
    del step
    gc.collect()
    torch.cuda.empty_cache()
    return round(peak, 3)


def zero_stage_run(size: str, vocab: int, batch: int, seq_len: int, steps: int, warmup: int, repeats: int,
                   stage: int) -> dict:
    """One DeepSpeed engine (one rank, bf16 on GPU) around our ELECTRA model with tasks/pretrain/deepspeed/zero<stage>.json;
    ``warmup`` then ``repeats`` timed windows of ``steps`` steps. Run in its own process
    (harness.in_fresh_process)."""
    import json

    import torch

    cuda = torch.cuda.is_available()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port)}.items():
        os.environ.setdefault(k, v)
    import deepspeed

    from xylent.models.config import preset
    from xylent.models.electra import ElectraModel
    from xylent.models.training.optim import (engine_config, engine_optimizer, flops_per_token, lr_lambdas, make_optimizer,
                              peak_tflops, warmup_linear_decay)

    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    cfg = preset(size, vocab_size=vocab, max_position=max(512, seq_len), specials=SPECIALS)
    torch.manual_seed(0)
    model = ElectraModel(cfg, DISC_WEIGHT, MASK_PROB).to(device)
    fast_path(model, cfg)  # the trainer's CUDA path: flex, encoders compiled
    # the trainer's engine: its config function, optimizer and schedule (models/training/trainer.py train())
    ds = engine_config(json.loads((HERE.parent / "tasks" / "pretrain" / "deepspeed" / f"zero{stage}.json").read_text()),
                       micro_batch=batch, grad_accum=1, clip=1.0, bf16=cuda)
    opt = make_optimizer(model, lr=1e-4)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lr_lambdas(model, opt.param_groups, warmup_linear_decay(0, (warmup + repeats) * steps)))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=schedule, config=ds)
    engine.train()
    data = [b.to(device) for b in batches(max(steps, 1), batch, seq_len, vocab)]
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)

    def one(k):
        k %= len(data)  # the bare rows' batches and noise, prepared once
        ids = data[k]
        st = engine(ids, ids == cfg.special("pad"), None, _noise(ids, k), **_host_counts(model, cfg, ids, k))
        engine.backward(engine.module.loss(st, _norms(st)))
        engine.step()

    k = 0

    def window():
        nonlocal k
        for _ in range(steps):
            one(k)
            k += 1
        if cuda:
            torch.cuda.synchronize()

    _, summ = harness.timed(window, repeats=repeats, warmup=warmup)
    tps = batch * seq_len * steps / summ["median_s"]
    fpt = flops_per_token(cfg, seq_len, "electra", MASK_PROB)
    peak = peak_tflops(torch.cuda.get_device_name(device)) if cuda else None
    return {"stage": stage, "optimizer_wrapper": engine_optimizer(engine), "steps_per_window": steps, **summ,
            "tokens_per_s_median": round(tps, 1),
            "tokens_per_s_best": round(batch * seq_len * steps / summ["best_s"], 1),
            "mfu": round(tps * fpt / (peak * 1e12), 4) if peak else None,
            "peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3) if cuda else None,
            "device": torch.cuda.get_device_name(device) if cuda else "cpu"}


def flex_self_test(device, size: str) -> dict:
    """Flex against the materialised reference on ``device`` before any flex row is timed: forward in fp32
    and under bf16 autocast, and where PyTorch has it (CUDA) backward too — the input's gradient and every
    parameter's.  Errors are ‖flex − reference‖ / ‖reference‖ over real positions; ``passed`` False keeps
    the flex sides out of the timing (gpu_rows)."""
    from dataclasses import replace

    import torch

    from xylent.models.config import preset
    from xylent.models.encoder import Encoder
    from xylent.models.weight_init import init_weights

    cuda = device.type == "cuda"
    base = preset(size, specials=SPECIALS)
    torch.manual_seed(0)
    ref = Encoder(replace(base, attention="materialised"), 2, 0.0).apply(init_weights).to(device)
    with torch.no_grad():  # the gate and table away from their start, so their terms weigh
        for m in ref.modules():
            if hasattr(m, "uv"):
                m.uv.weight.normal_()
        ref.rel.table.weight.normal_()
    flex = Encoder(replace(base, attention="flex"), 2, 0.0).to(device)
    flex.load_state_dict(ref.state_dict())
    b, n = (4, 512) if cuda else (2, 130)
    emb = torch.randn(b, n, base.hidden, device=device)
    pad = torch.zeros(b, n, dtype=torch.bool, device=device)
    pad[1, n * 3 // 5:], pad[-1, 17:] = True, True
    real = (~pad)[..., None].float()
    weights = torch.randn(b, n, base.hidden, device=device) * real  # what the backward is taken of

    def run(model, bf16):
        x = emb.clone().requires_grad_(cuda)
        model.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16), torch.set_grad_enabled(cuda):
            out = model(x, pad).float() * real
        grads = {}
        if cuda:
            (out * weights).sum().backward()
            grads = {"input": x.grad, **{k: p.grad for k, p in model.named_parameters() if p.grad is not None}}
        return out.detach(), grads

    def rel(a, r):
        return float((a.float() - r.float()).norm() / r.float().norm().clamp(min=1e-30))

    limits = {"fp32": 1e-4, "bf16": 2e-2}  # bf16: the two kernels round in different orders
    checks = {}
    for precision, limit in limits.items():
        (f_out, f_grads), (r_out, r_grads) = run(flex, precision == "bf16"), run(ref, precision == "bf16")
        grad_err = {k: rel(f_grads[k], g) for k, g in r_grads.items()}
        worst = max(grad_err, key=grad_err.get) if grad_err else None
        checks[precision] = {"forward": rel(f_out, r_out), "limit": limit,
                             "backward_worst": None if worst is None else grad_err[worst], "worst_tensor": worst,
                             "tensors_compared": len(grad_err)}
    passed = all(c["forward"] <= c["limit"] and (c["backward_worst"] or 0.0) <= c["limit"] for c in checks.values())
    return {"passed": passed, "device": device.type, "rows": b, "width": n, "size": size, "layers": 2,
            "backward": "compared" if cuda else "not run: PyTorch has no FlexAttention backward on CPU",
            "checks": checks}


def gpu_sides(cfg, nobias, with_flex: bool, skip_hf: bool, steps=("discriminator", "electra")) -> dict:
    """{step: {side: (maker, config)}}: the default path (flex and compiled on CUDA) and flex with the encoders
    eager when the self-test let them, the materialised reference eager, the same model without the bias, and
    transformers."""
    from dataclasses import replace
    from functools import partial

    makers = {"discriminator": (ours_discriminator, hf_discriminator, HF_DISC),
              "electra": (ours_electra, hf_electra, HF_ELECTRA)}
    groups = {}
    for what in steps:
        ours, hf, hf_name = makers[what]
        sides = {"xylent": (ours, cfg), FLEX_EAGER: (partial(ours, compile=False), cfg)} if with_flex else {}
        sides[MATERIALISED] = (ours, replace(cfg, attention="materialised"))
        sides[NO_BIAS] = (ours, nobias)
        if not skip_hf:
            sides[hf_name] = (hf, cfg)
        groups[what] = sides
    return groups


def working_sides(makers: dict, data, device) -> tuple[dict, dict]:
    """(the sides that build and take a step, {side: why not} for the others): one side that fails to
    compile on this GPU must not cost the other sides' rows."""
    import gc

    import torch

    ok, failed = {}, {}
    for name, (make, c) in makers.items():
        try:
            torch.manual_seed(0)
            with torch.device(device):
                step, _ = make(c)
            _window(step, data[:1], device, True)()
            ok[name] = (make, c)
        except Exception as exc:  # recorded beside the rows
            failed[name] = f"{type(exc).__name__}: {str(exc)[:500]}"
            print(f"GPU side {name!r} failed: {failed[name]}", flush=True)
        step = None
        gc.collect()
        torch.cuda.empty_cache()
    return ok, failed


def time_gpu_groups(groups: dict, cfg, data, device, args, peak, seq_len: int) -> dict:
    rows = {}
    for what, makers in groups.items():
        makers, failed = working_sides(makers, data, device)
        rows[what] = compare(makers, cfg, data, device, args, bf16=True) if makers else {}
        rows[what].update({n: {"failed": why} for n, why in failed.items()})
        fpt = step_flops_per_token(what, cfg, seq_len)
        for n, (m, c) in makers.items():
            r = rows[what][n]
            r["flops_per_token"] = fpt
            r["vocab_size"] = c.vocab_size
            r["mfu_median"] = round(r["tokens_per_s_median"] * fpt / (peak * 1e12), 4) if peak else None
            r["peak_memory_gib"] = _peak_memory_alone(m, c, data, device)
            print(f"GPU {what} V={c.vocab_size} {n}: {r['tokens_per_s_median']:,.0f} tokens/s, "
                  f"{r['peak_memory_gib']} GiB", flush=True)
    return rows


def gpu_rows(args) -> dict:
    import torch

    from xylent.models.config import preset
    from xylent.models.training.optim import peak_tflops

    if args.device == "cpu":
        return {"skipped": "not asked: --device cpu", "size": args.gpu_size}
    if not torch.cuda.is_available():
        if args.device == "cuda":
            raise SystemExit("--device cuda: torch sees no GPU (torch.cuda.is_available() is False)")
        return {"skipped": "no GPU: torch.cuda.is_available() is False on this machine", "size": args.gpu_size}
    device = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(device)
    size = "tiny" if args.quick else args.gpu_size
    selftest = flex_self_test(device, size)
    print(f"flex self-test: {selftest}", flush=True)
    peak = peak_tflops(name)
    vocabs = args.gpu_vocab_list
    rows, by_vocab = {}, {}
    for k, vocab in enumerate(vocabs):
        cfg = preset(size, vocab_size=vocab, max_position=max(512, args.gpu_seq_len), specials=SPECIALS)
        # the first GPU check (H200, 2026-11-27) had our step at 0.55x transformers' where the CPU has it at 0.97x:
        # the no-bias side tells what XLM-E's gated bias costs on each kernel
        nobias = preset(size, vocab_size=vocab, max_position=cfg.max_position, relative_bias=False,
                        specials=SPECIALS)
        data = [b.to(device) for b in batches(args.gpu_steps, args.gpu_batch, args.gpu_seq_len, vocab)]
        # the full vocabulary: the whole step only, where the generator's output layer is what grows
        groups = gpu_sides(cfg, nobias, selftest["passed"], args.skip_hf, ("discriminator", "electra") if k == 0
                           else ("electra",))
        timed = time_gpu_groups(groups, cfg, data, device, args, peak, args.gpu_seq_len)
        if k == 0:
            rows, first = timed, cfg
        else:
            by_vocab[str(vocab)] = {"model": cfg.to_dict(), "rows": timed}
    stages = {}
    for stage in args.zero_stage_list:
        run = harness.in_fresh_process("pretrain", "zero_stage_run", {
            "size": size, "vocab": vocabs[0], "batch": args.gpu_batch, "seq_len": args.gpu_seq_len,
            "steps": args.gpu_steps, "warmup": args.warmup, "repeats": args.repeats, "stage": stage})
        stages[str(stage)] = run["result"]
        print(f"ZeRO-{stage}: {run['result']}", flush=True)
    return {"device": name, "peak_bf16_tflops": peak, "size": size, "model": first.to_dict(), "precision": "bf16",
            "batch": args.gpu_batch, "seq_len": args.gpu_seq_len, "steps_per_window": args.gpu_steps,
            "flex_self_test": selftest, "rows": rows, "other_vocabularies": by_vocab,
            "zero_stages": {"world_size": 1, "objective": "electra", "stages": stages}}


# ---------------------------------------------------------------- run

# ---------------------------------------------------------------- the generator head at the full vocabulary

def vocab_head_memory(head: str, rows: int, vocab: int, hidden: int) -> dict:
    """One forward + backward of the generator's output layer (tied logits, summed cross-entropy, the
    inverse-CDF sample, the argmax) over ``rows`` masked tokens, fp32, in this process: the peak resident
    memory above its inputs (VmHWM after a reset, minus VmRSS; the weights' gradient, the same for both
    heads, is part of it), the time. ``head``: "unchunked", the head
    before issue 61 (models/electra.py at 3948a21), or "chunked" (xylent.models.vocab_head)."""
    import time
    import zlib

    import torch
    import torch.nn.functional as F

    from xylent.models.masking import sample_tokens
    from xylent.models.vocab_head import tied_lm_loss

    g = torch.Generator().manual_seed(0)
    h = torch.randn(rows, hidden, generator=g).requires_grad_()
    weight = (torch.randn(vocab, hidden, generator=g) * 0.05).requires_grad_()
    bias = torch.zeros(vocab, requires_grad=True)
    target, u = torch.randint(5, vocab, (rows,), generator=g), torch.rand(rows, generator=g)
    inputs_mb = harness.vm_rss_mb()
    reset = harness.reset_peak_rss()
    t = time.perf_counter()
    if head == "unchunked":
        logits = F.linear(h, weight, bias)
        loss = F.cross_entropy(logits.float(), target, reduction="sum")
        with torch.no_grad():
            sampled, predicted = sample_tokens(logits, u), logits.argmax(-1)
        del logits
    else:
        tok, sampled, predicted = tied_lm_loss(h, weight, bias, target, u)
        loss = tok.sum()
    loss.backward()
    seconds = time.perf_counter() - t
    return {"head": head, "peak_above_inputs_mb": round(harness.vm_hwm_mb() - inputs_mb, 1) if reset else None,
            "inputs_mb": round(inputs_mb, 1), "weight_grad_mb": round(weight.grad.numel() * 4 / 2**20, 1),
            "seconds": round(seconds, 2), "loss": float(loss), "sampled_crc32": zlib.crc32(sampled.numpy().tobytes()),
            "predicted_crc32": zlib.crc32(predicted.numpy().tobytes()),
            "weight_grad_norm": float(weight.grad.norm()), "h_grad_norm": float(h.grad.norm())}


def vocab_memory(args) -> dict:
    """The generator head's memory at the GPU rows' size (masked rows = 15 % of --gpu-batch x --gpu-seq-len,
    the largest of --gpu-vocabs, --gpu-size's hidden width), measured on the CPU in fp32: the head before
    issue 61 against the chunked one, each in a fresh process, and whether they agree."""
    from xylent.models.config import preset

    args.repeats, args.warmup = 1, 0  # one run a side: the memory of a fixed computation, not a timing
    vocab = 5000 if args.quick else max(int(v) for v in args.gpu_vocabs.split(","))
    rows = 64 if args.quick else round(args.gpu_batch * args.gpu_seq_len * MASK_PROB)
    hidden = 64 if args.quick else preset(args.gpu_size, vocab_size=vocab, specials=SPECIALS).hidden
    sides = {head: harness.in_fresh_process("pretrain", "vocab_head_memory",
                                            {"head": head, "rows": rows, "vocab": vocab, "hidden": hidden})
             for head in ("unchunked", "chunked")}
    old, new = sides["unchunked"]["result"], sides["chunked"]["result"]
    payload = {"config": {"rows": rows, "vocab": vocab, "hidden": hidden, "precision": "fp32", "device": "cpu",
                          "what": "one forward + backward of the generator head (logits, summed cross-entropy, "
                                  "sample, argmax); peak RSS above its inputs (VmHWM reset before the call)"},
               "sides": sides,
               "same_samples": old["sampled_crc32"] == new["sampled_crc32"],
               "same_argmax": old["predicted_crc32"] == new["predicted_crc32"],
               "loss_relative_difference": abs(old["loss"] - new["loss"]) / abs(old["loss"]),
               "memory_ratio": (round(old["peak_above_inputs_mb"] / new["peak_above_inputs_mb"], 2)
                                if old["peak_above_inputs_mb"] and new["peak_above_inputs_mb"] else None)}
    harness.write_result("pretrain_vocab_memory", payload, args)
    for head, r in sides.items():
        res = r["result"]
        print(f"{head}: {res['peak_above_inputs_mb']} MB above the inputs (the weights' gradient "
              f"{res['weight_grad_mb']} MB of it), {res['seconds']} s", flush=True)
    return payload


def main(argv: list[str] | None = None) -> dict:
    ap = harness.parser(__doc__)
    ap.add_argument("--size", default=None, help="model preset of the CPU rows (default small, quick tiny)")
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary (default 32000, quick 1000)")
    ap.add_argument("--batch", type=int, default=None, help="rows per step (default 8, quick 4)")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per row (default 128, quick 32)")
    ap.add_argument("--steps", type=int, default=None, help="steps per timed window (default 4, quick 1)")
    ap.add_argument("--threads", default="1,all", help="torch thread counts of the comparisons ('all': every core)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto: GPU rows when a GPU is visible; cpu: CPU rows only; cuda: GPU rows or fail")
    ap.add_argument("--gpu-size", default="base")
    ap.add_argument("--gpu-batch", type=int, default=32)
    ap.add_argument("--gpu-seq-len", type=int, default=512)
    ap.add_argument("--gpu-steps", type=int, default=10, help="steps per timed GPU window")
    ap.add_argument("--gpu-vocabs", default="32000,250002", help="vocabularies of the GPU rows: both steps at "
                    "the first, the whole ELECTRA step at the others (250 002: XLM-R's, the spec's default)")
    ap.add_argument("--zero-stages", default=None, help="DeepSpeed ZeRO stages to measure on GPU (default 0,1,2,3)")
    ap.add_argument("--skip-hf", action="store_true", help="leave out the transformers sides")
    ap.add_argument("--gpu-only", action="store_true", help="only the GPU rows (benchmarks/gpu_check.py: the CPU "
                    "rows are this machine's, not the lent GPU's)")
    ap.add_argument("--vocab-memory", action="store_true", help="only the generator head's memory at the GPU rows' "
                    "size and largest vocabulary, before and after issue 61 (results/pretrain_vocab_memory.json)")
    args = harness.finish_args(ap.parse_args(argv))
    if args.vocab_memory:
        return vocab_memory(args)
    q = args.quick
    args.size = args.size or ("tiny" if q else "small")
    args.vocab = args.vocab or (1000 if q else 32000)
    args.batch = args.batch or (4 if q else 8)
    args.seq_len = args.seq_len or (32 if q else 128)
    args.steps = args.steps or (1 if q else 4)
    if q:
        args.gpu_batch, args.gpu_seq_len, args.gpu_steps = 4, 32, 1
    args.gpu_vocab_list = [int(v) for v in args.gpu_vocabs.split(",")]
    if q:
        args.gpu_vocab_list = [1000, 5000]
    args.zero_stage_list = [int(s) for s in (args.zero_stages or ("0" if q else "0,1,2,3")).split(",")]
    cores = len(os.sched_getaffinity(0))
    args.thread_counts = sorted({cores if t.strip() == "all" else int(t) for t in args.threads.split(",")})

    import torch

    from xylent.models.config import preset

    cfg = preset(args.size, vocab_size=args.vocab, max_position=max(512, args.seq_len), specials=SPECIALS)
    cfg_nobias = preset(args.size, vocab_size=args.vocab, max_position=cfg.max_position, relative_bias=False,
                        specials=SPECIALS)
    payload = {"config": {"size": args.size, "model": cfg.to_dict(), "batch": args.batch, "seq_len": args.seq_len,
                          "steps_per_window": args.steps, "mask_prob": MASK_PROB, "disc_weight": DISC_WEIGHT,
                          "precision": "fp32", "device": "cpu", "optimizer": "AdamW (fused), lr 1e-4",
                          "peer": None if args.skip_hf else "transformers", "torch_interop_threads":
                          torch.get_num_interop_threads()}}
    payload["config"]["flops_per_token"] = {w: step_flops_per_token(w, cfg, args.seq_len)
                                            for w in ("discriminator", "electra", "mlm", "infoxlm", "veco")}
    payload["cpu"] = None if args.gpu_only else cpu_rows(args, cfg, cfg_nobias)
    payload["gpu"] = gpu_rows(args)
    harness.write_result("pretrain", payload, args)
    return payload


# ---------------------------------------------------------------- markdown

def _tps(r: dict | None) -> str:
    """'median (best)' tokens/s."""
    if r is None:
        return "–"
    return f"{harness.num(r['tokens_per_s_median'])} ({harness.num(r['tokens_per_s_best'])})"


def _n(k: int, word: str) -> str:
    return f"{k} {word}" + ("" if k == 1 else "s")


def _spread(r: dict) -> float:
    """(slowest - fastest window) / median: how much this machine varied."""
    return (max(r["runs_s"]) - min(r["runs_s"])) / r["median_s"]


def _x(a: dict, b: dict) -> float:
    """a's median throughput over b's."""
    return a["tokens_per_s_median"] / b["tokens_per_s_median"]


def _peer(sides: dict) -> dict | None:
    return next((v for k, v in sides.items() if k.startswith("transformers") and "failed" not in v), None)


STEP_LABEL = {"discriminator": "discriminator step (RTD loss; peer `ElectraForPreTraining`)",
              "electra": "whole ELECTRA step (G + sample + D, λ = {w}; peer `ElectraForMaskedLM` + "
                         "`ElectraForPreTraining`, shared embeddings)"}


def _cpu_md(result: dict) -> list[str]:
    cfg, cpu = result["config"], result["cpu"]
    m = cfg["model"]
    out = [f"`{cfg['size']}` ({m['layers']} × {m['hidden']}, FFN {m['ffn']}, {m['heads']} heads; generator "
           f"{_n(m['generator_layers'], 'layer')}), vocabulary {harness.num(m['vocab_size'])}, {cfg['batch']} × "
           f"{cfg['seq_len']} random tokens per step, {cfg['precision']} on CPU, dropout {m['dropout']}, "
           f"{_n(cfg['steps_per_window'], 'step')} per window; tokens/s of the median window (best in brackets), "
           f"{_n(result['repeats'], 'window')} per side after {result['warmup']} warm-up, the same torch threads on "
           "every side:", ""]
    by = cpu["by_threads"]
    steps = list(next(iter(by.values())))
    rows, slower, notes = [], [], []
    for what in steps:
        for t, groups in by.items():
            sides = groups[what]
            ours, nob, peer = sides["xylent"], sides.get(NO_BIAS), _peer(sides)
            ratio = "–" if peer is None else (f"**{_x(ours, peer):.2f}×**"
                                              + (f" ({_x(nob, peer):.2f}× without the bias)" if nob else ""))
            rows.append([STEP_LABEL[what].format(w=harness.num(cfg["disc_weight"])), t, _tps(ours), _tps(nob),
                         _tps(peer), ratio])
            if peer is not None and _x(ours, peer) < 1:
                slower.append(f"the {what} step with {_n(int(t), 'thread')} ({_x(ours, peer):.2f}×)")
            if nob is not None:
                cost = 1 - _x(ours, nob)
                if min(ours["n"], nob["n"]) < 2:
                    verdict = "one window per side, so the noise is not measured"
                else:
                    noise = max(_spread(ours), _spread(nob))
                    verdict = ("larger than" if abs(cost) > noise else "within") + \
                        f" the spread of the windows ({noise * 100:.1f} % of the median)"
                notes.append(f"{what} step, {_n(int(t), 'thread')}: {cost * 100:+.1f} %, {verdict}")
    out += [harness.table(["", "threads", "xylent", "xylent, no relative bias", "transformers",
                           "xylent / transformers (median)"], rows), ""]
    if slower:
        out += ["xylent is slower than transformers on " + "; ".join(slower) + ".", ""]
    if notes:
        out += ["What the gated relative position bias costs (1 − median tokens/s with it over without it): "
                + "; ".join(notes) + ".", ""]
    first = next(iter(cpu["by_threads"].values()))
    par = []
    for what, sides in first.items():
        peer = _peer(sides)
        if peer is not None:
            par.append(f"{what}: xylent {harness.num(sides['xylent']['params'])}, transformers "
                       f"{harness.num(peer['params'])} (attention `{peer.get('attn_implementation')}`)")
    if par:
        out += ["Parameters of each side (shared embeddings counted once): " + "; ".join(par) + ".", ""]
    peer = _peer(first.get("electra", {}))
    if peer is not None:
        # counted, not timed: the generator's output layer at every position (transformers) or at the masked ones
        h, v = m["hidden"], m["vocab_size"]
        head_all = 3 * 2 * (h * h + h * v)
        extra = head_all * (1 - cfg["mask_prob"])
        share = extra / (cfg["flops_per_token"]["electra"] + extra)
        out += [f"Counted, not timed: transformers' generator evaluates its output layer (h × V = {h} × "
                f"{harness.num(v)}) at every position, ours only at the {cfg['mask_prob'] * 100:.0f} % masked ones; "
                f"the extra positions are {share * 100:.1f} % of the FLOPs of transformers' whole step at this size "
                "(the share grows with the vocabulary).", ""]
    return out


def _objectives_md(result: dict) -> list[str]:
    cfg, obj = result["config"], result["cpu"]["objectives"]
    m, sides = cfg["model"], obj["sides"]
    ref = sides["electra"]
    half = cfg["seq_len"] // 2
    what = {"electra": f"generator ({_n(m['generator_layers'], 'layer')}) + discriminator ({m['layers']})",
            "mlm": f"one {m['layers']}-layer encoder",
            "infoxlm": (f"MLM + the query side again up to the contrasted layer "
                        f"({sides.get('infoxlm', {}).get('contrasted_layer', '?')} of {m['layers']}) + the key "
                        "encoder's forward"),
            "veco": "a plug-out and a plug-in pass (cross-attention in every layer) over both sides"}
    rows = [[n, _tps(r), f"{_x(r, ref):.2f}×", what.get(n, "")] for n, r in sides.items()]
    opts = obj["options"].get("infoxlm") or {}
    return [f"**One row per pretraining objective** (`objective on TRTD rows`: the same {cfg['batch']} × "
            f"{cfg['seq_len']} rows as translation pairs `<s> x </s> y </s>`, {half} tokens a side, same model "
            f"size, {_n(obj['threads'], 'thread')}; ELECTRA is the reference):", "",
            harness.table(["objective", "tokens/s, median (best)", "vs ELECTRA (median)", "what one step runs"],
                          rows), "",
            "InfoXLM's row uses " + ", ".join(f"`{k}` {v}" for k, v in opts.items()) + ".", ""]


def _gpu_table(sides_by_step: dict) -> str:
    rows = []
    for what, sides in sides_by_step.items():
        peer = _peer(sides)
        for n, r in sides.items():
            if "failed" in r:
                rows.append([what, n, f"failed: {r['failed'][:160]}", "–", "–", ""])
                continue
            rows.append([what, n, _tps(r), "–" if r.get("mfu_median") is None else f"{r['mfu_median'] * 100:.1f} %",
                         f"{r['peak_memory_gib']:.2f} GiB",
                         f"{_x(r, peer):.2f}×" if peer is not None and r is not peer else ""])
    return harness.table(["step", "side", "tokens/s, median (best)", "MFU (median)", "peak memory",
                          "xylent / transformers"], rows)


def _self_test_md(test: dict | None) -> list[str]:
    if not test:
        return []
    errs = "; ".join(f"{p}: forward {c['forward']:.1e}"
                     + ("" if c["backward_worst"] is None else
                        f", backward worst {c['backward_worst']:.1e} ({c['worst_tensor']}, {c['tensors_compared']} "
                        "tensors)") + f" (limit {c['limit']:g})" for p, c in test["checks"].items())
    verdict = ("passed: the flex side was timed" if test["passed"] else
               "**failed: the flex side was not timed** (the rows below are the other sides')")
    return [f"Flex self-test before timing ({test['rows']} × {test['width']} tokens, {test['layers']} layers of "
            f"`{test['size']}`, relative error ‖flex − materialised‖ / ‖materialised‖): {errs}; {verdict}.", ""]


def _gpu_md(result: dict) -> list[str]:
    gpu = result.get("gpu") or {"skipped": "no GPU section in this result"}
    if "skipped" in gpu:
        why = gpu["skipped"]
        head = ("not measured: no GPU was available to this run" if why.startswith("no GPU")
                else f"not measured: {why}")
        return [f"**GPU (`{gpu.get('size', 'base')}`, bf16: tokens/s, MFU, peak memory per ZeRO stage, against "
                f"transformers' `ElectraForPreTraining`): {head}** (`{why}`). `--device cuda` measures them where "
                "a GPU is lent; no figure is estimated.", ""]
    m = gpu["model"]
    out = [f"**GPU**: {gpu['device']}, `{gpu['size']}` ({m['layers']} × {m['hidden']}), vocabulary "
           f"{harness.num(m['vocab_size'])}, bf16 autocast, {gpu['batch']} × {gpu['seq_len']} tokens per step, "
           f"{gpu['steps_per_window']} steps per window; MFU over a dense bf16 peak of "
           f"{harness.num(gpu['peak_bf16_tflops'])} TFLOP/s, the same FLOPs per token for every side; peak memory of "
           "each side built alone. " + (
               f"`xylent` is the default CUDA path (FlexAttention, encoders compiled), `{MATERIALISED}` the step as "
               "it was before it:" if "flex_self_test" in gpu else
               "Measured before the flex path existed: `xylent` is the materialised bias, eager:"),
           "", *_self_test_md(gpu.get("flex_self_test")),
           _gpu_table(gpu["rows"]), ""]
    for vocab, other in (gpu.get("other_vocabularies") or {}).items():
        out += [f"The same at vocabulary {harness.num(int(vocab))} (the whole step: the generator's output layer "
                "is what grows):", "", _gpu_table(other["rows"]), ""]
    z = gpu.get("zero_stages", {})
    if z.get("stages"):
        bare = gpu["rows"].get("electra", {}).get("xylent")
        out += [f"DeepSpeed engine around our ELECTRA model, {z['world_size']} rank, one process per stage "
                "(`tasks/pretrain/deepspeed/zero<N>.json`" + (", built as the trainer builds it" if any(
                    "optimizer_wrapper" in r for r in z["stages"].values()) else "") + "); its cost is 1 − its "
                "tokens/s over the bare whole step's (`xylent` above, same sizes):", "",
                harness.table(["ZeRO stage", "optimizer as the engine steps it", "tokens/s, median (best)",
                               "MFU (median)", "peak memory", "cost vs the bare step"],
                              [[s, f"`{r['optimizer_wrapper']}`" if r.get("optimizer_wrapper") else "–", _tps(r),
                                "–" if r.get("mfu") is None else f"{r['mfu'] * 100:.1f} %",
                                "–" if r.get("peak_memory_gib") is None else f"{r['peak_memory_gib']:.2f} GiB",
                                "–" if bare is None else f"{(1 - _x(r, bare)) * 100:+.1f} %"]
                               for s, r in z["stages"].items()]), ""]
    return out


def markdown(result: dict) -> str:
    return "\n".join(_cpu_md(result) + _objectives_md(result) + _gpu_md(result))


if __name__ == "__main__":
    main()
