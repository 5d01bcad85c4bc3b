"""The ``sources`` of a spec: where the corpus comes from (CC-100, OPUS, URLs, local files, gettext catalogs)."""

from __future__ import annotations

import re
from typing import Annotated, Literal, Union

from pydantic import Field, field_validator, model_validator

from xylent.languages import check_language, parse_pair
from xylent.spec.base import Strict

SourceName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)]


FileFormat = Literal["text", "text-xz", "text-gz", "moses-zip", "tsv", "parquet", "gettext"]



def _placeholders(template: str, needed: tuple[str, ...], what: str) -> str:
    """A URL template without the placeholder that tells its units apart fetches one URL for all of them
    (two languages collapsed onto one unit, found only when the download failed)."""
    if not any(n in template for n in needed):  # one of them is enough
        raise ValueError(f"url_template {template!r} lacks {' or '.join(needed)}: {what} needs its own URL "
                         f"(e.g. ...{needed[0]}...)")
    return template

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

    @field_validator("url_template")
    @classmethod
    def _one_url_per_language(cls, v):
        return _placeholders(v, ("{file}", "{lang}"), "each language's file")


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

    @field_validator("url_template")
    @classmethod
    def _one_url_per_pair(cls, v):
        return _placeholders(v, ("{pair}",), "each pair's zip")

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
