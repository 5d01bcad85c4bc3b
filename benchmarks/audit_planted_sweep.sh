#!/bin/bash
# The planted-audit claim at fixed audit.baseline_every N (docs/stages/audit.md, "Cost"): the planted
# corpora of seeds 0-2 (tests/audit_planted.py) audited through the CLI at each N, then the ranks of
# copy / hub / shuffled by w_final, read by the acceptance test's own bar
# (tests/acceptance/test_planted_audit.py::bar). The accuracy side of benchmarks/audit.py's overhead sweep.
#   bash benchmarks/audit_planted_sweep.sh OUT N [N ...]                        # ~9 min an audit on 2 cores
#   SET='audit.language_every=4' bash benchmarks/audit_planted_sweep.sh OUT 1   # more overrides (KEY=VALUE ...)
#   bash benchmarks/audit_planted_sweep.sh OUT                                  # only read what OUT holds
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "$1"); shift
mkdir -p "$out"
for n in "$@"; do
  for seed in 0 1 2; do
    c=$out/corpus-$seed
    [ -f "$c/spec.yaml" ] || .venv/bin/python -c "from pathlib import Path; \
from tests.audit_planted import write_corpus; write_corpus(Path('$c'), seed=$seed)"
    .venv/bin/xylent run audit --spec "$c/spec.yaml" --workspace "$out/ws-$seed" --json \
      --set audit.baseline_every="$n" ${SET:+$(printf -- ' --set %s' $SET)} > "$out/N$n-s$seed.json"
  done
done
# tests/ on the path as pytest puts it: the acceptance test imports tests/audit_planted.py by its bare name
PYTHONPATH=tests .venv/bin/python - "$out" <<'PY'
import json, sys
from pathlib import Path
from xylent.tasks.audit.contract import read_audit
from tests.acceptance.test_planted_audit import COPY, HUB, NOISY, bar
for f in sorted(Path(sys.argv[1]).glob("N*-s*.json")):
    t = read_audit(Path(json.loads(f.read_text())["stages"]["audit"]["output_dir"]))
    r, w = dict(zip(t["pair"], t["rank_up"])), dict(zip(t["pair"], t["w_final"]))
    best_clean = max(w[p] for p in t["pair"] if p not in (NOISY, COPY, HUB))
    print(f"{f.stem}: copy / hub / shuffled {r[COPY]} / {r[HUB]} / {r[NOISY]} of {t.height}; "
          f"shuffled {w[NOISY]:.2f} vs best clean {best_clean:.2f}; bar {'held' if all(bar(t)) else 'missed'}")
PY
