"""Audit evidence on a real dedup output with planted defects: rates, hub texts,
dedup's removals, verdicts, samples, and the audit's plots."""

from __future__ import annotations

import random
from pathlib import Path

import matplotlib.image
import polars as pl
import pyarrow as pa
import pytest

from xylent.spec import DedupConfig
from xylent.stage import section_identity
from xylent.workspace import Workspace

from xylent.tasks.audit import plots
from xylent.tasks.audit.evidence import pair_evidence, reading, sample_pairs, verdict
from xylent.tasks.dedup import run as phases
from xylent.tasks.dedup.run import assemble
from xylent.tasks.prepare import contract as layout  # the text layout
from xylent.tasks.prepare.writer import BITEXT_SCHEMA, PartWriter

LONG_HUB = ("No se encontró el archivo solicitado en el servidor; compruebe la ruta, los permisos "
            "y vuelva a intentarlo más tarde.")


def planted() -> dict[str, list[tuple[str, str]]]:
    """Five pairs of 20 kept rows each; en-es also has 10 rows on a hub dedup removes."""
    clean = [(f"Der Zug {i} fährt heute um {i} Uhr ab.", f"Train {i} leaves today at {i} o'clock.") for i in range(20)]
    copies = [(f"Version {i} of the Django admin", f"  VERSION {i}   of the DJANGO admin ") for i in range(16)]
    copies += [(f"The file {i} was saved.", f"Le fichier {i} a été enregistré.") for i in range(4)]
    hub = [(f"Unknown error in module {k}.", "Error desconocido.") for k in range(6)]
    hub += [(f"File {k} could not be found on the server.", LONG_HUB) for k in range(5)]
    hub += [(f"The meeting {i} starts at noon.", f"La reunión {i} empieza a mediodía.") for i in range(9)]
    hub += [(f"Hello number {k}.", "Hola.") for k in range(10)]  # 10 partners: dedup's hub rule (>= 8) drops them
    length = [(f"The car {i} is red.", f"La macchina {i} è rossa.") for i in range(15)]
    length += [(f"OK{i}.", f"Sì, è proprio quello che volevo dire sull'intera faccenda {i} oggi.") for i in range(5)]
    dups = [(f"Das Haus {i} ist groß.", f"La maison {i} est grande.") for i in range(15)]
    dups += dups[:5]  # exact repeats, in later parts than their first occurrence
    return {"de-en": clean, "en-fr": copies, "en-es": hub, "en-it": length, "de-fr": dups}


def prepared(root: Path, corpus: dict[str, list[tuple[str, str]]], part_rows: int = 7) -> Path:
    for pair, rows in corpus.items():
        a, b = pair.split("-")
        w = PartWriter(root, layout.partition(layout.BITEXT, pair), "t", BITEXT_SCHEMA, part_rows)
        w.write(pa.table({"src": [s for s, _ in rows], "tgt": [t for _, t in rows], "src_lang": [a] * len(rows),
                          "tgt_lang": [b] * len(rows), "source": ["test"] * len(rows)}))
        w.close()
    return root


def run_dedup(prep: Path, final: Path, cfg: DedupConfig, languages: tuple[str, ...], *, publish: bool,
              every_group_buckets: int | None = None) -> Path:
    """The dedup stage's own phases and assembly, in this process; ``publish`` also
    writes the manifest (with the config) as the stage kit does. ``every_group_buckets`` overrides the plan's
    bucket count for every pair."""
    ws = Workspace(final.parent)
    with ws.building(final) as tmp:
        items = [p.as_dict() for p in layout.parts(prep)]
        work = tmp / "_work"
        buckets = phases.plan_buckets(items, cfg.buckets)
        if every_group_buckets:
            for it in items:
                it["buckets"] = every_group_buckets
            buckets = sorted({(k, n, b) for k, n, _ in buckets for b in range(every_group_buckets)})
        phases.map_items(items, work, cfg, languages)
        phases.reduce_buckets(buckets, work, cfg)
        assemble(items, phases.apply_items(items, work, tmp, cfg), work, tmp, cfg.samples_per_reason)
        if publish:
            ws.publish(tmp, final, {"stage": "dedup",
                                    "config": {"dedup": section_identity(cfg), "languages": list(languages)}})
        else:
            tmp.rename(final)
    return final


