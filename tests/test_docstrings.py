"""Every public function's docstring: the sections it must keep, and its Example runs.

docs/design.md holds the contracts; a docstring keeps Parameters / Returns / Raises where
they apply, one short Example that runs on the CPU (checked here with doctest) and a link
to its contract.
"""

from __future__ import annotations

import doctest
import inspect

import pytest
import torch

import specdec_kernels.ops as ops

PUBLIC = [
    name
    for name in ops.__all__
    if inspect.isfunction(getattr(ops, name))  # the ops and constructors, not the NamedTuples
]


@pytest.mark.parametrize("name", PUBLIC)
def test_docstring_links_its_contract_and_keeps_its_sections(name):
    doc = inspect.getdoc(getattr(ops, name))
    assert "docs/design.md" in doc, f"{name}: link the contract in docs/design.md"
    assert "Raises\n------" in doc and "Examples\n--------" in doc, name
    assert len(doc.splitlines()) <= 90, f"{name}: the contract lives in docs/design.md"


@pytest.mark.parametrize("name", PUBLIC)
def test_docstring_example_runs(name):
    fn = getattr(ops, name)
    globs = {"torch": torch, **{n: getattr(ops, n) for n in ops.__all__}}
    tests = doctest.DocTestFinder(recurse=False).find(fn, name, globs=globs)
    assert tests and tests[0].examples, f"{name} has no Example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for t in tests:
        runner.run(t)
    assert runner.failures == 0, f"{name}: its Example does not print what it says"
