"""Parallel text from gettext catalogs (.po files).

A catalog entry is keyed by (catalog, msgctxt, msgid); its msgid is the source
language's text (English for Django) and its msgstr a human translation.  Two
languages' catalogs that share a key give a sentence pair between them.

Entries that are obsolete, fuzzy or untranslated are skipped.  Plural entries
follow the spec's ``plurals``: ``singular`` pairs msgid with msgstr[0] (the
form used for n = 1 in most languages), ``all`` also pairs msgid_plural with
msgstr[1], ``skip`` drops them.
"""

from __future__ import annotations

import re
from pathlib import Path

import polib

from xylent.errors import XylentError

Key = tuple[str, str, str]  # (catalog, msgctxt, msgid[#plural])


# A keyword line or a continuation line: one complete "..." string (escapes allowed) and nothing after it.
_PO_LINE = re.compile(r'(?:(?:msgctxt|msgid|msgid_plural|msgstr(?:\[\d+\])?)\s+)?"(?:[^"\\]|\\.)*"\s*')


def _check_strings(path: Path) -> None:
    """polib reads an unterminated string by dropping its last character
    ("Hallo → "Hall"); refuse the file instead, naming the line, as msgfmt does."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            if not _PO_LINE.fullmatch(text):
                raise XylentError(f"malformed line in gettext catalog (an unterminated string, or text "
                                  f"outside quotes): {text[:80]!r}", where=f"{path}:{number}",
                                  fix="fix the line (check it with `msgfmt -c`), or leave this catalog out")


def read_catalog(path: Path, catalog: str, plurals: str) -> tuple[dict[Key, str], dict[Key, str], dict]:
    """-> (translations by key, source texts by key, counts)."""
    _check_strings(path)
    try:
        po = polib.pofile(str(path), wrapwidth=0)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise XylentError(
            f"cannot parse gettext catalog: {exc}", where=str(path), fix="check that it is a valid .po file"
        ) from None
    trans: dict[Key, str] = {}
    source: dict[Key, str] = {}
    counts = {"entries": 0, "fuzzy": 0, "untranslated": 0, "plural_skipped": 0}
    for e in po:
        if e.obsolete or not e.msgid:
            continue
        counts["entries"] += 1
        ctx = e.msgctxt or ""
        base: Key = (catalog, ctx, e.msgid)
        source[base] = e.msgid
        if e.msgid_plural:
            source[(catalog, ctx, e.msgid + "#plural")] = e.msgid_plural
        if "fuzzy" in e.flags:
            counts["fuzzy"] += 1
            continue
        if e.msgid_plural:
            if plurals == "skip":
                counts["plural_skipped"] += 1
                continue
            forms = e.msgstr_plural
            if forms.get(0):
                trans[base] = forms[0]
            else:
                counts["untranslated"] += 1
            if plurals == "all" and forms.get(1):
                trans[(catalog, ctx, e.msgid + "#plural")] = forms[1]
            continue
        if e.msgstr:
            trans[base] = e.msgstr
        else:
            counts["untranslated"] += 1
    return trans, source, counts