@pytest.fixture(scope="module")
def dedup_out(tmp_path_factory) -> Path:
    """Dedup with only its hub rule on (at 8 partners): every other defect reaches training."""
    tmp = tmp_path_factory.mktemp("audit")
    cfg = DedupConfig(bitext_exact=False, copies=False, length_ratio=False, langid=False, hubs=True,
                      hub_min_partners=8, buckets=2)
    return run_dedup(prepared(tmp / "prep", planted()), tmp / "dedup" / "fp", cfg,
                     ("de", "en", "es", "fr", "it"), publish=True)


def test_a_pair_held_in_one_part_is_one_bucket_and_drops_what_many_buckets_drop(tmp_path):
    cfg = DedupConfig(langid=False, hub_min_partners=8, buckets=5)
    prep = prepared(tmp_path / "prep", planted(), part_rows=1000)
    items = [p.as_dict() for p in layout.parts(prep)]
    assert phases.plan_buckets(items, 5) == [("bitext", pair, 0) for pair in sorted(planted())]
    many_parts = [p.as_dict() for p in layout.parts(prepared(tmp_path / "p7", planted()))]
    n_parts = {pair: sum(it["name"] == pair for it in many_parts) for pair in planted()}
    assert min(n_parts.values()) < 4 < max(n_parts.values()), n_parts
    assert phases.plan_buckets(many_parts, 4) == [
        ("bitext", pair, b) for pair in sorted(planted()) for b in range(max(4, n_parts[pair]))], (
        "several parts: the spec's buckets, or one per part where the parts are more (a bucket holds about a part)")
    langs = ("de", "en", "es", "fr", "it")
    one = run_dedup(prep, tmp_path / "one" / "fp", cfg, langs, publish=False)
    many = run_dedup(prep, tmp_path / "many" / "fp", cfg, langs, publish=False, every_group_buckets=5)
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(many) for p in many.rglob("*") if p.is_file())
    removed = pl.read_parquet(one / "removed_samples.parquet")
    assert {"exact", "hub", "copy", "ratio"} <= set(removed["reason"]), "every bucketed rule and the flags had work"
    for f in files:
        if f.suffix == ".parquet":
            assert pl.read_parquet(one / f).equals(pl.read_parquet(many / f)), f


@pytest.fixture(scope="module")
def evidence(dedup_out) -> dict[str, dict]:
    return {r["pair"]: r for r in pair_evidence(dedup_out).to_dicts()}


def test_rates_are_what_was_planted(evidence):
    assert sorted(evidence) == ["de-en", "de-fr", "en-es", "en-fr", "en-it"]
    rates = {p: (r["rows"], r["copy_rate"], r["hub_rate"], r["length_outlier_rate"], r["duplicate_rate"])
             for p, r in evidence.items()}
    assert rates == {
        "de-en": (20, 0.0, 0.0, 0.0, 0.0),
        "en-fr": (20, 0.8, 0.0, 0.0, 0.0),
        "en-es": (20, 0.0, 0.55, 0.0, 0.0),
        "en-it": (20, 0.0, 0.0, 0.25, 0.0),
        "de-fr": (20, 0.0, 0.0, 0.0, 0.25),
    }
    assert all(r["langid_mismatch_rate"] is None for r in evidence.values()), "dedup ran no lang-id: no rate"


