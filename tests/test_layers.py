"""The layer rules of ``docs/design.md``: which part of the code may import which.

Read from the source with ``ast`` (nothing is imported), so a forbidden import fails here
even when it happens to work on this machine (e.g. ``ops/`` importing Triton, which breaks
CPU-only installs).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = "specdec_kernels"

# layer -> the package-internal modules (prefixes) it may import; third-party rules below.
ALLOWED = {
    "constants": (),
    "reference": ("specdec_kernels.constants", "specdec_kernels.reference"),
    "cpu": ("specdec_kernels.constants", "specdec_kernels.cpu"),
    "kernels": ("specdec_kernels.constants", "specdec_kernels.kernels"),
    "ops": ("specdec_kernels.constants", "specdec_kernels.cpu", "specdec_kernels.ops"),
    "integrations": (
        "specdec_kernels.constants",
        "specdec_kernels.ops",
        "specdec_kernels.integrations",
    ),
    "examples": ("specdec_kernels.ops", "specdec_kernels.constants", "examples"),
}
# Third-party modules a layer must never import (at module level or inside a function).
FORBIDDEN = {
    "constants": ("torch", "triton"),
    "reference": ("triton",),
    "cpu": ("triton",),
    "ops": ("triton",),
    "integrations": ("triton",),
}


def _layer(path: Path) -> str | None:
    rel = path.relative_to(ROOT).parts
    if rel[0] == "ops":
        return "ops"
    if rel[0] == "examples":
        return "examples"
    if rel[0] == PKG and len(rel) > 2:
        return rel[1]
    if rel[0] == PKG and rel[1] == "constants.py":
        return "constants"
    return None  # the package's __init__ (it imports ops to register them)


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # "from specdec_kernels import cpu" imports the subpackage specdec_kernels.cpu
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names


def _files():
    for top in (PKG, "ops", "examples"):
        yield from sorted((ROOT / top).rglob("*.py"))


@pytest.mark.parametrize("path", list(_files()), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_layer_rules(path):
    layer = _layer(path)
    if layer is None:
        return
    own = ALLOWED[layer]
    for name in _imports(path):
        if name.startswith((PKG + ".", "examples.")) and not name.startswith(f"{PKG}.__version__"):
            assert name.startswith(own), f"{layer} may not import {name}"
        top = name.split(".")[0]
        assert top not in FORBIDDEN.get(layer, ()), f"{layer} may not import {top}"


def test_the_layer_checker_sees_a_forbidden_import(tmp_path, monkeypatch):
    # The rule above must be able to fail: an ops module importing a kernel is caught.
    bad = ROOT / "ops" / "_layer_probe.py"
    fake = tmp_path / "probe.py"
    fake.write_text("from specdec_kernels.kernels import ngram\n")
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: fake.open().read())
    with pytest.raises(AssertionError, match="ops may not import specdec_kernels.kernels"):
        test_imports_follow_the_layer_rules(bad)


# ---------------------------------------------------------------- module size

MAX_MODULE_LINES = 400
PRODUCT = (PKG, "ops", "examples", "bench")
"""The product's code (tests excluded): what a reader of the library meets."""


def long_modules(root: Path, tops=PRODUCT, limit: int = MAX_MODULE_LINES) -> list[str]:
    """The ``.py`` files under ``root/<top>`` with more than ``limit`` lines."""
    out = []
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            n = len(path.read_text().splitlines())
            if n > limit:
                out.append(f"{path.relative_to(root)}: {n} lines")
    return out


def test_no_product_module_is_over_400_lines():
    too_long = long_modules(ROOT)
    assert not too_long, f"split these by what they hold (<= {MAX_MODULE_LINES} lines): {too_long}"


def test_the_size_check_sees_a_long_module(tmp_path):
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    assert long_modules(tmp_path) == []
    (tmp_path / "ops" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert long_modules(tmp_path) == [f"ops/long.py: {MAX_MODULE_LINES + 1} lines"]
