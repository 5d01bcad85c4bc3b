"""Language codes: which codes xylent accepts and how corpora name them.

A language code is an ISO 639-1 code, or an ISO 639-3 code for languages
without one (``ast``, ``ceb``, ``ckb`` ...), optionally followed by ``_`` and a
script or variant subtag: ``zh_Hant``, ``sr_Latn``, ``hi_rom`` (CC-100's
romanised text), ``my_zaw`` (Zawgyi-encoded Burmese).  Underscore, not hyphen,
because ``pair=xx-yy`` directories use the hyphen as separator.
"""

from __future__ import annotations

import re

from xylent.errors import XylentError

ISO_639_1 = set(
    """aa ab ae af ak am an ar as av ay az ba be bg bh bi bm bn bo br bs ca ce ch co
    cr cs cu cv cy da de dv dz ee el en eo es et eu fa ff fi fj fo fr fy ga gd gl gn
    gu gv ha he hi ho hr ht hu hy hz ia id ie ig ii ik io is it iu ja jv ka kg ki kj
    kk kl km kn ko kr ks ku kv kw ky la lb lg li ln lo lt lu lv mg mh mi mk ml mn mr
    ms mt my na nb nd ne ng nl nn no nr nv ny oc oj om or os pa pi pl ps pt qu rm rn
    ro ru rw sa sc sd se sg si sk sl sm sn so sq sr ss st su sv sw ta te tg th ti tk
    tl tn to tr ts tt tw ty ug uk ur uz ve vi vo wa wo xh yi yo za zh zu""".split()
)

# ISO 639-3 codes seen in CC-100, CCMatrix, OPUS and Django's catalogs that have
# no two-letter code.
ISO_639_3_EXTRA = set(
    """ast azb ban bar bcl ceb ckb cdo dsb fil frr fur gom gsw hak haw hif hmn hsb
    ilo jbo kab kbd lij lmo mai min mwl mzn nap nds new nso pam pms pnb rue sah scn
    sco szl tcy udm vec war wuu yue zea""".split()
)

KNOWN_BASE_CODES = ISO_639_1 | ISO_639_3_EXTRA

_CODE_RE = re.compile(r"^(?P<base>[a-z]{2,3})(?:_(?P<sub>[A-Za-z]{3,4}))?$")


def check_language(code: str, *, where: str) -> str:
    """Return ``code`` if it is a language code xylent knows, else a user error."""
    m = _CODE_RE.fullmatch(code or "")  # not match(): "$" would accept a trailing newline
    if not m or m.group("base") not in KNOWN_BASE_CODES:
        raise XylentError(
            f"unknown language code {code!r}",
            where=where,
            fix="use an ISO 639-1 code (de, sw, zh) or ISO 639-3 where there is none "
            "(ast, ceb), optionally with a script suffix (zh_Hant, sr_Latn); see docs/stages/prepare.md",
        )
    return code


def parse_pair(pair: str, *, where: str) -> tuple[str, str]:
    """``"en-sw"`` -> ``("en", "sw")``, both checked."""
    parts = pair.split("-")
    if len(parts) != 2 or parts[0] == parts[1]:
        raise XylentError(
            f"malformed language pair {pair!r}",
            where=where,
            fix="write pairs as two different language codes joined by '-', e.g. en-sw",
        )
    return check_language(parts[0], where=where), check_language(parts[1], where=where)


def pair_name(a: str, b: str) -> str:
    """Canonical, alphabetically ordered pair name, as OPUS names its files."""
    x, y = sorted((a, b))
    return f"{x}-{y}"


# Django ships catalogs per *locale*; this table picks, for each xylent language
# code, the locale directory whose translations we use.  A language absent from
# the table uses the locale of the same name.  Where a language has several
# locales (pt / pt_BR, es / es_AR / es_MX ...), we pick the most complete one;
# regional variants are otherwise ignored.
DJANGO_LOCALES = {
    "pt": "pt_BR",
    "zh": "zh_Hans",
    "zh_Hant": "zh_Hant",
    "sr": "sr",
    "sr_Latn": "sr_Latn",
    "nb": "nb",
    "nn": "nn",
}

# CC-100 file names (``{name}.txt.xz``) where they differ from our code.
CC100_FILE_NAMES = {
    "zh": "zh-Hans",
    "zh_Hant": "zh-Hant",
    "nso": "ns",
}
