#!/usr/bin/env bash
# `make test-vllm`: run tests/integrations in a venv that holds vllm==$VLLM_VERSION and the
# torch it pins (a CUDA build, several GB; it imports and runs on a CPU-only machine).
#
# The venv lives outside the clone, under the user cache directory, named after the exact
# pinned versions and the Python minor version, so every clone and CI run on this machine
# reuses it: ${XDG_CACHE_HOME:-~/.cache}/specdec-kernels/venv-vllm-<v>-torch<v>-py<v>
# (override with VLLM_VENV). A marker holding the recipe is written last: a venv without
# it (an interrupted build) or with another recipe is removed and built again. A lock
# file keeps two runs on the same machine from building or installing at the same time.
#
# Each run installs this tree into the venv (editable, --no-deps: pip never touches
# vLLM's torch) and runs `pytest tests/integrations` with TRITON_INTERPRET=1.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}
VLLM_VERSION=${VLLM_VERSION:-0.33.0}
VLLM_TORCH=${VLLM_TORCH:-2.14.0}
PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/specdec-kernels
VENV=${VLLM_VENV:-$CACHE/venv-vllm-$VLLM_VERSION-torch$VLLM_TORCH-py$PYVER}
TOOLS=("pytest>=8" "hypothesis>=6.100" "wheel")
RECIPE="vllm==$VLLM_VERSION torch==$VLLM_TORCH ${TOOLS[*]}"
MARKER=$VENV/.specdec-recipe
PY=$VENV/bin/python

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9

if [ ! -f "$MARKER" ] || [ "$(cat "$MARKER")" != "$RECIPE" ]; then
    echo "test-vllm: building $VENV ($RECIPE)"
    start=$(date +%s)
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$PY" -m pip install -q "vllm==$VLLM_VERSION" "torch==$VLLM_TORCH"
    # the test tools may add packages but not move any version vLLM resolved
    "$PY" -m pip freeze --exclude-editable > "$VENV/vllm-freeze.txt"
    "$PY" -m pip install -q -c "$VENV/vllm-freeze.txt" "${TOOLS[@]}"
    echo "$RECIPE" > "$MARKER"
    echo "test-vllm: venv built in $(($(date +%s) - start)) s"
else
    echo "test-vllm: reusing $VENV"
fi

start=$(date +%s)
"$PY" -m pip install -q --no-deps --no-build-isolation -e "$ROOT"
echo "test-vllm: this tree installed in $(($(date +%s) - start)) s"
"$PY" -c 'import torch, vllm; print(f"test-vllm: vllm {vllm.__version__}, torch {torch.__version__}")'

cd "$ROOT"
if [ "${1:-}" = "--bench" ]; then  # `make bench-vllm`: the proposer benchmark in this venv
    shift
    exec env PYTHONPATH="$ROOT" "$PY" -m bench.vllm_proposer "$@"
fi
export TRITON_INTERPRET=${TRITON_INTERPRET:-1}
# -P: the clone's root is not on sys.path, so a stale specdec_kernels.egg-info there (from
# the main venv's editable install) cannot hide the installed entry points
exec "$PY" -P -m pytest -q -p no:cacheprovider --durations=10 tests/integrations "$@"
