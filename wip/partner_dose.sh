#!/bin/bash
# The partner baseline's dose-response on the planted corpus (issue 34), after both wip patches are applied:
#   bash wip/partner_dose.sh OUT [SEED] [BASELINE] [--set KEY=VALUE ...]   (about 6 min an audit on 2 cores)
# e.g. a held-out sample 10x the default's: bash wip/partner_dose.sh OUT 0 heldout-larger --set audit.holdout=0.2
# then: .venv/bin/python wip/partner_dose.py OUT
set -e
out=$1; seed=${2:-0}; baseline=${3:-partner-larger}; shift $(( $# < 3 ? $# : 3 ))
mkdir -p "$out"
for d in 0.0 0.25 0.5 1.0; do
  spec=$(.venv/bin/python -c "import sys; sys.path.insert(0, 'tests'); from pathlib import Path
from audit_planted import write_corpus; print(write_corpus(Path('$out/corpus-$seed-$d'), seed=$seed, shuffled=$d))")
  .venv/bin/xylent run audit --spec "$spec" --workspace "$out/ws-$seed-$d" --json \
    --set audit.baseline="$baseline" "$@" > "$out/out-$baseline-$seed-$d.json"
done
