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


_WITHOUT_TRITON = r"""
import importlib.abc, sys

class HideTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)")
        return None

sys.meta_path.insert(0, HideTriton())
import torch
import specdec_kernels.ops as ops

assert "triton" not in sys.modules and "specdec_kernels.kernels.rejection" not in sys.modules
t = torch.tensor([[1, 2, 3, 1, 2]], dtype=torch.int32)
n = torch.tensor([5], dtype=torch.int32)
p = ops.ngram_propose(t, n, min_n=1, max_n=2, num_speculative_tokens=2)
logits = torch.zeros((p.draft_token_ids.shape[0] * 3, 5))
cu = torch.tensor([0, 2], dtype=torch.int32)
r = ops.rejection_sample(logits, p.draft_token_ids.flatten(), cu, num_speculative_tokens=2)
v = ops.prepare_verify_inputs(t, n, p.draft_token_ids, p.num_draft_tokens, None,
                              max_model_len=8)
c = ops.commit_accepted_tokens(torch.zeros((1, 8), dtype=torch.int32), n.clone(),
                               r.output_token_ids, r.num_emitted, max_model_len=8)
assert "triton" not in sys.modules
print("cpu path ok", p.draft_token_ids.tolist(), int(c.num_committed[0]))
"""


def test_cpu_path_imports_and_runs_without_triton():
    # macOS and CPU-only users have no Triton wheel: the package must import and run its
    # CPU path without it (the Triton launchers load at the first CUDA tensor).
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TRITON], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "cpu path ok [[3, 1]]" in out.stdout


def test_sdist_carries_what_its_tests_need(tmp_path):
    # An unpacked sdist must be able to run its own test-suite: tests/ imports bench/ and
    # examples/, and the docs the code points to must be there too.
    code = f"import sys, setuptools.build_meta as m; print(m.build_sdist({str(tmp_path)!r}))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    import tarfile

    with tarfile.open(tmp_path / out.stdout.strip().splitlines()[-1]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for need in (
        "tests/conftest.py",
        "tests/test_ngram.py",
        "bench/harness.py",
        "bench/gpu_check.sh",
        "examples/engine/engine.py",
        "examples/engine/prompts.json",
        "ops/_library.py",
        "specdec_kernels/py.typed",
        "docs/design.md",
        "LICENSE",
    ):
        assert need in names, need
