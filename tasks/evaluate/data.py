"""Evaluation data built from what is installed: parallel pairs from a package's
gettext catalogs (a Tatoeba-style task), and the messages a gettext source
reserved before prepare (a probe task labelled by catalog, or retrieval pairs).

Both are written in the same layouts the readers of real data read (Tatoeba's
``<xx>-en.<xx>`` / ``<xx>-en.en``; the probe's ``train-<lang>.tsv`` /
``test-<lang>.tsv``), so a user can look at exactly what was evaluated.
"""

from __future__ import annotations

import collections
import os
import unicodedata
from pathlib import Path

from xylent.tasks.download.contract import read_records
from xylent.tasks.prepare.gettext import Key, read_catalog
from xylent.tasks.prepare.holdout import msgid, probe_split, reserved_keys
from xylent.atomic import write_text_atomic
from xylent.errors import XylentError


def _clean(text: str) -> str:
    # what prepare does to every segment (NFC, one line), so evaluation sees the text pretraining would have
    return " ".join(unicodedata.normalize("NFC", text).split())


def _catalog_texts(items: list[tuple[str, str, Path]], plurals: str) -> tuple[dict[str, dict[Key, str]], dict]:
    """(lang, catalog, path) -> (lang -> key -> translation, key -> English msgid)."""
    texts: dict[str, dict[Key, str]] = {}
    english: dict[Key, str] = {}
    for lang, catalog, path in sorted(items):
        trans, src, _ = read_catalog(path, catalog, plurals)
        texts.setdefault(lang, {}).update(trans)
        english.update(src)
    return texts, english


def package_pairs(package: str, languages: list[str], locales: dict[str, str] | None = None,
                  max_pairs: int | None = None) -> dict[str, tuple[list[str], list[str]]]:
    """lang -> (xx sentences, en sentences) from an installed package's catalogs."""
    from xylent.tasks.download.plan import plan_gettext
    from xylent.spec import GettextSource, Spec

    src = GettextSource(name="eval", kind="gettext", package=package, languages=["en", *languages],
                       locales=locales or {})
    spec = Spec(languages=["en", *languages], sources=[src])
    items = [(it.lang, it.catalog, Path(it.path)) for it in plan_gettext(spec, src)]
    texts, english = _catalog_texts(items, "singular")
    return {lang: _pairs(texts.get(lang, {}), english, max_pairs) for lang in languages}


def _pairs(trans: dict[Key, str], english: dict[Key, str], max_pairs: int | None) -> tuple[list[str], list[str]]:
    return unique_pairs([(_clean(trans[k]), _clean(english[k])) for k in sorted(trans)], max_pairs)


def unique_pairs(pairs: list[tuple[str, str]], max_pairs: int | None = None) -> tuple[list[str], list[str]]:
    """One pair per distinct sentence on either side (a repeated sentence makes
    acc@1 ill-defined), empty ones dropped, at most ``max_pairs``."""
    seen_xx, seen_en, xx, en = set(), set(), [], []
    for a, b in pairs:
        if a and b and a not in seen_xx and b not in seen_en:
            seen_xx.add(a)
            seen_en.add(b)
            xx.append(a)
            en.append(b)
    return (xx[:max_pairs], en[:max_pairs]) if max_pairs else (xx, en)


def holdout_messages(download_dir: Path, source: str, holdout: dict, plurals: str, languages: list[str],
                     source_language: str = "en"):
    """The reserved messages of ``source``: lang -> [(label, split, text)] with
    label = the catalog's folder (Django: conf, contrib/admin, ...) and split
    train/test; plus lang -> key -> text for pairing."""
    recs = [r for r in read_records(download_dir) if r["source"] == source and r["format"] == "gettext"]
    if not recs:
        raise XylentError(f"the download stage has no gettext catalogs of source {source!r}",
                          where="spec field evaluate.tasks[].source", fix="name a gettext source of the spec")
    items = [(r["lang"], r["catalog"], Path(download_dir) / r["source"] / r["filename"]) for r in recs]
    texts, english = _catalog_texts(items, plurals)
    texts[source_language] = english  # the msgids are this language's text
    keys = reserved_keys(english, holdout)
    out = {}
    for lang in languages:
        rows = []
        for k in sorted(keys & texts.get(lang, {}).keys()):
            text = _clean(texts[lang][k])
            if text:
                rows.append((os.path.dirname(k[0]) or k[0], probe_split(msgid(k), holdout), text, k))
        out[lang] = rows
    return out


