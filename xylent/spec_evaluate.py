"""The ``evaluate`` section of the spec: which encoders, on which tasks.

Other tools read these names (``evaluate.models``, ``evaluate.tasks`` with
``name``/``kind``/``path``/``languages``/``layer``); keep them stable.
"""

from __future__ import annotations

from typing import ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from xylent.languages import check_language


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)





class ModelRef(Strict):
    """An encoder on disk: an exported xylent ``model/`` dir or a local Hugging Face dir."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    path: str
    kind: Literal["xylent", "hf"]


# pipeline: this spec's pretrain output; random-init: the same architecture and tokenizer, untrained;
# bag-of-subwords: no model at all, the pipeline tokenizer's piece counts (the trivial peer)
EvalModel = Union[Literal["pipeline", "random-init", "bag-of-subwords"], ModelRef]

RETRIEVAL = ("tatoeba", "bucc")
FORMATS = {
    "tatoeba": ("auto", "tatoeba-raw", "tatoeba", "gettext", "holdout"),
    "bucc": ("auto", "bucc2018"),
    "probe": ("auto", "tsv", "holdout"),
}


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
    kind: Literal["tatoeba", "bucc", "bucc2018", "probe"]
    format: Literal["auto", "tatoeba-raw", "tatoeba", "bucc2018", "tsv", "gettext", "holdout"] = "auto"
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
        if self.kind == "probe" and self.train_language not in self.languages:
            raise ValueError(f"evaluate task {self.name!r}: train_language {self.train_language!r} must be one of "
                             "its languages (it is tested there too: the transfer gap starts from it)")
        if self.kind in RETRIEVAL and "en" in self.languages:
            raise ValueError(f"evaluate task {self.name!r}: list the non-English languages; English is the target")
        return self


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
