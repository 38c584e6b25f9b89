"""Small helpers shared by the launchers (no device queries here)."""

from __future__ import annotations


def next_pow2(x: int) -> int:
    """Smallest power of two >= max(x, 1)."""
    return 1 << max(int(x) - 1, 0).bit_length()
