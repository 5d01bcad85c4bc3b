"""From the spec to train.json: the encoder's shape, the DeepSpeed config and
every training knob, resolved in one place (defaults live in the spec only)."""

from __future__ import annotations

import json
from pathlib import Path

from xylent.models.config import EncoderConfig, preset
from xylent.models.training.run_config import SPEC_KNOBS, TrainConfig
from xylent.errors import XylentError
from xylent.objectives import OBJECTIVES
from xylent.spec import DEFAULT_CLIP, DEFAULT_LR, Spec

from xylent.tasks.pretrain.contract import METRICS_FILE
from xylent.data.shards import has_rows, read_index
from xylent.tasks.vocab.contract import tokenizer_and_specials

# package data: an install carries them (setup.py, pyproject.toml package-data)
ZERO_CONFIGS = Path(__file__).resolve().with_name("deepspeed")


def encoder_config(spec: Spec, vocab_size: int, seq_len: int, specials: dict[str, int]) -> EncoderConfig:
    base = preset(spec.model.size)
    over = spec.model.overrides()
    over.setdefault("max_position", max(base.max_position, seq_len))
    if over["max_position"] < seq_len:
        raise XylentError(f"model.max_position ({over['max_position']}) is shorter than shards.seq_len ({seq_len})",
                          where="spec field model.max_position", fix="raise it to at least shards.seq_len")
    return preset(spec.model.size, vocab_size=vocab_size, specials=dict(specials), **over)


def _attention_fits(enc: EncoderConfig, seq_len: int, rows: int, *, hostfile: str | None) -> None:
    """CPU ranks on this machine build each layer's attention as a rows × heads × L × L tensor
    (the materialised path): one that outgrows the machine's memory would kill a rank minutes
    in, with "run the same command again" as advice (``shards.seq_len`` 100000 asked for 80 GB).
    GPU ranks take FlexAttention, which never builds it; other hosts' memory is not known here."""
    from xylent.launch import gpu_available

    if hostfile or gpu_available():
        return
    import psutil

    need = rows * enc.heads * seq_len * seq_len * 4  # fp32 scores of one layer, one micro-batch, one rank
    have = psutil.virtual_memory().total
    if need > have:
        raise XylentError(f"one layer's attention would take {need / 2**30:,.1f} GiB on each CPU rank ({rows} rows × "
                          f"{enc.heads} heads × {seq_len}² fp32), more than this machine's {have / 2**30:,.1f} GiB",
                          where="spec fields shards.seq_len and pretrain.batch_size",
                          fix="lower shards.seq_len (the papers use 512) or pretrain.batch_size (per rank: batch_size "
                              "/ ranks), or train on GPUs, whose attention never builds this tensor")


def deepspeed_config(spec: Spec) -> tuple[Path, int]:
    """(the DeepSpeed JSON to use, its ZeRO stage).  Without ``pretrain.deepspeed_config``
    ``zero_stage`` picks tasks/pretrain/deepspeed/zero<N>.json; with it, the stage is the file's
    own, and a ``zero_stage`` set in the spec that disagrees is an error (never
    silently overridden either way)."""
    p = spec.pretrain
    if not p.deepspeed_config:
        return ZERO_CONFIGS / f"zero{p.zero_stage}.json", p.zero_stage
    path = spec.resolve_path(p.deepspeed_config)
    try:
        stage = int(json.loads(path.read_text()).get("zero_optimization", {}).get("stage", 0))
    except FileNotFoundError:
        raise XylentError("DeepSpeed config not found", where=str(path),
                          fix="point pretrain.deepspeed_config at a JSON file, or leave it unset") from None
    except OSError as exc:
        raise XylentError(f"the DeepSpeed config cannot be read ({exc.strerror})", where=str(path),
                          fix="point pretrain.deepspeed_config at a readable JSON file") from None
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
        raise XylentError(f"the DeepSpeed config is not a JSON object with zero_optimization.stage ({exc})",
                          where=str(path), fix="fix the file (see tasks/pretrain/deepspeed/zero2.json for the shape)") from None
    if "zero_stage" in p.model_fields_set and p.zero_stage != stage:
        raise XylentError(f"pretrain.zero_stage is {p.zero_stage} but {path.name} says zero_optimization.stage "
                          f"{stage}", where="spec fields pretrain.zero_stage and pretrain.deepspeed_config",
                          fix="drop pretrain.zero_stage (your file decides), or change the stage in the file")
    return path, stage


