"""AdamW with XY-LENT's settings (Table 9), its parameter groups, and the
linear warmup + linear decay schedule; FLOP counts for MFU."""

from __future__ import annotations

import torch
from torch import nn

from xylent.models.config import EncoderConfig
from xylent.models.objectives import model_class


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only: biases, LayerNorm and the gate's per-head w
    are left alone (BERT/ELECTRA practice; XY-LENT does not say).  A model that can
    hold its body still for a while (VECO's ``freeze_body_steps``) gets its body and
    the rest in separate groups, so the body's lr can be 0 (lr_lambdas)."""
    split = getattr(model, "freezes_body", lambda: False)()
    groups: dict[tuple[bool, bool], list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        decay = not (p.ndim < 2 or name.endswith(".bias") or ".ln" in name)
        body = split and not model.is_cross(name)
        groups.setdefault((body, decay), []).append(p)
    return [{"params": ps, "weight_decay": weight_decay if decay else 0.0, "body": body}
            for (body, decay), ps in sorted(groups.items(), key=lambda kv: (kv[0][0], not kv[0][1]))]


def lr_lambdas(model: nn.Module, groups: list[dict], schedule):
    """One lr multiplier per parameter group: ``schedule`` everywhere, except 0 for the body's
    groups while the model holds its body still (lr 0 also stops AdamW's decoupled decay)."""
    frozen = getattr(model, "body_frozen", None)
    if frozen is None or not any(g.get("body") for g in groups):
        return schedule
    return [(lambda s: 0.0 if frozen(s) else schedule(s)) if g.get("body") else schedule for g in groups]


def make_optimizer(model: nn.Module, lr: float, betas=(0.9, 0.98), eps: float = 1e-6,
                   weight_decay: float = 0.01) -> torch.optim.Optimizer:
    # the fused kernel (CPU and CUDA since torch 2.4) updates every tensor in one pass
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=tuple(betas), eps=eps, fused=True)


def engine_config(base: dict, *, micro_batch: int, grad_accum: int, clip: float, bf16: bool) -> dict:
    """DeepSpeed's config: the file's own settings, its ZeRO stage included, with what the run decides
    (micro-batch per rank, accumulation, clipping, precision).  The trainer and the pretrain benchmark both
    build their engine from this, so the benchmark times the trainer's engine.

    bf16 at ZeRO 0 is DeepSpeed's ``torch_autocast`` (fp32 weights, bf16 matmuls), not its ``bf16`` mode:
    there DeepSpeed 0.19.8 (``_do_optimizer_sanity_check`` → ``_configure_fp16_optimizer``) wraps any optimizer
    but its FusedAdam in FP16_UnfusedOptimizer (a Python loop over parameters), FusedAdam in FP16_Optimizer,
    and both check overflow with a host sync per gradient; under torch_autocast it wraps nothing and steps our
    fused AdamW itself, as the bare step does.  At ZeRO 1 and 2 bf16 mode's DeepSpeedZeroOptimizer already runs
    that AdamW fused, on one flat fp32 partition per group, and keeps weights and gradients in bf16.
    docs/stages/pretrain.md, "Precision and the optimizer under DeepSpeed".
    """
    ds = {k: v for k, v in base.items() if not k.startswith("_")}  # the ZeRO stage is the file's own
    autocast = bf16 and ds.get("zero_optimization", {}).get("stage", 0) == 0
    ds.update({
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": clip,
        "bf16": {"enabled": bf16 and not autocast},
        "torch_autocast": {"enabled": autocast, "dtype": "bfloat16"},
    })
    return ds


def engine_optimizer(engine) -> str:
    """What the engine steps, as a benchmark row records it: DeepSpeed's wrapper and the optimizer
    inside, e.g. ``DeepSpeedZeroOptimizer > AdamW(fused)``; the optimizer alone when nothing wraps it."""
    outer = engine.optimizer
    inner = getattr(outer, "optimizer", None)

    def name(opt) -> str:
        return type(opt).__name__ + ("(fused)" if getattr(opt, "defaults", {}).get("fused") else "")
    return name(outer) if inner is None else f"{type(outer).__name__} > {name(inner)}"


def warmup_linear_decay(warmup: int, total: int, final_ratio: float = 0.0):
    """lr multiplier at optimizer step s: 0 → 1 over ``warmup`` steps, then linearly
    down to ``final_ratio`` at ``total``."""
    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        span = max(1, total - warmup)
        return max(final_ratio, 1.0 - (1.0 - final_ratio) * (step - warmup) / span)
    return f


def flops_per_token(cfg: EncoderConfig, seq_len: int, objective: str, mask_prob: float = 0.15) -> float:
    """Training FLOPs (forward + backward = 3 × forward) per input token.

    Per layer and token a forward pass costs 2 × 12·h² (QKV, output, two FFN
    matrices, with ffn = 4h in general: 2·(4h² + 2·h·ffn)) plus 2 × 2·seq·h for
    QKᵀ and AV.  The generator head runs only at the masked positions (h·V each).
    """
    h = cfg.hidden
    per_layer = 2 * (4 * h * h + 2 * h * cfg.ffn) + 4 * seq_len * h
    model = model_class(objective)  # its layers per token and any extra head (xylent.models.objective)
    head = mask_prob * 2 * (h * h + h * cfg.vocab_size)
    return 3 * (model.layer_passes(cfg) * per_layer + head + model.extra_head_flops(cfg))


PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "GH200": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}


def peak_tflops(device_name: str, configured: float | None = None) -> float | None:
    """Dense bf16 peak of the device (vendor datasheets), unless configured."""
    if configured:
        return configured
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in device_name:
            return value
    return None
