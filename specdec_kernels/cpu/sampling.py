"""The CPU path's building blocks of sampled verification, as numba functions on one row.

A row is read in ``BLOCK``-entry pieces: float32 rows as views, bfloat16 rows widened into
a float32 buffer. Every hot loop below indexes its pieces from 0 (an offset index makes
numba guard it against negative values, and the guard stops LLVM vectorising), reads and
writes distinct arrays, and calls no libm (only the rare fallbacks do):

- the row maximum is an integer ``max`` over order-preserving bit keys of the raw row
  (float32 or bfloat16 bits: no widening); a positive NaN has a key above ``+inf``'s, and
  only then does a second, NaN-aware pass run (NaN read as ``-inf``);
- the first maximal id compares bits (``-0`` and ``+0`` together), a block at a time;
- the weights ``e = exp2((l - m) * scale)`` (``kernels/sampling.py`` has the formula and
  why) are taken in the pass that finds the maximum (``row_weights``: against the running
  maximum, rescaled at the end where it grew; a row with a filter on takes two passes
  instead, ``sampled_weights``, so that equal logits get equal weights), with a degree-6
  polynomial for ``2**f`` on
  ``[0, 1)`` (relative error < 1e-7, the float32 rounding of ``exp2``; ``2**0`` is exactly
  1, so the maximum has weight 1) and the exponent added to the bits;
- block sums of ``BLOCK`` weights in float64 (reordered freely, so they vectorise); the
  running sum of the block sums picks the block of the inverse-CDF sample, a running sum
  inside it the id (float64 throughout: in float32 the tail of a 150k vocabulary would
  lose ~1e-5 of the mass to rounding).
"""

from __future__ import annotations

import numpy as np

from specdec_kernels.cpu._jit import (
    NONE_F32,
    NONE_I32,
    as_float32,
    bits_float,
    float_bits,
    jit,
    jit_with,
    opt,
)

BLOCK = 1024
"""Entries of a row handled per piece (and ids per block of the inverse CDF)."""
LOG2E = np.float32(1.4426950408889634)
EXP2_MIN = np.float32(-126.0)
"""Weights ``exp2(z)`` with ``z <= EXP2_MIN`` (they would be subnormal) count as 0."""
NEG_INF = np.float32(-np.inf)
# order keys: bits ^ (sign ? 0x7fff... : 0), so that keys compare as the floats do
NEG_INF_KEY = np.int32(-2139095041)  # float32 -inf: 0xff800000 ^ 0x7fffffff
POS_INF_KEY = np.int32(0x7F800000)
BF16_NEG_INF_KEY = np.int16(-32641)  # bfloat16 -inf: 0xff80 ^ 0x7fff
BF16_POS_INF_KEY = np.int16(0x7F80)
_TINY = np.float32(2.0**-126)  # the smallest normal float32
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
def block(f32, u16, bf16, g, j0, n, buf):
    """Row ``g``'s columns ``j0 .. j0+n-1`` as float32: a view of the row, or its bfloat16
    bits widened (exactly) into ``buf``."""
    if bf16:
        src = u16[g, j0 : j0 + n]
        bits = buf[:n].view(np.uint32)
        for i in range(n):
            bits[i] = np.uint32(src[i]) << 16
        return buf[:n]
    return f32[g, j0 : j0 + n]


@jit
def _key_max(bits, best):
    """The largest order key of the bit patterns ``bits`` (int32 or int16) and ``best``."""
    shift = bits.itemsize * 8 - 1
    low = (1 << shift) - 1
    for i in range(bits.shape[0]):
        b = bits[i]
        best = max(best, b ^ ((b >> shift) & low))
    return best


@jit
def _key_float(key, bf16):
    """The float32 whose order key is ``key`` (a bfloat16 key: the bfloat16's value)."""
    if bf16:
        return bits_float(np.int32(((key ^ ((key >> 15) & 0x7FFF)) & 0xFFFF) << 16))
    return bits_float(np.int32(key ^ ((key >> 31) & 0x7FFFFFFF)))


