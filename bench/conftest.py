"""pytest-benchmark set-up for ``bench/bench_*.py``.

Run with ``pytest bench/bench_ngram.py`` (files named on the command line are collected
whatever their name) or ``pytest bench -o python_files='bench_*.py'``; ``BENCH_QUICK=1``
selects the tiny shapes. Each case is built and checked once (outputs of every
implementation compared) before any of its implementations is timed.
"""

from __future__ import annotations

import os

import pytest

from bench.harness import OP

QUICK = os.environ.get("BENCH_QUICK") == "1"


def case_params(module) -> list:
    """``pytest.param(spec, impl)`` for every case of ``module``, case-major."""
    specs = module.QUICK_SPECS if QUICK else module.SPECS
    out = []
    for spec in specs:
        label = "-".join(str(v) if k == "op" else f"{k}{v}" for k, v in spec.items())
        for impl in (OP, *module.BASELINES):
            out.append(pytest.param(spec, impl, id=f"{label}-{impl}"))
    return out


class _CaseCache:
    """Keeps the last built (and checked) case, so big inputs are built once per spec."""

    def __init__(self):
        self.key = None
        self.case = None

    def get(self, module, spec):
        key = (module.__name__, tuple(spec.items()))
        if key != self.key:
            self.key, self.case = None, None  # free the previous inputs first
            case = module.build(spec)
            case.note = case.check()
            self.key, self.case = key, case
        return self.case


_CACHE = _CaseCache()


@pytest.fixture
def run_case(benchmark):
    """``run_case(module, spec, impl)``: check the case (once), then time ``impl``."""

    def run(module, spec, impl):
        case = _CACHE.get(module, spec)
        if impl not in case.impls or impl in case.untimed:
            pytest.skip(f"{impl} is not run at this shape")
        benchmark.group = f"{case.op} {case.label}"
        benchmark.extra_info["bytes_moved"] = case.bytes_moved
        benchmark.extra_info["check"] = case.note
        fn = case.impls[impl]
        if case.setup is None:
            benchmark(fn)
        else:
            benchmark.pedantic(fn, setup=case.setup, rounds=50, warmup_rounds=2)
        stats = benchmark.stats.stats if benchmark.stats else None
        if stats is not None:
            benchmark.extra_info["GB/s"] = round(case.bytes_moved / stats.median / 1e9, 3)

    return run
