#!/usr/bin/env bash
# GPU check for specdec-kernels: the GPU tests, then the GPU timings (bench/gpu.py).
#
#   bash bench/gpu_check.sh            # from anywhere; uses .venv/bin/python if present
#   PYTHON=python3 bash bench/gpu_check.sh
#
# Installs nothing and needs no network (test tools come from a carried .wheelhouse/). Whole script < 5 minutes on one GPU: every stage
# has its own time limit (seconds, overridable), so a slow stage cannot eat the others:
#   GPU_TESTS_TIMEOUT (default 60):     pytest -m gpu (tests that need CUDA)
#   KERNEL_TESTS_TIMEOUT (default 120): the kernel-vs-reference tests, now on CUDA
#                                       (pytest -m "not slow and not model"; stops after
#                                       KERNEL_TESTS_MAXFAIL failures, default 20)
#   BENCH_TIMEOUT (default 100):        python -m bench.gpu (writes bench/results/<date>-<gpu>.md)
#   OVERHEAD_TIMEOUT (default 45):      python -m bench.overhead --device cuda, the host's cost
#                                       of one call per op with real launches
#                                       (writes bench/results/<date>-overhead-<gpu>.md)
# Extra arguments are passed to bench.gpu (e.g. --quick, --only ngram).
# Exit status: 0 if every stage passed, else the first failing stage's status.
set -u -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: no CUDA device visible to $PY; nothing to do" >&2
    exit 2
fi
"$PY" -c 'import torch, triton; print("torch", torch.__version__, "| triton", triton.__version__,
      "| CUDA", torch.version.cuda, "|", torch.cuda.get_device_name())'
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader

# The test tools, if this machine lacks them: pure-Python wheels from .wheelhouse/ (made
# here by `make gpu-wheelhouse` and carried with the working tree), unpacked into a
# temporary folder on PYTHONPATH. Nothing is installed into the machine's Python.
if ! "$PY" -c 'import pytest, hypothesis' 2>/dev/null; then
    if ls .wheelhouse/*.whl >/dev/null 2>&1; then
        site=$(mktemp -d)
        "$PY" -c 'import glob, sys, zipfile
for w in glob.glob(".wheelhouse/*.whl"):
    zipfile.ZipFile(w).extractall(sys.argv[1])' "$site"
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
        echo "gpu_check: pytest/hypothesis from .wheelhouse (unpacked in $site)"
    else
        echo "gpu_check: pytest or hypothesis missing and no .wheelhouse/ (run make gpu-wheelhouse and carry it)" >&2
    fi
fi

# The kernels must run compiled, not interpreted.
unset TRITON_INTERPRET
XDIST=()
if "$PY" -c 'import xdist' 2>/dev/null; then XDIST=(-n "${XDIST_WORKERS:-8}"); fi

status=0
stage() {  # stage NAME TIMEOUT CMD...
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s): $*"
    local t0=$SECONDS
    timeout --signal=INT --kill-after=10 "$limit" "$@"
    local rc=$?
    if [ $rc -eq 5 ] && [ "$name" = "gpu-tests" ]; then rc=0; fi  # pytest: no tests collected
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
    if [ $rc -ne 0 ] && [ $status -eq 0 ]; then status=$rc; fi
}

stage gpu-tests "${GPU_TESTS_TIMEOUT:-60}" \
    "$PY" -m pytest -m gpu -q -p no:cacheprovider tests
stage kernel-tests "${KERNEL_TESTS_TIMEOUT:-120}" \
    "$PY" -m pytest -m "not slow and not model and not gpu" -q -rf \
    --maxfail="${KERNEL_TESTS_MAXFAIL:-20}" -p no:cacheprovider ${XDIST[@]+"${XDIST[@]}"} tests
stage timings "${BENCH_TIMEOUT:-100}" \
    "$PY" -m bench.gpu "$@"
stage overhead "${OVERHEAD_TIMEOUT:-45}" \
    "$PY" -m bench.overhead --device cuda --rounds 200 --repeats 5

echo "gpu_check: done, exit $status (results in bench/results/)"
exit $status
