"""The run specification: pydantic models loaded from YAML.

Every field can be overridden from the CLI with ``--set dotted.path=value``
(the value is parsed as YAML, so ``--set sources.0.max_lines=1000`` and
``--set languages=[en,de]`` both work).  Unknown keys are errors.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from xylent.errors import XylentError
from xylent.languages import check_language, pair_name, parse_pair
from xylent.spec_audit import AuditConfig
from xylent.spec_evaluate import EvaluateConfig, Strict


SourceName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)]
FileFormat = Literal["text", "text-xz", "text-gz", "moses-zip", "tsv", "parquet", "gettext"]


class SourceBase(Strict):
    name: SourceName
    max_bytes: int | None = Field(
        default=None,
        gt=0,
        description="Fetch at most this many bytes of each file (a prefix; stream formats only). "
        "Prepare reads the prefix up to its last complete line.",
    )
    max_lines: int | None = Field(
        default=None, gt=0, description="Prepare reads at most this many lines (or pairs) per file."
    )


class Cc100Source(SourceBase):
    """CC-100: one ``{file}.txt.xz`` per language; paragraphs per line, documents
    separated by blank lines."""

    kind: Literal["cc100"]
    languages: list[str] | None = None
    url_template: str = "https://data.statmt.org/cc-100/{file}.txt.xz"
    file_names: dict[str, str] = Field(
        default_factory=dict, description="language code -> CC-100 file name, for the few that differ"
    )


class OpusSource(SourceBase):
    """An OPUS corpus as moses zips (``{l1}-{l2}.txt.zip``, pair in alphabetical order)."""

    kind: Literal["opus"]
    corpus: str
    version: str
    pairs: list[str] | None = Field(
        default=None,
        description="pairs to fetch; when omitted the OPUS API lists the corpus and every pair "
        "whose two languages are in the spec's languages is taken",
    )
    url_template: str = "https://object.pouta.csc.fi/OPUS-{corpus}/{version}/moses/{pair}.txt.zip"
    api_url: str = "https://opus.nlpl.eu/opusapi/"

    @field_validator("pairs")
    @classmethod
    def _pairs(cls, v):
        if v is not None:
            for p in v:
                parse_pair(p, where="sources[].pairs")
        return v


class _FileSource(SourceBase):
    format: FileFormat
    lang: str | None = None
    pair: str | None = None

    @model_validator(mode="after")
    def _one_of(self):
        if self.format == "gettext" and (self.lang is None or self.pair is not None):
            raise ValueError(
                f"source {self.name!r}: a gettext catalog needs 'lang' (the language of its msgstr; msgids are English)"
            )
        if (self.lang is None) == (self.pair is None):
            raise ValueError(f"source {self.name!r}: give exactly one of 'lang' (monolingual) or 'pair' (bitext)")
        if self.pair is not None:
            parse_pair(self.pair, where=f"source {self.name!r}")
            if self.format not in ("moses-zip", "tsv", "parquet"):
                raise ValueError(f"source {self.name!r}: format {self.format!r} holds monolingual text; use 'lang'")
        elif self.format == "moses-zip":
            raise ValueError(f"source {self.name!r}: a moses-zip holds a bitext; use 'pair'")
        if self.lang is not None:
            check_language(self.lang, where=f"source {self.name!r}")
        if self.max_bytes is not None and self.format in ("moses-zip", "parquet", "gettext"):
            raise ValueError(
                f"source {self.name!r}: max_bytes cuts a file to a prefix, which a {self.format} file "
                "cannot be read from; use max_lines"
            )
        return self


class UrlSource(_FileSource):
    kind: Literal["url"]
    url: str
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    size: int | None = Field(default=None, ge=0)


class LocalSource(_FileSource):
    kind: Literal["local"]
    path: str


class HoldoutConfig(Strict):
    """Messages of a gettext source reserved for evaluation before prepare: they
    never reach pretraining, and the evaluate stage's ``holdout`` tasks read them."""

    fraction: float = Field(gt=0, lt=1, description="share of the source's English messages reserved")
    test_fraction: float = Field(default=0.5, gt=0, lt=1,
                                 description="share of the reserved messages a probe is tested on (the rest trains)")
    seed: int = 0


