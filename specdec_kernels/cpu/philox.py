"""Philox4x32-10 in torch, bit-identical to ``specdec_kernels/kernels/philox.py``.

torch has no unsigned 32-bit arithmetic that every version supports, so the 32-bit words
live in int64 tensors (values in ``[0, 2**32)``) and the 32x32 -> 64-bit multiply is split
into 16-bit limbs of the counter word: ``M * c = M * c_hi * 2**16 + M * c_lo`` with both
partial products below ``2**48``, so nothing overflows int64. The mapping of seed, counter
and stream onto the key and counter words, and of output word 0 onto a float32 uniform,
is documented in the Triton module and repeated in :func:`philox_uniform`.
"""

from __future__ import annotations

import torch

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10
_MASK32 = 0xFFFFFFFF
_MASK16 = 0xFFFF


def _mulhilo(m: int, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hi, lo)`` 32-bit halves of the 64-bit product ``m * c`` (``m``, ``c`` < 2**32)."""
    lo_part = m * (c & _MASK16)  # < 2**48
    hi_part = m * (c >> 16)  # < 2**48; the product is hi_part * 2**16 + lo_part
    low_sum = lo_part + ((hi_part & _MASK16) << 16)  # < 2**49
    lo = low_sum & _MASK32
    hi = (hi_part >> 16) + (low_sum >> 32)
    return hi & _MASK32, lo


def philox4x32_10(
    c0: torch.Tensor,
    c1: torch.Tensor,
    c2: torch.Tensor,
    c3: torch.Tensor,
    k0: torch.Tensor,
    k1: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ten Philox4x32 rounds on int64 tensors holding 32-bit words; returns four such tensors."""
    c0, c1, c2, c3 = (t.to(torch.int64) & _MASK32 for t in (c0, c1, c2, c3))
    k0, k1 = (t.to(torch.int64) & _MASK32 for t in (k0, k1))
    for _ in range(PHILOX_ROUNDS):
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + PHILOX_W0) & _MASK32
        k1 = (k1 + PHILOX_W1) & _MASK32
    return c0, c1, c2, c3


def philox_uniform(seeds: torch.Tensor, counters: torch.Tensor, stream: int) -> torch.Tensor:
    """float32 uniforms in [0, 1), bit-identical to the Triton ``philox_uniform``.

    Key ``(seed & 0xffffffff, (seed >> 32) & 0xffffffff)``, counter
    ``(counter & 0xffffffff, (counter >> 32) & 0xffffffff, stream, 0)`` (the int64 values
    read as 64 unsigned bits), ``u = (word0 >> 8) * 2**-24``. ``seeds`` and ``counters``
    are int64 tensors of broadcastable shapes.
    """
    seeds = seeds.to(torch.int64)
    counters = counters.to(torch.int64)
    seeds, counters = torch.broadcast_tensors(seeds, counters)
    k0 = seeds & _MASK32
    k1 = (seeds >> 32) & _MASK32  # arithmetic shift, then mask: the high word's bits
    c0 = counters & _MASK32
    c1 = (counters >> 32) & _MASK32
    c2 = torch.full_like(c0, int(stream) & _MASK32)
    c3 = torch.zeros_like(c0)
    r0, _, _, _ = philox4x32_10(c0, c1, c2, c3, k0, k1)
    return (r0 >> 8).to(torch.float32) * (2.0**-24)
