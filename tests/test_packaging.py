"""The package and its op layer come from the same tree, installed or not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import specdec_kernels
import specdec_kernels.ops

ROOT = Path(__file__).resolve().parent.parent


def test_ops_come_from_the_same_tree_as_the_package():
    pkg = Path(specdec_kernels.__file__).resolve().parent
    ops = Path(specdec_kernels.ops.__file__).resolve().parent
    assert ops in (pkg / "ops", pkg.parent / "ops")


def test_source_copy_imports_without_installing(tmp_path):
    # A copy of the tree that nothing installed (e.g. the GPU machine's working tree) must
    # import its own ops/, not the installed one.
    copy = tmp_path / "tree"
    for name in ("specdec_kernels", "ops"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    code = "import specdec_kernels.ops as o; print(o.__file__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=copy, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert Path(out.stdout.strip()).resolve() == (copy / "ops" / "__init__.py").resolve()
