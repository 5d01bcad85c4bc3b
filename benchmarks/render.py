"""Write the measured parts of docs/records/benchmarks.md from benchmarks/results/*.json.

Every benchmark script exposes `markdown(result: dict) -> str`; its output
replaces the block between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` in
the doc. Text outside the blocks is prose without figures, so no number in the
doc is typed by hand. Scripts with `plots(result, folder)` also redraw their
figures into docs/img/benchmarks/.

    python benchmarks/render.py            # rewrite the blocks (and plots)
    python benchmarks/render.py --check    # exit 1 when the doc is out of sync with the JSON (CI)
    python benchmarks/render.py --results benchmarks/results/quick --only dedup   # one block, to stdout
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

import harness  # noqa: E402

DOC = ROOT / "docs" / "records" / "benchmarks.md"
IMG = ROOT / "docs" / "img" / "benchmarks"
# the order of the doc; each is benchmarks/<name>.py writing results/<name>.json
BENCHMARKS = ("prepare_throughput", "dedup", "vocab", "sampling", "shards", "scaling", "cluster",
              "pretrain", "evaluate", "audit", "finetune", "overhead")
# results brought back from a lent machine (benchmarks/gpu_results.py): rendered the same way, never smoke-run here
DEVICE_RESULTS = ("gpu_results",)
# computed from other results, no timing of their own (projection.py: GPU-hours from the GPU rows; data_cost.py:
# the real corpus's core-hours from the scaling run)
DERIVED = ("projection", "data_cost")
BLOCK = re.compile(r"(<!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.S)


def render_block(name: str, results: Path) -> str:
    result = harness.load_result(name, results)
    if result is None:
        return (f"*No result yet: run `python benchmarks/{name}.py` "
                f"(writes `benchmarks/results/{name}.json`), then `python benchmarks/render.py`.*\n")
    module = importlib.import_module(name)
    body = module.markdown(result).rstrip("\n")
    return f"{body}\n\n{getattr(module, 'provenance', harness.provenance)(result)}\n"


def render(text: str, results: Path, *, doc_name: str = "docs/records/benchmarks.md") -> str:
    seen = set()

    def sub(m: re.Match) -> str:
        seen.add(m["name"])
        if m["name"] not in BENCHMARKS + DEVICE_RESULTS + DERIVED:
            raise SystemExit(f"{doc_name}: block bench:{m['name']} names no benchmark "
                             f"(known: {', '.join(BENCHMARKS + DEVICE_RESULTS + DERIVED)})")
        return m.group(1) + render_block(m["name"], results) + m.group(4)

    out = BLOCK.sub(sub, text)
    missing = [b for b in BENCHMARKS + DEVICE_RESULTS + DERIVED if b not in seen]
    if missing:
        raise SystemExit(f"{doc_name}: no generated block for {', '.join(missing)}; add "
                         + " ".join(f"'<!-- bench:{b} -->' '<!-- /bench:{b} -->'" for b in missing))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the doc differs from what the JSON gives")
    ap.add_argument("--results", default=str(harness.RESULTS))
    ap.add_argument("--doc", default=str(DOC), help="the doc to rewrite (its blocks are read from --template)")
    ap.add_argument("--template", default=None, help="read the doc from here (default: --doc itself)")
    ap.add_argument("--only", default=None, metavar="NAME", help="print one benchmark's block to stdout and stop")
    args = ap.parse_args(argv)
    if args.only:
        print(render_block(args.only, Path(args.results)))
        return 0
    doc = Path(args.doc)
    template = Path(args.template) if args.template else doc
    text = template.read_text()
    new = render(text, Path(args.results), doc_name=str(template))
    if args.check:
        if new != text:
            diff = "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                str(doc), "rendered from JSON", n=1))
            print(f"{doc} is out of sync with {args.results}: run `python benchmarks/render.py`\n{diff[:6000]}")
            return 1
        print(f"{doc} is in sync with {args.results}")
        return 0
    doc.write_text(new)
    for name in BENCHMARKS:
        result = harness.load_result(name, Path(args.results))
        module = importlib.import_module(name) if result is not None else None
        if module is not None and hasattr(module, "plots"):
            folder = IMG if doc == DOC else doc.parent / "img"
            for p in module.plots(result, folder):
                print(f"drew {p}")
    print(f"wrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
