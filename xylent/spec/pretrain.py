"""The ``model`` and ``pretrain`` sections: the encoder, its objective and its training."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from xylent.objectives import OBJECTIVES, with_section
from xylent.spec.base import Strict



def registrable(name: str, field: str) -> str:
    """A name MLflow's model registry takes (no '/' or ':', not blank), checked before any training: the
    registry refused it only after the whole run, and nothing was published."""
    if not name.strip() or "/" in name or ":" in name or name != name.strip():
        raise ValueError(f"{field} gives the registered model name {name!r}, which MLflow refuses (no '/', ':', "
                         "or surrounding spaces): choose another")
    return name

class ModelConfig(Strict):
    """A size band (models/config.py presets, XLM-E Table 8) with any field overridden.
    The vocabulary size comes from the vocab stage, positions from shards.seq_len."""

    size: Literal["tiny", "small", "base", "large", "xl"] = "tiny"
    hidden: int | None = Field(default=None, gt=0)
    layers: int | None = Field(default=None, gt=0)
    heads: int | None = Field(default=None, gt=0)
    ffn: int | None = Field(default=None, gt=0)
    generator_layers: int | None = Field(default=None, gt=0)
    max_position: int | None = Field(default=None, gt=0)
    rel_buckets: int | None = Field(default=None, gt=1)
    rel_max_distance: int | None = Field(default=None, gt=1)
    dropout: float | None = Field(default=None, ge=0, lt=1)
    relative_bias: bool | None = None
    gate: Literal["xlm-e", "wavlm"] | None = None  # the bias gate: XLM-E §3.3 (default) or WavLM's code
    attention: Literal["auto", "flex", "materialised"] | None = Field(
        default=None, description="the kernel that adds the gated bias: flex (FlexAttention, CUDA, no attention "
        "dropout), materialised (a B×H×L×L bias through SDPA) or auto (default: flex on CUDA); "
        "docs/stages/pretrain.md")

    generator_output: Literal["tied", "untied"] | None = Field(
        default=None, description="ELECTRA's generator output layer: tied to the token embeddings (default, XLM-E) "
        "or untied, a matrix of its own (the embeddings then move only by the tokens input; "
        "docs/stages/pretrain.md)")

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("attention", "generator_output")

    def overrides(self) -> dict:
        return {k: v for k, v in self.model_dump().items() if k != "size" and v is not None}


# lr / clip per size band (XY-LENT Table 9 for base/large/xl; ours for tiny/small)
DEFAULT_LR = {"tiny": 2e-3, "small": 1e-3, "base": 8e-4, "large": 2e-4, "xl": 1e-4}


DEFAULT_CLIP = {"tiny": 2.0, "small": 2.0, "base": 2.0, "large": 1.0, "xl": 1.0}


class InfoXLMConfig(Strict):
    """XLCo, InfoXLM's cross-lingual contrast (models/infoxlm.py); read with objective: infoxlm."""

    layer: int | None = Field(default=None, gt=0, description="the layer whose states are contrasted; default "
                              "InfoXLM's: 8 of 12 (Base), 12 of 24 (Large), two-thirds otherwise")
    queue_size: int = Field(default=131_072, gt=0, description="negative keys kept from earlier batches (paper: 131072)")
    temperature: float = Field(default=0.25, gt=0, allow_inf_nan=False, description="τ of InfoNCE (reference: 0.25)")
    momentum: float = Field(default=0.999, ge=0, lt=1, description="m of the key encoder's EMA (paper: 0.999 or 0.9999)")
    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False, description="XLCo's weight next to MMLM + TLM")
    normalize: bool = Field(default=False, description="L2-normalise queries and keys (the reference does not)")
    pool: Literal["cls", "mean"] = Field(default="cls", description="cls: the <s> state (InfoXLM); mean: the mean "
                                         "over real tokens, as retrieval pools")
    in_batch_negatives: bool = Field(default=False, description="also contrast against the other pairs of the same "
                                     "global batch (keys of the same key-encoder version), not the queue alone")
    mixup: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False,
                         description="mixup contrast: the share of rows that are merged with another row of the "
                         "global batch into one pair (x_i x_j against y_i y_j, each side in random order); 0: off")
    scale: Literal["shared", "separate"] = Field(
        default="shared", description="shared (InfoXLM's code): (Σ masked-token CE + weight·Σ example InfoNCE) / "
        "(masked tokens + examples), so one example counts like one masked token; separate: each loss its own "
        "mean, XLCo's times weight")
    masked_inputs: bool = Field(default=True, description="contrast the masked pair the TLM term reads (InfoXLM's "
                                "code masks XLCo's inputs at the MLM rate); false: the uncorrupted pair")

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("mixup", "scale", "masked_inputs")


REGISTRY_URI = re.compile(r"^models:/(?P<name>[^/@']+)(?:/(?P<version>latest|[0-9]+)|@(?P<alias>[A-Za-z0-9_-]+))$")


