"""Vectorised text cleaning with Arrow compute (the hot loop of prepare).

Per segment: decode UTF-8 (invalid lines are counted and dropped), Unicode
normalisation (NFC by default), tabs/newlines to spaces, other control and
non-characters removed, surrounding whitespace trimmed, and a row with no visible
character left (spaces, zero-width and format characters, the braille and Hangul
blanks) emptied: it is a blank line, counted as one and never a sentence.
"""

from __future__ import annotations

import unicodedata

import numpy as np
import pyarrow as pa
import polars as pl
import pyarrow.compute as pc

from xylent.spec import PrepareConfig

# C0/C1 controls (tab, CR, LF handled separately), BOM and the two non-characters.
_CONTROL = r"[\x{00}-\x{08}\x{0B}\x{0C}\x{0E}-\x{1F}\x{7F}-\x{9F}\x{FEFF}\x{FFFE}\x{FFFF}]"
_ANY_CONTROL = r"[\x{00}-\x{1F}\x{7F}-\x{9F}\x{FEFF}\x{FFFE}\x{FFFF}]"
# a row of these only shows nothing: separators and spaces, format characters (zero-width, bidi marks, tags), the
# braille blank and the Hangul fillers
_INVISIBLE_ROW = r"^[\p{Z}\p{Cf}\x{2800}\x{3164}\x{115F}\x{1160}\x{FFA0}]+$"


def decode_lines(lines: list[bytes]) -> tuple[list[str | None], int]:
    """bytes lines -> str (None where the bytes are not UTF-8), and how many were invalid."""
    out: list[str | None] = []
    bad = 0
    for raw in lines:
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(None)
            bad += 1
    return out, bad


def _already_normalized(arr: pa.Array, form: str) -> bool:
    """Quick check of the whole block at once (CPython's is_normalized runs at
    hundreds of MB/s on already-normalised text, which web text nearly always is).
    A False here only sends the block down the slower exact path."""
    data = arr.buffers()[2]
    if data is None:
        return True
    try:
        return unicodedata.is_normalized(form, memoryview(data).tobytes().decode("utf-8"))
    except UnicodeDecodeError:
        return False


def _normalize(arr: pa.Array, form: str) -> pa.Array:
    # Arrow's utf8_normalize does not compose (e + U+0301 stays two code points,
    # pyarrow 25), so polars does it, and only on the rows that are not ASCII.
    if _already_normalized(arr, form):
        return arr
    nonascii = pc.invert(pc.string_is_ascii(arr))
    if not pc.any(nonascii).as_py():
        return arr
    sub = pl.from_arrow(arr.filter(nonascii)).str.normalize(form).to_arrow().cast(arr.type)
    return pc.replace_with_mask(arr, nonascii, sub)


def clean_array(arr: pa.Array, cfg: PrepareConfig) -> pa.Array:
    """Normalise and strip an Arrow string array (nulls stay null)."""
    arr = pc.utf8_trim_whitespace(arr)
    if cfg.strip_control:
        dirty = pc.match_substring_regex(arr, pattern=_ANY_CONTROL)
        if pc.any(dirty).as_py():  # rare: fix only those rows
            sub = pc.replace_substring_regex(arr.filter(dirty), pattern=r"[\t\n\r]", replacement=" ")
            sub = pc.replace_substring_regex(sub, pattern=_CONTROL, replacement="")
            arr = pc.utf8_trim_whitespace(pc.replace_with_mask(arr, dirty, sub))
    if cfg.normalization != "none":
        arr = _normalize(arr, cfg.normalization)
    invisible = pc.match_substring_regex(arr, pattern=_INVISIBLE_ROW)
    if pc.any(invisible).as_py():
        arr = pc.if_else(invisible, pa.scalar("", arr.type), arr)
    return arr


def length_mask(arr: pa.Array, cfg: PrepareConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Masks (keep, too_short, too_long) over a cleaned array; nulls are neither kept nor counted."""
    lengths = pc.utf8_length(arr).to_numpy(zero_copy_only=False)
    valid = ~np.asarray(pc.is_null(arr).to_numpy(zero_copy_only=False))
    lengths = np.where(valid, np.nan_to_num(lengths.astype(float)), 0)
    too_short = valid & (lengths < cfg.min_chars)
    too_long = valid & (lengths > cfg.max_chars)
    keep = valid & ~too_short & ~too_long
    return keep, too_short, too_long
