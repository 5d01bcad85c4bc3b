#!/bin/bash
# The planted claim at fixed audit.baseline_every N (docs/stages/audit.md, "Cost"): seeds 0-2 of
# tests/audit_planted.py through the CLI, then the ranks of copy / hub / shuffled by w_final.
#   bash wip/planted_every.sh OUT N [N ...]      # ~9 min an audit on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "$1"); shift
mkdir -p "$out"
for n in "$@"; do
  for seed in 0 1 2; do
    c=$out/corpus-$seed
    [ -f "$c/spec.yaml" ] || .venv/bin/python -c "import sys; sys.path[:0] = ['tests']; from pathlib import Path; \
from audit_planted import write_corpus; write_corpus(Path('$c'), seed=$seed)"
    .venv/bin/xylent run audit --spec "$c/spec.yaml" --workspace "$out/ws-$seed" --json \
      --set audit.baseline_every="$n" > "$out/N$n-s$seed.json"
  done
done
.venv/bin/python - "$out" <<'PY'
import json, sys
from pathlib import Path
sys.path[:0] = [".", "tests"]
from audit_planted import PLANTED
from tasks.audit.contract import read_audit
noisy, copy, hub = (f"{min('en', x)}-{max('en', x)}" for x in (PLANTED["noisy"], PLANTED["copy"], PLANTED["hub"]))
for f in sorted(Path(sys.argv[1]).glob("N*-s*.json")):
    t = read_audit(Path(json.loads(f.read_text())["stages"]["audit"]["output_dir"]))
    r, w = dict(zip(t["pair"], t["rank_up"])), dict(zip(t["pair"], t["w_final"]))
    clean = [p for p in t["pair"] if p not in (noisy, copy, hub)]
    held = r[copy] >= t.height - 1 and r[hub] > t.height // 2 and r[noisy] <= 3 and all(r[noisy] < r[p] for p in clean)
    print(f"{f.stem}: copy / hub / shuffled {r[copy]} / {r[hub]} / {r[noisy]} of {t.height}; "
          f"shuffled {w[noisy]:.2f} vs best clean {max(w[p] for p in clean):.2f}; bar {'held' if held else 'missed'}")
PY