def train_config(spec: Spec, upstream: dict[str, Path], ckdir: Path, run_id: str | None,
                 tracking_uri: str | None, shards_source: str | None = None) -> TrainConfig:
    """``shards_source``: where the ranks read shards (an object-store workspace's URL),
    when not the upstream's local folder."""
    p = spec.pretrain
    index = read_index(upstream["shards"])
    for t in p.batch_kinds:
        if not has_rows(index, t):
            raise XylentError(f"pretrain.batch_kinds has {t!r} but the shards hold no {t.upper()} data",
                              where=str(upstream["shards"]), fix=f"drop {t!r} from pretrain.batch_kinds or add sources")
    tokenizer, specials = tokenizer_and_specials(upstream["vocab"])
    enc = encoder_config(spec, tokenizer.get_piece_size(), index["seq_len"], specials)
    _attention_fits(enc, index["seq_len"], p.batch_size // p.ranks, hostfile=p.hostfile)
    layer = p.infoxlm.layer
    if p.objective == "infoxlm" and layer is not None and layer > enc.layers:
        raise XylentError(f"pretrain.infoxlm.layer is {layer} but the model has {enc.layers} layers",
                          where="spec field pretrain.infoxlm.layer", fix=f"pick 1..{enc.layers}, or leave it unset")
    ds_path, stage = deepspeed_config(spec)
    no_zero3 = OBJECTIVES[p.objective].no_zero3
    if stage == 3 and no_zero3:  # the spec checks zero_stage; a user's JSON may say 3 too
        raise XylentError(f"{ds_path.name} is ZeRO-3, whose partitioned parameters cannot serve objective "
                          f"{p.objective}: it {no_zero3}",
                          where="spec fields pretrain.objective and pretrain.deepspeed_config",
                          fix=f"use a ZeRO 0-2 DeepSpeed config for objective {p.objective}")
    return TrainConfig(
        shards_dir=shards_source or str(upstream["shards"]), sampling_dir=str(upstream["sampling"]),
        checkpoint_dir=str(ckdir / "deepspeed"), metrics_file=str(ckdir / METRICS_FILE),
        deepspeed_config=str(ds_path), zero_stage=stage, model=enc.to_dict(),
        **{k: v for k, v in p.model_dump(mode="json").items() if k in SPEC_KNOBS},
        lr=p.lr or DEFAULT_LR[spec.model.size], clip=p.clip or DEFAULT_CLIP[spec.model.size], seed=spec.seed,
        objective_options=p.objective_options(), init_from=None, dro=None, mlflow_tracking_uri=tracking_uri,
        mlflow_run_id=run_id)


def check_resumable(cfg: TrainConfig, world: int) -> list[str]:
    """Before anything starts: set a damaged newest checkpoint aside (the ranks resume from the one
    before it; what was set aside is returned, for the stage's warnings), and refuse to resume a
    ZeRO 1-3 checkpoint on another world size."""
    from xylent.models.training.checkpoints import checkpoint_info, resume_problem, usable_checkpoints

    done, notes = usable_checkpoints(Path(cfg.checkpoint_dir))
    if not done:
        return notes
    why = resume_problem(done[-1], world, cfg.zero_stage)
    if why:
        saved = checkpoint_info(done[-1])["world_size"]
        raise XylentError(why, where=str(done[-1]),
                          fix=f"resume on {saved} rank(s) (pretrain.ranks={saved}, or the same hostfile), or start "
                              "again with --force; to change the world size mid-run, train with pretrain.zero_stage=0")
    return notes
