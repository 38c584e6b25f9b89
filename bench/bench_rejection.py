"""pytest-benchmark: ``pytest bench/bench_rejection.py`` (see bench/conftest.py)."""

import pytest

from bench import cases_rejection as cases
from bench.conftest import case_params


@pytest.mark.parametrize(("spec", "impl"), case_params(cases))
def test_rejection(run_case, spec, impl):
    run_case(cases, spec, impl)
