"""Pretraining throughput, side by side with Hugging Face transformers' ELECTRA.

Every row trains the same batches (B × L token ids, 15 % masked) with AdamW and
reports tokens/s of full optimizer steps (forward + backward + fused AdamW
update, the same kernel on both sides), best of ``--repeats`` timed windows
after warm-up:

- ``discriminator``: our discriminator stack + RTD head vs ``ElectraForPreTraining``
  of the same size (replaced-token labels given);
- ``electra``: our whole XLM-E step (generator, sampling, discriminator, λ = 50)
  vs HF ``ElectraForMaskedLM`` + ``ElectraForPreTraining`` with shared embeddings
  composed the same way (the HF ELECTRA recipe);
- ``…, no relative bias``: ours with ``relative_bias: false`` — what the gated
  bias costs;
- ``objective on TRTD rows``: one row per pretraining recipe (``electra``,
  ``mlm``, ``infoxlm``, ``veco``) on the same translation-pair rows, ELECTRA the
  reference (``objective.<name>_over_electra``).

On a GPU (``--device cuda``) the script also reports MFU for bf16 and peak
memory of the bare model; memory per ZeRO stage comes from the trainer itself
(``peak_memory_gb`` per step in metrics.jsonl / MLflow, one run per
``pretrain.zero_stage``).

    python benchmarks/pretrain.py --size small [--out benchmarks/results/pretrain.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from models.config import preset
from models.electra import ElectraModel, RTDHead
from models.encoder import Embeddings, Encoder
from models.init import init_weights
from models.masking import choose_masked, row_noise, sample_tokens
from models.stats import Norms
from models.optim import flops_per_token, make_optimizer, peak_tflops


def batches(n: int, b: int, length: int, vocab: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, vocab, (b, length), generator=g)
        ids[:, 0], ids[:, -1] = 1, 2
        out.append(ids)
    return out


class OurDiscriminator(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embeddings, self.encoder, self.head = Embeddings(cfg), Encoder(cfg, cfg.layers, cfg.dropout), RTDHead(
            cfg.hidden)
        self.pad_id = cfg.special("pad")
        self.apply(init_weights)

    def forward(self, ids, labels):
        logits = self.head(self.encoder(self.embeddings(ids), ids == self.pad_id))
        return F.binary_cross_entropy_with_logits(logits, labels.float())


def ours_discriminator_step(cfg):
    model = OurDiscriminator(cfg)
    opt = make_optimizer(model, lr=1e-4)

    def step(ids, k):
        labels = (torch.rand(ids.shape, generator=torch.Generator().manual_seed(k)) < 0.15)
        opt.zero_grad(set_to_none=True)
        model(ids, labels).backward()
        opt.step()
    return step


def ours_electra_step(cfg):
    model = ElectraModel(cfg)
    opt = make_optimizer(model, lr=1e-4)

    def step(ids, k):
        pad = ids == cfg.special("pad")
        noise = row_noise(0, k, 0, list(range(len(ids))), [ids.shape[1]] * len(ids), ids.shape[1]).to(ids.device)
        st = model(ids, pad, None, noise)
        opt.zero_grad(set_to_none=True)
        model.loss(st, Norms(st.g_count.item(), max(st.d_count.item(), 1))).backward()
        opt.step()
    return step


def objective_step(objective: str, options: dict | None = None):
    """One optimizer step of a recipe on TRTD rows ``<s> x </s> y </s>`` (x, y: half the row each): every
    objective on the same pair rows, the ELECTRA row the reference (the cost of XLCo's extra passes and key
    encoder, of VECO's plug-in pass)."""
    def make(cfg):
        from models.objectives import build_model

        model = build_model(objective, cfg, options=options)
        if hasattr(model, "attach"):
            model.attach(next(model.parameters()).device)
        opt = make_optimizer(model, lr=1e-4)

        def step(ids, k):
            ids = ids.clone()
            half = ids.shape[1] // 2
            ids[:, half - 1] = cfg.special("eos")
            seg = (torch.arange(ids.shape[1], device=ids.device) >= half).long().expand_as(ids)
            pad = ids == cfg.special("pad")
            noise = row_noise(0, k, 0, list(range(len(ids))), [ids.shape[1]] * len(ids), ids.shape[1]).to(ids.device)
            st = model(ids, pad, seg, noise)
            c = st.c_count.item() if st.c_count is not None else 1
            opt.zero_grad(set_to_none=True)
            model.loss(st, Norms(max(st.g_count.item(), 1), max(st.d_count.item(), 1), max(c, 1))).backward()
            opt.step()
            if hasattr(model, "after_step"):
                model.after_step()
        return step
    return make


OBJECTIVE_ROWS = {"electra": None, "mlm": None, "veco": None,
                  "infoxlm": {"queue_size": 4096, "pool": "mean", "normalize": True, "in_batch_negatives": True}}


def hf_configs(cfg):
    from transformers import ElectraConfig

    common = dict(vocab_size=cfg.vocab_size, embedding_size=cfg.hidden, hidden_size=cfg.hidden,
                  num_attention_heads=cfg.heads, intermediate_size=cfg.ffn, max_position_embeddings=cfg.max_position,
                  hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout, pad_token_id=3)
    disc = ElectraConfig(num_hidden_layers=cfg.layers, **common)
    gen = ElectraConfig(num_hidden_layers=cfg.generator_layers, **{**common, "hidden_dropout_prob": 0.0,
                                                                   "attention_probs_dropout_prob": 0.0})
    return gen, disc


def hf_discriminator_step(cfg):
    from transformers import ElectraForPreTraining

    model = ElectraForPreTraining(hf_configs(cfg)[1])
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)  # the same optimizer kernel as ours

    def step(ids, k):
        labels = (torch.rand(ids.shape, generator=torch.Generator().manual_seed(k)) < 0.15).long()
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, attention_mask=(ids != cfg.special("pad")).long(), labels=labels).loss.backward()
        opt.step()
    return step