def write_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(line.replace("\n", " ") + "\n" for line in lines))


def write_tatoeba(root: Path, pairs: dict[str, tuple[list[str], list[str]]]) -> Path:
    """XTREME's preprocessed Tatoeba layout: ``<xx>-en.<xx>``, ``<xx>-en.en`` with
    the English side sorted (so the answers are not the line order), and the gold
    ``labels/test-<xx>.tsv``: per xx line, the index of its translation."""
    for lang, (xx, en) in pairs.items():
        order = sorted(range(len(en)), key=lambda i: en[i])
        where = {i: rank for rank, i in enumerate(order)}
        write_lines(root / f"{lang}-en.{lang}", xx)
        write_lines(root / f"{lang}-en.en", [en[i] for i in order])
        write_lines(root / "labels" / f"test-{lang}.tsv", [str(where[i]) for i in range(len(xx))])
    return root


def write_probe(root: Path, messages: dict[str, list[tuple]], train_language: str,
                translations: dict[str, str] | None = None) -> Path:
    """``train-<train_language>.tsv`` and ``test-<lang>.tsv``, lines ``label<TAB>text``,
    or ``label<TAB>text<TAB>translation`` with ``translations`` (message key -> the
    English text; an English row's translation is itself)."""
    def line(lab, text, key):
        return f"{lab}\t{text}" if translations is None else f"{lab}\t{text}\t{translations[key]}"

    for lang, rows in messages.items():
        keep = [r for r in rows if translations is None or r[3] in translations]
        write_lines(root / f"test-{lang}.tsv", [line(lab, text, key) for lab, split, text, key in keep
                                                if split == "test"])
        if lang == train_language:
            write_lines(root / f"train-{lang}.tsv", [line(lab, text, key) for lab, split, text, key in keep
                                                     if split == "train"])
    return root


def read_probe(root: Path, lang: str, split: str, *, translations: bool = False) -> tuple[list[str], ...]:
    """(labels, texts) of ``<split>-<lang>.tsv``, and with ``translations`` each text's
    translation, the file's third column; malformed lines name file and line."""
    path = Path(root) / f"{split}-{lang}.tsv"
    if not path.is_file():
        raise XylentError(f"probe data has no {split} file for language {lang!r}", where=str(path),
                          fix=f"add {path.name} (lines: label<TAB>text) or drop {lang!r} from the task's languages")
    labels, texts, trans = [], [], []
    raw = path.read_bytes()
    for no, line in enumerate(raw.split(b"\n"), 1):
        try:
            line = line.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as exc:
            raise XylentError(f"not UTF-8 text: {exc.reason}", where=f"{path}:{no}",
                              fix="re-encode the file as UTF-8") from None
        if not line:
            continue
        cols = line.split("\t")
        if len(cols) not in (2, 3) or not all(cols):
            raise XylentError("a probe line must be 'label<TAB>text' (or 'label<TAB>text<TAB>translation') with "
                              "every column non-empty", where=f"{path}:{no}", fix="fix or remove that line")
        if translations and len(cols) != 3:
            raise XylentError("a plug-in probe reads every text beside its translation: this line has no third "
                              "column", where=f"{path}:{no}",
                              fix="write lines as label<TAB>text<TAB>translation, or set the task's plug_in: false")
        labels.append(cols[0])
        texts.append(cols[1])
        trans.append(cols[2] if len(cols) == 3 else None)
    if not texts:
        raise XylentError("probe file has no examples", where=str(path), fix="fill it or drop the language")
    return (labels, texts, trans) if translations else (labels, texts)


