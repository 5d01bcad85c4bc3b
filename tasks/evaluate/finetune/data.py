"""The official file formats of the fine-tuned XTREME tasks, read strictly.

A task folder holds ``<split>-<lang>.<ext>`` files (split: train, dev, test,
translate-train), the layout XTREME's ``download_data.sh`` leaves for XNLI and
PAWS-X; SQuAD-format JSON and CoNLL-style files are named the same way
(``train-en.json`` = SQuAD v1.1's train file, ``test-de.json`` = XQuAD's
``xquad.de.json``, ``train-en.tsv`` = PAN-X's English train file).

- classification, ``xnli``/``pawsx``: ``text_a<TAB>text_b<TAB>label``, or the
  original files with a header (``sentence1``/``premise``, ``sentence2``/
  ``hypothesis``, ``label``/``gold_label``: columns found by name);
- classification, ``tsv``/``holdout``: ``label<TAB>text`` (the probe's layout);
- qa: SQuAD v1.1 JSON (``data[].paragraphs[].qas[]`` with ``id``, ``question``,
  ``answers[].text``/``answer_start``);
- tagging: one ``token<TAB>tag`` (or space separated; the last column is the
  tag) per line, a blank line between sentences; PAN-X's ``en:token`` prefix and
  ``-DOCSTART-`` lines are dropped.

Every malformed input raises :class:`XylentError` naming the file and line.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from xylent.errors import XylentError

EXTENSION = {"classification": "tsv", "qa": "json", "tagging": "tsv"}
_HEADER_A, _HEADER_B, _HEADER_LABEL = ("sentence1", "premise"), ("sentence2", "hypothesis"), ("label", "gold_label")


@dataclass
class Example:
    """One training or test example of any fine-tuned kind."""

    texts: tuple[str, ...] = ()       # classification: (text,) or (text_a, text_b)
    label: str | None = None          # classification
    tokens: list[str] = field(default_factory=list)   # tagging
    tags: list[str] = field(default_factory=list)     # tagging
    qid: str = ""                     # qa
    question: str = ""
    context: str = ""
    answers: list[tuple[str, int]] = field(default_factory=list)  # qa: (text, answer_start)


def split_file(root: Path, kind: str, split: str, lang: str) -> Path:
    return Path(root) / f"{split}-{lang}.{EXTENSION[kind]}"


def _lines(path: Path) -> list[tuple[int, str]]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise XylentError(f"file not found: {path}", where=str(path),
                          fix="add the file or drop that language/split from the task") from None
    out = []
    for no, line in enumerate(raw.split(b"\n"), 1):
        try:
            out.append((no, line.decode("utf-8").rstrip("\r")))
        except UnicodeDecodeError as exc:
            raise XylentError(f"not UTF-8 text: {exc.reason}", where=f"{path}:{no}",
                              fix="re-encode the file as UTF-8") from None
    return out


def read_classification(path: Path, fmt: str) -> list[Example]:
    """``fmt``: ``xnli``/``pawsx`` (sentence pairs) or ``tsv``/``holdout`` (label<TAB>text)."""
    lines = [(no, line) for no, line in _lines(path) if line.strip()]
    pair = fmt in ("xnli", "pawsx", "auto")
    cols = None
    if pair and lines:
        head = [c.strip().lower() for c in lines[0][1].split("\t")]
        if any(h in head for h in _HEADER_LABEL) and any(h in head for h in _HEADER_A):
            cols = tuple(next(head.index(h) for h in names if h in head)
                         for names in (_HEADER_A, _HEADER_B, _HEADER_LABEL))
            lines = lines[1:]
    out = []
    for no, line in lines:
        parts = line.split("\t")
        if cols is not None:
            if len(parts) <= max(cols):
                raise XylentError(f"a line with {len(parts)} columns, the header names {max(cols) + 1}",
                                  where=f"{path}:{no}", fix="fix or remove that line")
            a, b, label = (parts[c] for c in cols)
            out.append(Example(texts=(a, b), label=label.strip()))
        elif pair:
            if len(parts) != 3 or not all(p.strip() for p in parts):
                raise XylentError("a sentence-pair line must be 'text_a<TAB>text_b<TAB>label', all non-empty",
                                  where=f"{path}:{no}", fix="fix or remove that line (or say format: tsv for "
                                  "'label<TAB>text' files)")
            out.append(Example(texts=(parts[0], parts[1]), label=parts[2].strip()))
        else:
            if len(parts) != 2 or not all(p.strip() for p in parts):
                raise XylentError("a line must be 'label<TAB>text' with both non-empty", where=f"{path}:{no}",
                                  fix="fix or remove that line")
            out.append(Example(texts=(parts[1],), label=parts[0].strip()))
    if not out:
        raise XylentError("no examples in the file", where=str(path), fix="fill it or drop the language")
    return out


def read_tagging(path: Path, lang: str) -> list[Example]:
    out, tokens, tags = [], [], []
    prefix = f"{lang}:"
    for no, line in [*_lines(path), (0, "")]:
        if not line.strip():
            if tokens:
                out.append(Example(tokens=tokens, tags=tags))
            tokens, tags = [], []
            continue
        if line.startswith("-DOCSTART-"):
            continue
        parts = line.split("\t") if "\t" in line else line.split()
        if len(parts) < 2 or not parts[0].strip() or not parts[-1].strip():
            raise XylentError("a tagging line must be 'token<TAB>tag' (a blank line ends a sentence)",
                              where=f"{path}:{no}", fix="fix or remove that line")
        token = parts[0].strip()
        tokens.append(token[len(prefix):] if token.startswith(prefix) and len(token) > len(prefix) else token)
        tags.append(parts[-1].strip())
    if not out:
        raise XylentError("no sentences in the file", where=str(path), fix="fill it or drop the language")
    return out


def read_squad(path: Path) -> list[Example]:
    lines = _lines(path)  # for the UTF-8 check and the missing-file message
    try:
        doc = json.loads("\n".join(line for _, line in lines))
    except json.JSONDecodeError as exc:
        raise XylentError(f"not valid JSON: {exc.msg}", where=f"{path}:{exc.lineno}",
                          fix="the file must be SQuAD v1.1 JSON ({'data': [{'paragraphs': [...]}]})") from None
    out, seen = [], set()
    try:
        for article in doc["data"]:
            for para in article["paragraphs"]:
                context = para["context"]
                for qa in para["qas"]:
                    qid = str(qa["id"])
                    if qid in seen:
                        raise XylentError(f"question id {qid!r} appears twice", where=str(path),
                                          fix="give every question a unique id (predictions are keyed by it)")
                    seen.add(qid)
                    answers = [(a["text"], int(a["answer_start"])) for a in qa.get("answers", [])]
                    out.append(Example(qid=qid, question=qa["question"], context=context, answers=answers))
    except (KeyError, TypeError, ValueError) as exc:
        raise XylentError(f"not SQuAD v1.1 format ({type(exc).__name__}: {exc})", where=str(path),
                          fix="each paragraph needs 'context' and 'qas'; each question 'id', 'question' and "
                          "'answers' with 'text' and 'answer_start'") from None
    if not out:
        raise XylentError("no questions in the file", where=str(path), fix="fill it or drop the language")
    return out


def read_examples(root: Path, kind: str, fmt: str, split: str, lang: str) -> list[Example]:
    path = split_file(root, kind, split, lang)
    if kind == "qa":
        return read_squad(path)
    if kind == "tagging":
        return read_tagging(path, lang)
    return read_classification(path, fmt)


def carve_dev(examples: list[Example], fraction: float) -> tuple[list[Example], list[Example]]:
    """(train, dev): a fixed share of the examples, chosen by a hash of their
    content (the same split on every run and machine, whatever the file order)."""
    def key(e: Example) -> int:
        text = "\x1f".join([*e.texts, *e.tokens, e.qid, e.question])
        return zlib.crc32(text.encode("utf-8")) % 10_000
    dev = [e for e in examples if key(e) < fraction * 10_000]
    train = [e for e in examples if key(e) >= fraction * 10_000]
    if not dev or not train:
        raise XylentError(f"{len(examples)} training examples are too few to hold out a dev set",
                          where="evaluate.tasks[].finetune.dev_fraction",
                          fix="add a dev-<train_language> file or more training examples")
    return train, dev
