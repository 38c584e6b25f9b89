"""Allocation of the large, randomly probed tables (the n-gram indexes).

An own-history index of 256 rows x 128k tokens is a 2 GiB table probed at random; on a CPU
with 4 KiB pages nearly every probe also misses the TLB, which made a step at 128k tokens
~2x the step at 1k although the work is the same. Backing the table with transparent huge
pages (2 MiB) removes most of those misses: ``full`` asks the kernel for them with
``madvise(MADV_HUGEPAGE)`` before the first touch, which is what PyTorch's own
``THP_MEM_ALLOC_ENABLE=1`` does for every allocation. It is advice: on other systems, on
GPUs, for small tables or when the call fails, the tensor is the same, just on normal pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import torch

_MADV_HUGEPAGE = 14  # Linux
_HUGE_PAGE = 2 << 20
_MIN_BYTES = 8 * _HUGE_PAGE  # below this the TLB covers the table anyway
_libc = None


def _madvise_huge(t: torch.Tensor) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    first = -(-start // _HUGE_PAGE) * _HUGE_PAGE  # whole huge pages inside the buffer
    if end - first >= _HUGE_PAGE:
        length = (end - first) // _HUGE_PAGE * _HUGE_PAGE
        _libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(length), _MADV_HUGEPAGE)


def full(shape, fill_value, *, dtype: torch.dtype, device) -> torch.Tensor:
    """``torch.full``; on a Linux CPU, large tensors are advised onto huge pages first."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if t.device.type == "cpu" and sys.platform == "linux" and t.nbytes >= _MIN_BYTES:
        try:
            _madvise_huge(t)
        except (OSError, AttributeError, TypeError):  # no libc or no madvise: plain pages
            pass
    return t.fill_(fill_value)