class GettextSource(SourceBase):
    """Translation catalogs (.po) shipped inside an installed Python package."""

    kind: Literal["gettext"]
    package: str
    languages: list[str] | None = None
    source_language: str = Field(default="en", description="the language of the msgids")
    locales: dict[str, str] = Field(
        default_factory=dict, description="language code -> locale directory, over the built-in table"
    )
    plurals: Literal["singular", "all", "skip"] = Field(
        default="singular",
        description="singular: msgid <-> msgstr[0]; all: also msgid_plural <-> msgstr[1]; skip: drop plural entries",
    )
    holdout: HoldoutConfig | None = Field(default=None, description="reserve messages for evaluation")

    @field_validator("locales")
    @classmethod
    def _locale_names(cls, value: dict[str, str]) -> dict[str, str]:
        # a locale is one folder name inside the package (pt_BR, sr@latin): it becomes part of a workspace path
        for lang, locale in value.items():
            if not re.fullmatch(r"[A-Za-z0-9_@.+-]+", locale) or locale in (".", ".."):
                raise ValueError(f"locales[{lang!r}] = {locale!r} is not a locale folder name (like pt_BR or "
                                 "sr@latin): no path separators or '..'")
        return value


Source = Annotated[
    Union[Cc100Source, OpusSource, UrlSource, LocalSource, GettextSource], Field(discriminator="kind")
]


class RunnerConfig(Strict):
    kind: Literal["threads", "processes", "dask", "ray"] = "threads"
    max_workers: int | None = Field(default=None, gt=0)
    address: str | None = Field(default=None, description="Dask scheduler / Ray cluster address")


class TrackingConfig(Strict):
    experiment: str = "xylent"
    tracking_uri: str | None = Field(
        default=None, description="default: $MLFLOW_TRACKING_URI, else sqlite:///<workspace>/mlflow.db"
    )


class DownloadConfig(Strict):
    concurrency: int = Field(default=4, gt=0)
    retries: int = Field(default=5, ge=0)
    backoff_s: float = Field(default=0.5, ge=0)
    timeout_s: float = Field(default=60.0, gt=0, description="per connect and per read: a server silent this long "
                             "is a failed attempt (retried)")
    total_timeout_s: float | None = Field(default=None, gt=0, description="a whole file, all attempts together: "
                                          "a slower download stops with an error (its bytes are kept to resume)")
    chunk_bytes: int = Field(default=1 << 20, gt=0)


class PrepareConfig(Strict):
    normalization: Literal["NFC", "NFKC", "none"] = "NFC"
    strip_control: bool = True
    min_chars: int = Field(default=1, ge=0, description="drop segments shorter than this (after cleaning)")
    max_chars: int = Field(default=20000, gt=0, description="drop segments longer than this")
    part_rows: int = Field(default=500_000, gt=0, description="rows per output Parquet part")
    max_malformed_rate: float = Field(default=0.5, ge=0, le=1, description="tsv bitext: a file with a larger "
                                      "share of lines that are not 'src<TAB>tgt' is an error, not a silent drop")
    max_member_bytes: int | None = Field(default=None, gt=0, description="moses zip: a member that expands past "
                                         "this many bytes is refused before it is read (a zip bomb's guard)")

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("max_malformed_rate", "max_member_bytes")

    @model_validator(mode="after")
    def _bounds(self):
        if self.min_chars > self.max_chars:
            raise ValueError(f"prepare.min_chars ({self.min_chars}) is above prepare.max_chars ({self.max_chars}): "
                             "every segment would be dropped")
        return self


