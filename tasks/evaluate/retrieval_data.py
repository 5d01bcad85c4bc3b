"""Readers for the two XTREME retrieval tasks evaluated without fine-tuning:
Tatoeba (LASER's test set) and BUCC 2018 (the shared task's files).

Lines are split the way the reference's Python readers split them (universal
newlines: ``\\n``, ``\\r\\n`` and ``\\r`` end a line) and stripped, as
XTREME's ``l.strip()`` does.  Blank lines are kept: XTREME embeds every line,
so dropping one would shift every later pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from xylent.errors import XylentError

# LASER's Tatoeba test set (facebookresearch/LASER data/tatoeba/v1): the ISO 639-3 code of
# each of its 112 languages, as its files name them (tatoeba.<code>-eng.<code>).
LASER_TATOEBA = tuple("""
afr amh ang ara arq arz ast awa aze bel ben ber bos bre bul cat cbk ceb ces cha cmn cor csb
cym dan deu dsb dtp ell epo est eus fao fin fra fry gla gle glg gsw heb hin hrv hsb hun hye
ido ile ina ind isl ita jav jpn kab kat kaz khm kor kur kzj lat lfn lit lvs mal mar max mhr
mkd mon nds nld nno nob nov oci orv pam pes pms pol por ron rus slk slv spa sqi srp swe swg
swh tam tat tel tgl tha tuk tur tzl uig ukr urd uzb vie war wuu xho yid yue zsm""".split())


def _tag(code: str) -> str | None:
    """The shortest standard tag of a language code (BCP 47 via langcodes, which
    ships CLDR's tables): "cat" and "ca" -> "ca"; an individual language CLDR
    treats as its macrolanguage's default -> the macrolanguage ("cmn" -> "zh",
    "pes" -> "fa", "swh" -> "sw").  None: not a language code."""
    import langcodes

    try:
        return langcodes.Language.get(code).prefer_macrolanguage().to_tag()
    except ValueError:  # langcodes' LanguageTagError
        return None


@lru_cache(maxsize=1)
def _laser_by_tag() -> dict[str, str]:
    out: dict[str, str] = {}
    for code in LASER_TATOEBA:  # kzj is a deprecated spelling of dtp: both files exist, dtp's wins the tag
        out.setdefault(_tag(code), code)
    return out


def tatoeba_code(lang: str) -> str:
    """LASER's file code of ``lang`` (any ISO 639-1/-3 or BCP 47 spelling: "ca", "cat",
    "zh", "cmn"), or ``lang`` itself when LASER has no such language."""
    if lang in LASER_TATOEBA:
        return lang
    return _laser_by_tag().get(_tag(lang) or "", lang)


BUCC_LANGS = ("de", "fr", "ru", "zh")
# XTREME renames the shared task's `sample` split to `dev` and `training` to
# `test` (scripts/download_data.sh, download_bucc18); both namings are accepted.
BUCC_TUNE_SPLITS = ("dev", "sample")
BUCC_TEST_SPLITS = ("test", "training")


def read_lines(path: Path, strip: bool = True) -> list[str]:
    """The lines of a UTF-8 file, stripped unless ``strip`` is False (then only
    the line ends go); undecodable bytes are reported by line."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise XylentError(f"{path.name} is not UTF-8 text ({e.reason}) at line {line}",
                          where=f"{path}:{line}", fix="re-encode the file as UTF-8 or fetch it again") from None
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line opens no new one
    return [line.strip() for line in lines] if strip else lines


# -- Tatoeba -------------------------------------------------------------------

def tatoeba_files(data_dir: Path, lang: str) -> list[tuple[Path, Path]]:
    """The (xx, en) file pairs ``read_tatoeba`` looks for, raw layout first."""
    iso3 = tatoeba_code(lang)
    return [(data_dir / f"tatoeba.{iso3}-eng.{iso3}", data_dir / f"tatoeba.{iso3}-eng.eng"),
            (data_dir / f"{lang}-en.{lang}", data_dir / f"{lang}-en.en")]


