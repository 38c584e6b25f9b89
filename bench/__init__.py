"""Microbenchmarks for specdec-kernels: each op against what a user would otherwise run.

``python -m bench`` runs the CPU suite and writes ``bench/results/<date>-<machine>.md`` and a
plot; ``bash bench/gpu_check.sh`` runs the GPU tests and timings on a CUDA machine;
``pytest bench/bench_ngram.py`` (and the other ``bench_*.py`` files) run the same cases
under pytest-benchmark. See ``bench/README.md``.
"""

import os as _os

# numba's OpenMP layer would bring a second OpenMP runtime into a process that already has
# torch's; its own work-queue pool does not. Set before numba is imported (it reads the
# variable then); bench/baselines/ngram_numba.py repeats it for imports from elsewhere.
_os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")
