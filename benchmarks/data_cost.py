"""What XY-LENT's real corpus costs through the data stages, in core-hours and disk, projected from the
scaling benchmark's measured rates (benchmarks/results/scaling.json), never typed.

    .venv/bin/python benchmarks/data_cost.py     # writes benchmarks/results/data_cost.json
    .venv/bin/python benchmarks/render.py        # then its block in docs/records/benchmarks.md

Rerun it after scaling.py writes a new run: tests/test_benchmarks.py's derived-result test fails while the
committed projection is not what the committed inputs give.

The corpus. Monolingual: CC-100 as XY-LENT used it ("we follow Chi et al. (2022) and use the CC-100
dataset"), at the per-language sizes of Chi et al.'s own reconstruction of it, InfoXLM's Table 8 (GB), read
from ../shared/papers/infoxlm.txt: 87 languages in the text we have, where InfoXLM's prose says 94. Bitext:
CCMatrix v1's published pair counts and words per pair of languages (../shared/data/ccmatrix_v1_pairs.tsv),
all 1 197 pairs; XY-LENT used 1 015 of them and does not list which, so this is an upper bound. CCMatrix
counts words, not bytes: a pair of languages' text is its words (taken as both sides' together: en-es has
39 a pair) times the mean UTF-8 bytes per whitespace word of its two languages, measured on the real text
this machine has (Django's gettext catalogs; a language Django lacks takes the median over all catalogs).

The model. A stage whose work follows the text (download, prepare, dedup, shards) costs the core-seconds
per MB of text it took at the scaling run's largest size (median stage time x threads / MB of text, mono
and bitext together), times the corpus's MB: linear in the text. At the run's sizes the time slopes are
below 1 (fixed costs amortised), so the linear figure is the conservative one while a stage's slope stays
at or under 1; the table gives each slope beside its figure. Disk: each stage's output and peak disk per
MB of text at the same size (the benchmark's generated text compresses unlike real text, so download's
compressed bytes are the least transferable figure). vocab trains on a capped sample per language and
sampling on one count per language: neither follows the text, and neither was measured at the real
corpus's settings (vocab's default sample is 1 010 000 sentences per language, the run's 6 000), so
neither is projected. Hours on N cores is core-hours / N: the spread that this assumes is measured at 2
workers (benchmarks/cluster.py), not at N, and dedup's resolve runs one task per language. Download's rate is
loopback's: a real download is bound by the network, which no figure here measures.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

import harness  # noqa: E402
from scaling import TEXT_RATE as PROJECTED  # noqa: E402  the stages whose work follows the text

RESULT = "data_cost"
SHARED = REPO.parent / "shared"
INFOXLM = SHARED / "papers" / "infoxlm.txt"
CCMATRIX_PAIRS = SHARED / "data" / "ccmatrix_v1_pairs.tsv"
XY_LENT = SHARED / "papers" / "xy-lent.txt"
QUOTE = "we follow Chi et al. (2022) and use the CC-100 dataset"
TABLE_CAPTION = "Table 8: The statistics of CCNet used corpus for pretraining."
CORES = (64,)


def cc100_sizes(path: Path = INFOXLM) -> dict[str, float]:
    """Language -> GB, from InfoXLM's Table 8 (rows of up to three `code size` cells, above its caption)."""
    text = path.read_text()
    end = text.index(TABLE_CAPTION)
    start = text.rindex("Code\tSize (GB)", 0, end)
    body = text[text.index("\n", start) + 1:end]
    cells = re.findall(r"([a-z]{2,3})\t([0-9]+(?:\.[0-9]+)?)", body)
    if len(cells) != 3 * body.count("\n") - 3 or len(cells) < 80:  # three cells a row, one empty line
        raise SystemExit(f"{path}: read {len(cells)} languages from the {body.count(chr(10))} lines of its Table 8")
    return {code: float(gb) for code, gb in cells}


def ccmatrix_pairs(path: Path = CCMATRIX_PAIRS) -> list[dict]:
    """Every pair of languages: sentence pairs and words (the published `27.88M` read as 27 880 000)."""
    scale = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f, delimiter="\t"):
            w = r["words"]
            words = float(w[:-1]) * scale[w[-1]] if w[-1] in scale else float(w)
            rows.append({"a": r["lang_a"], "b": r["lang_b"], "pairs": int(r["sentence_pairs"]), "words": words})
    return rows


