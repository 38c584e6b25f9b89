"""pytest-benchmark: ``pytest bench/bench_draft_plan.py`` (see bench/conftest.py)."""

import pytest

from bench import cases_draft_plan as cases
from bench.conftest import case_params


@pytest.mark.parametrize(("spec", "impl"), case_params(cases))
def test_draft_plan(run_case, spec, impl):
    run_case(cases, spec, impl)
