"""The XY-LENT paper's own numbers, for the scorecard to set a run beside.

``xylent_paper.tsv`` (next to this file) is generated, never edited: it is
``shared/data/xylent_paper/tables.tsv`` (Patra et al. 2023, transcribed one number
a row) with a ``source`` column naming the table each row comes from::

    python -m xylent.tasks.evaluate.paper_refs ../shared/data/xylent_paper

Rows: ``table setting band model task lang metric value source``; ``table1`` is
the headline table (``lang = avg``), ``table4`` the transfer gaps (Base),
``table10``..``table14`` the per-language scores of PAWS-X, XNLI, MLQA,
TyDiQA-GoldP and XQuAD.  Scores are on the paper's 0-100 scale.
"""

from __future__ import annotations

import csv
import sys
from functools import lru_cache
from pathlib import Path

from xylent.markdown import score

PAPER_FILE = Path(__file__).with_name("xylent_paper.tsv")
COLUMNS = ("table", "setting", "band", "model", "task", "lang", "metric", "value", "source")
CITATION = "Patra et al. 2023 (arXiv:2210.14867)"
# which per-language table holds each XTREME task (the paper's appendix)
PER_LANGUAGE = {"pawsx": "table10", "xnli": "table11", "mlqa": "table12", "tydiqa": "table13", "xquad": "table14"}
# the run's metric name -> the paper's
METRIC = {"accuracy": "acc", "f1": "f1", "exact_match": "em"}


def _source(table: str) -> str:
    number = table.removeprefix("table")
    return f"{CITATION}, Table {number}"


def build(shared_dir: Path) -> list[dict]:
    """The rows of ``shared_dir/tables.tsv`` with their source."""
    with open(Path(shared_dir) / "tables.tsv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [{**r, "source": _source(r["table"])} for r in rows]


def write(rows: list[dict], path: Path = PAPER_FILE) -> None:
    from xylent.atomic import write_text_atomic

    lines = ["\t".join(COLUMNS)] + ["\t".join(str(r[c]) for c in COLUMNS) for r in rows]
    write_text_atomic(path, "\n".join(lines) + "\n")


@lru_cache(maxsize=1)
def load() -> tuple[dict, ...]:
    """The committed scores, values as floats (Table 11's parameter counts, "580M", stay text)."""
    if not PAPER_FILE.is_file():
        return ()
    with open(PAPER_FILE, newline="", encoding="utf-8") as f:
        return tuple({**r, "value": r["value"] if r["metric"] == "params" else float(r["value"])}
                     for r in csv.DictReader(f, delimiter="\t"))


def table1() -> list[dict]:
    return [r for r in load() if r["table"] == "table1"]


def transfer_gaps(task: str) -> list[dict]:
    return [r for r in load() if r["table"] == "table4" and r["task"] == task]


def per_language(task: str, metric: str) -> list[dict]:
    """Tables 10-14 for an XTREME task, in the paper's metric (``metric`` is the run's name)."""
    table, m = PER_LANGUAGE.get(task), METRIC.get(metric, metric)
    return [r for r in load() if r["table"] == table and r["metric"] == m and r["lang"] != "avg"]


# -- the scorecard's sections ------------------------------------------------------------------------

BANDS = ("Base", "Large", "XL", "XXL")
TABLE1_COLUMNS = (("xquad", "f1"), ("xquad", "em"), ("mlqa", "f1"), ("mlqa", "em"), ("tydiqa", "f1"),
                  ("tydiqa", "em"), ("xnli", "acc"), ("pawsx", "acc"))


def _order(key: tuple) -> tuple:
    setting, band, model = key
    return (setting != "zero-shot", BANDS.index(band) if band in BANDS else len(BANDS), model)


def table1_section() -> list[str]:
    from xylent.markdown import markdown_table

    rows = table1()
    if not rows:
        return []
    by = {}
    for r in rows:
        by.setdefault((r["setting"], r["band"], r["model"]), {})[(r["task"], r["metric"])] = r["value"]
    table = [{"setting": k[0], "band": k[1], "model": k[2],
              **{f"{t} {m}": score(v.get((t, m))) for t, m in TABLE1_COLUMNS}}
             for k, v in sorted(by.items(), key=lambda kv: _order(kv[0]))]
    gaps = {}
    for r in load():
        if r["table"] == "table4":
            gaps.setdefault(r["model"], {})[r["task"]] = r["value"]
    gap_rows = [{"model (Base)": m, **{t: score(v.get(t)) for t in ("xquad", "mlqa", "tydiqa", "xnli", "pawsx")}}
                for m, v in gaps.items()]
    return ["## The XY-LENT paper's numbers", "",
            f"Table 1 of {CITATION} (XY-LENT and XLM-E: medians of five fine-tuning runs; XLM-R from Goyal et al. "
            "2021, mT5 from Xue et al. 2021), averages over each task's languages; every row with its source in "
            "`tasks/evaluate/xylent_paper.tsv`. Full-scale models: the demo is not comparable to them.", "",
            markdown_table(table), "",
            "Table 4, cross-lingual transfer gap (English − the other languages' average; EM for QA; lower is better):",
            "", markdown_table(gap_rows), ""]


def task_section(task: str, xtreme_task: str | None, metric: str, protocol: str, scores: dict) -> list[str]:
    """Tables 10-14's per-language rows of ``xtreme_task`` beside the run's own, and Table 4's
    gap beside the run's."""
    from xylent.markdown import markdown_table

    rows = [r for r in per_language(xtreme_task or "", metric) if r["setting"] == protocol]
    if not rows:
        return []
    models = list(scores["models"])
    paper = {}
    for r in rows:
        paper.setdefault(f"{r['model']} {r['band']} (paper)", {})[r["lang"]] = r["value"]
    langs = sorted({lang for m in models for lang in scores["models"][m][task]["languages"]} |
                   {lang for v in paper.values() for lang in v})
    table = [{"language": lang,
              **{m: score(scores["models"][m][task]["languages"].get(lang, {}).get(metric)) for m in models},
              **{col: score(v.get(lang)) for col, v in paper.items()}} for lang in langs]
    out = [f"{xtreme_task} per language beside the paper's Table {PER_LANGUAGE[xtreme_task].removeprefix('table')} "
           f"({protocol}, {METRIC.get(metric, metric)}; {CITATION}):", "", markdown_table(table), ""]
    gaps = {r["model"]: r["value"] for r in transfer_gaps(xtreme_task)}
    if gaps and protocol == "zero-shot":
        ours = ", ".join(f"{m} {score(scores['models'][m][task].get('transfer_gap'))}" for m in models)
        out += [f"Transfer gap: this run {ours}; the paper's Table 4 (Base) "
                + ", ".join(f"{m} {score(v)}" for m, v in gaps.items()) + ".", ""]
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m xylent.tasks.evaluate.paper_refs SHARED_DIR (the folder holding tables.tsv)",
              file=sys.stderr)
        return 2
    rows = build(Path(argv[0]))
    write(rows)
    print(f"{len(rows)} rows -> {PAPER_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