def bytes_per_word() -> dict[str, float]:
    """Language -> UTF-8 bytes per whitespace word of its real text: the msgstrs of Django's own catalog
    (django/conf/locale/<locale>/LC_MESSAGES/django.po), English from the msgids; one space per word counted."""
    import django
    import polib

    from xylent.languages import DJANGO_LOCALES

    root = Path(django.__file__).parent / "conf" / "locale"
    by_locale = {v: k for k, v in DJANGO_LOCALES.items()}
    out = {}
    for po in sorted(root.glob("*/LC_MESSAGES/django.po")):
        locale = po.parent.parent.name
        entries = [e for e in polib.pofile(str(po)) if not e.obsolete and "fuzzy" not in e.flags]
        texts = [e.msgid for e in entries] if locale == "en" else [e.msgstr for e in entries if e.msgstr]
        words = sum(len(t.split()) for t in texts)
        if words >= 200:  # a catalog this short says little
            out[by_locale.get(locale, locale)] = (sum(len(t.encode()) for t in texts) + words) / words
    return dict(sorted(out.items()))


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _gpu_hours(results: Path) -> list[dict]:
    """Per budget of benchmarks/projection.py: the fewest and most GPU-hours of xylent's measured lines."""
    projection = harness.load_result("projection", results) or {"budgets": []}
    out = []
    for b in projection["budgets"]:
        for t in b["tables"]:
            hours = [x["gpu_hours"] for x in t["lines"] if x["measured"] and x["side"] == "xylent"]
            if hours:
                out.append({"budget": b["name"], "device": t["device"], "vocab_size": t["vocab_size"],
                            "gpu_hours": [min(hours), max(hours)]})
    return out


def project(results: Path = harness.RESULTS) -> dict:
    scaling = harness.load_result("scaling", results)
    if scaling is None:
        raise SystemExit(f"no {results}/scaling.json: run benchmarks/scaling.py first")
    k = -1  # the largest size: start-up costs amortised furthest
    size, threads = scaling["sizes"][k], scaling["threads"]
    text_mb = size["text_mb"]
    cc100 = cc100_sizes()
    mono_mb = sum(cc100.values()) * 1000
    bpw = bytes_per_word()
    fallback = _median(list(bpw.values()))
    pairs = ccmatrix_pairs()
    bitext_mb = sum(p["words"] * (bpw.get(p["a"], fallback) + bpw.get(p["b"], fallback)) / 2 for p in pairs) / 1e6
    corpus_mb = mono_mb + bitext_mb
    stages = {}
    for stage in PROJECTED:
        row = scaling["stages"][stage][k]
        core_s_per_mb = row["stage_s"]["median"] * threads / text_mb
        core_hours = core_s_per_mb * corpus_mb / 3600
        stages[stage] = {
            "core_s_per_mb": core_s_per_mb, "mb_per_s_per_core": 1 / core_s_per_mb,
            "time_slope": scaling["slopes"][stage]["stage_s"], "core_hours": core_hours,
            "wall_hours": {str(n): core_hours / n for n in CORES},
            "output_tb": row["output_mb"]["max"] / text_mb * corpus_mb / 1e6,
            "peak_disk_tb": row["peak_disk_mb"]["max"] / text_mb * corpus_mb / 1e6}
    knobs = scaling["knobs"]
    from xylent.spec import VocabConfig
    default = {k: VocabConfig.model_fields[k].default for k in ("input_sentence_size", "held_sentences")}
    not_projected = {
        "vocab": (f"it trains on a capped sample per language ({harness.num(knobs['vocab.input_sentence_size'] + knobs['vocab.held_sentences'])} "
                  f"sentences in the scaling run, {harness.num(sum(default.values()))} by default): its cost follows "
                  "the languages and the cap, not the text, and was not measured at the default cap"),
        "sampling": ("it counts once per language: its cost follows the languages, not the text (the scaling "
                     "run's sampling section measures it against their number)")}
    return {
        "source": {"scaling_date": scaling["date"], "text_mb": text_mb, "threads": threads,
                   "mono_mb": size["mono_mb"], "bitext_pairs": size["bitext_pairs"],
                   "cpu": scaling.get("environment", {}).get("machine", {}).get("cpu_model")},
        "corpus": {"cc100_languages": len(cc100), "cc100_gb": round(sum(cc100.values()), 1),
                   "cc100_largest": max(cc100, key=cc100.get), "cc100_largest_gb": max(cc100.values()),
                   "ccmatrix_language_pairs": len(pairs), "ccmatrix_pairs": sum(p["pairs"] for p in pairs),
                   "ccmatrix_words": sum(p["words"] for p in pairs),
                   "bytes_per_word": {"languages": len(bpw), "median": fallback,
                                      "min": min(bpw.values()), "max": max(bpw.values())},
                   "mono_mb": mono_mb, "bitext_mb": bitext_mb, "text_mb": corpus_mb},
        "quote": {"where": "XY-LENT §4 (Pretraining Data)", "text": QUOTE,
                  "sizes_from": "InfoXLM's Table 8 (its appendix)"},
        "cores": list(CORES), "stages": stages, "not_projected": not_projected, "gpu": _gpu_hours(results),
        "totals": {"core_hours": sum(s["core_hours"] for s in stages.values()),
                   "peak_disk_tb": max(s["peak_disk_tb"] for s in stages.values())}}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=str(harness.RESULTS), help="where scaling.json is")
    ap.add_argument("--out", default=None, help="where data_cost.json goes (default: --results)")
    args = ap.parse_args(argv)
    if QUOTE not in " ".join(XY_LENT.read_text().split()):
        sys.exit(f"data_cost: {XY_LENT} no longer says {QUOTE!r}")
    payload = project(Path(args.results))
    harness.write_result(RESULT, payload, argparse.Namespace(out=args.out or args.results, quick=False,
                                                             repeats=None, warmup=None))
    return payload


