"""Triton building blocks of sampled verification: the CUDA path's weights, filters and
inverse CDF, used by ``kernels/rejection.py``'s row kernel.

The weights: with ``l`` the logits (NaN read as ``-inf``), ``m = max l`` and
``scale = log2(e) / T``, ``e = 1`` where ``l == m``, else ``exp2(z)`` for
``z = (l/2 - m/2) * (2 * scale) > -126`` and 0 below, so ``0 <= e <= 1``, the top token
has ``e = 1``, and ``+inf`` or all ``-inf`` rows still give a proper distribution. ``z``
is ``(l - m) / T`` in base 2, halved so that ``l - m`` cannot overflow near 3.4e38 and
computed before dividing so that a tiny ``T`` cannot overflow ``l / T``; weights that
would be subnormal count as 0 (the CPU path computes the same values; ``exp2`` is also the
instruction ``exp`` becomes on the GPU).

Top-k and top-p thresholds are found without sorting: the kept set is always
``{x : e(x) >= t}`` and, for non-negative floats, comparing values is comparing their
int32 bit patterns, so ``t`` is the smallest bit pattern with ``F(t) < threshold``, where
``F(t)`` counts (top-k: ``F < k``) or sums (top-p: ``F < top_p * S_k``) the weights with
bit pattern ``> t``. ``F`` is non-increasing, so a search over the integer range
``[lo, bits(1.0)]`` with ``NPIV`` pivots per pass over the vocabulary finds it exactly
(about 8 passes for 16 pivots, each also summing the weights above every pivot, so the
kept mass comes for free; blocks with no weight left inside the search interval skip the
comparisons, so later passes cost about a read of the row). It reproduces the
tie-inclusive definition exactly (top-k keeps every token tied with the k-th largest
weight).
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
EXP2_MIN = tl.constexpr(-126.0)  # exp2(z) for z <= -126 would be subnormal: weight 0


@triton.jit
def _load_logits(row_ptr, offs, V, stride_v):
    """fp32 logits of one block, NaN read as -inf; lanes past V are -inf."""
    l = tl.load(row_ptr + offs.to(tl.int64) * stride_v, mask=offs < V, other=float("-inf"))
    l = l.to(tl.float32)
    return tl.where(l != l, float("-inf"), l)


@triton.jit
def _weights(row_ptr, offs, V, stride_v, scale2, m_l):
    """Unnormalised fp32 weights ``e`` of one block (0 past V), ``scale2 = 2 log2(e) / T``.

    Self-contained (no nested calls): the interpreter pays for every device-function call,
    and the threshold search calls this once per block and pass.
    """
    l = tl.load(row_ptr + offs.to(tl.int64) * stride_v, mask=offs < V, other=float("-inf"))
    l = l.to(tl.float32)
    l = tl.where(l != l, float("-inf"), l)
    z = (l * 0.5 - m_l * 0.5) * scale2
    e = tl.where(z > EXP2_MIN, tl.exp2(z), 0.0)
    e = tl.where(l == m_l, 1.0, e)
    return tl.where(offs < V, e, 0.0)


@triton.jit
def _row_max(row_ptr, V, stride_v, BLOCK: tl.constexpr):
    """One pass: the max logit (NaN read as -inf) and its lowest index."""
    m = float("-inf")
    arg = 0
    for s in range(0, V, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        l = _load_logits(row_ptr, offs, V, stride_v)
        bm = tl.max(l, axis=0)
        bi = tl.min(tl.where(l == bm, offs, V), axis=0)
        arg = tl.where(bm > m, bi, arg)
        m = tl.maximum(m, bm)
    return m, arg


@triton.jit
def _raw_weights(l, offs, V, m):
    """``exp(l - m)`` of one block of logits (as ``exp2``; 1 at the max, 0 past V): the
    log-softmax normaliser's terms at temperature 1."""
    z = (l - m) * LOG2E
    r = tl.where(z > EXP2_MIN, tl.exp2(z), 0.0)
    r = tl.where(l == m, 1.0, r)
    return tl.where(offs < V, r, 0.0)


