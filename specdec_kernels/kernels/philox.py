"""Philox4x32-10 counter-based random numbers in Triton (the device side of the library's RNG).

Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2,
3", SC 2011; the Random123 library): a 128-bit counter ``(c0, c1, c2, c3)`` and a 64-bit
key ``(k0, k1)`` give four 32-bit outputs after ten rounds. A round multiplies ``c0`` and
``c2`` by fixed 32-bit constants into 64-bit products (``hi``, ``lo``) and mixes

    ``(c0, c1, c2, c3) <- (hi(M1 * c2) ^ c1 ^ k0, lo(M1 * c2), hi(M0 * c0) ^ c3 ^ k1, lo(M0 * c0))``

and the key is bumped by the Weyl constants ``(W0, W1)`` between rounds.

How the library maps its inputs onto Philox (the same in ``specdec_kernels/cpu/philox.py``):

- key: ``seed`` (int64, any value) read as 64 unsigned bits; ``k0`` = low 32 bits,
  ``k1`` = high 32 bits.
- counter: ``value`` (int64, e.g. ``offsets[b] + j``) read as 64 unsigned bits;
  ``c0`` = low 32 bits, ``c1`` = high 32 bits; ``c2`` = ``stream`` (0: acceptance
  uniform, 1: sampling uniform); ``c3`` = 0.
- uniform: output word 0 ``r0``; ``u = (r0 >> 8) * 2**-24``, a float32 on the grid
  ``{0, 2**-24, ..., 1 - 2**-24}``, so ``0 <= u < 1`` and every step is exact in float32.

The words are held in 64-bit unsigned integers, so the 32x32 -> 64-bit multiply needs no
``umulhi`` and works on the GPU and under the interpreter alike.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

PHILOX_M0 = tl.constexpr(0xD2511F53)
PHILOX_M1 = tl.constexpr(0xCD9E8D57)
PHILOX_W0 = tl.constexpr(0x9E3779B9)
PHILOX_W1 = tl.constexpr(0xBB67AE85)
PHILOX_ROUNDS = tl.constexpr(10)


@triton.jit
def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Ten Philox4x32 rounds; any integer tensors of matching shapes, read modulo 2**32.

    Returns the four output words as uint64 tensors holding 32-bit values. Every word is
    kept in uint64 so a round is a handful of operations with no casts (the 64-bit product
    of two 32-bit words cannot overflow); on the GPU this is a few extra integer
    instructions per call, and the sampler makes two calls per row.
    """
    c0 = c0.to(tl.uint64) & 0xFFFFFFFF
    c1 = c1.to(tl.uint64) & 0xFFFFFFFF
    c2 = c2.to(tl.uint64) & 0xFFFFFFFF
    c3 = c3.to(tl.uint64) & 0xFFFFFFFF
    k0 = k0.to(tl.uint64) & 0xFFFFFFFF
    k1 = k1.to(tl.uint64) & 0xFFFFFFFF
    for r in tl.static_range(PHILOX_ROUNDS):
        if r > 0:
            k0 = (k0 + PHILOX_W0) & 0xFFFFFFFF
            k1 = (k1 + PHILOX_W1) & 0xFFFFFFFF
        p0 = c0 * PHILOX_M0
        p1 = c2 * PHILOX_M1
        c0, c1, c2, c3 = (
            (p1 >> 32) ^ c1 ^ k0,
            p1 & 0xFFFFFFFF,
            (p0 >> 32) ^ c3 ^ k1,
            p0 & 0xFFFFFFFF,
        )
    return c0, c1, c2, c3


@triton.jit
def philox_uniform(seed, counter, stream):
    """float32 uniform in [0, 1) for int64 ``seed``, int64 ``counter`` and a small int ``stream``.

    Key ``(seed & 0xffffffff, seed >> 32)``, counter ``(counter & 0xffffffff, counter >> 32,
    stream, 0)`` (both int64 values read as 64 unsigned bits), ``u = (word0 >> 8) * 2**-24``.
    """
    s = seed.to(tl.int64).to(tl.uint64, bitcast=True)
    c = counter.to(tl.int64).to(tl.uint64, bitcast=True)
    r0, _, _, _ = philox4x32_10(c, c >> 32, c * 0 + stream, c * 0, s, s >> 32)
    return (r0 >> 8).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def _philox_block_kernel(ctr_ptr, key_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    c0 = tl.load(ctr_ptr + offs * 4 + 0, mask=mask, other=0)
    c1 = tl.load(ctr_ptr + offs * 4 + 1, mask=mask, other=0)
    c2 = tl.load(ctr_ptr + offs * 4 + 2, mask=mask, other=0)
    c3 = tl.load(ctr_ptr + offs * 4 + 3, mask=mask, other=0)
    k0 = tl.load(key_ptr + offs * 2 + 0, mask=mask, other=0)
    k1 = tl.load(key_ptr + offs * 2 + 1, mask=mask, other=0)
    r0, r1, r2, r3 = philox4x32_10(c0, c1, c2, c3, k0, k1)
    tl.store(out_ptr + offs * 4 + 0, r0.to(tl.int64), mask=mask)
    tl.store(out_ptr + offs * 4 + 1, r1.to(tl.int64), mask=mask)
    tl.store(out_ptr + offs * 4 + 2, r2.to(tl.int64), mask=mask)
    tl.store(out_ptr + offs * 4 + 3, r3.to(tl.int64), mask=mask)


@triton.jit
def _philox_uniform_kernel(seeds_ptr, counters_ptr, out_ptr, n, stream, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    seed = tl.load(seeds_ptr + offs, mask=mask, other=0)
    counter = tl.load(counters_ptr + offs, mask=mask, other=0)
    tl.store(out_ptr + offs, philox_uniform(seed, counter, stream), mask=mask)


def philox4x32(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Raw Philox4x32-10 words: int64 ``[n, 4]`` counters and ``[n, 2]`` keys (values in
    ``[0, 2**32)``) to int64 ``[n, 4]`` outputs. For tests (known-answer vectors)."""
    n = counter.shape[0]
    out = torch.empty((n, 4), dtype=torch.int64, device=counter.device)
    if n:
        block = 128
        _philox_block_kernel[(triton.cdiv(n, block),)](
            counter.contiguous(), key.contiguous(), out, n, BLOCK=block
        )
    return out


def philox_uniform_tensor(seeds: torch.Tensor, counters: torch.Tensor, stream: int) -> torch.Tensor:
    """float32 uniforms for int64 ``seeds`` and ``counters`` (same 1-D shape) on one stream."""
    n = seeds.shape[0]
    out = torch.empty((n,), dtype=torch.float32, device=seeds.device)
    if n:
        block = 128
        _philox_uniform_kernel[(triton.cdiv(n, block),)](
            seeds.contiguous(), counters.contiguous(), out, n, stream, BLOCK=block
        )
    return out
