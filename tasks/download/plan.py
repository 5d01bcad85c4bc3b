"""What to fetch for each source: a list of `FetchItem`s.

CC-100 and OPUS sources expand to one URL per language / pair; a package's
gettext catalogs expand to one local file per catalog and language.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

import requests

from xylent.tasks.download.identity import local_file
from xylent.errors import XylentError
from xylent.languages import CC100_FILE_NAMES, DJANGO_LOCALES, pair_name, parse_pair
from xylent.spec import Spec


@dataclass(frozen=True)
class FetchItem:
    source: str
    format: str  # text, text-xz, text-gz, moses-zip, tsv, parquet, gettext
    filename: str  # where it lands, relative to the source's folder
    url: str | None = None  # fetched when set ...
    path: str | None = None  # ... else read in place (local files, package catalogs)
    lang: str | None = None
    pair: str | None = None
    catalog: str | None = None  # gettext: which catalog (same key across languages)
    sha256: str | None = None
    size: int | None = None
    max_bytes: int | None = None
    copy: bool = False  # copy a local file into the workspace (small package catalogs)

    def __post_init__(self):
        check_relative(self.filename, f"source {self.source!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def check_relative(name: str, where: str) -> str:
    """``name`` must stay inside the folder it is joined to: every file name that
    comes from a spec field, a URL or a server lands in the workspace or nowhere."""
    parts = name.replace("\\", "/").split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or ":" in parts[0]:
        raise XylentError(f"the file name {name!r} would land outside its folder in the workspace",
                          where=where, fix="use plain names: no '..', '.', empty or absolute path parts "
                          "(for a URL, one that ends in a file name)")
    return name


MAX_NAME_BYTES = 200  # file systems allow 255 bytes a name; the partial file adds ".part.json" and the like


def short_name(name: str) -> str:
    """A URL's file name as a file system takes it: one too long (a name past 255 bytes is an OSError on
    every common file system) keeps its start and its suffixes, with a hash of the whole name between, so
    two long names never land on one file."""
    if len(name.encode()) <= MAX_NAME_BYTES:
        return name
    import hashlib

    stem, dot, suffix = name.partition(".")
    suffix = dot + suffix if len(suffix.encode()) <= 40 else ""
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    head = stem.encode()[:MAX_NAME_BYTES - len(suffix.encode()) - 17].decode(errors="ignore")
    return f"{head}-{digest}{suffix}"


def opus_list_pairs(api_url: str, corpus: str, version: str, *, timeout: float = 60.0) -> list[str]:
    """Ask the OPUS API which moses files a corpus version has; return pair names."""
    params = {"corpus": corpus, "version": version, "preprocessing": "moses"}
    try:
        resp = requests.get(api_url, params=params, timeout=timeout)
    except requests.RequestException as exc:
        raise XylentError(f"cannot reach the OPUS API: {exc}", where=api_url, fix="check api_url or list 'pairs'") from None
    if resp.status_code != 200:
        raise XylentError(f"the OPUS API answered HTTP {resp.status_code}", where=resp.url)
    try:
        corpora = resp.json()["corpora"]
        pairs = {pair_name(c["source"], c["target"]) for c in corpora}
    except (ValueError, KeyError, TypeError):
        raise XylentError("the OPUS API answered something that is not its JSON listing", where=resp.url) from None
    if not pairs:
        raise XylentError(
            f"OPUS has no moses files for {corpus} {version}",
            where=resp.url,
            fix="check the corpus name and version (they are case-sensitive, e.g. CCMatrix v1)",
        )
    return sorted(pairs)


def _catalog_dirs(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise XylentError(
            f"Python package {package!r} is not installed",
            where="spec field sources[].package",
            fix=f"install it (pip install {package}); the demo's packages come with pip install -e '.[demo]'",
        )
    if not spec.submodule_search_locations:  # a single module (six.py): no folder to hold catalogs
        raise XylentError(
            f"{package!r} is a single Python module ({spec.origin}), not a package: it ships no gettext catalogs "
            "(locale/<lang>/LC_MESSAGES/*.po)",
            where="spec field sources[].package",
            fix="name a package that ships translations (django, django-allauth's allauth, ...)",
        )
    return Path(list(spec.submodule_search_locations)[0])


def plan_gettext(spec: Spec, source) -> list[FetchItem]:
    """One item per catalog and language.  The msgids are the source language's text: read beside
    every other language's catalogs, or, for a source of the source language alone (MetaXLM's English
    phase 1), from its own locale's catalogs (Django ships ``en``: every msgid, no msgstr) or the one
    that ``locales`` names for it."""
    root = _catalog_dirs(source.package)
    items = []
    table = {**DJANGO_LOCALES, **source.locales}
    langs = spec.source_languages(source)
    for lang in langs:
        if lang == source.source_language and langs != [lang]:
            continue  # the msgids beside the other languages' catalogs are this language's text
        locale = table.get(lang, lang)
        found = sorted(root.glob(f"**/locale/{locale}/LC_MESSAGES/*.po"))
        if not found and lang == source.source_language:
            raise XylentError(
                f"package {source.package!r} has no catalogs of locale {locale!r} to read the {lang!r} msgids from",
                where=f"source {source.name!r}",
                fix=f"name a locale the package has whose catalogs hold every msgid, e.g. sources[].locales: "
                f"{{{lang}: de}} (only their msgids are read)",
            )
        if not found:
            raise XylentError(
                f"package {source.package!r} has no catalogs for language {lang!r} (locale {locale!r})",
                where=f"source {source.name!r}",
                fix="drop the language from the spec's languages, or map it to a locale the package has "
                "with sources[].locales",
            )
        for po in found:
            rel = po.relative_to(root)
            # catalog key: the path with the locale folder taken out, equal across languages
            parts = list(rel.parts)
            i = parts.index("locale")
            catalog = "/".join(parts[:i] + parts[i + 3 :])
            items.append(
                FetchItem(
                    source=source.name, format="gettext", filename=f"{locale}/{rel.as_posix()}",
                    path=str(po), lang=lang, catalog=catalog, copy=True,
                )
            )
    return items


def plan_source(spec: Spec, source) -> list[FetchItem]:
    """Expand one source of the spec into the files it consists of."""
    if source.kind == "cc100":
        names = {**CC100_FILE_NAMES, **source.file_names}
        items = []
        for lang in spec.source_languages(source):
            file = names.get(lang, lang)
            url = source.url_template.format(file=file, lang=lang)
            items.append(
                FetchItem(source=source.name, format="text-xz", filename=f"{file}.txt.xz", url=url,
                          lang=lang, max_bytes=source.max_bytes)
            )
        return items
    if source.kind == "opus":
        if source.pairs is not None:
            pairs = [pair_name(*parse_pair(p, where=f"source {source.name!r}")) for p in source.pairs]
        else:
            wanted = set(spec.languages)
            pairs = [
                p for p in opus_list_pairs(source.api_url, source.corpus, source.version)
                if set(p.split("-")) <= wanted
            ]
            if not pairs:
                raise XylentError(
                    f"OPUS {source.corpus} {source.version} has no pair between the spec's languages",
                    where=f"source {source.name!r}",
                )
        return [
            FetchItem(
                source=source.name, format="moses-zip", filename=f"{p}.txt.zip",
                url=source.url_template.format(corpus=source.corpus, version=source.version, pair=p),
                pair=p,
            )
            for p in pairs
        ]
    if source.kind == "gettext":
        return plan_gettext(spec, source)
    if source.kind == "url":
        # the path's last part: a query (a presigned URL's signature) is no part of a file name
        name = short_name(urlsplit(source.url).path.rstrip("/").rsplit("/", 1)[-1] or "data")
        return [
            FetchItem(source=source.name, format=source.format, filename=name, url=source.url,
                      lang=source.lang, pair=source.pair,
                      sha256=source.sha256, size=source.size, max_bytes=source.max_bytes,
                      catalog=name if source.format == "gettext" else None)
        ]
    if source.kind == "local":
        path = spec.resolve_path(source.path)
        local_file(path, source.name)
        return [
            FetchItem(source=source.name, format=source.format, filename=path.name, path=str(path),
                      lang=source.lang, pair=source.pair,
                      max_bytes=source.max_bytes, catalog=path.name if source.format == "gettext" else None)
        ]
    raise XylentError(f"unknown source kind {source.kind!r}", where=f"source {source.name!r}")
