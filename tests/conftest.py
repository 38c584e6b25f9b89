"""Test set-up: run the Triton kernels on the CPU when there is no CUDA device.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a kernel, so it must be set
before ``specdec_kernels`` is imported; this file is imported by pytest first.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import hypothesis  # noqa: E402
import pytest  # noqa: E402

import specdec_kernels  # noqa: E402, F401

hypothesis.settings.register_profile(
    "ci", deadline=None, derandomize=True, max_examples=40, print_blob=True
)
hypothesis.settings.register_profile("dev", deadline=None, max_examples=40)
hypothesis.settings.load_profile("ci" if os.environ.get("CI") else "dev")

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture
def kernel_device():
    """Device the Triton launchers run on: CUDA if present, else CPU under the interpreter."""
    return torch.device("cuda") if HAS_CUDA else torch.device("cpu")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (bench/gpu_check.sh runs these)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
