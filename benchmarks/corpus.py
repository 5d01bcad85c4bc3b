"""A generated corpus in the layouts XY-LENT's data comes in, written as a stream at any size.

CC-100 layout (`cc100/<lang>.txt.xz`: a paragraph per line, a blank line after each
document) over ten languages of eight scripts whose sizes follow a Zipf law (the k-th
language holds k^-1.2 of the monolingual text, as CC-100's sizes fall off), and OPUS
layout (`opus/Bench/v1/moses/<pair>.txt.zip`, two line-aligned members) for every pair
of them, a pair's size following the product of its languages' shares. Words are drawn
from a Zipf vocabulary per script; 4 % of lines are boilerplate repeated across
documents, 3 % of documents repeat the one before with a word added, 1 % of bitext rows
repeat the row before: the duplicates dedup exists for.

Nothing is held whole: text is made in blocks of about 8 MB (vectorised: a block's words
are gathered from one byte array) and piped to `xz` or into the zip member, so the
generator's memory does not follow the corpus. Deterministic for a seed, byte for byte
(zip members carry a fixed date): a block's random numbers come from (seed, language or
pair, stream, block number), one stream each for the vocabulary, the blocks and the
boilerplate pool.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import zipfile
from itertools import combinations
from pathlib import Path

import numpy as np

# language -> (letters, words separated by spaces); the order is the Zipf rank of its size
SCRIPTS = {
    "en": ("etaoinshrdlcumwfgypbvkjxqz", True),
    "de": ("enisratdhulcgmobwfkzpvjyxqäöüß", True),
    "ru": ("оеаинтсрвлкмдпуяызьбгчйхжшюцщэфъё", True),
    "zh": ("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可里后"
           + "".join(map(chr, range(0x4E00, 0x4E00 + 3000))), False),
    "ar": ("اليمونرتبهعدسفكقحجشطصزخضذثظغ", True),
    "hi": ("कखगघचछजझटठडढणतथदधनपफबभमयरलवशसहािीुूेैोौं", True),
    "tr": ("aeinrlıkdmyustbozüşgçhğvcöpfj", True),
    "el": ("αοεινταςρπμκλυηδγωθφχβξζψ", True),
    "ko": ("".join(map(chr, range(0xAC00, 0xAC00 + 800))), True),
    "th": ("กขคงจชซญดตถทธนบปผพฟมยรลวศสหอฮะาิีึืุูเแโใไ่้๊๋", False),
}
MONO_FILE = "cc100/{lang}.txt.xz"  # the layouts, relative to the corpus folder (scaling.py serves them)
MOSES_FILE = "opus/{corpus}/{version}/moses/{pair}.txt.zip"
OPUS_CORPUS, OPUS_VERSION = "Bench", "v1"
ZIP_DATE = (2020, 1, 1, 0, 0, 0)  # every member's timestamp: the same bytes on every run
ZIPF_EXPONENT = 1.2  # of the languages' sizes: the largest ~40 % of the monolingual text
BLOCK_BYTES = 8_000_000
BLOCK_ROWS = 100_000  # bitext rows per block
VOCAB, BLOCKS, POOL = 0, 1, 2  # random streams: numpy pads a short seed list with zeros, so each is tagged
DOC_BREAK = 0.3  # a document ends after a line with this probability (geometric, mean 3.3 lines)


def language_shares(langs: list[str] | None = None) -> dict[str, float]:
    langs = langs or list(SCRIPTS)
    w = np.arange(1, len(langs) + 1, dtype=float) ** -ZIPF_EXPONENT
    return dict(zip(langs, (w / w.sum()).tolist()))


def pair_shares(langs: list[str] | None = None) -> dict[str, float]:
    share = language_shares(langs)
    raw = {"-".join(sorted(p)): share[p[0]] * share[p[1]] for p in combinations(share, 2)}
    total = sum(raw.values())
    return {p: v / total for p, v in sorted(raw.items())}


class Vocabulary:
    """A Zipf word list over one script, as one byte array: a block of lines is a gather."""

    def __init__(self, lang: str, seed: int, words: int = 20_000):
        letters, self.spaced = SCRIPTS[lang]
        rng = np.random.default_rng([seed, _code(lang), VOCAB])
        freq = 1.0 / np.arange(1, len(letters) + 1)
        lengths = rng.integers(1, 10, words) if self.spaced else rng.integers(1, 4, words)
        chars = rng.choice(list(letters), size=int(lengths.sum()), p=freq / freq.sum())
        cuts = np.cumsum(lengths)[:-1]
        self.words = ["".join(w).encode() for w in np.split(chars, cuts)]
        zipf = 1.0 / np.arange(1, words + 1) ** 1.05
        self.cdf = np.cumsum(zipf) / zipf.sum()
        # every word carries its separator; the last token ends a line (a sentence mark first where
        # words run together, as Chinese and Thai are written)
        tokens = [w + b" " for w in self.words] if self.spaced else list(self.words)
        tokens.append(b"\n" if self.spaced else "。".encode() + b"\n")
        self.end = len(tokens) - 1
        self.lens = np.array([len(t) for t in tokens], np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lens)[:-1]])
        self.blob = np.frombuffer(b"".join(tokens), np.uint8)

    def lines(self, rng: np.random.Generator, words_per_line: np.ndarray) -> bytes:
        """One line per entry of ``words_per_line`` (each >= 1), every line ending in a newline."""
        n = int(words_per_line.sum())
        ids = np.searchsorted(self.cdf, rng.random(n)).clip(max=self.end - 1)
        ids = np.insert(ids, np.cumsum(words_per_line), self.end)
        lens = self.lens[ids]
        total = int(lens.sum())
        out = self.blob[np.repeat(self.starts[ids] - (np.cumsum(lens) - lens), lens) + np.arange(total)]
        if self.spaced:  # the separator of each line's last word
            keep = np.ones(total, bool)
            keep[np.flatnonzero(out == 10) - 1] = False
            out = out[keep]
        return out.tobytes()


def _code(name: str) -> int:
    return int.from_bytes(name.encode(), "little")


def mono_blocks(vocab: Vocabulary, target: int, seed: int, lang: str):
    """CC-100 layout, about ``target`` bytes, in blocks of about BLOCK_BYTES."""
    pool = vocab.lines(np.random.default_rng([seed, _code(lang), POOL]), np.full(200, 8)).splitlines()
    made, block, prev, line_bytes = 0, 0, None, 150.0
    while made < target:
        rng = np.random.default_rng([seed, _code(lang), BLOCKS, block])
        want = min(BLOCK_BYTES, target - made)
        lines = vocab.lines(rng, rng.integers(6, 50, max(1, int(want / line_bytes)))).splitlines()
        line_bytes = max(1.0, sum(map(len, lines)) / len(lines))  # this script's, for the next block
        for i, j in zip(np.flatnonzero(rng.random(len(lines)) < 0.04).tolist(),
                        rng.integers(0, len(pool), len(lines)).tolist()):
            lines[i] = pool[j]
        ends = np.flatnonzero(rng.random(len(lines)) < DOC_BREAK).tolist() + [len(lines) - 1]
        near = rng.random(len(ends)) < 0.03
        extra = rng.integers(0, len(vocab.words), len(ends)).tolist()
        docs, start = [], 0
        for k, end in enumerate(ends):
            if end < start:
                continue
            doc = lines[start:end + 1]
            start = end + 1
            if prev is not None and near[k]:
                doc = [prev[0] + b" " * vocab.spaced + vocab.words[extra[k]], *prev[1:]]
            prev = doc
            docs.append(b"\n".join(doc) + b"\n\n")
            want -= len(docs[-1])
            if want <= 0:  # the target reached: the corpus ends with a whole document
                break
        text = b"".join(docs)
        made += len(text)
        block += 1
        yield text


def bitext_blocks(src: Vocabulary, tgt: Vocabulary, rows: int, seed: int, pair: str):
    """(source lines, target lines) blocks, ``rows`` rows in all; 1 % of rows repeat the one before."""
    done, block = 0, 0
    while done < rows:
        rng = np.random.default_rng([seed, _code(pair), BLOCKS, block])
        n = min(BLOCK_ROWS, rows - done)
        words = rng.integers(3, 17, n)
        x = src.lines(rng, words).splitlines()
        y = tgt.lines(rng, np.maximum(2, np.round(words * rng.uniform(0.8, 1.25, n))).astype(int)).splitlines()
        for i in np.flatnonzero(rng.random(n) < 0.01).tolist():
            if i:
                x[i], y[i] = x[i - 1], y[i - 1]
        done += n
        block += 1
        yield b"\n".join(x) + b"\n", b"\n".join(y) + b"\n"


def write_xz(path: Path, blocks) -> dict:
    """Pipe ``blocks`` through `xz -0` (two threads) into ``path``; returns bytes and lines of text."""
    size = lines = 0
    with open(path, "wb") as f:
        proc = subprocess.Popen(["xz", "-0", "-T2", "-c"], stdin=subprocess.PIPE, stdout=f)
        try:
            for b in blocks:
                proc.stdin.write(b)
                size += len(b)
                lines += b.count(b"\n")
        finally:
            proc.stdin.close()
            if proc.wait() != 0:
                raise RuntimeError(f"xz exited {proc.returncode} writing {path}")
    return {"text_bytes": size, "lines": lines, "file_bytes": path.stat().st_size}


def write_moses_zip(path: Path, pair: str, blocks) -> dict:
    """Both members of an OPUS moses zip from (source, target) blocks: the source member
    streams into the zip, the target's text waits in a scratch file beside it (a zip
    writes one member at a time)."""
    a, b = pair.split("-")
    size = rows = 0
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tgt") as scratch:
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1, allowZip64=True) as zf:
            with zf.open(_member(pair, a), "w", force_zip64=True) as out:
                for x, y in blocks:
                    out.write(x)
                    scratch.write(y)
                    size += len(x) + len(y)
                    rows += x.count(b"\n")
            scratch.flush()
            scratch.seek(0)
            with zf.open(_member(pair, b), "w", force_zip64=True) as out:
                shutil.copyfileobj(scratch, out, 8 << 20)
    return {"text_bytes": size, "lines": rows, "file_bytes": path.stat().st_size}


def _member(pair: str, lang: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(f"{OPUS_CORPUS}.{pair}.{lang}", date_time=ZIP_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    try:  # level 1, as the zip's: Python 3.13 names it compress_level, 3.11 _compresslevel
        info.compress_level = 1
    except AttributeError:
        info._compresslevel = 1
    return info


def make_corpus(folder: Path, mono_mb: float, pairs_m: float, *, langs: list[str] | None = None,
                seed: int = 0) -> dict:
    """``mono_mb`` MB of CC-100-layout text and ``pairs_m`` million bitext rows under ``folder``
    (MONO_FILE, MOSES_FILE); returns what was written."""
    langs = langs or list(SCRIPTS)
    vocab = {lang: Vocabulary(lang, seed) for lang in langs}
    files = {}
    for lang, share in language_shares(langs).items():
        path = folder / MONO_FILE.format(lang=lang)
        path.parent.mkdir(parents=True, exist_ok=True)
        files[lang] = write_xz(path, mono_blocks(vocab[lang], int(mono_mb * 1e6 * share), seed, lang))
    for pair, share in pair_shares(langs).items():
        a, b = pair.split("-")
        rows = max(1, round(pairs_m * 1e6 * share))
        path = folder / MOSES_FILE.format(corpus=OPUS_CORPUS, version=OPUS_VERSION, pair=pair)
        path.parent.mkdir(parents=True, exist_ok=True)
        files[pair] = write_moses_zip(path, pair, bitext_blocks(vocab[a], vocab[b], rows, seed, pair))
    mono = [f for name, f in files.items() if "-" not in name]
    bitext = [f for name, f in files.items() if "-" in name]
    return {"text_mb": round(sum(f["text_bytes"] for f in files.values()) / 1e6, 3),
            "mono_mb": round(sum(f["text_bytes"] for f in mono) / 1e6, 3),
            "bitext_pairs": sum(f["lines"] for f in bitext),
            "file_mb": round(sum(f["file_bytes"] for f in files.values()) / 1e6, 3), "files": files}