class DedupConfig(Strict):
    # monolingual, exact
    exact: bool = True
    exact_level: Literal["line", "document"] = Field(
        default="line", description="line: paragraphs seen before anywhere in the language are dropped (CCNet)")
    normalize: Literal["ccnet", "lower", "none"] = Field(
        default="ccnet", description="ccnet: lowercase, strip punctuation/symbols/digits, collapse spaces")
    # monolingual, near-duplicates (MinHash LSH)
    near: bool = True
    near_level: Literal["line", "document"] = "document"
    num_perm: int = Field(default=112, gt=0)
    bands: int = Field(default=14, gt=0)
    rows: int = Field(default=8, gt=0)
    threshold: float = Field(default=0.8, gt=0, le=1)
    ngram: int = Field(default=5, gt=0, description="word n-gram size of shingles")
    char_ngram: int = Field(default=5, gt=0, description="character n-gram size for char_languages")
    char_languages: list[str] = Field(
        default_factory=lambda: ["zh", "zh_Hant", "yue", "wuu", "ja", "th", "lo", "km", "my", "my_zaw", "bo", "dz"],
        description="languages written without spaces: character n-gram shingles")
    seed: int = 0
    buckets: int = Field(default=16, gt=0, description="hash partitions resolved independently")
    # bitext rules
    bitext_exact: bool = True
    copies: bool = True
    copy_threshold: float = Field(default=0.9, gt=0, le=1, description="character similarity of the two sides")
    length_ratio: bool = True
    max_length_ratio: float = Field(default=3.0, gt=1)
    length_unit: Literal["auto", "chars", "words"] = Field(
        default="auto", description="auto: characters for char_languages, words otherwise (as OpusFilter)")
    hubs: bool = True
    hub_min_partners: int = Field(default=5, gt=1, description="a sentence aligned to this many distinct others is a hub")
    langid: bool = Field(default=False, description="per-side language identification (lingua); needs the langid extra")
    langid_min_chars: int = Field(default=20, ge=0, description="shorter sides are not judged (too ambiguous)")
    langid_max_confidence: float = Field(
        default=0.05, gt=0, lt=1, description="a side is a mismatch when the detector gives its declared language "
        "less than this confidence (among the spec's languages)")
    samples_per_reason: int = Field(default=20, ge=0)

    @model_validator(mode="after")
    def _bands(self):
        if self.bands * self.rows > self.num_perm:
            raise ValueError(f"dedup: {self.bands} bands x {self.rows} rows needs num_perm >= {self.bands * self.rows}")
        return self


class VocabConfig(Strict):
    grid: list[int] = Field(default_factory=lambda: list(range(1000, 50001, 1000)), min_length=1,
                            description="per-language vocabulary sizes (the reference: 1k..50k step 1k)")
    budget: int = Field(default=500_000, gt=0, description="pieces in the union of the chosen vocabularies")
    alpha: float = Field(default=0.7, gt=0, le=1, description="q_i ∝ m_i^alpha over the languages' sentence counts")
    beta: float = Field(default=0.7, gt=0, description="language weights q_i^beta")
    character_coverage: float = Field(default=0.9995, gt=0, le=1)
    input_sentence_size: int = Field(default=1_000_000, gt=0, description="sentences sampled per model")
    held_sentences: int = Field(default=10_000, gt=0, description="held-out sentences for ALP (at most)")
    held_fraction: float = Field(default=0.1, gt=0, lt=1, description="... and at most this share of a language")
    byte_fallback: bool = True
    threads_per_model: int = Field(default=1, gt=0, description="SentencePiece trainer threads per model")
    joint_baseline: bool = True

    @field_validator("grid")
    @classmethod
    def _grid(cls, v):
        if sorted(set(v)) != v or v[0] <= 0:
            raise ValueError("vocab.grid must be strictly increasing positive sizes")
        return v


class ShardsConfig(Strict):
    seq_len: int = Field(default=512, ge=8, description="tokens per MRTD sequence and TRTD pair, specials included")
    shard_mb: int = Field(default=256, gt=0, description="maximum size of one Arrow shard")