def test_hub_evidence_names_the_shared_texts(evidence):
    hub = evidence["en-es"]
    assert hub["hub_side"] == "tgt" and hub["hub_max_sources"] == 6
    assert hub["top_hubs"] == ["Error desconocido.", LONG_HUB[:80]]
    assert evidence["de-en"]["top_hubs"] == [] and evidence["de-en"]["hub_max_sources"] == 1


def test_dedup_removals_come_from_its_stats(evidence):
    hub = evidence["en-es"]
    assert hub["rows_before_dedup"] == 30 and hub["removed_hub"] == 10 and hub["removed_hub_rate"] == 10 / 30
    assert hub["removed_hub_texts"] == ["Hola."]
    for r in evidence.values():
        # the manifest says these rules were off: their zeros mean "not checked", so no number
        assert r["removed_copy"] is None and r["removed_exact_rate"] is None and r["removed_ratio"] is None
    assert evidence["de-en"]["removed_hub"] == 0 and evidence["de-en"]["removed_hub_texts"] == []


def test_pairs_are_selected_in_order_and_unknown_pairs_are_errors(dedup_out):
    from xylent.errors import XylentError

    table = pair_evidence(dedup_out, ["en-it", "de-en"], top_hubs=1)
    assert table["pair"].to_list() == ["en-it", "de-en"]
    assert pair_evidence(dedup_out, ["en-es"], top_hubs=1)["top_hubs"].to_list() == [["Error desconocido."]]
    with pytest.raises(XylentError, match="en-de"):
        pair_evidence(dedup_out, ["en-de"])


def test_verdicts_name_the_defect(evidence):
    assert verdict(evidence["de-en"]) == "no defect in the evidence"
    assert verdict(evidence["en-fr"]) == "near copies: 80 % of targets equal their source"
    assert verdict(evidence["en-es"]) == ('hub-aligned: 55 % of targets shared by ≥ 5 sources '
                                          '(e.g. "Error desconocido."); dedup removed 33 % of the pair for hubs')
    assert verdict(evidence["en-it"]) == "length mismatch: 25 % of pairs differ in length by more than 3×"
    assert verdict(evidence["de-fr"]) == "duplicates: 25 % of pairs repeat an earlier pair exactly"


def test_the_reading_follows_section_6_6s_directions(evidence):
    """Down-weighted hubs and copies are trivial (§6.6: en-xh, ca-es); up-weighted pairs possibly noisy."""
    assert reading(evidence["en-es"], "down").startswith("trivial: hub-aligned")
    assert reading(evidence["en-fr"], "down").startswith("trivial: near copy")
    assert reading(evidence["de-en"], "down").startswith("easy: no copy or hub")
    assert reading(evidence["de-en"], "up").startswith("possibly noisy")
    assert reading(evidence["en-es"], "up").startswith("possibly noisy"), "the direction decides, not the evidence"


def test_several_findings_most_severe_first():
    row = {"rows": 100, "hub_min_sources": 5, "hub_side": "src", "top_hubs": [], "copy_rate": 0.3,
           "hub_rate": 0.6, "length_outlier_rate": float("nan"), "duplicate_rate": 0.0, "langid_mismatch_rate": None}
    assert verdict(row) == ("hub-aligned: 60 % of sources shared by ≥ 5 targets; "
                            "near copies: 30 % of targets equal their source")
    assert verdict({"pair": "xx-yy", "rows": 0}) == "no rows: dedup kept none of this pair"


