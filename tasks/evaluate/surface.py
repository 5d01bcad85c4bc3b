"""What a translator copies verbatim, and retrieval without it (issue 63, item 3).

Software catalogs carry placeholders (``%(name)s``, ``{0}``), numbers, URLs, markup and code
names into every translation unchanged.  A retriever that matches those strings finds many
pairs without any notion of meaning: on the demo's held-out Django messages 18 % of the
English sentences share such a string with their translation, and scoring on those strings
alone reaches most of what the random-init encoder and the bag of subwords score.  So every
Tatoeba-style task is also scored on a *stripped* variant: that surface removed from both
sides, whitespace collapsed, and the pairs left empty or identical (after case folding)
dropped.  The scorecard's verdict reads the stripped variant.

What counts as surface, in the order it is removed (each pattern sees the text the earlier
ones left): markup tags and character entities; URLs and e-mail addresses; printf, Python-format
and brace placeholders; code names (``snake_case``, ``dotted.names``, ``CamelCase.attr``);
numbers (any script's digits); then every punctuation and symbol character.  Letters of any
script stay, so words a language borrows as they are (``Django``, ``True``) stay too: only the
pair itself could tell a borrowed word from a copied string.
"""

from __future__ import annotations

import re
import unicodedata

_MARKUP = re.compile(r"</?[A-Za-z][^<>]*>|&(?:[A-Za-z]+|#[0-9]+|#x[0-9A-Fa-f]+);")
_URL = re.compile(r"(?:https?|ftp)://\S+|www\.\S+|[\w.+-]+@[\w-]+(?:\.[\w-]+)+", re.UNICODE)
# %(name)s, %s, %d, %.2f, %-5d, {0}, {name}, {}, {name!r:>10}, $name, ${name}
_PLACEHOLDER = re.compile(r"%(?:\([^)]*\))?[-+#0]*\d*(?:\.\d+)?[sdifgeExXcrua%]|\{[^{}\s]*\}|\$\{?[A-Za-z_]\w*\}?")
# allow_empty, class_name.allow_future, os.path: an underscore or a dot inside a name
_CODE = re.compile(r"\b[A-Za-z_][A-Za-z0-9]*(?:[_.][A-Za-z0-9_]+)+\b|\b_\w+\b")
_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*", re.UNICODE)  # \d is every script's decimal digits
_SPACE = re.compile(r"\s+")


def _surface_strings(text: str) -> list[str]:
    """The surface strings of ``text`` (for the overlap share), and nothing of its words."""
    found = []
    for pattern in (_MARKUP, _URL, _PLACEHOLDER, _CODE, _NUMBER):
        found += pattern.findall(text)
        text = pattern.sub(" ", text)
    return found


def strip_surface(text: str) -> str:
    """``text`` without its surface: its words of any script, one space between them."""
    for pattern in (_MARKUP, _URL, _PLACEHOLDER, _CODE, _NUMBER):
        text = pattern.sub(" ", text)
    kept = "".join(" " if unicodedata.category(c)[0] in "PSZ" else c for c in text)
    return _SPACE.sub(" ", kept).strip()


def shares_surface(a: str, b: str) -> bool:
    """True when ``a`` and ``b`` have a placeholder, number, URL, markup or code name in common."""
    return bool(set(_surface_strings(a)) & set(_surface_strings(b)))


def surface_overlap(src: list[str], tgt: list[str]) -> float:
    """The share (0-100) of line-aligned pairs whose two sides share a surface string."""
    if not src:
        return 0.0
    return 100.0 * sum(shares_surface(a, b) for a, b in zip(src, tgt)) / len(src)


def stripped_pairs(src: list[str], tgt: list[str]) -> tuple[list[str], list[str], int]:
    """The pairs of ``src``/``tgt`` with their surface stripped: (src, tgt, how many were dropped).
    Dropped: a pair left empty on a side or the same on both (case folded), and a pair either of
    whose sides an earlier pair already has (``Delete selected %(model)s`` and ``Delete selected
    %(verbose_name_plural)s`` strip to one text; gold is a line, so one of two copies is always wrong)."""
    out_src, out_tgt, seen_src, seen_tgt = [], [], set(), set()
    for a, b in zip(src, tgt):
        a, b = strip_surface(a), strip_surface(b)
        if a and b and a.casefold() != b.casefold() and a not in seen_src and b not in seen_tgt:
            seen_src.add(a)
            seen_tgt.add(b)
            out_src.append(a)
            out_tgt.append(b)
    return out_src, out_tgt, len(src) - len(out_src)