def hf_electra_step(cfg):
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    gen_cfg, disc_cfg = hf_configs(cfg)
    gen, disc = ElectraForMaskedLM(gen_cfg), ElectraForPreTraining(disc_cfg)
    disc.electra.embeddings = gen.electra.embeddings  # shared token + position embeddings, as ELECTRA does
    gen.train()
    disc.train()
    params = list({id(p): p for p in list(gen.parameters()) + list(disc.parameters())}.values())
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)

    def step(ids, k):
        mask = (ids != cfg.special("pad")).long()
        noise = row_noise(0, k, 0, list(range(len(ids))), [ids.shape[1]] * len(ids), ids.shape[1]).to(ids.device)
        masked = choose_masked(ids, None, 0.15, noise[0], cfg.special_ids)
        labels = ids.masked_fill(~masked, -100)
        g = gen(input_ids=ids.masked_fill(masked, cfg.special("mask")), attention_mask=mask, labels=labels)
        with torch.no_grad():
            sampled = sample_tokens(g.logits[masked], noise[1][masked])
        corrupted = ids.clone()
        corrupted[masked] = sampled
        d = disc(input_ids=corrupted, attention_mask=mask, labels=(corrupted != ids).long())
        opt.zero_grad(set_to_none=True)
        (g.loss + 50.0 * d.loss).backward()
        opt.step()
    return step