class InitConfig(Strict):
    """``pretrain.init``: start from an existing encoder (MetaXLM) -- the body copied, the
    new vocabulary's embeddings matched piece by piece (dictionary, exact, normalised),
    the rest random (docs/stages/pretrain.md)."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    from_: str = Field(alias="from", min_length=1,
                       description="a local model dir -- an xylent export (<ws>/pretrain/<fp>/model), an `xylent "
                       "export-hf` dir, a Hugging Face BERT/RoBERTa/XLM-R dir; relative to the spec file -- or a "
                       "registered model models:/<name>/<version|latest> (or @<alias>) in the workspace's MLflow store")
    dictionary: str | None = Field(default=None, description="bilingual dictionary, one 'new-word<TAB>old-word' "
                                   "(or MUSE's 'new old') per line: pieces matched through translations")
    dictionary_first: bool = Field(default=True, description="look a piece up in the dictionary before matching it "
                                   "by text (MetaXLM §3.2's order); false: only pieces no text rule matched")
    generator: Literal["random", "body", "source"] = Field(
        default="random", description="ELECTRA's generator: random; body: the first generator_layers layers of the "
        "source body; source: the source's own generator (an xylent ELECTRA export)")
    heads: bool = Field(default=True, description="copy the source's pretraining heads that the new model has under "
                        "the same name and shape (vocabulary-sized biases remapped)")

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("dictionary_first",)

    @field_validator("from_")
    @classmethod
    def _from(cls, v: str) -> str:
        if v.startswith("models:") and not REGISTRY_URI.match(v):
            raise ValueError(f"{v!r} is not a registered model URI: write models:/<name>/<version> (a number or "
                             "'latest') or models:/<name>@<alias>, or give a local dir")
        return v

    def registry(self) -> dict | None:
        """{name, version, alias} of a ``models:/`` source, else None (a local dir)."""
        m = REGISTRY_URI.match(self.from_)
        return m.groupdict() if m else None


class VecoConfig(Strict):
    """VECO's CA-MLM (models/veco.py); read with objective: veco."""

    freeze_body_steps: int = Field(default=0, ge=0, description="the two-phase schedule for a model started from an "
                                   "encoder (pretrain.init): steps during which only the cross-attention trains")
    pair_mask_prob: float = Field(default=0.25, gt=0, lt=1, description="the masking rate of translation pairs "
                                  "(VECO Table 8: 25 % bilingual, 15 % monolingual = pretrain.mask_prob)")
    tlm: bool = Field(default=True, description="add TLM on the joined pair row to CA-MLM's four terms (VECO §4: "
                      "the overall objective is TLM + CA-MLM); false: CA-MLM alone")
    combine: Literal["sum", "mean"] = Field(default="sum", description="sum: the terms' per-token means added, as "
                                            "the paper adds its log-likelihoods; mean: their average")

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("pair_mask_prob", "tlm", "combine")


