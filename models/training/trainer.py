"""One training rank, started by the ``deepspeed`` launcher:

    deepspeed --num_gpus N --module xylent.models.training.trainer --config train.json

(local CPU ranks are started directly by ``xylent.launch``, with the
command line and environment the launcher would give them).

Each optimizer step runs ``grad_accum`` micro-batches per task it trains
(``alternate``: one task per step; ``mix``: every task every step).  Losses are
normalised by token counts summed over all ranks (xylent.models.stats), data and
masking noise are functions of (seed, step, global row), so with dropout 0 the
run is the same on any number of ranks up to float rounding.  Dropout is not:
each rank draws it from its own stream (seed + 1 + rank), so with dropout > 0
runs on different world sizes are statistically alike, not equal.

Checkpoints: ``<checkpoints>/step-XXXXXXXX/`` = DeepSpeed's files + each rank's
RNG state + the loaders' state (client state) + ``COMPLETE``, written last; a
restart loads the newest complete one and continues exactly.  Rank 0 writes one
JSON line of metrics per step to ``metrics.jsonl`` and sends them to MLflow.

The step never waits on the device (issue 61): each micro-batch's noise, masked count
and unigram counts are made in the loader's thread (xylent.models.training.step_inputs), the sums stay
on the device, and the metrics of a whole logging interval are read at once at every
``log_every`` boundary, checkpoint and the end (xylent.models.training.step_metrics).  Every line holds
its own step's losses, accuracies, grad norm and tokens; on a GPU ``step_seconds``,
``tokens_per_second`` and ``mfu`` are the averages of the interval the line is in (one
step's time is not known without waiting on the device), on the CPU each step's own.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

# XYLENT_LAUNCH_PHASES=<file>: each rank appends when each phase of its start ended (a JSON line per phase,
# wall-clock seconds) — how benchmarks/overhead.py splits a launch's time to the first step. Unset, or this
# module imported rather than run: nothing.
_PHASES_FILE = os.environ.get("XYLENT_LAUNCH_PHASES") if __name__ == "__main__" else None


def phase(name: str) -> None:
    if not _PHASES_FILE:
        return
    rank, lines = int(os.environ.get("RANK", 0)), []
    if name == "trainer_module_start":  # the first: when the OS started this process (to 10 ms)
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks since boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        lines.append({"rank": rank, "phase": "process_start", "t": time.time() - age})
    lines.append({"rank": rank, "phase": name, "t": time.time()})
    with open(_PHASES_FILE, "a") as f:
        f.write("".join(json.dumps(x) + "\n" for x in lines))


phase("trainer_module_start")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

phase("torch_imported")

from xylent.models.config import EncoderConfig  # noqa: E402
from xylent.rank_exit import DIVERGED, DIVERGED_MARK  # noqa: E402
from xylent.models.embedding_health import FILE as HEALTH_FILE, embedding_health  # noqa: E402
from xylent.models.encoder import compile_encoders  # noqa: E402
from xylent.models.training.audit.step import make_audit  # noqa: E402
from xylent.models.objectives import build_model  # noqa: E402
from xylent.models.training.optim import (  # noqa: E402
    flops_per_token, lr_lambdas, make_optimizer, peak_tflops, warmup_linear_decay)
from xylent.models.training.rank import restore_rng, save_rng, watch_parent  # noqa: E402
from xylent.models.training.checkpoints import (  # noqa: E402
    COMPLETE, complete_checkpoints, file_records, refuse_other_world_size)
from xylent.models.training.run_config import TrainConfig, task_plan  # noqa: E402
from xylent.models.training.snapshots import Snapshots  # noqa: E402
from xylent.models.stats import Norms  # noqa: E402
from xylent.models.training.step_inputs import StepInputs, micro_batches, on_device  # noqa: E402
from xylent.models.training.step_metrics import Interval  # noqa: E402
from xylent.data.loader import TrainingLoader  # noqa: E402  (the shard contract: all models take from tasks)

phase("xylent_modules_imported")

def gradient_norm(module: torch.nn.Module) -> torch.Tensor | None:
    """Global L2 norm of the (already all-reduced) gradients, before clipping: on the device, unread."""
    norms = [p.grad.detach().float().norm() for p in module.parameters() if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else None


def ds_config(cfg: TrainConfig, bf16: bool, world: int) -> dict:
    # one home for the engine's config: benchmarks/pretrain.py uses it too
    from xylent.models.training.optim import engine_config

    return engine_config(json.loads(Path(cfg.deepspeed_config).read_text()), micro_batch=cfg.batch_size // world,
                         grad_accum=len(task_plan(cfg, 0)), clip=cfg.clip, bf16=bf16)


def _lines_up_to(path: Path, step: int) -> None:
    """Keep the JSON lines of ``path`` up to ``step`` (a killed run's later ones are redone); none at step 0."""
    kept = []
    if path.exists() and step > 0:
        for ln in path.read_text().splitlines():
            try:
                if json.loads(ln)["step"] <= step:
                    kept.append(ln)
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a line cut short by the kill
    path.write_text("".join(ln + "\n" for ln in kept))


class MetricsSink:
    """Rank 0's metrics: metrics.jsonl (every step, flushed), the token embeddings' health
    (xylent.models.embedding_health, step 0 and every checkpoint) and MLflow (batched)."""

    def __init__(self, cfg: TrainConfig, start_step: int):
        self.path = Path(cfg.metrics_file)
        self.health = self.path.parent / HEALTH_FILE
        self.every = cfg.log_every
        for path in (self.path, self.health):
            _lines_up_to(path, start_step)
        self.file = open(self.path, "a")
        self.client, self.run_id, self.pending = None, cfg.mlflow_run_id, []
        self.monitor = None
        if self.run_id:
            from mlflow import MlflowClient

            self.client = MlflowClient(cfg.mlflow_tracking_uri)
            if cfg.system_metrics:
                from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

                self.monitor = SystemMetricsMonitor(self.run_id, sampling_interval=cfg.system_metrics_interval,
                                                    resume_logging=start_step > 0,
                                                    tracking_uri=cfg.mlflow_tracking_uri)
                self.monitor.start()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()
        if self.client is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.pending += [Metric(k, float(v), now, step) for k, v in metrics.items()]
        if step % self.every == 0:
            self.flush()

    def log_health(self, step: int, values: dict[str, float]) -> None:
        with open(self.health, "a") as fh:
            fh.write(json.dumps({"step": step, **values}) + "\n")
        if self.client is not None:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            self.pending += [Metric(f"embeddings/{k}", float(v), now, step) for k, v in values.items()]

    def flush(self) -> None:
        for i in range(0, len(self.pending), 1000):
            self.client.log_batch(self.run_id, metrics=self.pending[i: i + 1000])
        self.pending = []

    def close(self) -> None:
        if self.client is not None:
            self.flush()
        if self.monitor is not None:
            self.monitor.finish()
        self.file.close()


class UnigramBaseline:
    """The generator's trivial peer: cross-entropy of a step's tokens under the
    add-one unigram distribution of every token the run trained on before it.
    Masked positions are a uniform draw of the non-special tokens, so this is the
    loss a generator that ignores the context would reach.  Counts are summed over
    all ranks (the same number for any world size) and saved with checkpoints (a
    resumed run logs what an uninterrupted one does)."""

    def __init__(self, vocab_size: int, device: torch.device):
        self.counts = torch.ones(vocab_size, dtype=torch.float64, device=device)

    def __call__(self, tokens: torch.Tensor, seen: torch.Tensor, world: int) -> torch.Tensor:
        """(sum of -log q(token), tokens) over the global micro-batch; then the counts take its tokens.
        ``tokens``: this rank's non-special ones in row-major order, ``seen``: their counts (float64),
        both made on the host (xylent.models.training.step_inputs): a boolean mask or a bincount here would
        wait on the device."""
        nll = -(self.counts[tokens] / self.counts.sum()).log().sum()
        stat = torch.stack([nll, torch.full((), float(tokens.numel()), dtype=nll.dtype, device=nll.device)])
        if world > 1:
            dist.all_reduce(stat)
            dist.all_reduce(seen)
        self.counts += seen
        return stat


def stop_if_diverged(lines: list[tuple[int, dict[str, float]]], cfg: TrainConfig) -> None:
    """Stop the run, with launch.DIVERGED, at the first logged step whose loss is not finite: the weights
    are NaN from there on, and a checkpoint or a published model of them would pass for a result."""
    for at, metrics in lines:
        if not math.isfinite(metrics["loss"]):
            print(f"{DIVERGED_MARK} the loss is {metrics['loss']} at step {at}: training stopped before its "
                  f"checkpoint, nothing is published (pretrain.lr {cfg.lr}, warmup_steps {cfg.warmup_steps}, "
                  f"clip {cfg.clip}, precision {cfg.precision})", flush=True)
            sys.exit(DIVERGED)


def should_compile(cfg: TrainConfig, cuda: bool) -> bool:
    """pretrain.compile: auto compiles on CUDA only (xylent.models.encoder.compile_encoders says why)."""
    return cfg.compile == "on" or (cfg.compile == "auto" and cuda)


def train(cfg: TrainConfig) -> None:
    cuda = torch.cuda.is_available() and not os.environ.get("DS_ACCELERATOR") == "cpu"
    import deepspeed

    phase("deepspeed_imported")
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    phase("process_group_ready")  # DeepSpeed's compiled CPU comm op loaded (cached after its first build), gloo up
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    bf16 = cuda if cfg.precision == "auto" else cfg.precision == "bf16"
    for name in ("batch_size", "trtd_max_tokens"):  # global sizes, split evenly over the ranks
        if getattr(cfg, name) % world:
            raise SystemExit(f"xylent: pretrain.{name}={getattr(cfg, name)} is not divisible by the world size "
                             f"{world}; choose a multiple of it")

    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    enc = EncoderConfig(**cfg.model)
    model = build_model(cfg.objective, enc, cfg.disc_weight, cfg.mask_prob, cfg.objective_options)
    if cfg.init_from:  # before DeepSpeed copies the weights: a resumed run's checkpoint overrides them
        from safetensors.torch import load_file

        model.load_state_dict(load_file(cfg.init_from), strict=True)
    if should_compile(cfg, cuda):
        compile_encoders(model)
    optimizer = make_optimizer(model, cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay)
    lr_schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambdas(model, optimizer.param_groups, warmup_linear_decay(cfg.warmup_steps, cfg.steps)))
    phase("model_built")
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=lr_schedule,
                                           config=ds_config(cfg, bf16, world))
    phase("engine_ready")
    engine.module.attach(device)  # state outside the trained module (InfoXLM's keys); xylent.models.objective
    torch.manual_seed(cfg.seed + 1 + rank)  # dropout: each rank its own stream

    loaders = {t: TrainingLoader(cfg.shards_dir, cfg.sampling_dir, task=t, seed=cfg.seed, rank=rank, world_size=world,
                                 batch_size=cfg.batch_size // world, max_tokens=cfg.trtd_max_tokens // world,
                                 verify=rank == 0, holdout=cfg.dro.holdout if cfg.dro and t == "trtd" else 0.0)
               for t in cfg.batch_kinds}
    audit = make_audit(cfg, loaders, engine, rank, world, device)  # NO_AUDIT in a plain pretrain run
    loaders.update(audit.loaders())
    unigram = UnigramBaseline(enc.vocab_size, device)
    ckroot = Path(cfg.checkpoint_dir)
    start = 0
    done = complete_checkpoints(ckroot)
    if done:
        refuse_other_world_size(done[-1], world, cfg.zero_stage)
        tag = done[-1].name
        _, client = engine.load_checkpoint(str(ckroot), tag=tag)
        start = int(client["step"])
        audit.restore(client)  # first: a checkpoint of another audit (its loaders too) is refused by name
        for t, state in client["loaders"].items():
            loaders[t].load_state_dict(state)
        if "objective" in client:
            engine.module.load_objective_state(client["objective"])
        if "unigram_counts" in client:
            unigram.counts = client["unigram_counts"].to(device)
        elif rank == 0:
            print("xylent: the checkpoint holds no unigram counts (saved before they were); "
                  "generator_unigram_loss restarts from add-one counts", flush=True)
        rng = done[-1] / f"rng-rank{rank}.pt"
        if rng.exists() and client.get("world_size") == world:
            restore_rng(rng, cuda)
        if rank == 0:
            print(f"xylent: resumed from {done[-1]} at step {start}", flush=True)

    phase("loaders_open")  # and a checkpoint restored, where there is one
    sink = MetricsSink(cfg, start) if rank == 0 else None
    phase("metrics_sink_open")  # rank 0: MLflow's client (and system metrics) when the run is tracked
    schedule = audit.schedule

    def segment(a: int) -> dict:
        """Each task's batches from step ``a`` to the next re-sampling (or the end): exactly
        those, so none is drawn ahead with weights that are about to change."""
        b = next((s for s in schedule if s > a), cfg.steps)
        out = {}
        for t in cfg.batch_kinds:
            positions = micro_batches(cfg, t, a, b)
            out[t] = loaders[t].batches(len(positions), prepare=StepInputs(
                positions, cfg.seed, rank, world, loaders[t].pad, enc.special_ids, enc.vocab_size,
                engine.module.host_counts, pin=cuda))
        return {**out, **audit.batches(a, b)}

    snapshots = Snapshots(cfg.snapshot_tokens, ckroot, device) if cfg.snapshot_tokens else None
    if snapshots is not None and done:
        snapshots.restore(client)
    iters = None
    seq_len = loaders[cfg.batch_kinds[0]].seq_len
    fpt = flops_per_token(enc, seq_len, cfg.objective, cfg.mask_prob)
    peak = peak_tflops(torch.cuda.get_device_name(device), cfg.peak_tflops) if cuda else None
    interval = Interval(engine.module.loss_weights, fpt, peak * 1e12 * world if peak else None, averaged=cuda)

    def record_health(step: int) -> None:
        """Rank 0: the token embeddings' health (xylent.models.embedding_health); not under ZeRO-3, whose rank holds
        a partition of them.  Reads the weights only: no random number, no change to what trains."""
        weight = engine.module.token_embedding()
        if sink is None or weight.numel() == 0:
            return
        seen = unigram.counts > 1  # every non-special token input so far, on all ranks
        seen[list(enc.special_ids)] = True
        sink.log_health(step, embedding_health(weight, seen))

    if start == 0:
        record_health(0)  # the random-init peer of every later record
    engine.train()
    for step in range(start, cfg.steps):
        lr = max(lr_schedule.get_last_lr())  # the lr this step uses (a frozen body's groups are at 0)
        sums: dict[str, torch.Tensor] = {}
        unigram_sums: dict[str, torch.Tensor] = {}
        resampled, gauges = {}, {}
        if audit.due(step):
            loaders["trtd"].set_weights(audit.resample(step))
            resampled, iters = audit.metrics(), None
        if iters is None or step in schedule:
            iters = segment(step)
        audit.begin(step, iters)
        plan, unclipped_norm = task_plan(cfg, step), None
        for micro, task in enumerate(plan):
            batch = next(iters[task])
            if step == start and micro == 0:
                phase("first_batch")
            ids, seg, noise = (on_device(batch, k, device) for k in ("ids", "segments", "noise"))
            pad = ids == loaders[task].pad
            rows = [rank + world * k for k in range(ids.shape[0])]
            unigram_sums[task] = unigram_sums.get(task, 0) + unigram(
                on_device(batch, "unigram_tokens", device), on_device(batch, "unigram_seen", device), world)
            per_row = audit.wants_rows(task)
            if per_row:
                audit.before_pass(ids, pad, seg, noise, batch, step, micro, rows)
            st = engine(ids, pad, seg, noise, per_row=per_row, **batch.get("host_counts", {}))
            if per_row:
                audit.after_pass(st, batch)
            reduced = torch.cat([st.sums(), st.counts()])
            if world > 1:
                dist.all_reduce(reduced)
            engine.backward(engine.module.loss(st, Norms.from_reduced(reduced, world)))
            if rank == 0 and cfg.zero_stage == 0 and micro == len(plan) - 1:
                unclipped_norm = gradient_norm(engine.module)  # DeepSpeed keeps no global norm without ZeRO
            engine.step()
            if micro == len(plan) - 1:
                engine.module.after_step()  # e.g. InfoXLM's momentum encoder follows the updated weights
            sums[task] = sums.get(task, 0) + reduced  # on the device: read once per logging interval
            if snapshots is not None:
                snapshots.add(reduced)
            gauges.update(st.extra)
        audit.end(step)
        done_step = step + 1
        checkpoint = done_step % cfg.checkpoint_every == 0 or done_step == cfg.steps
        if rank == 0:
            gn = engine.get_global_grad_norm()
            gn = unclipped_norm if gn is None else gn
            interval.add(done_step, sums, unigram_sums, gn.detach().clone() if isinstance(gn, torch.Tensor) else gn,
                         lr, {**resampled, **gauges})
            if done_step % cfg.log_every == 0 or checkpoint:  # the lines before the checkpoint that keeps them
                lines = interval.lines(torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None)
                for at, metrics in lines:
                    sink.log(at, metrics)
                stop_if_diverged(lines, cfg)  # before the checkpoint: no non-finite weights are kept or published
                if done_step % cfg.log_every == 0 or done_step == cfg.steps:
                    parts = " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if "loss" in k or k == "tokens_per_second")
                    print(f"xylent: step {done_step}/{cfg.steps} {parts}", flush=True)
                interval.restart()
        if step == start:
            phase("first_step")
        if snapshots is not None and (done_step % cfg.log_every == 0 or checkpoint):
            snapshots.take_if_due(engine, done_step, rank)
            interval.restart()
        if checkpoint:
            extra = {"unigram_counts": unigram.counts.cpu(), **audit.state(),
                     **(snapshots.state() if snapshots is not None else {})}
            state = engine.module.objective_state()
            if state is not None:
                extra["objective"] = state
            record_health(done_step)  # first: a run killed before the checkpoint completes redoes this line
            save_checkpoint(engine, cfg, ckroot, done_step, {t: ld.state_dict() for t, ld in loaders.items()},
                            rank, world, cuda, extra)
            interval.restart()
    if sink is not None:
        sink.close()
    audit.finish(rank)
    dist.barrier()
    phase("trained")