def read_tatoeba(data_dir: Path, lang: str, labels: Path | None = None) -> tuple[list[str], list[str]]:
    """Line-aligned (xx sentences, en sentences) of one Tatoeba language.

    Two layouts are recognised in ``data_dir``:

    - LASER's raw files, ``tatoeba.<iso3>-eng.<iso3>`` and ``tatoeba.<iso3>-eng.eng``
      (``lang`` mapped by :func:`tatoeba_code`, which knows all 112 of LASER's
      languages; a code outside them is used as is): line i of each file is a pair.
    - XTREME's preprocessed files, ``<xx>-en.<xx>`` and ``<xx>-en.en``.  XTREME's
      preprocessing sorts the English side to hide the answers, so these are
      only usable with ``labels``: XTREME's gold file, one line per xx sentence
      holding the index of its translation in ``<xx>-en.en``.  The English side
      is returned reordered so that it is line-aligned again.

    Duplicate sentences are kept (gold is a line index, not a text).
    """
    candidates = tatoeba_files(data_dir, lang)
    found = next(((xx, en) for xx, en in candidates if xx.is_file() and en.is_file()), None)
    if found is None:
        looked = ", ".join(f"{xx.name} + {en.name}" for xx, en in candidates)
        present = [p.name for pair in candidates for p in pair if p.is_file()]
        if present:
            looked += f"; only {', '.join(present)} is there"
        raise XylentError(f"no Tatoeba files for language {lang!r} in {data_dir} (looked for {looked})",
                          where=str(data_dir),
                          fix="download Tatoeba (LASER's data/tatoeba/v1) into this folder, or check the language code")
    xx_path, en_path = found
    xx, en = read_lines(xx_path), read_lines(en_path)
    if len(xx) != len(en):
        raise XylentError(f"Tatoeba files differ in length: {xx_path.name} has {len(xx)} lines, "
                          f"{en_path.name} has {len(en)}", where=str(data_dir),
                          fix="line i of each file must be a translation pair; fetch the files again")
    if not xx:
        raise XylentError(f"Tatoeba files for {lang!r} are empty: {xx_path.name}, {en_path.name}",
                          where=str(data_dir), fix="fetch the files again")
    if xx_path.name.startswith("tatoeba."):
        return xx, en
    if labels is None:
        raise XylentError(f"{en_path.name} is in XTREME's preprocessed layout, whose English side is sorted "
                          f"and no longer aligned with {xx_path.name}", where=str(en_path),
                          fix=f"pass XTREME's gold labels for {lang} (test-{lang}.tsv), or use LASER's raw files "
                              f"tatoeba.{tatoeba_code(lang)}-eng.*")
    return xx, _align(en, read_lines(labels), labels)


def _align(en: list[str], gold: list[str], path: Path) -> list[str]:
    if len(gold) != len(en):
        raise XylentError(f"{path.name} has {len(gold)} labels for {len(en)} sentences", where=str(path),
                          fix="use the gold file of the same language and Tatoeba version")
    order = []
    for line_no, value in enumerate(gold, 1):
        try:
            order.append(int(value))
        except ValueError:
            raise XylentError(f"{path.name}: label {value!r} is not a line index", where=f"{path}:{line_no}",
                              fix="each line must hold the 0-based index of the English translation") from None
    # A permutation keeps the English side the same set, so search over it
    # ranks exactly what search over the file would.
    if sorted(order) != list(range(len(en))):
        raise XylentError(f"{path.name} is not a permutation of 0..{len(en) - 1}", where=str(path),
                          fix="use the gold file of the same language and Tatoeba version")
    return [en[i] for i in order]


# -- BUCC 2018 -----------------------------------------------------------------

@dataclass(frozen=True)
class BuccSplit:
    """One split of one BUCC language pair; ``gold`` is None where the split has
    no gold file (XTREME deletes the test gold)."""

    split: str
    src_ids: list[str]
    src_texts: list[str]
    tgt_ids: list[str]
    tgt_texts: list[str]
    gold: set[tuple[str, str]] | None


