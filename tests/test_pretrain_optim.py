"""The optimizer under DeepSpeed's engine (issue 61, item 3): which wrapper runs it at each ZeRO
stage and precision, and that the engine as the trainer now builds it (xylent.models.training.optim.engine_config)
updates the weights as it did before on CPU.

The engines are real DeepSpeed 0.19.8 engines on the CPU accelerator with gloo, one rank, in one
child process (DeepSpeed's process group and accelerator are process-wide).  DeepSpeed picks its
optimizer wrapper from the config and the optimizer's class alone (``_do_optimizer_sanity_check``,
``_configure_optimizer``), not from the device, so building the GPU's bf16 configuration here shows
the wrapper a GPU gets; what only a GPU can show is the speed (benchmarks/pretrain.py --device cuda).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ZERO = ROOT / "tasks" / "pretrain" / "deepspeed"
STEPS = 5
SPECIALS = dict(zip(("unk", "bos", "eos", "pad", "mask"), range(5)))


def _old_config(stage: int, bf16: bool) -> dict:
    """models/training/trainer.py ds_config as it was before engine_config (bf16 mode at every stage)."""
    base = {k: v for k, v in json.loads((ZERO / f"zero{stage}.json").read_text()).items() if not k.startswith("_")}
    base.update({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
                 "bf16": {"enabled": bf16}})
    return base


def _new_config(stage: int, bf16: bool) -> dict:
    from xylent.models.training.optim import engine_config

    return engine_config(json.loads((ZERO / f"zero{stage}.json").read_text()), micro_batch=4, grad_accum=1,
                         clip=1.0, bf16=bf16)


def test_bf16_at_zero_0_is_torch_autocast_and_bf16_mode_above():
    for stage in (0, 1, 2, 3):
        ds = _new_config(stage, bf16=True)
        assert ds["zero_optimization"]["stage"] == stage and "_comment" not in ds
        assert ds["bf16"]["enabled"] is (stage > 0)
        assert ds["torch_autocast"] == {"enabled": stage == 0, "dtype": "bfloat16"}
        cpu = _new_config(stage, bf16=False)
        assert not cpu["bf16"]["enabled"] and not cpu["torch_autocast"]["enabled"]
        assert {k: v for k, v in cpu.items() if k != "torch_autocast"} == _old_config(stage, bf16=False), \
            "on CPU (fp32) the config is today's, plus autocast switched off"


# ------------------------------------------------------------------ the child: real engines


def _child(out: Path) -> None:
    os.environ["DS_ACCELERATOR"] = "cpu"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.path.insert(0, str(ROOT))
    import deepspeed
    import torch

    from xylent.models.config import preset
    from xylent.models.electra import ElectraModel
    from xylent.models.masking import row_noise
    from xylent.models.training.optim import engine_optimizer, lr_lambdas, make_optimizer, warmup_linear_decay
    from xylent.models.stats import Norms

    deepspeed.init_distributed(dist_backend="gloo")
    cfg = preset("tiny", vocab_size=300, specials=SPECIALS)
    g = torch.Generator().manual_seed(0)
    data = []
    for k in range(STEPS):
        ids = torch.randint(5, cfg.vocab_size, (4, 24), generator=g)
        ids[:, 0], ids[:, -1] = SPECIALS["bos"], SPECIALS["eos"]
        ids[1, 16:] = SPECIALS["pad"]
        lengths = (ids != SPECIALS["pad"]).sum(1).tolist()
        data.append((ids, row_noise(0, k, 0, list(range(4)), lengths, ids.shape[1])))

    def parts():
        torch.manual_seed(0)
        model = ElectraModel(cfg, 50.0, 0.15)
        opt = make_optimizer(model, lr=1e-3)
        return model, opt, torch.optim.lr_scheduler.LambdaLR(
            opt, lr_lambdas(model, opt.param_groups, warmup_linear_decay(2, STEPS)))

    def loss_of(model, st):
        return model.loss(st, Norms(max(float(st.g_count), 1.0), max(float(st.d_count), 1.0)))

    def engine_run(ds: dict) -> tuple[str, dict]:
        model, opt, schedule = parts()
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=schedule, config=ds)
        for ids, noise in data:
            engine.backward(loss_of(engine.module, engine(ids, ids == SPECIALS["pad"], None, noise)))
            engine.step()
        return engine_optimizer(engine), {n: p.detach().clone() for n, p in engine.module.named_parameters()}

    def bare_run() -> dict:
        """The step without an engine: autocast, clipping, the fused AdamW, the schedule.  The clipping is
        DeepSpeed's function, the one its engine calls at ZeRO 0 without bf16 mode: its norm (per-parameter
        norms, stacked) rounds otherwise than torch's foreach norm, and that last bit of the clip factor,
        carried on through bf16 forwards, came to 1e-4 relative in the weights after 5 steps (CPU, measured)."""
        from deepspeed.runtime.utils import clip_grad_norm_

        model, opt, schedule = parts()
        for ids, noise in data:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                st = model(ids, ids == SPECIALS["pad"], None, noise)
            loss_of(model, st).backward()
            clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            schedule.step()
            opt.zero_grad(set_to_none=True)
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    def differ(a: dict, b: dict) -> dict:
        assert a.keys() == b.keys()
        return {"identical": all(torch.equal(a[n], b[n]) for n in a),
                "max_rel": max(float((a[n].float() - b[n].float()).norm() / b[n].float().norm().clamp(min=1e-12))
                               for n in a),
                "moved": max(float((a[n].float() - start[n]).abs().max()) for n in a)}

    def fp32(stage: int) -> dict:
        old_name, old = engine_run(_old_config(stage, bf16=False))
        new_name, new = engine_run(_new_config(stage, bf16=False))
        return {"old": old_name, "new": new_name, **differ(new, old)}

    def bf16() -> dict:
        out = {str(stage): engine_run(_new_config(stage, bf16=True))[0] for stage in (0, 1, 2)}
        return {**out, "old 0": engine_run(_old_config(0, bf16=True))[0]}

    def against_bare() -> dict:
        return differ(engine_run(_new_config(0, bf16=True))[1], bare_run())

    start = {n: p.detach().float().clone() for n, p in parts()[0].named_parameters()}
    result = {}
    for name, part in {"fp32 0": lambda: fp32(0), "fp32 1": lambda: fp32(1), "fp32 2": lambda: fp32(2),
                       "bf16": bf16, "against_bare": against_bare}.items():
        try:  # each part on its own: one that fails names itself, the others still report
            result[name] = part()
        except Exception:
            result[name] = {"error": traceback.format_exc()[-3000:]}
    out.write_text(json.dumps(result))


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("engines") / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, __file__, str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def _part(engines: dict, name: str) -> dict:
    r = engines[name]
    assert "error" not in r, f"{name}:\n{r.get('error')}"
    return r


@pytest.mark.costs(deepspeed=1)
def test_on_cpu_the_engine_gives_the_weights_it_gave_before(engines):
    """fp32 (CPU, the tests' and the demo's precision): bit for bit, after 5 steps with clipping and
    the schedule, at ZeRO 0, 1 and 2, through the same wrapper as before."""
    for stage in (0, 1, 2):
        r = _part(engines, f"fp32 {stage}")
        assert r["identical"], (stage, r)
        assert r["moved"] > 1e-4, "the weights moved: the comparison is not of two untouched models"
        assert r["new"] == r["old"] == ("AdamW(fused)" if stage == 0 else "DeepSpeedZeroOptimizer > AdamW(fused)")


@pytest.mark.costs(deepspeed=1)
def test_the_gpu_precision_never_gets_deepspeeds_unfused_wrapper(engines):
    """bf16 (what a GPU run gets): at ZeRO 0 DeepSpeed steps our fused AdamW itself, at 1 and 2 its ZeRO
    optimizer runs it; the configuration before this change got FP16_UnfusedOptimizer at ZeRO 0."""
    bf16 = _part(engines, "bf16")
    assert bf16["old 0"] == "FP16_UnfusedOptimizer > AdamW(fused)", "the check sees DeepSpeed's own choice"
    assert bf16["0"] == "AdamW(fused)"
    assert bf16["1"] == bf16["2"] == "DeepSpeedZeroOptimizer > AdamW(fused)"


@pytest.mark.costs(deepspeed=1)
def test_the_engine_at_zero_0_in_bf16_steps_as_the_bare_step_does(engines):
    """torch_autocast at ZeRO 0 is the bare step's arithmetic, bit for bit: autocast forward, fp32 weights
    and gradients, the same fused AdamW and schedule, no wrapper's copies or loss scale in between."""
    r = _part(engines, "against_bare")
    assert r["moved"] > 1e-4
    assert r["identical"], r


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
