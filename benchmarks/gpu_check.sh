#!/usr/bin/env bash
# The one command on a lent GPU machine (issue 37; benchmarks/gpu_check.py says what it measures):
#
#   benchmarks/gpu_check.sh OUT [--minutes 1.5] [--toy] [--skip-bench]   (≤ 9 min in all on a lent GPU)
#
# Installs the bundle's wheels (make gpu-bundle, carried as .gpu-bundle) into a private
# folder where DeepSpeed is missing, puts it first on PYTHONPATH and PATH (the ranks inherit both), then runs the check.
# PYTHON picks the interpreter (default python3, the GPU image's torch); XYLENT_GPU_BUNDLE
# another bundle.
set -euo pipefail
out=${1:?usage: benchmarks/gpu_check.sh OUT [--minutes M] [--toy] [--skip-bench]}
shift
here=$(cd "$(dirname "$0")/.." && pwd)
bundle=${XYLENT_GPU_BUNDLE:-$here/.gpu-bundle}
py=${PYTHON:-python3}
# the wheels are for the GPU image (Python 3.12, no DeepSpeed); where DeepSpeed is installed (here) they are not needed
if compgen -G "$bundle/wheels/*.whl" > /dev/null && ! "$py" -c "import deepspeed" > /dev/null 2>&1; then
    site=$(mktemp -d)/site
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$bundle"/wheels/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH"
fi
export PYTHONUNBUFFERED=1
exec "$py" "$here/benchmarks/gpu_check.py" "$out" --bundle "$bundle" "$@"
