"""The CPU path's building blocks of sampled verification, as numba functions on one row.

A row streams through ``BLOCK``-entry float32 buffers (bfloat16 widened on the way), so
every loop below runs over contiguous memory that fits the L1 cache and vectorises:

- the row maximum is an integer ``max`` over order-preserving bit keys (a float maximum
  with NaN read as ``-inf`` does not vectorise; an integer one does);
- the weights ``e = exp2((l - m) * scale)`` (``kernels/sampling.py`` has the formula and
  why) use a degree-6 polynomial for ``2**f`` on ``[0, 1)`` (relative error < 1e-7, the
  float32 rounding of ``exp2``; ``2**0`` is exactly 1, so the maximum has weight 1) and the
  exponent added to the bits: no libm call, so the loop vectorises;
- block sums of ``CDF_BLOCK`` weights, accumulated in eight lanes; the running sum of the
  block sums picks the block of the inverse-CDF sample, a running sum inside it the id.
"""

from __future__ import annotations

import numpy as np

from specdec_kernels.cpu._jit import jit

BLOCK = 1024
"""Entries of a row handled per buffer (and ids per block of the inverse CDF)."""
LOG2E = np.float32(1.4426950408889634)
EXP2_MIN = np.float32(-126.0)
"""Weights ``exp2(z)`` with ``z <= EXP2_MIN`` (they would be subnormal) count as 0."""
NEG_INF = np.float32(-np.inf)
NEG_INF_KEY = np.int32(-2139095041)  # the order key of -inf: bits(-inf) ^ 0x7fffffff
_T_FAST_MIN = np.float32(2.0**-90)
_T_FAST_MAX = np.float32(1e36)
# 2**f = 1 + f * (P1 + f * (P2 + ...)) on [0, 1)
P1 = np.float32(0.6931470632553101)
P2 = np.float32(0.2402293086051941)
P3 = np.float32(0.0554852820932865)
P4 = np.float32(0.009675451554358006)
P5 = np.float32(0.001246784464456141)
P6 = np.float32(0.0002161292068194598)


@jit
def load(f32, u16, bf16, g, j0, n, buf):
    """``buf[:n] = row g, columns j0 .. j0+n-1`` as float32 (bfloat16 bits widened)."""
    if bf16:
        bits = buf.view(np.uint32)
        row = u16[g]
        for i in range(n):
            bits[i] = np.uint32(row[j0 + i]) << 16
    else:
        row = f32[g]
        for i in range(n):
            buf[i] = row[j0 + i]


@jit
def row_max(f32, u16, bf16, g, V, buf):
    """The row's maximum, NaN read as ``-inf``."""
    best = NEG_INF_KEY
    ib = buf.view(np.int32)
    for j0 in range(0, V, BLOCK):
        n = min(BLOCK, V - j0)
        load(f32, u16, bf16, g, j0, n, buf)
        for i in range(n):
            b = ib[i]
            key = b ^ ((b >> 31) & np.int32(0x7FFFFFFF))
            key = key if buf[i] == buf[i] else NEG_INF_KEY
            best = max(best, key)
    ib[0] = best ^ ((best >> 31) & np.int32(0x7FFFFFFF))
    return buf[0]


@jit
def argmax(f32, u16, bf16, g, V, buf):
    """The first id of the row's maximum (NaN read as ``-inf``; ties: the lowest id)."""
    m = row_max(f32, u16, bf16, g, V, buf)
    for j0 in range(0, V, BLOCK):
        n = min(BLOCK, V - j0)
        load(f32, u16, bf16, g, j0, n, buf)
        for i in range(n):
            if buf[i] == m or (m == NEG_INF and buf[i] != buf[i]):
                return j0 + i
    return 0


@jit
def exp2_neg(z, n, out, o, tmp):
    """``out[o : o + n] = 2**z[:n]`` for ``z <= 0`` (0 where ``z <= EXP2_MIN`` or NaN);
    ``tmp``: int32 scratch. Arrays whole (contiguous), offsets explicit: a bit view needs it."""
    bits = out.view(np.int32)
    for i in range(n):
        x = max(z[i], EXP2_MIN)  # NaN: EXP2_MIN (zeroed below)
        e = np.floor(x)
        f = x - e
        out[o + i] = np.float32(1.0) + f * (P1 + f * (P2 + f * (P3 + f * (P4 + f * (P5 + f * P6)))))
        tmp[i] = np.int32(e) << 23
    for i in range(n):
        bits[o + i] = bits[o + i] + tmp[i]
    for i in range(n):
        if not z[i] > EXP2_MIN:
            out[o + i] = 0.0


