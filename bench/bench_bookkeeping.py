"""pytest-benchmark: ``pytest bench/bench_bookkeeping.py`` (see bench/conftest.py)."""

import pytest

from bench import cases_bookkeeping as cases
from bench.conftest import case_params


@pytest.mark.parametrize(("spec", "impl"), case_params(cases))
def test_bookkeeping(run_case, spec, impl):
    run_case(cases, spec, impl)
