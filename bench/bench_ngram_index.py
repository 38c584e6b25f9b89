"""pytest-benchmark: ``pytest bench/bench_ngram_index.py`` (see bench/conftest.py)."""

import pytest

from bench import cases_ngram_index as cases
from bench.conftest import case_params


@pytest.mark.parametrize(("spec", "impl"), case_params(cases))
def test_ngram_index(run_case, spec, impl):
    run_case(cases, spec, impl)