@jit
def row_max(f32, u16, bf16, g, V, buf):
    """The row's maximum, NaN read as ``-inf``."""
    return range_max(f32, u16, bf16, g, 0, V, buf)


@jit
def range_max(f32, u16, bf16, g, j0, n, buf):
    """The maximum of row ``g``'s columns ``j0 .. j0+n-1``, NaN read as ``-inf``."""
    if bf16:
        key = _key_max(u16[g].view(np.int16)[j0 : j0 + n], BF16_NEG_INF_KEY)
        if key <= BF16_POS_INF_KEY:
            return _key_float(key, True)
    else:
        key = _key_max(f32[g].view(np.int32)[j0 : j0 + n], NEG_INF_KEY)
        if key <= POS_INF_KEY:
            return _key_float(key, False)
    best = NEG_INF  # a positive NaN: the float pass
    for b0 in range(j0, j0 + n, BLOCK):
        src = block(f32, u16, bf16, g, b0, min(BLOCK, j0 + n - b0), buf)
        for i in range(src.shape[0]):
            if src[i] > best:
                best = src[i]
    return best


@jit
def _first_bits(bits, mask, target):
    """The first ``i`` with ``bits[i] & mask == target``, a block at a time; -1 if none."""
    for j0 in range(0, bits.shape[0], BLOCK):
        piece = bits[j0 : j0 + BLOCK]
        hits = 0
        for i in range(piece.shape[0]):
            hits += (piece[i] & mask) == target
        if hits:
            for i in range(piece.shape[0]):
                if (piece[i] & mask) == target:
                    return j0 + i
    return -1


@jit
def argmax(f32, u16, bf16, g, V, buf):
    """The first id of the row's maximum (NaN read as ``-inf``; ties: the lowest id)."""
    m = row_max(f32, u16, bf16, g, V, buf)
    if m == NEG_INF:  # -inf and NaN alike
        for j0 in range(0, V, BLOCK):
            src = block(f32, u16, bf16, g, j0, min(BLOCK, V - j0), buf)
            for i in range(src.shape[0]):
                if not src[i] > NEG_INF:
                    return j0 + i
        return 0
    m_bits = float_bits(m)
    if bf16:  # equal floats are equal bits, but for -0 == +0
        mask = 0x7FFF if m == 0 else -1
        i = _first_bits(u16[g].view(np.int16), mask, np.int16(m_bits >> 16) & mask)
    else:
        mask = 0x7FFFFFFF if m == 0 else -1
        i = _first_bits(f32[g].view(np.int32), mask, m_bits & mask)
    return max(i, 0)


@jit_with("contract")  # the polynomial as fused multiply-adds: faster and (if anything) closer
def exp2_scaled(src, m, scale, out):
    """``out[i] = 2**z`` with ``z = (src[i] - m) * scale <= 0``: 0 where ``z <= EXP2_MIN``
    or NaN. ``src``: float32, or bfloat16 bits (widened here, in the same loop); ``out``: a
    distinct float32 array of the same length."""
    m, scale = np.float32(m), np.float32(scale)  # float32 arithmetic whatever the caller's
    for i in range(src.shape[0]):
        z = (as_float32(src[i]) - m) * scale
        x = z if z > EXP2_MIN else EXP2_MIN  # NaN too (its weight is dropped below)
        e = np.floor(x)
        f = x - e
        p = np.float32(1.0) + f * (P1 + f * (P2 + f * (P3 + f * (P4 + f * (P5 + f * P6)))))
        e2 = bits_float(np.int32(float_bits(p) + (np.int32(e) << 23)))  # p * 2**e, exactly
        out[i] = e2 if z > EXP2_MIN else np.float32(0.0)


@jit
def _exp2_row(f32, u16, bf16, g, j0, n, m, scale, out):
    """``exp2_scaled`` of row ``g``'s columns ``j0 .. j0+n-1``, read in place."""
    if bf16:
        exp2_scaled(u16[g, j0 : j0 + n], m, scale, out)
    else:
        exp2_scaled(f32[g, j0 : j0 + n], m, scale, out)