def save_checkpoint(engine, cfg: TrainConfig, root: Path, step: int, loader_states: dict, rank: int, world: int,
                    cuda: bool, extra: dict | None = None) -> None:
    tag = f"step-{step:08d}"
    engine.save_checkpoint(str(root), tag=tag, client_state={"step": step, "loaders": loader_states, **(extra or {}),
                                                             "world_size": world})
    save_rng(root / tag / f"rng-rank{rank}.pt", cuda)
    dist.barrier()
    if rank == 0:
        # every file's size and sha256: a checkpoint damaged later is found before a rerun trusts it
        (root / tag / COMPLETE).write_text(json.dumps({"step": step, "time": time.time(), "world_size": world,
                                                       "zero_stage": cfg.zero_stage,
                                                       "files": file_records(root / tag)}))
        for old in complete_checkpoints(root)[:-cfg.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        print(f"xylent: checkpoint {root / tag}", flush=True)
    dist.barrier()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="train.json written by the pretrain flow")
    ap.add_argument("--local_rank", type=int, default=0, help="set by the deepspeed launcher")
    args = ap.parse_args(argv)
    watch_parent()
    train(TrainConfig.load(args.config))


def exit_without_teardown() -> None:
    """End a one-rank run that finished: as a normal exit does, wait for the threads that are not
    daemons, run the exit handlers and flush the output; then skip the interpreter's teardown of the
    thousands of modules torch, DeepSpeed and MLflow loaded (seconds on 2 cores, after everything is
    written). With more ranks the normal exit is kept: it gives the last messages to the peers time."""
    if not (dist.is_initialized() and dist.get_world_size() == 1):
        return
    import atexit
    import sys
    import threading

    # the interpreter's own order: threading's exit hooks first (concurrent.futures wakes its idle
    # workers there, MLflow's async-logging pool among them), then the threads that are not daemons
    # are joined; then the atexit handlers.  A bare join would wait forever on an idle pool worker.
    if hasattr(threading, "_shutdown"):
        threading._shutdown()
    else:
        for t in threading.enumerate():
            if t is not threading.main_thread() and not t.daemon:
                t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    exit_without_teardown()
