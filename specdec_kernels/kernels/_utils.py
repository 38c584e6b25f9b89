"""Small helpers shared by the launchers (no device queries here)."""

from __future__ import annotations

import torch


def next_pow2(x: int) -> int:
    """Smallest power of two >= max(x, 1)."""
    return 1 << max(int(x) - 1, 0).bit_length()


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every launcher's output and scratch allocation, called as ``_utils._empty``.

    One place, so a test can swap it for a poisoned fill and see any slot a kernel leaves
    unwritten (``tests/conformance.py``).
    """
    return torch.empty(shape, dtype=dtype, device=device)


def proposal_outputs(B: int, k: int, device: torch.device) -> list[torch.Tensor]:
    """A proposal's outputs: drafts int32 ``[B, k]``, counts, match_len int32 ``[B]``,
    source int8 ``[B]`` (through :func:`_empty`)."""
    return [
        _empty((B, k), torch.int32, device),
        _empty((B,), torch.int32, device),
        _empty((B,), torch.int32, device),
        _empty((B,), torch.int8, device),
    ]
