#!/usr/bin/env bash
# The GPU benchmark in one call (launch/gpu_bench.py says what it measures), for a lent GPU
# machine without network: installs the wheel set carried beside the tree (.whl/, built here by
# `python -m launch.gpu_wheels --out=.whl`) if there is one, then runs every part into one JSON.
#
#   bash launch/gpu_bench.sh --out=gpu_bench.json [--seconds=20]
#   JAX_PLATFORMS=cpu bash launch/gpu_bench.sh --small --out=small.json   # CPU, a few minutes
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d .whl ] && ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export EBRL_JAX_CACHE="${EBRL_JAX_CACHE:-/tmp/ebrl_jax_cache}"
exec python3 -m launch.gpu_bench "$@"
