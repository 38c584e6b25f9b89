"""Every public function's docstring: the sections it must keep, and its Example runs.

docs/design.md holds the contracts; a docstring keeps Parameters / Returns / Raises where
they apply, one short Example that runs on the CPU (checked here with doctest) and a link
to its contract.
"""

from __future__ import annotations

import doctest
import inspect
import re
from pathlib import Path

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


ROOT = Path(__file__).resolve().parents[1]
DESIGN = (ROOT / "docs" / "design.md").read_text()
HEADINGS = [
    line.lstrip("#").strip().replace("`", "")
    for line in DESIGN.splitlines()
    if line.startswith("#")
]


@pytest.mark.parametrize("name", PUBLIC)
def test_the_contract_a_docstring_links_is_a_section_of_the_design(name):
    doc = " ".join(inspect.getdoc(getattr(ops, name)).split())
    sections = re.findall(r'``docs/design\.md``, "([^"]+)"', doc)
    assert sections, f"{name}: say which section of docs/design.md holds its contract"
    for section in sections:
        section = section.replace("`", "")
        assert any(section in h for h in HEADINGS), f"{name}: no section {section!r}"


def test_every_file_the_code_and_docs_cite_exists():
    # a citation of a document or module that is not there is a stale contract
    cited = re.compile(
        r"\b((?:docs|bench|examples|tests|ops|specdec_kernels)/[\w/.-]+\.(?:md|py|sh))"
    )
    missing = []
    for path in [*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md")] + [
        p for top in ("specdec_kernels", "ops", "examples", "bench")
        for p in (ROOT / top).rglob("*.py")
    ]:  # fmt: skip
        if "results" in path.parts:
            continue  # past runs cite what existed then
        for ref in cited.findall(path.read_text()):
            if not (ROOT / ref).exists() and "<" not in ref:
                missing.append(f"{path.relative_to(ROOT)}: {ref}")
    assert not missing, "\n".join(missing)
