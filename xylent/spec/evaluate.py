"""The ``evaluate`` section of the spec: which encoders, on which tasks.

Other tools read these names (``evaluate.models``, ``evaluate.tasks`` with
``name``/``kind``/``path``/``languages``/``layer``); keep them stable.
"""

from __future__ import annotations

import copy
import math
from functools import lru_cache
from pathlib import Path
from typing import ClassVar, Literal, Union

import yaml
from pydantic import Field, field_validator, model_validator

from xylent.languages import check_language
from xylent.spec.base import Strict


class ModelRef(Strict):
    """An encoder on disk: an exported xylent ``model/`` dir or a local Hugging Face dir."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    path: str
    kind: Literal["xylent", "hf"]
    trust_remote_code: bool = Field(default=False, description="hf: run the dir's own modeling file (needed for "
                                     "`xylent export-hf` dirs); only for dirs you trust, it is code")

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("trust_remote_code",)


# pipeline: this spec's pretrain output; random-init: the same architecture and tokenizer, untrained;
# bag-of-subwords: no model at all, the pipeline tokenizer's piece counts (the trivial peer)
EvalModel = Union[Literal["pipeline", "random-init", "bag-of-subwords"], ModelRef]

RETRIEVAL = ("tatoeba", "bucc")
FINETUNED = ("classification", "qa", "tagging")
FORMATS = {
    "tatoeba": ("auto", "tatoeba-raw", "tatoeba", "gettext", "holdout"),
    "bucc": ("auto", "bucc2018"),
    "probe": ("auto", "tsv", "holdout"),
    "classification": ("auto", "xnli", "pawsx", "tsv", "holdout"),
    "qa": ("auto", "squad"),
    "tagging": ("auto", "conll"),
}
# the XTREME tasks each fine-tuned kind can stand for: their submission folder, metric and defaults
XTREME_TASKS = {"classification": ("xnli", "pawsx"), "qa": ("xquad", "mlqa", "tydiqa"), "tagging": ("panx", "udpos")}
HPARAMS_FILE = Path(__file__).with_name("finetune_hparams.yaml")


HPARAM_TABLES = ("xtreme", "xy-lent")


@lru_cache(maxsize=1)
def hparams_table() -> dict:
    """The default fine-tuning hyperparameters per table (``tables.xtreme``, ``tables.xy-lent``) and
    XTREME task, each with its source; ``kinds`` maps a kind to the task whose row it takes."""
    return yaml.safe_load(HPARAMS_FILE.read_text(encoding="utf-8"))


class FineTune(Strict):
    """How a ``classification``/``qa``/``tagging`` task fine-tunes each encoder.

    Every value left out comes from :data:`HPARAMS_FILE`, the table ``defaults``
    names (``xtreme``: XTREME's scripts, one point; ``xy-lent``: XY-LENT's Table 15,
    learning-rate and epoch grids), for the task's ``xtreme_task``, or its kind's row;
    the resolved values are what the stage's fingerprint sees.  A list for ``lr`` or
    ``epochs`` is a grid: every point is fine-tuned on every seed and the point with
    the best mean dev score over the seeds is kept (tasks/evaluate/finetune/run.py).
    """

    protocol: Literal["zero-shot", "translate-train"] = Field(
        default="zero-shot", description="zero-shot: train on train_language only; translate-train: also on every "
        "language's translate-train-<lang> file")
    defaults: Literal["xtreme", "xy-lent"] = Field(
        default="xtreme", description="the table the values left out come from: xtreme (XTREME's scripts, one "
        "point per task) or xy-lent (XY-LENT's Table 15: grids selected on dev, XNLI's warmup in steps)")
    lr: float | list[float] | None = Field(default=None, description="a list: a grid searched on dev")
    epochs: int | list[int] | None = Field(default=None, description="a list: a grid searched on dev")
    batch_size: int | None = Field(default=None, gt=0, description="examples per optimiser step")
    warmup: float | None = Field(default=None, ge=0, lt=1, description="fraction of the steps with a rising lr")
    warmup_steps: int | None = Field(default=None, ge=0, description="steps with a rising lr (capped at the "
                                     "run's steps), instead of warmup; XY-LENT's XNLI: 12,500")
    weight_decay: float | None = Field(default=None, ge=0)
    max_length: int | None = Field(default=None, ge=16, description="tokens per input, specials included")
    selection: Literal["dev", "last"] | None = Field(
        default=None, description="dev: keep the epoch with the best train-language dev score; last: the final one")
    doc_stride: int | None = Field(default=None, gt=0, description="qa: tokens between window starts")
    max_query_length: int | None = Field(default=None, gt=0, description="qa: question tokens kept")
    max_answer_length: int | None = Field(default=None, gt=0, description="qa: longest answer span, in tokens")
    seeds: list[int] = Field(default_factory=lambda: [1], min_length=1, description="one run per seed: mean ± sd")
    max_train_examples: int | None = Field(default=None, gt=0, description="use at most this many (the first)")
    dev_fraction: float = Field(default=0.1, gt=0, lt=0.5, description="share of the training examples held out "
                                "as dev when the task has no dev file of its train language")
    checkpoint_every: int = Field(default=200, gt=0, description="optimiser steps between resumable checkpoints")
    launcher: Literal["process", "deepspeed"] = Field(
        default="process", description="process: in the evaluate task (GPU when torch sees one); deepspeed: "
        "`ranks` ranks through pretrain's DeepSpeed launcher (bf16 on GPUs)")
    ranks: int = Field(default=1, gt=0, description="deepspeed: ranks (GPUs; CPU ranks over gloo without one)")
    zero_stage: int = Field(default=2, ge=0, le=2, description="deepspeed: ZeRO stage")
    master_port: int | None = Field(default=None, description="deepspeed: rendezvous port (default: a free one)")

    # launcher and ranks change the numbers (per-rank dropout streams, bf16 weights on GPU ranks): not here
    OPERATIONAL: ClassVar[tuple[str, ...]] = ("checkpoint_every", "zero_stage", "master_port")
    ADDED_LATER: ClassVar[tuple[str, ...]] = ("defaults", "warmup_steps")

    @field_validator("lr", "epochs")
    @classmethod
    def _grid(cls, v, info):
        points = v if isinstance(v, list) else [] if v is None else [v]
        if isinstance(v, list) and not v:
            raise ValueError(f"finetune.{info.field_name}: an empty grid; give a value or a list of values")
        if any(not math.isfinite(p) or p <= 0 for p in points):
            raise ValueError(f"finetune.{info.field_name} must be > 0, got {v}")
        if len(set(points)) != len(points):
            raise ValueError(f"finetune.{info.field_name}: the grid {v} repeats a value")
        return v[0] if isinstance(v, list) and len(v) == 1 else v

    def resolve(self, row: dict, kind: str) -> "FineTune":
        if self.warmup is not None and self.warmup_steps is not None:
            raise ValueError("finetune: give warmup (a fraction of the steps) or warmup_steps, not both")
        pinned_warmup = self.warmup is not None or self.warmup_steps is not None
        for key, value in row.items():
            if key == "from" or (pinned_warmup and key in ("warmup", "warmup_steps")):
                continue  # the row's provenance; a warmup the spec pins in either form wins
            if getattr(self, key) is None and (kind == "qa" or key not in ("doc_stride", "max_query_length",
                                                                            "max_answer_length")):
                setattr(self, key, value)
        if self.warmup is None and self.warmup_steps is None:
            self.warmup = 0.0
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"finetune.seeds must be distinct, got {self.seeds}")
        if self.launcher == "deepspeed" and self.batch_size % self.ranks:
            raise ValueError(f"finetune.batch_size {self.batch_size} must be a multiple of finetune.ranks "
                             f"{self.ranks}: every rank takes an equal slice of each batch")
        return self


class EvalTask(Strict):
    """One evaluation task.

    kinds: ``tatoeba`` (parallel sentences, acc@1 both ways), ``bucc`` (BUCC 2018
    mining, F1), ``probe`` (zero-shot transfer: a linear classifier on frozen
    sentence embeddings, trained on ``train_language`` only, tested on every
    language).  ``format`` says how ``path`` is laid out; ``gettext`` builds
    parallel pairs from an installed ``package``'s catalogs and ``holdout``
    reads the messages a gettext ``source`` reserved before prepare.
    """

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    kind: Literal["tatoeba", "bucc", "bucc2018", "probe", "classification", "qa", "tagging"]
    format: Literal["auto", "tatoeba-raw", "tatoeba", "bucc2018", "tsv", "gettext", "holdout", "xnli", "pawsx",
                    "squad", "conll"] = "auto"
    xtreme_task: Literal["xnli", "pawsx", "xquad", "mlqa", "tydiqa", "panx", "udpos"] | None = Field(
        default=None, description="fine-tuned kinds: the XTREME task this is (submission folder, metric, defaults)")
    finetune: FineTune | None = Field(default=None, description="fine-tuned kinds: hyperparameters and protocol")
    path: str | None = Field(default=None, description="local dir, or URL of a .tar.gz/.zip/.tar archive")
    labels: str | None = Field(default=None, description="tatoeba, XTREME's preprocessed layout: the dir of its "
                               "gold test-<xx>.tsv (the English side there is sorted)")
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$", description="checksum of the URL's file")
    package: str | None = Field(default=None, description="format gettext: the installed package with catalogs")
    source: str | None = Field(default=None, description="format holdout: the gettext source that reserved them")
    languages: list[str] = Field(min_length=1, description="the spec's 2-letter codes (English is the pivot)")
    layer: int | None = Field(default=None, description="retrieval: hidden-state index; default the middle layer")
    train_language: str = Field(default="en", description="probe: the one language it is trained on")
    max_pairs: int | None = Field(default=None, gt=0, description="gettext/holdout: at most this many per language")
    exclude_seen: bool = Field(default=False, description="gettext: drop pairs either side of which is in the "
                               "pretraining corpus (dedup's output), so the task measures transfer, not memory")
    plug_in: bool = Field(default=False, description="probe: read every text beside its English translation "
                          "through VECO's cross-attention (plug-in mode, final layer); the files' third column "
                          "(format holdout writes it); models without cross-attention are 'not applicable'")

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("xtreme_task", "finetune", "plug_in")

    @model_validator(mode="after")
    def _check(self):
        if self.kind == "bucc2018":
            self.kind = "bucc"  # XTREME's name for it
        for code in [*self.languages, self.train_language]:
            check_language(code, where=f"evaluate task {self.name!r}")
        if self.format not in FORMATS[self.kind]:
            raise ValueError(f"evaluate task {self.name!r}: format {self.format!r} does not fit kind {self.kind!r}; "
                             f"use one of {', '.join(FORMATS[self.kind])}")
        need = {"gettext": "package", "holdout": "source"}.get(self.format, "path")
        if getattr(self, need) is None:
            raise ValueError(f"evaluate task {self.name!r} (format {self.format}) needs '{need}'")
        if self.kind in FINETUNED:
            self._check_finetune()
        elif self.finetune is not None or self.xtreme_task is not None:
            raise ValueError(f"evaluate task {self.name!r}: finetune/xtreme_task apply to the kinds "
                             f"{', '.join(FINETUNED)} only, not {self.kind!r}")
        if self.kind in ("probe", *FINETUNED) and self.train_language not in self.languages:
            raise ValueError(f"evaluate task {self.name!r}: train_language {self.train_language!r} must be one of "
                             "its languages (it is tested there too: the transfer gap starts from it)")
        if self.plug_in and self.kind != "probe":
            raise ValueError(f"evaluate task {self.name!r}: plug_in applies to kind probe only, not {self.kind!r}")
        if self.plug_in and self.layer is not None:
            raise ValueError(f"evaluate task {self.name!r}: a plug-in probe reads the final layer (VECO's plug-in "
                             "pass gives no other); leave layer out")
        if self.kind in RETRIEVAL and "en" in self.languages:
            raise ValueError(f"evaluate task {self.name!r}: list the non-English languages; English is the target")
        return self

    def _check_finetune(self) -> None:
        if self.xtreme_task is not None and self.xtreme_task not in XTREME_TASKS[self.kind]:
            raise ValueError(f"evaluate task {self.name!r}: xtreme_task {self.xtreme_task!r} is not a {self.kind} "
                             f"task; use one of {', '.join(XTREME_TASKS[self.kind])}")
        if self.format == "holdout" and self.kind != "classification":
            raise ValueError(f"evaluate task {self.name!r}: format holdout gives labelled sentences, a "
                             "classification task; use kind: classification")
        table, ft = hparams_table(), self.finetune or FineTune()
        # a deep copy: the grids are lists, and the table is cached for every task
        row = copy.deepcopy(table["tables"][ft.defaults]["tasks"][self.xtreme_task or table["kinds"][self.kind]])
        self.finetune = ft.resolve(row, self.kind)

    @property
    def submission_format(self) -> str:
        """How a fine-tuned task's predictions are laid out (xylent.tasks.evaluate.submission's formats)."""
        return {"classification": "lines", "qa": "qa", "tagging": "tags"}[self.kind]


class EvaluateConfig(Strict):
    models: list[EvalModel] = Field(default_factory=lambda: ["pipeline", "random-init"],
                                    description="encoders side by side; names must be unique")
    tasks: list[EvalTask] = Field(default_factory=list)
    batch_size: int = Field(default=64, gt=0, description="sentences per forward pass")
    max_length: int = Field(default=128, ge=8, description="tokens per sentence, specials included")
    random_init_seed: int = Field(default=0, description="seed of the random-init baseline's weights")

    OPERATIONAL: ClassVar[tuple[str, ...]] = ("batch_size",)

    @model_validator(mode="after")
    def _unique(self):
        names = [m if isinstance(m, str) else m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"evaluate.models: names must be unique, got {names}")
        tasks = [t.name for t in self.tasks]
        if len(set(tasks)) != len(tasks):
            raise ValueError(f"evaluate.tasks: names must be unique, got {tasks}")
        return self

    def model_names(self) -> list[str]:
        return [m if isinstance(m, str) else m.name for m in self.models]