def bucc_dir(data_dir: Path, lang: str) -> Path:
    """``data_dir`` itself (XTREME's flat layout) or ``data_dir/<xx>-en`` (the archives' layout)."""
    nested = data_dir / f"{lang}-en"
    return nested if not any(data_dir.glob(f"{lang}-en.*.{lang}")) and nested.is_dir() else data_dir


def find_bucc_split(data_dir: Path, lang: str, names: tuple[str, ...]) -> str:
    """The first of ``names`` whose sentence files exist for ``lang``."""
    folder = bucc_dir(data_dir, lang)
    for name in names:
        if (folder / f"{lang}-en.{name}.{lang}").is_file() and (folder / f"{lang}-en.{name}.en").is_file():
            return name
    looked = ", ".join(f"{lang}-en.{n}.{lang} + {lang}-en.{n}.en" for n in names)
    raise XylentError(f"no BUCC 2018 files for {lang}-en in {folder} (looked for {looked})", where=str(folder),
                      fix="download BUCC 2018 (XTREME's scripts/download_data.sh, download_bucc18) into this folder")


def read_bucc(data_dir: Path, lang: str, split: str) -> BuccSplit:
    """Sentences (``<id>\\t<sentence>`` lines) and, if present, the gold pairs
    (``<xx-id>\\t<en-id>`` lines) of ``<xx>-en.<split>.*``."""
    folder = bucc_dir(data_dir, lang)
    src_ids, src_texts = _read_sentences(folder / f"{lang}-en.{split}.{lang}")
    tgt_ids, tgt_texts = _read_sentences(folder / f"{lang}-en.{split}.en")
    gold_path = folder / f"{lang}-en.{split}.gold"
    gold = _read_gold(gold_path, set(src_ids), set(tgt_ids)) if gold_path.is_file() else None
    return BuccSplit(split, src_ids, src_texts, tgt_ids, tgt_texts, gold)


def _read_sentences(path: Path) -> tuple[list[str], list[str]]:
    if not path.is_file():
        raise XylentError(f"BUCC file not found: {path.name} in {path.parent}", where=str(path),
                          fix="download BUCC 2018 again; each split needs its .<xx> and .en files")
    ids, texts, first_seen = [], [], {}
    # Unstripped, so that "<id>\t" (an empty sentence) keeps its tab.
    for line_no, line in enumerate(read_lines(path, strip=False), 1):
        sid, tab, text = line.partition("\t")
        sid = sid.strip()
        if not tab or not sid:
            raise XylentError(f"{path.name} line {line_no} is not '<id>\\t<sentence>': {line[:80]!r}",
                              where=f"{path}:{line_no}", fix="repair or re-download the file")
        if sid in first_seen:
            raise XylentError(f"{path.name} line {line_no} repeats id {sid!r} of line {first_seen[sid]}",
                              where=f"{path}:{line_no}", fix="ids must be unique; re-download the file")
        first_seen[sid] = line_no
        ids.append(sid)
        texts.append(text.strip())
    if not ids:
        raise XylentError(f"{path.name} holds no sentences", where=str(path), fix="re-download the file")
    return ids, texts


def _read_gold(path: Path, src_ids: set[str], tgt_ids: set[str]) -> set[tuple[str, str]]:
    gold = set()
    for line_no, line in enumerate(read_lines(path), 1):
        parts = line.split("\t")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise XylentError(f"{path.name} line {line_no} is not '<xx-id>\\t<en-id>': {line[:80]!r}",
                              where=f"{path}:{line_no}", fix="repair or re-download the gold file")
        src, tgt = (p.strip() for p in parts)
        unknown = src if src not in src_ids else tgt if tgt not in tgt_ids else None
        if unknown is not None:
            raise XylentError(f"{path.name} line {line_no} names id {unknown!r}, which is in no sentence file "
                              "of this split", where=f"{path}:{line_no}",
                              fix="the gold file must belong to the same split and language")
        gold.add((src, tgt))
    if not gold:
        raise XylentError(f"{path.name} holds no gold pairs", where=str(path), fix="re-download the gold file")
    return gold