class PretrainConfig(Strict):
    objective: Literal[tuple(OBJECTIVES)] = Field(  # xylent.objectives declares them
        default="electra", description="; ".join(f"{o.name}: {o.summary}" for o in OBJECTIVES.values()))
    # each objective's own section, named as the objective (xylent.objectives: with_section)
    infoxlm: InfoXLMConfig = Field(default_factory=InfoXLMConfig)
    veco: VecoConfig = Field(default_factory=VecoConfig)
    batch_kinds: list[Literal["mrtd", "trtd"]] = Field(
        default_factory=lambda: ["mrtd", "trtd"], min_length=1,
        description="what the steps train on: mrtd, monolingual text; trtd, translation pairs (XLM-E's two tasks)")
    batch_schedule: Literal["alternate", "mix"] = Field(
        default="alternate", description="alternate: one kind per optimizer step; mix: every kind every step")
    trtd_ratio: float = Field(default=0.5, gt=0, lt=1, description="alternate: share of steps that are TRTD")
    steps: int = Field(default=125_000, gt=0, description="optimizer steps")
    batch_size: int = Field(default=8192, gt=0, description="MRTD sequences per micro-batch, all ranks together")
    trtd_max_tokens: int = Field(default=4_194_304, gt=0,
                                 description="TRTD tokens (padded) per micro-batch, all ranks together")
    grad_accum: int = Field(default=1, gt=0, description="micro-batches per kind per optimizer step")
    lr: float | None = Field(default=None, gt=0, description="peak lr; default by size (base 8e-4, large 2e-4, xl 1e-4)")
    warmup_steps: int = Field(default=10_000, ge=0)
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = Field(default=1e-6, gt=0)
    weight_decay: float = Field(default=0.01, ge=0)
    clip: float | None = Field(default=None, gt=0, description="gradient clipping norm; default by size")
    disc_weight: float = Field(default=50.0, gt=0, description="λ in L_G + λ·L_D")
    mask_prob: float = Field(default=0.15, gt=0, lt=1)
    zero_stage: Literal[0, 1, 2, 3] = Field(
        default=2, description="picks tasks/pretrain/deepspeed/zero<N>.json; with deepspeed_config the file's stage rules")
    precision: Literal["auto", "fp32", "bf16"] = Field(default="auto", description="auto: bf16 on GPU, fp32 on CPU")
    compile: Literal["auto", "on", "off"] = Field(
        default="auto", description="torch.compile the encoders (one graph each); auto: on CUDA only")
    checkpoint_every: int = Field(default=1000, gt=0)
    keep_checkpoints: int = Field(default=2, gt=0)
    snapshot_tokens: list[int] = Field(
        default_factory=list, description="token counts at which the encoder is also exported (snapshots/), "
        "each at the first logging boundary at or past it; evaluate scores retrieval on each: a learning curve")
    # how to run, not what: left out of the fingerprint, so a restart may change them and still resume
    ranks: int = Field(default=1, gt=0, description="local ranks (GPUs; CPU processes without a GPU)")
    hostfile: str | None = Field(default=None, description="DeepSpeed hostfile for several nodes")
    master_port: int | None = Field(default=None, gt=0, lt=65536, description="default: a free port")
    deepspeed_config: str | None = Field(default=None, description="default: tasks/pretrain/deepspeed/zero<stage>.json")
    log_every: int = Field(default=10, gt=0, description="steps between MLflow flushes and log lines")
    system_metrics: bool = True
    system_metrics_interval: float = Field(default=10.0, gt=0, description="seconds between system metric samples")
    peak_tflops: float | None = Field(default=None, gt=0, description="for MFU; default from the GPU's name")
    register_name: str | None = Field(default=None, description="MLflow registered model; default xylent-<spec name>")
    init: InitConfig | None = Field(default=None, description="start from an existing encoder (MetaXLM): "
                                    "body copied, embeddings matched by piece; default: a random init")

    # compile: how the same arithmetic is scheduled (fused kernels round alike within a tolerance), not what
    OPERATIONAL: ClassVar[tuple[str, ...]] = ("ranks", "hostfile", "master_port", "log_every", "system_metrics",
                                              "system_metrics_interval", "peak_tflops", "register_name", "compile")
    # the objectives' sections came after the first outputs: at their defaults they leave fingerprints alone
    ADDED_LATER: ClassVar[tuple[str, ...]] = (*with_section(), "init", "snapshot_tokens")
    # "tasks" read as the stage package, evaluate.tasks and Prefect's tasks (2026-12-06); the old names still work
    RENAMED: ClassVar[dict[str, str]] = {"batch_kinds": "tasks", "batch_schedule": "task_schedule"}

    def unread_fields(self) -> set[str]:
        """The other objectives' sections: not read by this run, so not part of what it computes."""
        return set(with_section()) - {self.objective}

    def objective_options(self) -> dict:
        """The trained objective's own knobs (pretrain.<objective>), for train.json."""
        return getattr(self, self.objective).model_dump() if self.objective in with_section() else {}

    def objective_variant(self) -> dict[str, tuple]:
        """The trained objective's knobs that differ from its defaults, which are the paper's
        settings: {knob: (paper's, this run's)}; empty when the run trains the paper's form."""
        section = self.objective if self.objective in with_section() else None
        if not section:
            return {}
        ours, paper = getattr(self, section).model_dump(), type(getattr(self, section))().model_dump()
        return {k: (paper[k], v) for k, v in ours.items() if paper[k] != v}

    @field_validator("betas")
    @classmethod
    def _betas(cls, v):
        if not all(0 <= b < 1 for b in v):  # Adam's moment decays: a rank would die on the first step
            raise ValueError(f"betas {list(v)}: each must be in [0, 1) (Adam's decay rates; the papers: [0.9, 0.98])")
        return v

    @field_validator("snapshot_tokens")
    @classmethod
    def _snapshot_tokens(cls, v):
        if any(n <= 0 for n in v) or any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(f"snapshot_tokens {v}: token counts above 0, each larger than the one before "
                             "(e.g. [1000000, 4000000, 16000000])")
        return v

    @field_validator("register_name")
    @classmethod
    def _register_name(cls, v):
        return v if v is None else registrable(v, "pretrain.register_name")

    @model_validator(mode="after")
    def _check(self):
        if len(set(self.batch_kinds)) != len(self.batch_kinds):
            raise ValueError("pretrain.batch_kinds lists a kind twice")
        declared = OBJECTIVES[self.objective]
        if declared.needs_pairs and "trtd" not in self.batch_kinds:
            raise ValueError(f"objective {self.objective} learns from translation pairs ({declared.needs_pairs}): "
                             "add 'trtd' to pretrain.batch_kinds")
        if declared.no_zero3 and self.zero_stage == 3:
            raise ValueError(f"objective {self.objective} {declared.no_zero3}, which ZeRO-3's partitioned "
                             "parameters cannot update: use pretrain.zero_stage 0, 1 or 2")
        for name in ("batch_size", "trtd_max_tokens"):
            if getattr(self, name) % self.ranks:
                raise ValueError(f"pretrain.{name} ({getattr(self, name)}) must be divisible by pretrain.ranks "
                                 f"({self.ranks}): it is the global micro-batch, split evenly over ranks")
        return self
