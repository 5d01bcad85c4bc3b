"""Files in the XTREME submission layout: ``<root>/<task>/test-<lang>.<suffix>``.

Readers parse them the way google-research/xtreme ``evaluate.py`` does (lines
stripped, tag sentences separated by blank lines, SQuAD-format gold JSON) and
turn every malformed input into a :class:`XylentError` naming file and line.
:func:`write_predictions` writes what those readers read back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from xylent.atomic import write_text_atomic
from xylent.errors import XylentError

# How each task's files are laid out; the suffix follows from it.
TASK_FORMATS = {
    "pawsx": "lines", "xnli": "lines", "tatoeba": "lines",
    "bucc2018": "pairs",
    "panx": "tags", "udpos": "tags",
    "xquad": "qa", "mlqa": "qa", "tydiqa": "qa",
    "mewslix": "ranking",
    "xcopa": "jsonl",
}
_SUFFIX = {"lines": "tsv", "pairs": "tsv", "tags": "tsv", "qa": "json", "ranking": "json", "jsonl": "jsonl"}


def task_format(task: str) -> str:
    if task not in TASK_FORMATS:
        raise XylentError(f"unknown XTREME task {task!r}", fix=f"use one of: {', '.join(TASK_FORMATS)}")
    return TASK_FORMATS[task]


def submission_file(root: str | os.PathLike, task: str, lang: str, fmt: str | None = None) -> Path:
    """``fmt``: the layout of a task that is not one of XTREME's (a fine-tuned task of the user's)."""
    return Path(root) / task / f"test-{lang}.{_SUFFIX[fmt or task_format(task)]}"


# -- readers -------------------------------------------------------------------

def _open_text(path: Path):
    try:
        return open(path, encoding="utf-8")
    except FileNotFoundError:
        raise XylentError(f"file not found: {path}", where=str(path),
                          fix="write the file or point at the right submission folder") from None


def _decode_guard(path: Path, read):
    try:
        return read()
    except UnicodeDecodeError as e:
        raise XylentError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})", where=str(path),
                          fix="re-encode the file as UTF-8") from None


def read_lines(path: Path) -> list[str]:
    """One stripped value per line; blank lines are kept as ''."""
    # Iterating the file (not str.splitlines) so only \n, \r\n and \r end a
    # line, as in the reference reader.
    with _open_text(path) as f:
        return _decode_guard(path, lambda: [line.strip() for line in f])


def read_tag_sentences(path: Path) -> tuple[list[list[str]], list[int]]:
    """Sentences of one-tag-per-line files, and the 1-based line each sentence starts on.

    Every blank line closes a sentence, so two blank lines in a row make an
    empty sentence: the reference counts it, and so must we to align files.
    """
    sentences: list[list[str]] = []
    starts: list[int] = []
    current: list[str] = []
    start = 1
    for number, line in enumerate(read_lines(path), start=1):
        if line:
            current.append(line)
        else:
            sentences.append(current)
            starts.append(start)
            current = []
            start = number + 1
    if current:
        sentences.append(current)
        starts.append(start)
    return sentences, starts


def read_json(path: Path) -> Any:
    with _open_text(path) as f:
        text = _decode_guard(path, f.read)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise XylentError(f"{path}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}",
                          where=f"{path}:{e.lineno}", fix="fix the JSON (or regenerate the file)") from None


def read_qa_gold(path: Path) -> list[Mapping]:
    """SQuAD-format articles, from ``{"data": [...]}`` or a bare list."""
    data = read_json(path)
    if isinstance(data, dict) and "data" in data:
        data = data["data"]
    if not isinstance(data, list):
        raise XylentError(f"{path}: QA gold must be SQuAD JSON ({{\"data\": [articles]}}), got {type(data).__name__}",
                          where=str(path), fix="point the labels folder at the SQuAD-format test files")
    return data


def read_mapping(path: Path, value_type: type) -> dict:
    """A JSON object whose values are all ``value_type`` (QA answers, Mewsli-X rankings)."""
    data = read_json(path)
    what = "string answers" if value_type is str else "lists of ids"
    if not isinstance(data, dict):
        raise XylentError(f"{path}: expected a JSON object of example id -> {what}, got {type(data).__name__}",
                          where=str(path), fix="write the file with write_predictions")
    for key, value in data.items():
        if not isinstance(value, value_type) or (value_type is list and not all(isinstance(v, str) for v in value)):
            raise XylentError(f"{path}: example {key!r} maps to {type(value).__name__}, expected {what}",
                              where=str(path), fix="write the file with write_predictions")
    return data


def read_jsonl_labels(path: Path) -> list:
    """The ``label`` field of each JSON line (XCOPA)."""
    labels = []
    for number, line in enumerate(read_lines(path), start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise XylentError(f"{path}: malformed JSON on line {number}: {e.msg}", where=f"{path}:{number}",
                              fix="write one JSON object per line, with no blank lines") from None
        if not isinstance(row, dict) or "label" not in row:
            raise XylentError(f"{path}: line {number} has no \"label\" field", where=f"{path}:{number}",
                              fix='write each line as {"label": ...}')
        labels.append(row["label"])
    return labels


# -- writer --------------------------------------------------------------------

def _line_safe(path: Path, value: Any, what: str) -> str:
    text = str(value)
    if "\n" in text or "\r" in text:
        raise XylentError(f"{what} {text!r} for {path} holds a line break and would shift every later line",
                          where=str(path), fix="remove line breaks from predictions")
    return text


def _render(path: Path, fmt: str, predictions: Any) -> str:
    if fmt == "qa":
        answers = {str(k): str(v) for k, v in dict(predictions).items()}
        return json.dumps(answers, ensure_ascii=False, indent=1) + "\n"
    if fmt == "ranking":
        rankings = {str(k): [str(e) for e in v] for k, v in dict(predictions).items()}
        return json.dumps(rankings, ensure_ascii=False) + "\n"
    if fmt == "jsonl":
        return "".join(json.dumps({"label": p}, ensure_ascii=False) + "\n" for p in predictions)
    if fmt == "pairs":
        rows = ("\t".join(p) if not isinstance(p, str) else p for p in predictions)
        return "".join(_line_safe(path, row, "pair") + "\n" for row in rows)
    if fmt == "tags":
        out = []
        for sentence in predictions:
            for tag in sentence:
                tag = _line_safe(path, tag, "tag").strip()
                if not tag:
                    raise XylentError(f"an empty tag for {path} would read back as a sentence break",
                                      where=str(path), fix="predict a tag (e.g. 'O') for every token")
                out.append(tag + "\n")
            out.append("\n")  # blank line closes the sentence, also an empty one
        return "".join(out)
    return "".join(_line_safe(path, p, "prediction") + "\n" for p in predictions)


def write_predictions(root: str | os.PathLike, task: str, lang: str, predictions: Iterable | Mapping,
                      fmt: str | None = None) -> Path:
    """Write ``<root>/<task>/test-<lang>.<suffix>`` atomically and return its path.

    ``predictions`` is, by task: labels (pawsx, xnli, tatoeba, xcopa), tag
    sentences (panx, udpos), ``(src_id, tgt_id)`` pairs or ``"src\\ttgt"``
    strings (bucc2018), ``{question id: answer}`` (xquad, mlqa, tydiqa) or
    ``{example id: [entity ids best first]}`` (mewslix).
    """
    fmt = fmt or task_format(task)
    path = submission_file(root, task, lang, fmt)
    text = _render(path, fmt, predictions)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)
    return path
