"""What the prepare flow calls: one *unit* per downloaded file (a gettext source's catalogs form one unit,
since its pairs need all languages at once), written and published on its own, so editing one source
recomputes only that source; then :func:`assemble` (assemble.py) links the units into the stage's output.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from itertools import combinations
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from xylent.errors import XylentError
from xylent.spec import PrepareConfig
from xylent.workspace import Workspace, check_files, fingerprint

from xylent.tasks import versions
from xylent.tasks.prepare.assemble import assemble, source_options  # the flow's first and last steps; their home
from xylent.tasks.prepare.clean import clean_array, decode_lines, length_mask
from xylent.tasks.prepare.gettext import read_catalog
from xylent.tasks.prepare.holdout import drop_reserved
from xylent.tasks.prepare.contract import BITEXT, MONO, partition
from xylent.tasks.prepare.readers import iter_line_blocks, iter_moses_pairs, line_cap, lines_to_array
from xylent.tasks.prepare.writer import BITEXT_SCHEMA, MONO_SCHEMA, PartWriter

__all__ = ["VERSION", "assemble", "group_units", "prepare_unit", "source_options", "unit_fingerprint"]

# the stage's code version (its fingerprint and every unit's), kept in tasks/versions.py
VERSION = versions.PREPARE

STAT_FIELDS = ["lines_in", "invalid_utf8", "blank", "malformed", "too_short", "too_long", "rows_out", "chars_out", "docs"]


def group_units(records: list[dict]) -> list[list[dict]]:
    """Download records -> prepare units (a gettext source's catalogs go together)."""
    units: dict[str, list[dict]] = {}
    for rec in records:
        key = f"{rec['source']}#catalogs" if rec["format"] == "gettext" else f"{rec['source']}#{rec['filename']}"
        units.setdefault(key, []).append(rec)
    return list(units.values())


def unit_key(records: list[dict]) -> str:
    rec = records[0]
    what = "catalogs" if rec["format"] == "gettext" else (rec.get("lang") or rec.get("pair"))
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{rec['source']}.{what}")


def unit_fingerprint(records: list[dict], cfg: PrepareConfig, source_cfg: dict) -> str:
    inputs = sorted(
        (r["unit"], r["sha256"], r.get("lang"), r.get("pair"), r.get("catalog"), r["format"], r["truncated"])
        for r in records
    )
    return fingerprint(
        {
            "stage": "prepare",
            "version": VERSION,
            "inputs": inputs,
            "prepare": cfg.model_dump(mode="json"),
            "source": source_cfg,
        }
    )


def _input_path(ws: Workspace, rec: dict) -> Path:
    if rec.get("file"):
        return ws.ensure_local(ws.unit_dir("download", rec["unit"])) / rec["file"]
    path = Path(rec["path"])
    try:
        st = path.stat()
    except FileNotFoundError:
        raise XylentError("input file disappeared since the download stage", where=str(path),
                          fix="restore it, or rerun with --force download") from None
    if st.st_size != rec["bytes"] or st.st_mtime_ns != rec.get("mtime_ns", st.st_mtime_ns):
        raise XylentError("input file changed since the download stage recorded it", where=str(path),
                          fix="rerun: the changed file gets a new fingerprint and is prepared again")
    return path


class _Stats:
    def __init__(self, source: str, kind: str, name: str):
        self.row = {"source": source, "kind": kind, "name": name, **{f: 0 for f in STAT_FIELDS}}

    def add(self, **kw: int) -> None:
        for k, v in kw.items():
            self.row[k] += int(v)


def _doc_ids(prefix: str, idx: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise(prefix, pc.cast(pa.array(idx), pa.string()), "")


def _prepare_text(path: Path, rec: dict, out: Path, cfg: PrepareConfig, max_lines: int | None,
                  key: str, on_bytes: Callable[[int], None]) -> list[dict]:
    lang = rec["lang"]
    st = _Stats(rec["source"], "mono", lang)
    writer = PartWriter(out, partition(MONO, lang), key, MONO_SCHEMA, cfg.part_rows)
    doc_base, last_doc, seen = 0, -1, 0
    for block in iter_line_blocks(path, rec["format"], where=str(path), prefix_only=rec["truncated"],
                                  max_line_bytes=line_cap(cfg.max_chars)):
        on_bytes(len(block) + 1)
        arr = lines_to_array(block)
        if arr is None:  # invalid UTF-8 somewhere in this block: find the bad lines
            strs, bad = decode_lines(block.split(b"\n"))
            arr = pa.array(strs, pa.large_string())
            st.add(invalid_utf8=bad)
        if max_lines is not None:
            arr = arr.slice(0, max(0, max_lines - seen))
        seen += len(arr)
        st.add(lines_in=len(arr))
        cleaned = clean_array(arr, cfg)
        keep, too_short, too_long = length_mask(cleaned, cfg)
        lengths = pc.utf8_length(cleaned).to_numpy(zero_copy_only=False)
        valid = ~pc.is_null(cleaned).to_numpy(zero_copy_only=False)
        blank = valid & (np.nan_to_num(lengths.astype(float)) == 0)
        docs = doc_base + np.cumsum(blank)  # a blank line starts the next document
        doc_base = int(docs[-1]) if len(docs) else doc_base
        too_short &= ~blank
        keep &= ~blank
        kept_docs = docs[keep]
        if len(kept_docs):
            st.add(docs=len(np.unique(kept_docs)) - (1 if kept_docs[0] == last_doc else 0))
            last_doc = int(kept_docs[-1])
        text = cleaned.filter(pa.array(keep))
        st.add(blank=blank.sum(), too_short=too_short.sum(), too_long=too_long.sum(), rows_out=len(text),
               chars_out=pc.sum(pc.utf8_length(text)).as_py() or 0)
        if len(text):
            writer.write(_mono_rows(key, kept_docs, text, rec["source"]))
        if max_lines is not None and seen >= max_lines:
            break
    writer.close()
    return [st.row]


def _mono_rows(key: str, ids: np.ndarray, text: pa.Array, source: str) -> pa.Table:
    """Monolingual rows of one unit: their doc ids (``<unit key>:<n>``), text and source."""
    return pa.table({"doc_id": _doc_ids(f"{key}:", ids), "text": text,
                     "source": pa.array([source] * len(text), pa.string())})


class _PairWriter:
    """Cleans, filters and writes one bitext partition in canonical (alphabetical) order."""

    def __init__(self, out: Path, source: str, a: str, b: str, key: str, cfg: PrepareConfig):
        self.cfg = cfg
        self.source = source
        self.swap = a > b
        self.a, self.b = (b, a) if self.swap else (a, b)
        self.st = _Stats(source, "bitext", f"{self.a}-{self.b}")
        self.writer = PartWriter(out, partition(BITEXT, f"{self.a}-{self.b}"), key, BITEXT_SCHEMA, cfg.part_rows)

    def write(self, src: pa.Array, tgt: pa.Array) -> None:
        if self.swap:
            src, tgt = tgt, src
        cs, ct = clean_array(src, self.cfg), clean_array(tgt, self.cfg)
        ks, ss, ls = length_mask(cs, self.cfg)
        kt, st, lt = length_mask(ct, self.cfg)
        invalid = pc.is_null(cs).to_numpy(zero_copy_only=False) | pc.is_null(ct).to_numpy(zero_copy_only=False)
        keep = ks & kt
        too_long = (ls | lt) & ~invalid
        too_short = (ss | st) & ~invalid & ~too_long
        mask = pa.array(keep)
        s_out, t_out = cs.filter(mask), ct.filter(mask)
        self.st.add(lines_in=len(src), too_short=too_short.sum(), too_long=too_long.sum(), rows_out=len(s_out),
                    chars_out=(pc.sum(pc.utf8_length(s_out)).as_py() or 0) + (pc.sum(pc.utf8_length(t_out)).as_py() or 0))
        if len(s_out):
            n = len(s_out)
            self.writer.write(pa.table({
                "src": s_out, "tgt": t_out,
                "src_lang": pa.array([self.a] * n, pa.string()), "tgt_lang": pa.array([self.b] * n, pa.string()),
                "source": pa.array([self.source] * n, pa.string()),
            }))

    def close(self) -> dict:
        self.writer.close()
        return self.st.row


def _decoded(lines: list[bytes]) -> pa.Array:
    strs, _ = decode_lines(lines)
    return pa.array(strs, pa.large_string())


def _prepare_moses(path: Path, rec: dict, out: Path, cfg: PrepareConfig, max_lines: int | None, key: str,
                   on_bytes) -> list[dict]:
    a, b = rec["pair"].split("-")
    pw = _PairWriter(out, rec["source"], a, b, key, cfg)
    seen = 0
    for la, lb in iter_moses_pairs(path, a, b, where=str(path), max_line_bytes=line_cap(cfg.max_chars),
                                     max_member_bytes=cfg.max_member_bytes):
        if max_lines is not None:
            la, lb = la[: max_lines - seen], lb[: max_lines - seen]
        seen += len(la)
        on_bytes(sum(map(len, la)) + sum(map(len, lb)))
        sa, sb = _decoded(la), _decoded(lb)
        bad = (pc.is_null(sa).to_numpy(zero_copy_only=False) | pc.is_null(sb).to_numpy(zero_copy_only=False)).sum()
        pw.st.add(invalid_utf8=bad)
        pw.write(sa, sb)
        if max_lines is not None and seen >= max_lines:
            break
    return [pw.close()]


def _prepare_tsv(path: Path, rec: dict, out: Path, cfg: PrepareConfig, max_lines: int | None, key: str,
                 on_bytes) -> list[dict]:
    a, b = rec["pair"].split("-")
    pw = _PairWriter(out, rec["source"], a, b, key, cfg)
    seen = 0
    for block in iter_line_blocks(path, "text", where=str(path), prefix_only=rec["truncated"],
                                  max_line_bytes=line_cap(cfg.max_chars)):
        on_bytes(len(block) + 1)
        lines = block.split(b"\n")
        if max_lines is not None:
            lines = lines[: max_lines - seen]
        seen += len(lines)
        cols = [ln.rstrip(b"\r").split(b"\t") for ln in lines]
        good = [c for c in cols if len(c) == 2]
        pw.st.add(malformed=len(cols) - len(good))
        sa, sb = _decoded([c[0] for c in good]), _decoded([c[1] for c in good])
        pw.st.add(invalid_utf8=(pc.is_null(sa).to_numpy(zero_copy_only=False)
                                | pc.is_null(sb).to_numpy(zero_copy_only=False)).sum())
        pw.st.add(lines_in=len(cols) - len(good))
        pw.write(sa, sb)
        if max_lines is not None and seen >= max_lines:
            break
    row = pw.close()
    if row["malformed"] > cfg.max_malformed_rate * max(1, row["lines_in"]):  # e.g. no tabs at all: 0 pairs
        raise XylentError(f"{row['malformed']} of {row['lines_in']} lines are not 'src<TAB>tgt' "
                          f"(more than prepare.max_malformed_rate = {cfg.max_malformed_rate:g})", where=str(path),
                          fix="check the file's layout (one tab per line: source text, tab, target text), or "
                          "raise prepare.max_malformed_rate to keep only its well-formed lines")
    return [row]


def _read_batches(pf, columns: list[str], path: Path):
    """The file's batches; a damaged page behind an intact footer is the file's
    fault and says so (errors while writing the output are not caught here)."""
    batches = pf.iter_batches(columns=columns, batch_size=65536)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
            raise XylentError(f"the Parquet file's data cannot be read: {str(exc).splitlines()[0]}",
                              where=str(path), fix="the file is damaged: download or write it again") from None
        yield batch


def _prepare_parquet(path: Path, rec: dict, out: Path, cfg: PrepareConfig, max_lines: int | None, key: str,
                     on_bytes) -> list[dict]:
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise XylentError(f"not a readable Parquet file: {exc}", where=str(path)) from None
    cols = pf.schema_arrow.names
    need = ["text"] if rec.get("lang") else ["src", "tgt"]
    missing = [c for c in need if c not in cols]
    if missing:
        raise XylentError(f"the Parquet file lacks column(s) {missing}; it has {cols}", where=str(path),
                          fix="monolingual Parquet needs a 'text' column, bitext Parquet 'src' and 'tgt'")
    for name in need:  # ints, lists or bytes would crash deep in Arrow, or be turned into text silently
        kind = pf.schema_arrow.field(name).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise XylentError(f"the Parquet column {name!r} holds {kind}, not text", where=str(path),
                              fix=f"write {name!r} as a string column (UTF-8 text, one segment per row)")
    seen = 0
    if rec.get("lang"):
        lang = rec["lang"]
        st = _Stats(rec["source"], "mono", lang)
        writer = PartWriter(out, partition(MONO, lang), key, MONO_SCHEMA, cfg.part_rows)
        for batch in _read_batches(pf, need, path):
            arr = batch.column(0).cast(pa.large_string())
            if max_lines is not None:
                arr = arr.slice(0, max(0, max_lines - seen))
            n0 = seen
            seen += len(arr)
            cleaned = clean_array(arr, cfg)
            keep, too_short, too_long = length_mask(cleaned, cfg)
            text = cleaned.filter(pa.array(keep))
            ids = np.flatnonzero(keep) + n0
            st.add(lines_in=len(arr), too_short=too_short.sum(), too_long=too_long.sum(), rows_out=len(text),
                   docs=len(text), chars_out=pc.sum(pc.utf8_length(text)).as_py() or 0)
            if len(text):
                writer.write(_mono_rows(key, ids, text, rec["source"]))
            if max_lines is not None and seen >= max_lines:
                break
        writer.close()
        return [st.row]
    a, b = rec["pair"].split("-")
    pw = _PairWriter(out, rec["source"], a, b, key, cfg)
    for batch in _read_batches(pf, need, path):
        sa, sb = (batch.column(i).cast(pa.large_string()) for i in (0, 1))
        if max_lines is not None:
            sa, sb = sa.slice(0, max(0, max_lines - seen)), sb.slice(0, max(0, max_lines - seen))
        seen += len(sa)
        pw.write(sa, sb)
        if max_lines is not None and seen >= max_lines:
            break
    return [pw.close()]


def _prepare_gettext(ws: Workspace, records: list[dict], out: Path, cfg: PrepareConfig, source_cfg: dict,
                     key: str, on_bytes, notes: dict) -> list[dict]:
    source = records[0]["source"]
    src_lang = source_cfg.get("source_language", "en")
    plurals = source_cfg.get("plurals", "singular")
    texts: dict[str, dict] = {}
    english: dict = {}
    counts: Counter = Counter()
    for rec in sorted(records, key=lambda r: (r["lang"], r["catalog"])):
        path = _input_path(ws, rec)
        on_bytes(path.stat().st_size)
        trans, src, c = read_catalog(path, rec["catalog"], plurals)
        counts.update(c)
        texts.setdefault(rec["lang"], {}).update(trans)
        english.update(src)
    texts[src_lang] = english
    if source_cfg.get("holdout"):
        notes["holdout_dropped"] = drop_reserved(texts, dict(english), source_cfg["holdout"])
    max_lines = source_cfg.get("max_lines")
    rows = []
    for lang in sorted(texts):
        keys = sorted(texts[lang])[: max_lines or None]
        st = _Stats(source, "mono", lang)
        arr = clean_array(pa.array([texts[lang][k] for k in keys], pa.large_string()), cfg)
        keep, too_short, too_long = length_mask(arr, cfg)
        text = arr.filter(pa.array(keep))
        st.add(lines_in=len(keys), too_short=too_short.sum(), too_long=too_long.sum(), rows_out=len(text),
               docs=len(text), chars_out=pc.sum(pc.utf8_length(text)).as_py() or 0)
        writer = PartWriter(out, partition(MONO, lang), key, MONO_SCHEMA, cfg.part_rows)
        if len(text):
            ids = [fingerprint(list(k)) for k, kp in zip(keys, keep) if kp]
            writer.write(pa.table({"doc_id": pa.array([f"{key}:{i}" for i in ids]), "text": text,
                                   "source": pa.array([source] * len(text), pa.string())}))
        writer.close()
        rows.append(st.row)
    for a, b in combinations(sorted(texts), 2):
        shared = sorted(texts[a].keys() & texts[b].keys())[: max_lines or None]
        if not shared:
            continue
        pw = _PairWriter(out, source, a, b, key, cfg)
        pw.write(pa.array([texts[a][k] for k in shared], pa.large_string()),
                 pa.array([texts[b][k] for k in shared], pa.large_string()))
        rows.append(pw.close())
    notes["catalog_entries"] = dict(counts)
    return rows


def prepare_unit(records: list[dict], ws: Workspace, cfg: PrepareConfig, source_cfg: dict,
                 on_bytes: Callable[[int], None] = lambda n: None, force: bool = False) -> tuple[dict, bool]:
    """Prepare one unit into ``prepare/_units/<fp>/``; returns (manifest, cached?)."""
    fp = unit_fingerprint(records, cfg, source_cfg)
    unit = ws.unit_dir("prepare", fp)
    manifest = ws.manifest(unit, fetch=not force)
    if manifest is not None and not force and not check_files(unit, manifest):  # an edited unit is rebuilt
        return manifest, True
    started = time.time()
    key = unit_key(records)
    max_lines = source_cfg.get("max_lines")
    notes: dict = {}
    with ws.building(unit) as tmp:
        rec = records[0]
        if rec["format"] == "gettext":
            stats = _prepare_gettext(ws, records, tmp, cfg, source_cfg, key, on_bytes, notes)
        else:
            path = _input_path(ws, rec)
            fn = {"text": _prepare_text, "text-xz": _prepare_text, "text-gz": _prepare_text,
                  "moses-zip": _prepare_moses, "tsv": _prepare_tsv, "parquet": _prepare_parquet}[rec["format"]]
            stats = fn(path, rec, tmp, cfg, max_lines, key, on_bytes)
        manifest = ws.publish(tmp, unit, {
            "kind": "prepare-unit", "fingerprint": fp, "key": key,
            "inputs": [r["unit"] for r in records], "stats": stats, **notes,
            "seconds": round(time.time() - started, 3),
        })
    return manifest, False
