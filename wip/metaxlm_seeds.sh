#!/bin/bash
# (wip) the MetaXLM part of `make recipes` with this branch's code into /work/main/workspace (seed 0's phase 1 was forced once, 2026-11-28, to register per seed; a rerun resumes from the cached stages)
# MetaXLM per seed with the branch's code, into the recipes' workspace (the demo data stages per seed are cached there)
cd "$(dirname "$0")/.."; here=$(pwd)
X="env PYTHONPATH=$here /work/main/.venv/bin/python -m flows.kit.cli"
WS=/work/main/workspace
for s in 0 1 2; do
  echo "== seed $s $(date +%T)"
  $X run pretrain --spec data_specs/recipes/metaxlm-phase1.yaml --workspace $WS --set seed=$s \
    --set pretrain.register_name=xylent-metaxlm-phase1-seed$s || exit 1
  echo "== seed $s phase2 $(date +%T)"
  $X run evaluate --spec data_specs/recipes/metaxlm-phase2.yaml --workspace $WS --set seed=$s \
    --set pretrain.init.from=models:/xylent-metaxlm-phase1-seed$s/latest || exit 1
  echo "== seed $s scratch $(date +%T)"
  $X run evaluate --spec data_specs/recipes/metaxlm-scratch.yaml --workspace $WS --set seed=$s || exit 1
done
echo "== compare $(date +%T)"
$X compare --spec data_specs/recipes/metaxlm-scratch.yaml --spec data_specs/recipes/metaxlm-phase2.yaml \
  --set 'pretrain.init.from=models:/xylent-metaxlm-phase1-seed{seed}/latest' --workspace $WS --seeds 0 1 2 \
  --claim metaxlm-phase2:metaxlm-scratch --out docs/recipes-scorecard-metaxlm.md
echo "== done $(date +%T) rc $?"