# ---------------------------------------------------------------- docs/records/benchmarks.md (benchmarks/render.py)

def _tb(x: float) -> str:
    return f"{harness.num(x)} TB" if x >= 1 else f"{harness.num(x * 1000)} GB"


def markdown(result: dict) -> str:
    c, src = result["corpus"], result["source"]
    bpw = c["bytes_per_word"]
    rows = []
    for stage, s in result["stages"].items():
        rows.append([f"`{stage}`", harness.num(s["mb_per_s_per_core"]), f"{s['time_slope']:.2f}",
                     harness.num(round(s["core_hours"])),
                     *[harness.num(s["wall_hours"][str(n)]) for n in result["cores"]],
                     _tb(s["output_tb"]), _tb(s["peak_disk_tb"])])
    for stage in result["not_projected"]:
        rows.append([f"`{stage}`", "–", "–", "not projected", *["–" for _ in result["cores"]], "–", "–"])
    total = result["totals"]
    rows.append(["**the four**", "", "", f"**{harness.num(round(total['core_hours']))}**",
                 *[f"**{harness.num(total['core_hours'] / n)}**" for n in result["cores"]], "", ""])
    out = [
        f"The corpus XY-LENT pretrains on (\"{result['quote']['text']}\", {result['quote']['where']}): "
        f"CC-100 at the per-language sizes of Chi et al.'s reconstruction, {result['quote']['sizes_from']}: "
        f"{c['cc100_languages']} "
        f"languages (the table as our copy of the paper holds it; its prose says 94), {harness.num(c['cc100_gb'])} GB, the largest {c['cc100_largest']} at "
        f"{harness.num(c['cc100_largest_gb'])} GB; and all {harness.num(c['ccmatrix_language_pairs'])} pairs of "
        f"languages of CCMatrix v1 (XY-LENT used 1 015 of them, unnamed: an upper bound), {harness.num(c['ccmatrix_pairs'] / 1e9)} G sentence pairs and "
        f"{harness.num(c['ccmatrix_words'] / 1e9)} G words of both sides (../shared/data/ccmatrix_v1_pairs.tsv), "
        f"{_tb(c['bitext_mb'] / 1e6)} of text at {harness.num(bpw['median'])} UTF-8 bytes per word (the median "
        f"over {bpw['languages']} languages' Django catalogs, {harness.num(bpw['min'])}–{harness.num(bpw['max'])}): "
        f"{_tb(c['text_mb'] / 1e6)} of text in all.",
        f"Each stage's cost is its core-seconds per MB of text at the scaling run's largest size "
        f"({harness.num(src['text_mb'])} MB, {src['threads']} threads, {src['cpu'] or 'this machine'}, "
        f"{src['scaling_date'][:10]}) times that text: linear, which holds while the stage's measured time slope "
        "(beside it) stays at or under 1, an extrapolation of thousands of times the text measured. Hours on N "
        "cores assume the work spreads over all N, which the cluster benchmark measures at 2 workers only (and "
        "dedup's resolve is one task per language); download's rate is loopback's, where a real one waits on "
        "the network:",
        harness.table(["stage", "MB/s per core", "time slope", "core-hours",
                       *[f"hours on {n} cores" for n in result["cores"]], "output", "peak disk"], rows),
        "\n".join(f"- `{stage}` is not projected: {why}." for stage, why in result["not_projected"].items()),
    ]
    if result["gpu"]:
        gpu = "; ".join(f"{g['budget']} {harness.num(round(g['gpu_hours'][0]))}–{harness.num(round(g['gpu_hours'][1]))} "
                        f"GPU-hours ({g['device']}, V = {harness.num(g['vocab_size'])})" for g in result["gpu"])
        out.append(f"Beside pretraining at xylent's measured speed (the projection above: {gpu}), the four "
                   f"stages' {harness.num(round(total['core_hours']))} core-hours are CPU time on another machine: "
                   "they run once per corpus, before the first step.")
    return "\n\n".join(out)


def provenance(result: dict) -> str:
    git = result.get("environment", {}).get("git", {})
    commit = (git.get("commit") or "unknown")[:10] + (" + local changes" if git.get("dirty") else "")
    return (f"*Computed {result.get('date', '?')[:10]} by `data_cost.py` (commit {commit}; no timing of its own) "
            f"from benchmarks/results/scaling.json of {result['source']['scaling_date'][:10]}, InfoXLM's Table 8 and "
            f"CCMatrix v1's pair table; file `benchmarks/results/{RESULT}.json`.*")


if __name__ == "__main__":
    main()
