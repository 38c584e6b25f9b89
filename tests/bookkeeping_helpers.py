"""What the bookkeeping families' tests share (tests/test_commit.py,
tests/test_verify_inputs.py): the implementations compared, where the Triton launchers
run, and small tensor helpers."""

from __future__ import annotations

import torch

HAS_CUDA = torch.cuda.is_available()
I32, I64 = torch.int32, torch.int64
IMPLS = ("reference", "cpu", "triton")
ALL = (*IMPLS, "public")

# Where the Triton launchers run: CUDA on a GPU machine, else the CPU (interpreter).
KERNEL_DEVICE = "cuda" if HAS_CUDA else "cpu"


def _i32(x):
    return torch.tensor(x, dtype=I32)


def _to(t, device):
    return None if t is None else t.to(device)


def _cpu(out):
    return tuple(o.cpu() for o in out)