class SamplingConfig(Strict):
    ADDED_LATER: ClassVar[tuple[str, ...]] = ("exclude_pairs", "pivot")

    alpha: float = Field(default=0.7, gt=0, le=1, allow_inf_nan=False,
                         description="monolingual smoothing: p_j ∝ m_j^alpha")
    temperature: float = Field(default=5.0, gt=0, allow_inf_nan=False,
                               description="pair tables: target marginal a = p^(1/T)")
    pair_method: Literal["sinkhorn", "m2m", "temperature"] = Field(
        default="sinkhorn", description="which pair table the data loader follows (column p)")
    pair_alpha: float = Field(default=0.7, gt=0, le=1, allow_inf_nan=False,
                              description="temperature method: p_pair ∝ n_pair^pair_alpha")
    eps: float = Field(default=0.0, ge=0, allow_inf_nan=False,
                       description="0: empty pairs are structural zeros; > 0: the paper's -log(Q + eps)")
    bitext_budget: int = Field(default=1_000_000, gt=0,
                               description="sentence pairs drawn over training, for epochs and wastage")
    max_iter: int = Field(default=100_000, gt=0)
    exclude_pairs: list[str] = Field(
        default_factory=list, description="pairs given no probability (e.g. the audit's most up-weighted): "
        "the tables are built as if they had no data")
    pivot: str | None = Field(default=None, description="keep only the pairs with this language (e.g. en: the EN-X "
                              "only ablation of XY-LENT's X-Y bitexts); the others get probability 0")

    @field_validator("pivot")
    @classmethod
    def _pivot(cls, v):
        if v is not None:
            try:
                check_language(v, where="spec field sampling.pivot")
            except XylentError as exc:  # reported with the field's path, like every spec error
                raise ValueError(f"{exc.what}; {exc.fix}") from None
        return v

    @field_validator("exclude_pairs")
    @classmethod
    def _pairs(cls, v):
        out = []
        for p in v:
            try:
                a, b = parse_pair(p, where="spec field sampling.exclude_pairs")
            except XylentError as exc:  # reported with the field's path, like every spec error
                raise ValueError(f"{exc.what}; {exc.fix}") from None
            out.append(pair_name(a, b))
        if len(set(out)) != len(out):
            raise ValueError("sampling.exclude_pairs lists a pair twice")
        return out


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

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("mixup",)


REGISTRY_URI = re.compile(r"^models:/(?P<name>[^/@']+)(?:/(?P<version>latest|[0-9]+)|@(?P<alias>[A-Za-z0-9_-]+))$")