def test_langid_mismatch_comes_from_dedups_lang_id(tmp_path):
    nouns = [("Bahnhof", "station"), ("Brunnen", "fountain"), ("Laden", "shop"), ("Garten", "garden"),
             ("Turm", "tower"), ("Markt", "market"), ("Friedhof", "cemetery"), ("Hafen", "harbour")]
    rows = [(f"Der {de} liegt direkt neben dem alten Rathaus der Stadt.",
             f"The {en} is right next to the old town hall of the city.") for de, en in nouns]
    rows += [(f"Wir haben gestern lange über die neue Schule Nummer {k} gesprochen.",
              f"Wir haben gestern lange über die neue Schule Nummer {k} gesprochen, sagte sie.") for k in range(4)]
    cfg = DedupConfig(langid=True, copies=False, buckets=2)
    out = run_dedup(prepared(tmp_path / "prep", {"de-en": rows}), tmp_path / "dedup" / "fp", cfg, ("de", "en"),
                    publish=False)
    row = pair_evidence(out).row(0, named=True)
    assert row["removed_langid"] == 4 and row["langid_mismatch_rate"] == 4 / 12 and row["rows"] == 8
    assert verdict(row) == "language-id mismatch: 33 % of pairs had a side in another language (removed by dedup)"


def test_sample_pairs_are_real_rows_and_deterministic(dedup_out):
    kept = set(planted()["de-en"])
    first = sample_pairs(dedup_out, "de-en", n=5, seed=0)
    assert len(first) == 5 and set(first) <= kept and len(set(first)) == 5
    assert sample_pairs(dedup_out, "de-en", n=5, seed=0) == first
    assert sample_pairs(dedup_out, "de-en", n=5, seed=1) != first
    assert sorted(sample_pairs(dedup_out, "de-en", n=100, seed=3)) == sorted(kept), "n > rows: every row once"
    assert set(sample_pairs(dedup_out, "en-es", n=20)) <= set(planted()["en-es"][:20]), "only rows dedup kept"


def _png(path: Path) -> tuple[int, int]:
    assert path.exists() and path.stat().st_size > 0 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(path)
    assert img[..., :3].std() > 0.01, "not blank"
    return img.shape[:2]


def _names(n: int) -> list[str]:
    langs = [f"l{i:02d}" for i in range(30)]
    return [f"{a}-{b}" for i, a in enumerate(langs) for b in langs[i + 1:]][:n]


@pytest.mark.parametrize("n", [1, 50, 200])
def test_plots_write_pngs_with_nans(tmp_path, n):
    rng = random.Random(n)
    pairs = _names(n)
    w = {p: rng.uniform(0.2, 3.0) for p in pairs}
    if n > 1:
        w[pairs[1]] = float("nan")
    heights = {}
    heights["fig4"] = _png(plots.figure4(w, tmp_path / "fig4.png", n=10))[0]
    traj = pl.DataFrame([{"resample": r, "step": 100 * r, "pair": p, "q": 0.1, "prior": 0.1,
                          "w": None if (p == pairs[0] and r == 2) else rng.uniform(0.2, 3.0)}
                         for r in (1, 2, 3) for p in pairs])
    heights["traj"] = _png(plots.trajectories(traj, pairs, tmp_path / "traj.png"))[0]
    table = pl.DataFrame({"pair": pairs, "w_final": [w[p] for p in pairs],
                          "hub_rate": [None if i == 0 and n > 1 else rng.random() for i in range(n)],
                          "copy_rate": [rng.random() for _ in range(n)],
                          "duplicate_rate": [float("nan")] + [rng.random() for _ in range(n - 1)]})
    heights["scatter"] = _png(plots.w_against_evidence(table, ["hub_rate", "copy_rate", "duplicate_rate"],
                                                       tmp_path / "scatter.png"))[0]
    if n == 200:
        assert heights["traj"] > 1500, "200 lines labelled at their ends need a taller figure"


def test_figure4_grows_with_the_pairs_shown(tmp_path):
    w = {p: (i + 1) / 20 for i, p in enumerate(_names(40))}  # w from 0.05 to 2.0: both sides of 1
    small = _png(plots.figure4(w, tmp_path / "a.png", n=2))
    big = _png(plots.figure4(w, tmp_path / "b.png", n=20))
    assert big[0] > small[0]
    one = _png(plots.figure4({"de-en": 1.4}, tmp_path / "c.png"))
    assert one[0] > 0