def seen_texts(corpus: Path, lang: str) -> set[str]:
    """Every text of ``lang`` in a text-stage output (mono/ and both sides of bitext/),
    by its holdout identity (:func:`xylent.tasks.prepare.holdout.comparable`)."""
    import polars as pl

    from xylent.tasks.prepare.holdout import comparable
    from xylent.tasks.prepare.contract import BITEXT, MONO

    out: set[str] = set()
    mono = sorted((Path(corpus) / MONO / f"lang={lang}").glob("*.parquet"))
    if mono:
        out.update(comparable(t) for t in pl.read_parquet(mono, columns=["text"])["text"].to_list())
    for pair_dir in sorted((Path(corpus) / BITEXT).glob("pair=*")):
        a, b = pair_dir.name.removeprefix("pair=").split("-")
        if lang in (a, b):
            col = "src" if lang == a else "tgt"
            files = sorted(pair_dir.glob("*.parquet"))
            if files:
                out.update(comparable(t) for t in pl.read_parquet(files, columns=[col])[col].to_list())
    return out


def drop_seen(pairs: dict[str, tuple[list[str], list[str]]], corpus: Path) -> dict[str, int]:
    """Remove, in place, the pairs either side of which the corpus holds; -> dropped per language."""
    from xylent.tasks.prepare.holdout import comparable

    english = seen_texts(corpus, "en")
    dropped = {}
    for lang, (xx, en) in pairs.items():
        seen = seen_texts(corpus, lang)
        keep = [i for i in range(len(xx)) if comparable(xx[i]) not in seen and comparable(en[i]) not in english]
        dropped[lang] = len(xx) - len(keep)
        pairs[lang] = ([xx[i] for i in keep], [en[i] for i in keep])
    return dropped


LANG_CHECK_MIN_CHARS, LANG_CHECK_LINES = 30, 200  # lingua needs a sentence, not a button label


def probe_warnings(root: Path, task) -> list[str]:
    """What a probe's files hold that its scores would hide: a third column the task ignores
    (``plug_in`` off), and a file whose long lines mostly read as another of the task's
    languages (lingua, where installed: the demo and dev extras have it)."""
    out = []
    files = {f"train-{task.train_language}.tsv": task.train_language,
             **{f"test-{lang}.tsv": lang for lang in task.languages}}
    detect, known = _language_of(tuple(sorted({*task.languages, task.train_language})))
    for name, lang in files.items():
        path = Path(root) / name
        if not path.is_file():
            continue
        rows = [line.split("\t") for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line]
        extra = sum(len(cols) == 3 for cols in rows)
        if extra and not task.plug_in:
            out.append(f"evaluate task {task.name!r}: {extra} line(s) of {path} have a third column, which this "
                       "task ignores (plug_in: false reads label<TAB>text); set plug_in: true to read it as the "
                       "text's translation, or drop it")
        long = [cols[1] for cols in rows if len(cols) > 1 and len(cols[1]) >= LANG_CHECK_MIN_CHARS][:LANG_CHECK_LINES]
        if detect is None or lang not in known or len(long) < 20:
            continue  # a language lingua does not know could only be voted into the others
        votes = collections.Counter(detect(long))
        own = votes.pop(known[lang], 0)  # zh and zh_Hant are one ISO code: either is "its own"
        other, n = votes.most_common(1)[0] if votes else (None, 0)
        if other is not None and n >= 0.7 * len(long) and own <= 0.1 * len(long):
            out.append(f"evaluate task {task.name!r}: {n} of {len(long)} long lines of {path} read as {other!r}, "
                       f"{own} as {lang!r} (lingua): is it the right language's file?")
    return out


def _language_of(codes: tuple[str, ...]):
    """(texts -> the lowercase ISO 639-1 code lingua finds most likely for each, among ``codes``'s;
    each code lingua knows -> its ISO code); (None, {}) when lingua is missing or knows fewer than two."""
    try:
        from lingua import IsoCode639_1, LanguageDetectorBuilder
    except ImportError:
        return None, {}
    isos = {c: getattr(IsoCode639_1, c.split("_")[0].upper()) for c in codes
            if hasattr(IsoCode639_1, c.split("_")[0].upper())}
    if len(set(isos.values())) < 2:
        return None, {}
    detector = LanguageDetectorBuilder.from_iso_codes_639_1(*set(isos.values())).with_low_accuracy_mode().build()

    def detect(texts: list[str]) -> list[str | None]:
        return [None if found is None else found.iso_code_639_1.name.lower()
                for found in detector.detect_languages_in_parallel_of(texts)]
    return detect, {c: iso.name.lower() for c, iso in isos.items()}