class InitConfig(Strict):
    """``pretrain.init``: start from an existing encoder (MetaXLM) -- the body copied, the
    new vocabulary's embeddings matched piece by piece (exact, normalised, dictionary),
    the rest random (docs/stages/pretrain.md)."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    from_: str = Field(alias="from", min_length=1,
                       description="a local model dir -- an xylent export (<ws>/pretrain/<fp>/model), an `xylent "
                       "export-hf` dir, a Hugging Face BERT/RoBERTa/XLM-R dir; relative to the spec file -- or a "
                       "registered model models:/<name>/<version|latest> (or @<alias>) in the workspace's MLflow store")
    dictionary: str | None = Field(default=None, description="bilingual dictionary, one 'new-word<TAB>old-word' "
                                   "(or MUSE's 'new old') per line: unmatched pieces matched through translations")
    generator: Literal["random", "body", "source"] = Field(
        default="random", description="ELECTRA's generator: random; body: the first generator_layers layers of the "
        "source body; source: the source's own generator (an xylent ELECTRA export)")
    heads: bool = Field(default=True, description="copy the source's pretraining heads that the new model has under "
                        "the same name and shape (vocabulary-sized biases remapped)")

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


class PretrainConfig(Strict):
    objective: Literal["electra", "mlm", "infoxlm", "veco"] = Field(
        default="electra", description="electra: XLM-E generator + discriminator; mlm: the MLM/TLM ablation; "
        "infoxlm: MMLM + TLM + XLCo contrast; veco: MLM + cross-attention MLM (plug-in/plug-out)")
    infoxlm: InfoXLMConfig = Field(default_factory=InfoXLMConfig)
    veco: VecoConfig = Field(default_factory=VecoConfig)
    tasks: list[Literal["mrtd", "trtd"]] = Field(default_factory=lambda: ["mrtd", "trtd"], min_length=1)
    task_schedule: Literal["alternate", "mix"] = Field(
        default="alternate", description="alternate: one task per optimizer step; mix: every task every step")
    trtd_ratio: float = Field(default=0.5, gt=0, lt=1, description="alternate: share of steps that are TRTD")
    steps: int = Field(default=125_000, gt=0, description="optimizer steps")
    batch_size: int = Field(default=8192, gt=0, description="MRTD sequences per micro-batch, all ranks together")
    trtd_max_tokens: int = Field(default=4_194_304, gt=0,
                                 description="TRTD tokens (padded) per micro-batch, all ranks together")
    grad_accum: int = Field(default=1, gt=0, description="micro-batches per task per optimizer step")
    lr: float | None = Field(default=None, gt=0, description="peak lr; default by size (base 8e-4, large 2e-4, xl 1e-4)")
    warmup_steps: int = Field(default=10_000, ge=0)
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = Field(default=1e-6, gt=0)
    weight_decay: float = Field(default=0.01, ge=0)
    clip: float | None = Field(default=None, gt=0, description="gradient clipping norm; default by size")
    disc_weight: float = Field(default=50.0, gt=0, description="λ in L_G + λ·L_D")
    mask_prob: float = Field(default=0.15, gt=0, lt=1)
    zero_stage: Literal[0, 1, 2, 3] = Field(
        default=2, description="picks infra/deepspeed/zero<N>.json; with deepspeed_config the file's stage rules")
    precision: Literal["auto", "fp32", "bf16"] = Field(default="auto", description="auto: bf16 on GPU, fp32 on CPU")
    checkpoint_every: int = Field(default=1000, gt=0)
    keep_checkpoints: int = Field(default=2, gt=0)
    # how to run, not what: left out of the fingerprint, so a restart may change them and still resume
    ranks: int = Field(default=1, gt=0, description="local ranks (GPUs; CPU processes without a GPU)")
    hostfile: str | None = Field(default=None, description="DeepSpeed hostfile for several nodes")
    master_port: int | None = Field(default=None, gt=0, lt=65536, description="default: a free port")
    deepspeed_config: str | None = Field(default=None, description="default: infra/deepspeed/zero<stage>.json")
    log_every: int = Field(default=10, gt=0, description="steps between MLflow flushes and log lines")
    system_metrics: bool = True
    system_metrics_interval: float = Field(default=10.0, gt=0, description="seconds between system metric samples")
    peak_tflops: float | None = Field(default=None, gt=0, description="for MFU; default from the GPU's name")
    register_name: str | None = Field(default=None, description="MLflow registered model; default xylent-<spec name>")
    init: InitConfig | None = Field(default=None, description="start from an existing encoder (MetaXLM): "
                                    "body copied, embeddings matched by piece; default: a random init")

    OPERATIONAL: ClassVar[tuple[str, ...]] = ("ranks", "hostfile", "master_port", "log_every", "system_metrics",
                                              "system_metrics_interval", "peak_tflops", "register_name")
    ADDED_LATER: ClassVar[tuple[str, ...]] = ("infoxlm", "veco", "init")
    # each objective's own section: in the fingerprint only when that objective is trained
    OBJECTIVE_SECTIONS: ClassVar[dict[str, str]] = {"infoxlm": "infoxlm", "veco": "veco"}

    def unread_fields(self) -> set[str]:
        """The other objectives' sections: not read by this run, so not part of what it computes."""
        return {sec for obj, sec in self.OBJECTIVE_SECTIONS.items() if obj != self.objective}

    def objective_options(self) -> dict:
        """The trained objective's own knobs (pretrain.<objective>), for train.json."""
        section = self.OBJECTIVE_SECTIONS.get(self.objective)
        return getattr(self, section).model_dump() if section else {}

    @model_validator(mode="after")
    def _check(self):
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError("pretrain.tasks lists a task twice")
        if self.objective in ("infoxlm", "veco") and "trtd" not in self.tasks:
            raise ValueError(f"objective {self.objective} learns from translation pairs (InfoXLM: XLCo and TLM; "
                             "VECO: cross-attention MLM): add 'trtd' to pretrain.tasks")
        if self.objective == "infoxlm" and self.zero_stage == 3:
            raise ValueError("objective infoxlm keeps a momentum copy of the encoder, which ZeRO-3's partitioned "
                                 "parameters cannot update: use pretrain.zero_stage 0, 1 or 2")
        for name in ("batch_size", "trtd_max_tokens"):
            if getattr(self, name) % self.ranks:
                raise ValueError(f"pretrain.{name} ({getattr(self, name)}) must be divisible by pretrain.ranks "
                                 f"({self.ranks}): it is the global micro-batch, split evenly over ranks")
        return self