@triton.jit
def _raw_sum(row_ptr, V, stride_v, m, BLOCK: tl.constexpr):
    """One pass: the log-softmax normaliser ``sum exp(l - m)`` (greedy rows' logprobs)."""
    total = 0.0
    for s in range(0, V, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        l = _load_logits(row_ptr, offs, V, stride_v)
        total += tl.sum(_raw_weights(l, offs, V, m), axis=0)
    return total


@triton.jit
def _row_sums(
    row_ptr,
    V,
    stride_v,
    scale2,
    m,
    xs,
    t_min,
    HAS_MIN_P: tl.constexpr,
    WANT_X: tl.constexpr,
    LOGPROBS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One pass: the total weight ``S_z``, the weight with bit pattern ``>= t_min`` (the
    min-p kept sum; ``S_z`` without min-p), the weight of id ``xs`` (``WANT_X``) and the
    log-softmax normaliser (``LOGPROBS``; -1 otherwise)."""
    S_z = 0.0
    S_min = 0.0
    e_x = 0.0
    S_raw = 0.0
    for s in range(0, V, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        l = _load_logits(row_ptr, offs, V, stride_v)
        z = (l * 0.5 - m * 0.5) * scale2
        e = tl.where(z > EXP2_MIN, tl.exp2(z), 0.0)
        e = tl.where(offs < V, tl.where(l == m, 1.0, e), 0.0)
        S_z += tl.sum(e, axis=0)
        if HAS_MIN_P:
            S_min += tl.sum(tl.where(e.to(tl.int32, bitcast=True) >= t_min, e, 0.0), axis=0)
        if WANT_X:
            e_x += tl.sum(tl.where(offs == xs, e, 0.0), axis=0)
        if LOGPROBS:
            S_raw += tl.sum(_raw_weights(l, offs, V, m), axis=0)
    if not HAS_MIN_P:
        S_min = S_z
    if not LOGPROBS:
        S_raw = -1.0
    return S_z, S_min, e_x, S_raw


@triton.jit
def _kept_sum(row_ptr, V, stride_v, scale2, m, t, BLOCK: tl.constexpr):
    """One pass: the sum of the weights whose bit pattern is ``>= t``."""
    total = 0.0
    for s in range(0, V, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        e = _weights(row_ptr, offs, V, stride_v, scale2, m)
        total += tl.sum(tl.where(e.to(tl.int32, bitcast=True) >= t, e, 0.0), axis=0)
    return total


@triton.jit
def _search_threshold(
    row_ptr,
    V,
    stride_v,
    scale2,
    m,
    lo,
    s_lo,
    thresh,
    USE_SUM: tl.constexpr,
    BLOCK: tl.constexpr,
    NPIV: tl.constexpr,
):
    """Smallest int32 bit pattern ``t`` in ``[lo, bits(1.0)]`` with ``F(t) < thresh``,
    and the sum of the weights with bit pattern ``>= t``.

    ``F(t)`` is the number (``USE_SUM=False``) or the sum (``True``) of the weights with
    bit pattern ``> t``; ``F(bits(1.0)) = 0 < thresh`` by the caller's choice of
    ``thresh > 0``. ``s_lo`` is the kept sum at the initial ``lo``. Invariants: the answer
    lies in ``[lo, hi]``; ``s_lo`` is the sum of the weights ``>= lo``; ``count_hi`` and
    ``above_hi`` are the number and the sum of the weights ``> hi``. Each pass tests
    ``NPIV`` pivots in ``[lo, hi]`` and shrinks ``hi - lo`` by a factor ``NPIV``. Only
    weights in ``(lo, hi]`` can fall between pivots, so a block without any skips the
    pivot comparisons: after the first passes most blocks do, and a pass costs little
    more than reading the row.
    """
    hi = lo * 0 + 0x3F800000
    count_hi = 0.0
    above_hi = 0.0
    piv_i = tl.arange(0, NPIV)
    while lo < hi:
        step = (hi - lo + NPIV - 1) // NPIV
        piv = tl.minimum(lo + piv_i * step, hi)
        above = tl.zeros([NPIV], dtype=tl.float32) + above_hi  # sum of the weights > pivot
        count = tl.zeros([NPIV], dtype=tl.float32) + count_hi  # their number (V < 2**24)
        for s in range(0, V, BLOCK):
            offs = s + tl.arange(0, BLOCK)
            e = _weights(row_ptr, offs, V, stride_v, scale2, m)
            eb = e.to(tl.int32, bitcast=True)
            inside = (eb > lo) & (eb <= hi)
            if tl.max(inside.to(tl.int32), axis=0) > 0:
                gt = (eb[:, None] > piv[None, :]) & inside[:, None]
                above += tl.sum(tl.where(gt, e[:, None], 0.0), axis=0)
                if not USE_SUM:
                    count += tl.sum(gt.to(tl.float32), axis=0)
        if USE_SUM:
            ok = above < thresh
        else:
            ok = count < thresh
        # Pivots below hi are distinct (only hi, which passes, can repeat).
        fail = tl.max(tl.where(ok, -1, piv), axis=0)
        new_hi = tl.min(tl.where(ok, piv, hi), axis=0)
        if new_hi < hi:
            count_hi = tl.sum(tl.where(piv == new_hi, count, 0.0), axis=0)
            above_hi = tl.sum(tl.where(piv == new_hi, above, 0.0), axis=0)
            hi = new_hi
        if fail >= 0:
            s_lo = tl.sum(tl.where(piv == fail, above, 0.0), axis=0)
            lo = fail + 1
    return lo, s_lo


@triton.jit
def _filter_threshold(
    row_ptr,
    V,
    stride_v,
    scale2,
    m,
    S_z,
    S_min,
    b,
    top_k_ptr,
    top_p_ptr,
    t_min,
    HAS_TOP_K: tl.constexpr,
    HAS_TOP_P: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    BLOCK: tl.constexpr,
    SEARCH_BLOCK: tl.constexpr,
    NPIV: tl.constexpr,
):
    """The kept set ``{e >= t}`` of top-k, then top-p, then min-p (``t`` an int32 bit
    pattern, 0 = keep all) and its sum ``S``. No pass unless top-k or top-p is on."""
    t = 0
    S = S_z
    if HAS_TOP_K:
        K = tl.load(top_k_ptr + b)
        if (K > 0) & (K < V):
            t, S = _search_threshold(
                row_ptr,
                V,
                stride_v,
                scale2,
                m,
                t,
                S,
                K.to(tl.float32),
                USE_SUM=False,
                BLOCK=SEARCH_BLOCK,
                NPIV=NPIV,
            )
    if HAS_TOP_P:
        P = tl.load(top_p_ptr + b).to(tl.float32)
        if P < 1.0:
            t, S = _search_threshold(
                row_ptr,
                V,
                stride_v,
                scale2,
                m,
                t,
                S,
                P * S,
                USE_SUM=True,
                BLOCK=SEARCH_BLOCK,
                NPIV=NPIV,
            )
    if HAS_MIN_P:
        if t_min > t:
            if t == 0:  # no search cut anything: the sums pass summed {e >= t_min}
                S = S_min
            else:
                S = _kept_sum(row_ptr, V, stride_v, scale2, m, t_min, BLOCK)
            t = t_min
    return t, S


@triton.jit
def _residual_total(row_ptr, q_row, V, stride_v, stride_qv, scale2, m, t, S, BLOCK: tl.constexpr):
    """One pass: the mass ``R`` of the residual ``max(w / S - q, 0)``."""
    R = 0.0
    for s in range(0, V, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        e = _weights(row_ptr, offs, V, stride_v, scale2, m)
        w = tl.where(e.to(tl.int32, bitcast=True) >= t, e, 0.0)
        q = tl.load(q_row + offs.to(tl.int64) * stride_qv, mask=offs < V, other=0.0)
        r = tl.where(offs < V, tl.maximum(w / S - q.to(tl.float32), 0.0), 0.0)
        R += tl.sum(r, axis=0)
    return R


@triton.jit
def _inverse_cdf(
    row_ptr,
    q_row,
    V,
    stride_v,
    stride_qv,
    scale2,
    m,
    t,
    S,
    thr,
    resid,
    HAS_PROBS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """At most one pass, stopping at the block where the sample lies: the first id whose
    running mass exceeds ``thr`` (= ``u * total``), over the kept weights, or over the
    residual ``max(w / S - q, 0)`` when ``resid``. If rounding leaves no such id, the last
    id with positive mass; -1 if there is none."""
    found = V
    last = -1
    carry = 0.0
    s = 0
    while (s < V) & (found == V):
        offs = s + tl.arange(0, BLOCK)
        e = _weights(row_ptr, offs, V, stride_v, scale2, m)
        mass = tl.where(e.to(tl.int32, bitcast=True) >= t, e, 0.0)
        if HAS_PROBS:
            q = tl.load(
                q_row + offs.to(tl.int64) * stride_qv, mask=(offs < V) & resid, other=0.0
            ).to(tl.float32)
            mass = tl.where(resid, tl.maximum(mass / S - q, 0.0), mass)
            mass = tl.where(offs < V, mass, 0.0)
        run = carry + tl.cumsum(mass, axis=0)
        hit = (run > thr) & (mass > 0.0)
        found = tl.minimum(found, tl.min(tl.where(hit, offs, V), axis=0))
        last = tl.maximum(last, tl.max(tl.where(mass > 0.0, offs, -1), axis=0))
        carry += tl.sum(mass, axis=0)
        s += BLOCK
    return tl.where(found < V, found, last)


@triton.jit
def _log_prob(row_ptr, stride_v, tok, m, S_raw):
    """``log_softmax(l)[tok]`` as ``(l_tok - m) - log(S_raw)``: subtracting the max first keeps
    it exact for logits of any finite magnitude (``l_tok - (m + log S)`` would round
    ``log S`` into a huge ``m``); 0 - log(n) at the n ids of an infinite maximum."""
    l_tok = tl.load(row_ptr + tok.to(tl.int64) * stride_v).to(tl.float32)
    l_tok = tl.where(l_tok != l_tok, float("-inf"), l_tok)
    d = tl.where(l_tok == m, 0.0, l_tok - m)
    return d - tl.log(S_raw)
