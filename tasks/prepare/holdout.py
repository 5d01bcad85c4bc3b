"""Catalog messages reserved for evaluation (``sources[].holdout``).

A message is reserved by its English text (the msgid), so the same text in
two catalogs is reserved in both; a hash of (seed, text) decides, so the
choice does not depend on which languages or catalogs are present.  Prepare
drops every reserved key and, per language, every other key whose text equals
a reserved one (compared by :func:`comparable`): no reserved sentence reaches pretraining in any language.
The evaluate stage reads the same catalogs and the same rule back
(:func:`reserved_keys`), so both sides agree by construction.
"""

from __future__ import annotations

import hashlib
import unicodedata

Key = tuple[str, str, str]  # (catalog, msgctxt, msgid[#plural]), as in xylent.tasks.prepare.gettext


def _unit(seed: int, salt: str, text: str) -> float:
    h = hashlib.blake2b(f"{seed}\x00{salt}\x00{text}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def is_reserved(english: str, holdout: dict) -> bool:
    return _unit(holdout["seed"], "holdout", english) < holdout["fraction"]


def probe_split(english: str, holdout: dict) -> str:
    """'test' or 'train' for a reserved message (a second, independent hash of its
    normalised text: 'User' and 'user' land on the same side)."""
    return "test" if _unit(holdout["seed"], "split", comparable(english)) < holdout["test_fraction"] else "train"


def msgid(key: Key) -> str:
    """The English text a key is reserved by: a plural form goes with its singular."""
    return key[2].removesuffix("#plural")


def reserved_keys(english: dict[Key, str], holdout: dict) -> set[Key]:
    """The reserved keys among ``english`` (key -> English text)."""
    return {k for k in english if is_reserved(msgid(k), holdout)}


def comparable(text: str) -> str:
    """A text's identity for the holdout: compatibility-normalised, case-folded,
    with format characters (ZWNJ, ZWJ, ...) and whitespace runs as one space, so
    'سه‌شنبه' and 'سه شنبه' are one message (a tokenizer's normaliser may merge them)."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(" " if ch.isspace() or unicodedata.category(ch) == "Cf" else ch for ch in text)
    return " ".join(text.split()).casefold()


def drop_reserved(texts: dict[str, dict[Key, str]], english: dict[Key, str], holdout: dict) -> dict[str, int]:
    """Remove reserved messages from ``texts`` (lang -> key -> text) in place;
    returns how many entries each language lost."""
    keys = reserved_keys(english, holdout)
    lost = {}
    for lang, by_key in texts.items():
        taken = {comparable(by_key[k]) for k in keys if k in by_key}
        drop = [k for k, t in by_key.items() if k in keys or comparable(t) in taken]
        for k in drop:
            del by_key[k]
        lost[lang] = len(drop)
    return lost