class Spec(Strict):
    name: str = "xylent"
    seed: int = 0
    workspace: str | None = Field(default=None, description="default workspace; --workspace overrides")
    languages: list[str] = Field(min_length=1)
    sources: list[Source] = Field(min_length=1)
    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    download: DownloadConfig = Field(default_factory=DownloadConfig)
    prepare: PrepareConfig = Field(default_factory=PrepareConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    vocab: VocabConfig = Field(default_factory=VocabConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    shards: ShardsConfig = Field(default_factory=ShardsConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)

    # where relative paths in the spec are resolved (the spec file's folder)
    base_dir: str = Field(default=".", exclude=True)

    @field_validator("languages")
    @classmethod
    def _langs(cls, v):
        for code in v:
            check_language(code, where="spec field 'languages'")
        if len(set(v)) != len(v):
            raise ValueError("'languages' lists a language twice")
        return v

    @model_validator(mode="after")
    def _sources(self):
        names = [s.name for s in self.sources]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"source names must be unique; repeated: {sorted(dup)}")
        known = set(self.languages)
        for s in self.sources:
            declared = list(getattr(s, "languages", None) or [])
            if getattr(s, "lang", None):
                declared.append(s.lang)
            for p in ([s.pair] if getattr(s, "pair", None) else []) + list(getattr(s, "pairs", None) or []):
                declared.extend(p.split("-"))
            for code in declared:
                check_language(code, where=f"source {s.name!r}")
                if code not in known:
                    raise ValueError(
                        f"source {s.name!r} uses language {code!r}, which is not in the spec's 'languages'; "
                        "add it there or remove it from the source"
                    )
        return self

    @model_validator(mode="after")
    def _evaluate(self):
        known = set(self.languages)
        holdouts = {s.name for s in self.sources if getattr(s, "holdout", None)}
        for t in self.evaluate.tasks:
            for code in t.languages:
                if code not in known:
                    raise ValueError(f"evaluate task {t.name!r} uses language {code!r}, which is not in the spec's "
                                     "'languages'")
            if t.format == "holdout" and t.source not in holdouts:
                raise ValueError(f"evaluate task {t.name!r} reads the holdout of source {t.source!r}, but no gettext "
                                 f"source of that name reserves one; sources with a holdout: {sorted(holdouts)}")
        return self

    def source_languages(self, source) -> list[str]:
        return list(getattr(source, "languages", None) or self.languages)

    def resolve_path(self, p: str) -> Path:
        path = Path(p).expanduser()
        return path if path.is_absolute() else (Path(self.base_dir) / path).resolve()

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


# -- loading ------------------------------------------------------------------


def apply_override(data: dict, assignment: str) -> None:
    """Apply one ``dotted.path=value`` override to a raw spec dict, in place."""
    if "=" not in assignment:
        raise XylentError(
            f"bad --set {assignment!r}", fix="write overrides as key.path=value, e.g. --set prepare.min_chars=5"
        )
    path, raw = assignment.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as exc:
        raise XylentError(f"bad value in --set {assignment!r}: {exc}", fix="quote it or write valid YAML") from None
    keys = path.strip().split(".")
    node: Any = data
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        where = ".".join(keys[: i + 1])
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise XylentError(
                    f"--set {path}: {where!r} is not an index of a list of {len(node)} items",
                    fix="use a 0-based index that exists, e.g. sources.0.max_lines=1000",
                )
            idx = int(key)
            if last:
                node[idx] = value
            else:
                node = node[idx]
        elif isinstance(node, dict):
            if last:
                node[key] = value
            else:
                node = node.setdefault(key, {})
        else:
            raise XylentError(f"--set {path}: {'.'.join(keys[:i])!r} is a value, not a section")


def _format_validation_error(exc: ValidationError, source: str) -> XylentError:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see docs for the fields of this section)"
        lines.append(f"  - {loc or '(top level)'}: {msg}")
    return XylentError(
        "the spec is invalid:\n" + "\n".join(lines),
        where=source,
        fix="fix these fields in the YAML or in --set; every field is documented in docs/spec.md",
    )