@jit
def weights(f32, u16, bf16, g, V, m, T, w, blocks, buf):
    """The row's weights into ``w[:V]`` and the float64 sums of their ``BLOCK``-id blocks into
    ``blocks``; returns the (float64) total. ``e = 1`` where ``l == m``, else ``exp2(z)`` with
    ``z = (l/2 - m/2) * (2 * log2(e) / T)`` (``> EXP2_MIN``), NaN read as ``-inf``."""
    scale = LOG2E / np.float32(T)
    fast = np.isfinite(m) and T >= _T_FAST_MIN and T <= _T_FAST_MAX
    total = np.float64(0.0)
    for j0 in range(0, V, BLOCK):
        n = min(BLOCK, V - j0)
        out = w[j0 : j0 + n]
        if fast:  # (l - m) * scale is the halved formula bit for bit (docs/design.md)
            _exp2_row(f32, u16, bf16, g, j0, n, m, scale, out)
        else:
            src = block(f32, u16, bf16, g, j0, n, buf)
            for i in range(n):
                l = src[i] if src[i] == src[i] else NEG_INF
                if l == m:
                    out[i] = 1.0
                else:
                    z = (l * np.float32(0.5) - m * np.float32(0.5)) * (scale * np.float32(2.0))
                    out[i] = np.exp2(z) if z > EXP2_MIN else np.float32(0.0)
        blocks[j0 // BLOCK] = lane_sum(out)
        total += blocks[j0 // BLOCK]
    return total


@jit
def row_weights(f32, u16, bf16, g, V, T, w, blocks, refs, buf):
    """``weights`` with the row's maximum found on the way; returns ``(m, total)``.

    One read of the row instead of two (``row_max``, then ``weights``): each block's
    maximum, then its weights against the running maximum ``r`` (kept in ``refs``), and
    once the maximum ``m`` is known, the blocks taken against an older ``r`` are scaled by
    ``exp2((r - m) * scale)`` (in L2; weights that become subnormal count as 0). The same
    weights to float32 rounding, exactly 1 at the maximum. NaN, an infinite maximum, a row
    of ``-inf`` and extreme temperatures take the two reads."""
    scale = LOG2E / np.float32(T)
    nb = (V + BLOCK - 1) // BLOCK
    m = NEG_INF
    one_pass = T >= _T_FAST_MIN and T <= _T_FAST_MAX
    for bi in range(nb if one_pass else 0):
        j0 = bi * BLOCK
        n = min(BLOCK, V - j0)
        if bf16:  # the block's maximum from its raw bits (a positive NaN or +inf: stop)
            key = _key_max(u16[g].view(np.int16)[j0 : j0 + n], BF16_NEG_INF_KEY)
            one_pass = key < BF16_POS_INF_KEY
        else:
            key = _key_max(f32[g].view(np.int32)[j0 : j0 + n], NEG_INF_KEY)
            one_pass = key < POS_INF_KEY
        if not one_pass:
            break
        m = max(m, _key_float(key, bf16))
        out = w[j0 : j0 + n]
        if m == NEG_INF:
            out[:] = 0.0
        else:
            _exp2_row(f32, u16, bf16, g, j0, n, m, scale, out)
        blocks[bi] = lane_sum(out)
        refs[bi] = m
    if one_pass and m > NEG_INF:
        total = np.float64(0.0)
        for bi in range(nb):
            if refs[bi] < m:
                out = w[bi * BLOCK : min(V, (bi + 1) * BLOCK)]
                _rescale(out, np.exp2((np.float64(refs[bi]) - np.float64(m)) * scale))
                blocks[bi] = lane_sum(out)
            total += blocks[bi]
        return m, total
    m = row_max(f32, u16, bf16, g, V, buf)
    return m, weights(f32, u16, bf16, g, V, m, T, w, blocks, buf)


@jit
def sampled_weights(f32, u16, bf16, g, V, T, w, blocks, refs, buf, filtered):
    """The weights of a sampled row and their float64 total. With a filter on, in two reads
    (:func:`row_max`, then :func:`weights`): every weight is then a function of its logit
    alone, so tied logits keep tied weights at the filters' boundaries, where
    :func:`row_weights`' rescaled blocks can leave them a few ulps apart (and a top-k or
    top-p cut would keep one of a tie and not the other)."""
    if filtered:
        m = row_max(f32, u16, bf16, g, V, buf)
        return weights(f32, u16, bf16, g, V, m, T, w, blocks, buf)
    return row_weights(f32, u16, bf16, g, V, T, w, blocks, refs, buf)[1]


@jit
def _rescale(out, factor):
    """``out *= factor`` (< 1), products below the smallest normal float32 set to 0."""
    f = np.float32(factor)
    for i in range(out.shape[0]):
        v = out[i] * f
        out[i] = v if v >= _TINY else np.float32(0.0)


@jit_with("reassoc")  # the sum may be reordered: it vectorises (5x faster than in order)
def lane_sum(x):
    """``sum(x)`` of float32 values, in float64."""
    s = np.float64(0.0)
    for i in range(x.shape[0]):
        s += np.float64(x[i])
    return s


@jit
def block_sums(w, V, blocks):
    """Re-sum ``w[:V]`` by blocks into ``blocks`` (float64); returns the total."""
    total = np.float64(0.0)
    for j0 in range(0, V, BLOCK):
        blocks[j0 // BLOCK] = lane_sum(w[j0 : min(j0 + BLOCK, V)])
        total += blocks[j0 // BLOCK]
    return total


@jit
def inverse_cdf(w, V, blocks, total, u):
    """The first id whose running mass exceeds ``u * total`` (and whose own mass is > 0);
    if rounding leaves none in the block the running block sums pick, its last id with mass;
    -1 for a row without mass."""
    thr = np.float64(u) * total  # float64 sums: the tail of a large vocabulary is exact
    nb = (V + BLOCK - 1) // BLOCK
    carry = np.float64(0.0)
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
def raw_log_normaliser(f32, u16, bf16, g, V, m, w):
    """``sum exp2((l - m) * log2(e))`` of the raw row (``m`` finite): the log-softmax's
    normaliser is its log. ``w``: ``BLOCK`` entries of scratch."""
    S = np.float64(0.0)
    for j0 in range(0, V, BLOCK):
        n = min(BLOCK, V - j0)
        out = w[:n]
        _exp2_row(f32, u16, bf16, g, j0, n, m, LOG2E, out)
        S += lane_sum(out)
    return S


# ----------------------------------------------------------------------------- Philox

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_M32 = np.uint64(0xFFFFFFFF)


@jit
def _in_range(x, has, lo, hi, lo_open):
    """Whether every entry of ``x`` (if ``has``) lies in ``[lo, hi]`` (``(lo, hi]``); NaN never."""
    for i in range(x.shape[0] if has else 0):
        v = x[i]
        if not ((v > lo if lo_open else v >= lo) and v <= hi):
            return False
    return True


_FLOAT32_MAX = np.float32(np.finfo(np.float32).max)
_INT32_MAX = np.int32(2**31 - 1)


def param_arrays(temperature, top_k, top_p, min_p) -> tuple:
    """The four sampling parameters as the kernels take them: each an array (a placeholder
    when absent) and whether it was given (:func:`params_ok`'s arguments)."""
    return (
        opt(temperature, NONE_F32), temperature is not None, opt(top_k, NONE_I32),
        top_k is not None, opt(top_p, NONE_F32), top_p is not None, opt(min_p, NONE_F32),
        min_p is not None,
    )  # fmt: skip


@jit
def params_ok(temp, has_temp, top_k, has_top_k, top_p, has_top_p, min_p, has_min_p):
    """The sampling parameters' value checks (``rejection_sample``'s and
    ``top_logprobs``'): temperature finite and ``>= 0``, top-k ``>= 0``, top-p in
    ``(0, 1]``, min-p in ``[0, 1]``."""
    return (
        _in_range(temp, has_temp, np.float32(0.0), _FLOAT32_MAX, False)
        and _in_range(top_k, has_top_k, 0, _INT32_MAX, False)
        and _in_range(top_p, has_top_p, np.float32(0.0), np.float32(1.0), True)
        and _in_range(min_p, has_min_p, np.float32(0.0), np.float32(1.0), False)
    )


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
