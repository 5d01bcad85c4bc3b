"""prepare: streaming decode, cleaning, and a clear error for every broken input."""

from __future__ import annotations

import gzip
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import cc100_xz, moses_zip, po_file
from xylent.tasks.prepare import prepare_unit
from xylent.errors import XylentError
from xylent.spec import PrepareConfig
from xylent.workspace import Workspace, sha256_file


def record(path: Path, fmt: str, *, source="src", lang=None, pair=None, catalog=None, truncated=False) -> dict:
    st = path.stat()
    return {"source": source, "format": fmt, "filename": path.name, "path": str(path), "file": None,
            "url": None, "lang": lang, "pair": pair, "catalog": catalog, "unit": sha256_file(path)[:16],
            "sha256": sha256_file(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "truncated": truncated}


def run(tmp_path, records, cfg=None, **source_cfg):
    ws = Workspace(tmp_path / "ws")
    manifest, cached = prepare_unit(records, ws, cfg or PrepareConfig(), source_cfg)
    return ws.unit_dir("prepare", manifest["fingerprint"]), manifest


def mono(unit: Path, lang: str) -> pl.DataFrame:
    return pl.read_parquet(unit / "mono" / f"lang={lang}" / "*.parquet")


def test_cc100_documents_cleaning_and_stats(tmp_path):
    docs = [
        ["Erster Absatz.", "Zweiter\tAbsatz mit Tab."],
        ["Cafe\u0301 ist NFD.", "Steuer\x07zeichen\x00 weg.", "\ufeffBOM am Anfang."],
        ["x" * 50],
    ]
    f = tmp_path / "de.txt.xz"
    f.write_bytes(cc100_xz(docs))
    unit, manifest = run(tmp_path, [record(f, "text-xz", lang="de")], PrepareConfig(max_chars=40))
    df = mono(unit, "de")
    assert df["text"].to_list() == [
        "Erster Absatz.", "Zweiter Absatz mit Tab.", "Café ist NFD.", "Steuerzeichen weg.", "BOM am Anfang."
    ]
    assert df["doc_id"].n_unique() == 2, "blank lines separate documents"
    assert df["doc_id"][0] == df["doc_id"][1] != df["doc_id"][2]
    (st,) = manifest["stats"]
    assert st["too_long"] == 1 and st["rows_out"] == 5 and st["docs"] == 2 and st["blank"] == 3
    assert set(df["source"]) == {"src"}


def test_invalid_utf8_lines_are_counted_and_dropped(tmp_path):
    raw = "gut\n".encode() + b"\xff\xfe kaputt\n" + "auch gut\n".encode()
    f = tmp_path / "x.txt"
    f.write_bytes(raw)
    unit, manifest = run(tmp_path, [record(f, "text", lang="de")])
    assert mono(unit, "de")["text"].to_list() == ["gut", "auch gut"]
    assert manifest["stats"][0]["invalid_utf8"] == 1


def test_gzip_and_max_lines(tmp_path):
    f = tmp_path / "x.txt.gz"
    f.write_bytes(gzip.compress("".join(f"Zeile {i}\n" for i in range(100)).encode()))
    unit, manifest = run(tmp_path, [record(f, "text-gz", lang="de")], max_lines=10)
    assert mono(unit, "de")["text"].to_list() == [f"Zeile {i}" for i in range(10)]
    assert manifest["stats"][0]["rows_out"] == 10


def test_truncated_xz_is_a_clear_error(tmp_path):
    data = cc100_xz([[f"Satz Nummer {i} mit etwas Text." for i in range(5000)]], preset=6)
    f = tmp_path / "de.txt.xz"
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(XylentError) as err:
        run(tmp_path, [record(f, "text-xz", lang="de")])
    assert "truncated" in str(err.value) and "de.txt.xz" in str(err.value)
    assert "xylent never deletes it" in err.value.fix and "delete it" not in err.value.fix.replace("never deletes it", "")
    assert not list((tmp_path / "ws" / "prepare" / "_units").iterdir()), "no half output may remain"


def test_a_prefix_cut_on_purpose_is_read_to_its_last_complete_line(tmp_path):
    lines = [f"Satz Nummer {i} mit etwas Text." for i in range(5000)]
    data = cc100_xz([lines], preset=6)
    f = tmp_path / "de.txt.xz"
    f.write_bytes(data[: len(data) // 2])
    unit, manifest = run(tmp_path, [record(f, "text-xz", lang="de", truncated=True)])
    got = mono(unit, "de")["text"].to_list()
    assert 0 < len(got) < 5000 and got == lines[: len(got)]


def test_moses_zip_pairs_are_canonically_ordered(tmp_path):
    f = tmp_path / "en-sw.txt.zip"
    f.write_bytes(moses_zip("CCMatrix", "en", "sw", ["Hello", "Good morning", ""], ["Habari", "Habari za asubuhi", "x"]))
    # declared as sw-en: the partition is still alphabetical, columns follow it
    unit, manifest = run(tmp_path, [record(f, "moses-zip", pair="sw-en")])
    df = pl.read_parquet(unit / "bitext" / "pair=en-sw" / "*.parquet")
    assert df["src"].to_list() == ["Hello", "Good morning"]
    assert df["tgt"].to_list() == ["Habari", "Habari za asubuhi"]
    assert set(df["src_lang"]) == {"en"} and set(df["tgt_lang"]) == {"sw"}
    assert manifest["stats"][0]["too_short"] == 1


def test_moses_zip_with_different_line_counts_is_an_error(tmp_path):
    f = tmp_path / "en-sw.txt.zip"
    f.write_bytes(moses_zip("C", "en", "sw", ["a", "b", "c"], ["x", "y"]))
    with pytest.raises(XylentError) as err:
        run(tmp_path, [record(f, "moses-zip", pair="en-sw")])
    assert "different line counts" in str(err.value) and "3 lines" in str(err.value) and "2" in str(err.value)


def test_a_part_ends_at_its_bytes_of_text_as_well_as_its_rows(tmp_path):
    from xylent.tasks.prepare.writer import MONO_SCHEMA, PartWriter

    def rows(texts):
        return pa.table({"doc_id": [f"d{i}" for i in range(len(texts))], "text": texts, "source": ["s"] * len(texts)})

    def bytes_of(t):  # what the writer counts: every string column's UTF-8 bytes
        return sum(len(v.encode()) for c in t.columns for v in c.to_pylist())

    w = PartWriter(tmp_path, "lang=hi", "k", MONO_SCHEMA, part_rows=1000, part_bytes=1000)
    texts = ["ह" * 50] * 30 + ["x" * 5000] + ["a"] * 3  # 150 bytes a line of Hindi, then one line longer than a part
    for lo in range(0, len(texts), 7):  # written in blocks that do not line up with the parts
        w.write(rows(texts[lo: lo + 7]))
    w.close()
    parts = [pq.read_table(f) for f in sorted((tmp_path / "lang=hi").glob("*.parquet"))]
    assert [t["text"].to_pylist() for t in parts] == [texts[0:6], texts[6:12], texts[12:18], texts[18:24],
                                                       texts[24:30], [texts[30]], texts[31:]]
    assert all(bytes_of(t) <= 1000 for t in parts if t.num_rows > 1) and bytes_of(parts[5]) > 1000
    assert w.parts == len(parts) == 7 and w.rows == len(texts)
    by_rows = PartWriter(tmp_path, "lang=en", "k", MONO_SCHEMA, part_rows=4, part_bytes=10 ** 9)
    by_rows.write(rows(["short"] * 10))
    by_rows.close()
    assert [pq.read_table(f).num_rows for f in sorted((tmp_path / "lang=en").glob("*.parquet"))] == [4, 4, 2]


def test_moses_batches_are_bounded_in_bytes_as_well_as_pairs(tmp_path):
    from xylent.tasks.prepare.readers import iter_moses_pairs

    f = tmp_path / "en-sw.txt.zip"
    src = [f"{i} " + "long english text " * 500 for i in range(40)]  # ~9 kB a line: documents, not sentences
    tgt = [f"{i} " + "maandishi marefu " * 500 for i in range(40)]
    f.write_bytes(moses_zip("C", "en", "sw", src + ["a", "b", "c"], tgt + ["x", "y", "z"]))
    batches = list(iter_moses_pairs(f, "en", "sw", where=str(f), batch=1000, batch_bytes=60_000))
    sizes = [sum(map(len, la)) + sum(map(len, lb)) for la, lb in batches]
    assert len(batches) > 1 and max(sizes) < 60_000 + 2 * 9_100, sizes  # a batch passes the bound by one pair at most
    assert [x for la, _ in batches for x in la] == [s.encode() for s in src + ["a", "b", "c"]]
    assert [y for _, lb in batches for y in lb] == [t.encode() for t in tgt + ["x", "y", "z"]]
    counted = list(iter_moses_pairs(f, "en", "sw", where=str(f), batch=7))  # a small count ends a batch before the bytes do
    assert [len(la) for la, _ in counted] == [7] * 6 + [1]
    exact = list(iter_moses_pairs(f, "en", "sw", where=str(f), batch=43))  # a whole batch, then the end: no empty one
    assert [len(la) for la, _ in exact] == [43]


@pytest.mark.parametrize("name", ["../evil.en", "/etc/evil.sw"])
def test_zip_member_with_unsafe_path_is_refused(tmp_path, name):
    f = tmp_path / "en-sw.txt.zip"
    f.write_bytes(moses_zip("C", "en", "sw", ["a"], ["b"], extra={name: "x"}))
    with pytest.raises(XylentError, match="unsafe path"):
        run(tmp_path, [record(f, "moses-zip", pair="en-sw")])


def test_zip_without_the_declared_language_is_an_error(tmp_path):
    f = tmp_path / "en-sw.txt.zip"
    f.write_bytes(moses_zip("C", "en", "sw", ["a"], ["b"]))
    with pytest.raises(XylentError, match="language 'xh'"):
        run(tmp_path, [record(f, "moses-zip", pair="en-xh")])


def test_truncated_zip_is_an_error(tmp_path):
    data = moses_zip("C", "en", "sw", ["a"] * 1000, ["b"] * 1000)
    f = tmp_path / "en-sw.txt.zip"
    f.write_bytes(data[: len(data) - 40])
    with pytest.raises(XylentError, match="truncated|damaged"):
        run(tmp_path, [record(f, "moses-zip", pair="en-sw")])


def _zip_headers_say(data: bytes, *, flags: int = 0, method: int | None = None) -> bytes:
    """The archive with every local and central header's flag bits OR-ed with ``flags`` and its
    method set to ``method``: what an encrypted or a Deflate64 archive declares (Python writes neither)."""
    import struct

    out = bytearray(data)
    for sig, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = out.find(sig)
        while at >= 0:
            (bits,) = struct.unpack_from("<H", out, at + flag_at)
            struct.pack_into("<H", out, at + flag_at, bits | flags)
            if method is not None:
                struct.pack_into("<H", out, at + flag_at + 2, method)
            at = out.find(sig, at + 4)
    return bytes(out)


@pytest.mark.parametrize("case", ["password", "deflate64"])
def test_a_zip_python_cannot_read_is_refused_by_name_with_what_to_do(tmp_path, case):
    """Issue 64: a password-protected moses zip, or one packed with Deflate64 (Windows' Explorer
    packs large files so), failed with "internal error (a bug)"."""
    data = moses_zip("C", "en", "sw", ["a"] * 10, ["b"] * 10)
    data = _zip_headers_say(data, flags=0x1) if case == "password" else _zip_headers_say(data, method=9)
    f = tmp_path / "en-sw.txt.zip"
    f.write_bytes(data)
    with pytest.raises(XylentError, match="password-protected" if case == "password" else
                       "compressed with Deflate64 .zip method 9., which Python cannot read") as err:
        run(tmp_path, [record(f, "moses-zip", pair="en-sw")])
    assert "repack it with plain Deflate" in err.value.render() and str(f) in err.value.render()


def test_tsv_and_parquet_bitext(tmp_path):
    tsv = tmp_path / "p.tsv"
    tsv.write_text("eins\tone\nzwei\ttwo\nkaputt\n")
    unit, manifest = run(tmp_path, [record(tsv, "tsv", pair="de-en")])
    df = pl.read_parquet(unit / "bitext" / "pair=de-en" / "*.parquet")
    assert df.select("src", "tgt").rows() == [("eins", "one"), ("zwei", "two")]
    assert manifest["stats"][0]["malformed"] == 1
    pqf = tmp_path / "p.parquet"
    pq.write_table(pa.table({"src": ["one", "two"], "tgt": ["eins", "zwei"]}), pqf)
    unit, _ = run(tmp_path, [record(pqf, "parquet", pair="en-de")])
    df = pl.read_parquet(unit / "bitext" / "pair=de-en" / "*.parquet")
    assert df.select("src", "tgt").rows() == [("eins", "one"), ("zwei", "two")]


def test_parquet_without_text_column_is_an_error(tmp_path):
    pqf = tmp_path / "m.parquet"
    pq.write_table(pa.table({"body": ["x"]}), pqf)
    with pytest.raises(XylentError, match="lacks column"):
        run(tmp_path, [record(pqf, "parquet", lang="de")])


def test_gettext_catalogs_give_multiway_pairs(tmp_path):
    de = tmp_path / "de.po"
    fr = tmp_path / "fr.po"
    de.write_text(po_file([
        {"msgid": "Save", "msgstr": "Speichern"},
        {"msgid": "Delete", "msgstr": "Löschen"},
        {"msgid": "Draft", "msgstr": "Entwurf", "fuzzy": True},
        {"msgid": "Open", "msgctxt": "door", "msgstr": "Öffnen"},
        {"msgid": "%d item", "msgid_plural": "%d items", "msgstr_plural": ["%d Element", "%d Elemente"]},
        {"msgid": "Untranslated", "msgstr": ""},
    ]), encoding="utf-8")
    fr.write_text(po_file([
        {"msgid": "Save", "msgstr": "Enregistrer"},
        {"msgid": "Open", "msgctxt": "file", "msgstr": "Ouvrir"},
        {"msgid": "%d item", "msgid_plural": "%d items", "msgstr_plural": ["%d élément", "%d éléments"]},
    ]), encoding="utf-8")
    recs = [record(de, "gettext", lang="de", catalog="app.po"), record(fr, "gettext", lang="fr", catalog="app.po")]
    unit, manifest = run(tmp_path, recs, source_language="en", plurals="singular")
    pairs = {p.name: pl.read_parquet(p / "*.parquet") for p in (unit / "bitext").iterdir()}
    assert sorted(pairs) == ["pair=de-en", "pair=de-fr", "pair=en-fr"]
    de_fr = dict(pairs["pair=de-fr"].select("src", "tgt").rows())
    # msgctxt separates "Open" (door) from "Open" (file): no false pair
    assert de_fr == {"Speichern": "Enregistrer", "%d Element": "%d élément"}
    de_en = dict(pairs["pair=de-en"].select("src", "tgt").rows())
    assert "Entwurf" not in de_en and de_en["Öffnen"] == "Open" and len(de_en) == 4
    assert set(mono(unit, "en")["text"]) >= {"Save", "Delete", "Draft", "Untranslated", "%d item"}
    assert manifest["catalog_entries"]["fuzzy"] == 1 and manifest["catalog_entries"]["untranslated"] == 1
    unit_all, _ = run(tmp_path, recs, source_language="en", plurals="all")
    de_fr_all = dict(pl.read_parquet(unit_all / "bitext" / "pair=de-fr" / "*.parquet").select("src", "tgt").rows())
    assert de_fr_all["%d Elemente"] == "%d éléments"


def test_a_gettext_source_of_its_source_language_alone_gives_the_msgids_as_monolingual_text(tmp_path,
                                                                                          catalog_package):
    """MetaXLM's phase 1 is an English model: spec languages [en] read the msgids of the package's
    own en catalogs (Django ships them, every msgid, no msgstr), or of the locale that locales names."""
    from xylent.tasks.download.plan import plan_source
    from xylent.spec import spec_from_dict

    entries = [{"msgid": "Save", "msgstr": ""}, {"msgid": "Delete the file", "msgstr": ""}]
    catalog_package("enpkg", {"en": {"app.po": entries}, "de": {"app.po": [{"msgid": "Save", "msgstr": "Speichern"}]}})
    src = {"name": "cat", "kind": "gettext", "package": "enpkg"}
    spec = spec_from_dict({"name": "en-only", "languages": ["en"], "sources": [src]})
    items = plan_source(spec, spec.sources[0])
    assert [(i.lang, i.filename) for i in items] == [("en", "en/locale/en/LC_MESSAGES/app.po")]
    recs = [record(Path(i.path), "gettext", lang=i.lang, catalog=i.catalog) for i in items]
    unit, _ = run(tmp_path, recs, source_language="en", plurals="singular")
    assert sorted(p.name for p in (unit / "mono").iterdir()) == ["lang=en"] and not (unit / "bitext").exists()
    assert sorted(mono(unit, "en")["text"]) == ["Delete the file", "Save"]
    spec = spec_from_dict({"name": "en-only", "languages": ["en"], "sources": [{**src, "locales": {"en": "de"}}]})
    assert [i.filename for i in plan_source(spec, spec.sources[0])] == ["de/locale/de/LC_MESSAGES/app.po"]
    catalog_package("nopkg", {"de": {"app.po": entries}})
    spec = spec_from_dict({"name": "en-only", "languages": ["en"], "sources": [{**src, "package": "nopkg"}]})
    with pytest.raises(XylentError, match="no catalogs of locale 'en' to read the 'en' msgids from") as err:
        plan_source(spec, spec.sources[0])
    assert "locales: {en: de}" in err.value.render()


def test_a_local_file_changed_after_download_is_not_trusted(tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("eins\n")
    rec = record(f, "text", lang="de")
    f.write_text("zwei und mehr\n")
    with pytest.raises(XylentError, match="changed since the download"):
        run(tmp_path, [rec])


def test_output_is_deterministic(tmp_path):
    f = tmp_path / "de.txt.xz"
    f.write_bytes(cc100_xz([[f"Satz {i}." for i in range(1000)], ["Ende."]]))
    _, m1 = run(tmp_path, [record(f, "text-xz", lang="de")])
    ws2 = Workspace(tmp_path / "ws2")
    m2, _ = prepare_unit([record(f, "text-xz", lang="de")], ws2, PrepareConfig(), {})
    files = [(x["path"], x["sha256"]) for x in m1["files"]]
    assert files == [(x["path"], x["sha256"]) for x in m2["files"]]
    parts = [x for x in m1["files"] if x["path"].startswith("mono/lang=de/")]
    assert parts and sum(x["rows"] for x in parts) == 1001, "not two empty outputs"


def _tar_gz() -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        data = "".join(f"Satz {i}\n" for i in range(50)).encode()
        info = tarfile.TarInfo("de.txt")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return gzip.compress(buf.getvalue())


@pytest.mark.parametrize("fmt, data, said", [
    ("text", "".join(f"Привет, мир {i}\n" for i in range(50)).encode("utf-16"), "UTF-16 (its byte order mark"),
    ("text", "".join(f"Größe, naïve café {i}\n" for i in range(50)).encode("latin-1"), "50 of the first 50 lines"),
    ("text", gzip.compress(b"hello\n" * 50), "declared text, but the file is gzip-compressed (declare format: text-gz)"),
    ("text-gz", _tar_gz(), "the text-gz file holds a tar archive"),
    ("text", b"\xef\xbb\xbf\n  <!DOCTYPE html><html><body>Not found</body></html>\n", "an HTML page"),
    ("text", "".join(f"Hallo Welt {i}\n" for i in range(50)).encode("utf-16-le"), "UTF-16 without a byte order mark"),
], ids=["utf-16", "latin-1", "gzip-as-text", "tar-in-gz", "html", "utf-16-no-bom"])
def test_a_text_source_whose_bytes_say_it_is_something_else_is_refused_by_name(tmp_path, fmt, data, said):
    """Issue 64, 0b: read as UTF-8 these put garbage rows in (UTF-16 Russian, a tar header, an HTML error page) or
    lose most of their rows silently (Latin-1); their first bytes say what they are."""
    f = tmp_path / "de.txt"
    f.write_bytes(data)
    with pytest.raises(XylentError, match="") as err:
        run(tmp_path, [record(f, fmt, lang="de")])
    assert said in err.value.render() and str(f) in err.value.render(), err.value.render()


def test_rows_with_no_visible_character_are_blank_lines_not_sentences(tmp_path):
    f = tmp_path / "de.txt"
    f.write_text("Erster Satz.\n\u200b\u200b\n\u2800 \u2800\nZweiter\u200bSatz.\n\u3164\n")
    unit, manifest = run(tmp_path, [record(f, "text", lang="de")])
    assert mono(unit, "de")["text"].to_list() == ["Erster Satz.", "Zweiter\u200bSatz."]
    assert manifest["stats"][0]["blank"] == 3 and manifest["stats"][0]["rows_out"] == 2