def spec_from_dict(data: dict, *, source: str = "<spec>", base_dir: str = ".") -> Spec:
    data = dict(data)
    data["base_dir"] = base_dir
    try:
        return Spec.model_validate(data)
    except ValidationError as exc:
        raise _format_validation_error(exc, source) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an
    error: PyYAML would keep the last one silently, and half a spec would be ignored."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} appears twice in one mapping (only one would be used)",
                    key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_yaml(p: Path) -> dict:
    if not p.is_file():
        raise XylentError(f"spec file not found: {p}", fix="pass --spec with a YAML file, e.g. data_specs/demo.yaml")
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as exc:
        raise XylentError(f"the spec is not UTF-8 text ({exc.reason} at byte {exc.start})", where=str(p),
                          fix="save the spec as UTF-8") from None
    except yaml.YAMLError as exc:
        raise XylentError(f"the spec is not valid YAML: {exc}", where=str(p)) from None
    if not isinstance(data, dict):
        raise XylentError("the spec must be a YAML mapping", where=str(p))
    return data


def _merged(base: dict, over: dict) -> dict:
    """``over`` on top of ``base``: mappings merge key by key, anything else (lists too) is replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _with_bases(p: Path, seen: tuple[Path, ...] = ()) -> dict:
    """The spec at ``p`` with its ``extends:`` chain applied (a recipe = a base spec + what it changes)."""
    p = p.resolve()
    if p in seen:
        chain = " -> ".join(str(s) for s in (*seen, p))
        raise XylentError(f"specs extend each other in a cycle: {chain}", where=str(p), fix="remove one 'extends:'")
    data = _read_yaml(p)
    base = data.pop("extends", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise XylentError("'extends' must be the path of one spec file", where=str(p),
                          fix="write e.g. extends: ../demo.yaml (relative to this file)")
    return _merged(_with_bases(p.parent / base, (*seen, p)), data)


def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Spec:
    """The spec file (with its ``extends:`` chain), then each ``--set`` override.  Relative
    paths, the base's included, are resolved against the folder of the file named here."""
    p = Path(path)
    data = copy.deepcopy(_with_bases(p) if p.is_file() else _read_yaml(p))
    for ov in overrides:
        apply_override(data, ov)
    return spec_from_dict(data, source=str(p), base_dir=str(p.resolve().parent))