@jit
def weights(f32, u16, bf16, g, V, m, T, w, blocks, buf, tmp):
    """The row's weights into ``w[:V]`` and the sums of their ``BLOCK``-id blocks into
    ``blocks``; returns the total. ``e = 1`` where ``l == m``, else ``exp2(z)`` with ``z =
    (l/2 - m/2) * (2 * log2(e) / T)`` (``> EXP2_MIN``), NaN read as ``-inf``."""
    scale = LOG2E / np.float32(T)
    fast = np.isfinite(m) and T >= _T_FAST_MIN and T <= _T_FAST_MAX
    total = np.float32(0.0)
    for j0 in range(0, V, BLOCK):
        n = min(BLOCK, V - j0)
        load(f32, u16, bf16, g, j0, n, buf)
        if fast:  # (l - m) * scale is the halved formula bit for bit (docs/design.md)
            for i in range(n):
                buf[i] = (buf[i] - m) * scale
            exp2_neg(buf, n, w, j0, tmp)
        else:
            for i in range(n):
                l = buf[i] if buf[i] == buf[i] else NEG_INF
                if l == m:
                    w[j0 + i] = 1.0
                else:
                    z = (l * np.float32(0.5) - m * np.float32(0.5)) * (scale * np.float32(2.0))
                    w[j0 + i] = np.exp2(z) if z > EXP2_MIN else np.float32(0.0)
        blocks[j0 // BLOCK] = lane_sum(w[j0 : j0 + n])
        total += blocks[j0 // BLOCK]
    return total


@jit
def lane_sum(x):
    """``sum(x)`` in float32: eight lanes (so the adds pipeline and vectorise), then the lanes
    in order, then the tail."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
    n8 = x.shape[0] // 8 * 8
    for i in range(0, n8, 8):
        a0 += x[i]
        a1 += x[i + 1]
        a2 += x[i + 2]
        a3 += x[i + 3]
        a4 += x[i + 4]
        a5 += x[i + 5]
        a6 += x[i + 6]
        a7 += x[i + 7]
    s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    for i in range(n8, x.shape[0]):
        s += x[i]
    return s


@jit
def block_sums(w, V, blocks):
    """Re-sum ``w[:V]`` by blocks into ``blocks``; returns the total."""
    total = np.float32(0.0)
    for j0 in range(0, V, BLOCK):
        blocks[j0 // BLOCK] = lane_sum(w[j0 : min(j0 + BLOCK, V)])
        total += blocks[j0 // BLOCK]
    return total


@jit
def inverse_cdf(w, V, blocks, total, u):
    """The first id whose running mass exceeds ``u * total`` (and whose own mass is > 0);
    if rounding leaves none in the block the running block sums pick, its last id with mass;
    -1 for a row without mass."""
    thr = np.float32(u) * total
    nb = (V + BLOCK - 1) // BLOCK
    carry = np.float32(0.0)
    bi = nb - 1
    for i in range(nb):
        if carry + blocks[i] > thr:
            bi = i
            break
        if i < nb - 1:
            carry += blocks[i]
    run = carry
    last = -1
    for i in range(bi * BLOCK, min(V, (bi + 1) * BLOCK)):
        if w[i] > 0:
            run += w[i]
            last = i
            if run > thr:
                return i
    return last


@jit
def threshold(w, V, top_k, top_p, min_p):
    """The threshold ``t`` of the kept set ``{e >= t}`` (top-k, then top-p, then min-p on the
    weights ``w[:V]``, max 1); 0 when no filter is on. One sorted copy (top-p) or one
    partitioned copy (top-k alone) of the weights."""
    k_on = 0 < top_k < V
    p_on = top_p < 1.0
    t = np.float32(0.0)
    if k_on and not p_on:
        t = np.partition(w[:V], V - top_k)[V - top_k]
    elif p_on:
        s = np.sort(w[:V])[::-1]  # descending
        if k_on:
            t = s[top_k - 1]
        S_k = np.float32(0.0)
        for i in range(V):
            if w[i] >= t:
                S_k += w[i]
        bound = np.float32(top_p) * S_k
        above = np.float32(0.0)
        n_keep = 0
        for i in range(V):  # kept sorted positions are a prefix: ties share the first's mass
            if s[i] < t or not above < bound:
                break
            n_keep += 1
            above += s[i]
        t = max(t, s[max(n_keep - 1, 0)])
    if min_p > 0.0:
        t = max(t, np.float32(min_p))
    return t


@jit
def raw_log_normaliser(f32, u16, bf16, g, V, m, buf, tmp, w):
    """``sum exp2((l - m) * log2(e))`` of the raw row (``m`` finite): the log-softmax's
    normaliser is its log."""
    S = np.float32(0.0)
    for j0 in range(0, V, BLOCK):
        n = min(BLOCK, V - j0)
        load(f32, u16, bf16, g, j0, n, buf)
        for i in range(n):
            buf[i] = (buf[i] - m) * LOG2E
        exp2_neg(buf, n, w, 0, tmp)
        S += lane_sum(w[:n])
    return S


# ----------------------------------------------------------------------------- Philox

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_M32 = np.uint64(0xFFFFFFFF)


@jit
def philox_uniform(seed, counter, stream):
    """The float32 uniform of ``(seed, counter, stream)``: Philox4x32-10, bit-identical to
    ``kernels/philox.py`` and ``cpu/philox.py`` (the mapping is documented there)."""
    s = np.uint64(seed)
    c = np.uint64(counter)
    k0, k1 = s & _M32, s >> np.uint64(32)
    c0, c1, c2, c3 = c & _M32, c >> np.uint64(32), np.uint64(stream) & _M32, np.uint64(0)
    for _ in range(10):
        p0 = _M0 * c0
        p1 = _M1 * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & _M32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _M32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + _W0) & _M32
        k1 = (k1 + _W1) & _M32
    return np.float32(c0 >> np.uint64(8)) * np.float32(2.0**-24)
