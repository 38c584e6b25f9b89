"""Microbenchmarks for specdec-kernels: each op against what a user would otherwise run.

``python -m bench`` runs the CPU suite and writes ``bench/results/<date>-<machine>.md`` and a
plot; ``bash bench/gpu_check.sh`` runs the GPU tests and timings on a CUDA machine;
``pytest bench/bench_ngram.py`` (and the other ``bench_*.py`` files) run the same cases
under pytest-benchmark. See ``bench/README.md``.
"""