def measure(make, cfg, data, device, warmup: int, repeats: int, bf16: bool) -> dict:
    torch.manual_seed(0)
    step = make(cfg)
    tokens = sum(int(b.numel()) for b in data)
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else torch.autocast("cpu", enabled=False)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with ctx:
        for k in range(warmup):
            step(data[k % len(data)].to(device), k)
        best = float("inf")
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            for k, b in enumerate(data):
                step(b.to(device), k)
            if device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
    out = {"tokens_per_second": tokens / best, "seconds": best, "tokens": tokens}
    if device.type == "cuda":
        out["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def _move(make, device):
    """Build the model on the device: the step closures own their models, so set the default device."""
    def build(cfg):
        with torch.device(device):
            return make(cfg)
    return build


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=4, help="steps per timed window")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--out", default="benchmarks/results/pretrain.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    bf16 = device.type == "cuda"
    # the layout of xylent's tokenizers (tasks.vocab.specials), as a real run would copy it from spm.model
    specials = dict(zip(("unk", "bos", "eos", "pad", "mask"), range(5)))
    cfg = preset(args.size, vocab_size=args.vocab, max_position=max(512, args.seq_len), specials=specials)
    data = batches(args.steps, args.batch, args.seq_len, args.vocab)
    rows = {}
    plan = [("discriminator", "xylent", ours_discriminator_step, cfg),
            ("discriminator", "xylent, no relative bias", ours_discriminator_step,
             preset(args.size, vocab_size=args.vocab, max_position=cfg.max_position, relative_bias=False,
                    specials=specials)),
            ("electra", "xylent", ours_electra_step, cfg),
            ("electra", "xylent, no relative bias", ours_electra_step,
             preset(args.size, vocab_size=args.vocab, max_position=cfg.max_position, relative_bias=False,
                    specials=specials))]
    if not args.skip_hf:
        plan += [("discriminator", "transformers ElectraForPreTraining", hf_discriminator_step, cfg),
                 ("electra", "transformers ElectraForMaskedLM + ElectraForPreTraining", hf_electra_step, cfg)]
    plan += [("objective on TRTD rows", name, objective_step(name, opts), cfg) for name, opts in OBJECTIVE_ROWS.items()]
    for what, who, make, c in plan:
        r = measure(_move(make, device), c, data, device, args.warmup, args.repeats, bf16)
        if device.type == "cuda":
            objective = who if what.startswith("objective") else "electra" if what == "electra" else "mlm"
            fpt = flops_per_token(c, args.seq_len, objective) if what != "discriminator" else \
                3 * c.layers * (2 * (4 * c.hidden ** 2 + 2 * c.hidden * c.ffn) + 4 * args.seq_len * c.hidden)
            peak = peak_tflops(torch.cuda.get_device_name(device))
            if peak:
                r["mfu"] = r["tokens_per_second"] * fpt / (peak * 1e12)
        rows.setdefault(what, {})[who] = r
        print(f"{what:14s} {who:58s} {r['tokens_per_second']:12,.0f} tokens/s", flush=True)
    ratios = {}
    for what, by in rows.items():
        if what.startswith("objective"):  # each recipe's speed relative to ELECTRA's on the same rows
            for name, r in by.items():
                ratios[f"objective.{name}_over_electra"] = r["tokens_per_second"] / by["electra"]["tokens_per_second"]
            continue
        hf = [v for k, v in by.items() if k.startswith("transformers")]
        if hf:
            ratios[what] = by["xylent"]["tokens_per_second"] / hf[0]["tokens_per_second"]
        ratios[f"{what}.relative_bias_cost"] = 1 - by["xylent"]["tokens_per_second"] / by[
            "xylent, no relative bias"]["tokens_per_second"]
    result = {
        "benchmark": "pretrain", "size": args.size, "config": cfg.to_dict(), "batch": args.batch,
        "seq_len": args.seq_len, "device": torch.cuda.get_device_name(device) if bf16 else platform.processor()
        or platform.machine(), "threads": args.threads, "torch": torch.__version__, "precision": "bf16" if bf16
        else "fp32", "rows": rows, "ratio_xylent_over_transformers": ratios,
    }
    if not args.skip_hf:  # the peer ran, so it is installed
        import transformers

        result["transformers"] = transformers.__version__
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(ratios, indent=2))
    return result


if __name__ == "__main__":
    main()
