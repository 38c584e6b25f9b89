"""Triton rejection sampler: the CUDA path of ``rejection_sample``.

Two launches, no host synchronisation, no input written:

1. ``_rejection_rows_kernel``, grid ``(B, k+1)``: program ``(b, j)`` handles target row
   ``cu[b] + b + j`` of request ``b`` (nothing if ``j > k_b``). It decides, independently
   of the other rows, whether draft ``d_j`` is accepted and which token the request emits
   if row ``j`` is where it stops, plus that token's log-probability. One-hot drafts
   (coupled verification): the token is ``y_j``, the row's argmax (greedy) or its
   inverse-CDF sample with the stream-1 uniform of counter ``offsets[b] + j`` (sampled),
   and ``d_j`` is accepted iff ``d_j == y_j``. With draft probabilities: accepted iff
   ``u0 < p(d_j) / q(d_j)``, else the token is a sample of the residual
   ``normalize(max(p - q, 0))``. Because a request's uniforms depend only on
   ``(seed, offsets[b] + j, stream)``, rows after the first rejection can be evaluated in
   parallel and simply ignored later.
2. ``_rejection_finalize_kernel``, grid ``(B,)``: finds the first row that is not
   accepted, writes the emitted tokens (accepted drafts, then that row's token), -1
   padding, ``num_emitted`` and the log-probabilities.

Each row streams over the vocabulary in blocks of ``BLOCK`` (never a ``next_pow2(V)``
block); every pass recomputes the fp32 weights from the logits, so nothing of size ``V``
is stored. Passes over a row: one (the max) for a greedy row, plus one for logprobs; for a
sampled row without top-k/top-p, at most three: the max, the sums (total weight, the
min-p kept weight, the logprob normaliser, the draft's weight) and the inverse CDF, which
stops at the block where the sample lies. Top-k and top-p add the threshold search
(below); a rejected draft with draft probabilities adds one pass for the residual's total.

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

import torch
import triton
import triton.language as tl

from specdec_kernels.kernels import _utils
from specdec_kernels.kernels._utils import next_pow2
from specdec_kernels.kernels.philox import philox_uniform

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


@triton.jit
def _rejection_rows_kernel(
    logits_ptr,
    stride_lr,
    stride_lv,
    drafts_ptr,
    cu_ptr,
    probs_ptr,
    stride_pr,
    stride_pv,
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    seeds_ptr,
    offsets_ptr,
    row_tok_ptr,
    row_acc_ptr,
    row_lp_ptr,
    V,
    K1,
    HAS_PROBS: tl.constexpr,
    HAS_TEMP: tl.constexpr,
    HAS_TOP_K: tl.constexpr,
    HAS_TOP_P: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    LOGPROBS: tl.constexpr,
    BLOCK: tl.constexpr,
    SEARCH_BLOCK: tl.constexpr,
    NPIV: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    start = tl.load(cu_ptr + b).to(tl.int64)
    kb = tl.load(cu_ptr + b + 1).to(tl.int64) - start
    if j <= kb:
        row_ptr = logits_ptr + (start + b + j) * stride_lr
        is_draft = j < kb
        x = tl.load(drafts_ptr + start + j, mask=is_draft, other=-1)
        valid = is_draft & (x >= 0) & (x < V)
        xs = tl.where(valid, x, 0)

        m, arg = _row_max(row_ptr, V, stride_lv, BLOCK)
        tok = arg  # greedy: y_j is the argmax
        acc = valid & (x == arg)
        S_raw = -1.0  # the logprob normaliser, once a pass has summed it

        if HAS_TEMP:
            T = tl.load(temp_ptr + b).to(tl.float32)
            if T != 0.0:
                scale2 = (LOG2E / T) * 2.0
                t_min = 0
                if HAS_MIN_P:
                    t_min = tl.load(min_p_ptr + b).to(tl.float32).to(tl.int32, bitcast=True)
                S_z, S_min, e_x, S_raw = _row_sums(
                    row_ptr,
                    V,
                    stride_lv,
                    scale2,
                    m,
                    xs,
                    t_min,
                    HAS_MIN_P=HAS_MIN_P,
                    WANT_X=HAS_PROBS,
                    LOGPROBS=LOGPROBS,
                    BLOCK=BLOCK,
                )
                t, S = _filter_threshold(
                    row_ptr,
                    V,
                    stride_lv,
                    scale2,
                    m,
                    S_z,
                    S_min,
                    b,
                    top_k_ptr,
                    top_p_ptr,
                    t_min,
                    HAS_TOP_K=HAS_TOP_K,
                    HAS_TOP_P=HAS_TOP_P,
                    HAS_MIN_P=HAS_MIN_P,
                    BLOCK=BLOCK,
                    SEARCH_BLOCK=SEARCH_BLOCK,
                    NPIV=NPIV,
                )
                seed = tl.load(seeds_ptr + b)
                counter = tl.load(offsets_ptr + b) + j
                u = philox_uniform(seed, counter, 1)
                if HAS_PROBS:
                    # Speculative sampling: accept iff q(x) > 0 and u0 < p(x) / q(x); else
                    # sample normalize(max(p - q, 0)) (p if it has no mass or x is invalid).
                    q_row = probs_ptr + (start + j) * stride_pr
                    w_x = tl.where(valid & (e_x.to(tl.int32, bitcast=True) >= t), e_x, 0.0)
                    q_x = tl.load(q_row + xs.to(tl.int64) * stride_pv, mask=valid, other=0.0)
                    q_x = q_x.to(tl.float32)
                    acc = valid & (q_x > 0.0)
                    if acc:
                        acc = philox_uniform(seed, counter, 0) < (w_x / S) / q_x
                    if acc:
                        tok = x.to(tl.int32)
                    else:
                        total = S
                        resid = False
                        if valid:
                            R = _residual_total(
                                row_ptr, q_row, V, stride_lv, stride_pv, scale2, m, t, S, BLOCK
                            )
                            if R > 0.0:
                                resid = True
                                total = R
                        y = _inverse_cdf(
                            row_ptr,
                            q_row,
                            V,
                            stride_lv,
                            stride_pv,
                            scale2,
                            m,
                            t,
                            S,
                            u * total,
                            resid,
                            HAS_PROBS=True,
                            BLOCK=BLOCK,
                        )
                        tok = tl.where(y >= 0, y, arg)
                else:
                    # Coupled verification: y_j is the plain sampler's token; keep d_j iff equal.
                    y = _inverse_cdf(
                        row_ptr,
                        row_ptr,
                        V,
                        stride_lv,
                        0,
                        scale2,
                        m,
                        t,
                        S,
                        u * S,
                        False,
                        HAS_PROBS=False,
                        BLOCK=BLOCK,
                    )
                    tok = tl.where(y >= 0, y, arg)
                    acc = valid & (x == tok)

        out = b * K1 + j
        tl.store(row_tok_ptr + out, tok.to(tl.int32))
        tl.store(row_acc_ptr + out, acc.to(tl.int32))
        if LOGPROBS:
            if S_raw < 0.0:
                S_raw = _raw_sum(row_ptr, V, stride_lv, m, BLOCK)
            tl.store(row_lp_ptr + out, _log_prob(row_ptr, stride_lv, tok, m, S_raw))


@triton.jit
def _rejection_finalize_kernel(
    cu_ptr,
    row_tok_ptr,
    row_acc_ptr,
    row_lp_ptr,
    out_ptr,
    num_emitted_ptr,
    logprobs_ptr,
    K1,
    LOGPROBS: tl.constexpr,
    K1_BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    start = tl.load(cu_ptr + b)
    kb = tl.load(cu_ptr + b + 1) - start
    offs = tl.arange(0, K1_BLOCK)
    live = (offs <= kb) & (offs < K1)
    acc = tl.load(row_acc_ptr + b * K1 + offs, mask=live, other=0)
    stop = tl.min(tl.where(live & (acc == 0), offs, K1_BLOCK), axis=0)
    emit = offs <= stop
    tok = tl.load(row_tok_ptr + b * K1 + offs, mask=emit & live, other=-1)
    tl.store(out_ptr + b * K1 + offs, tl.where(emit, tok, -1), mask=offs < K1)
    tl.store(num_emitted_ptr + b, (stop + 1).to(tl.int32))
    if LOGPROBS:
        lp = tl.load(row_lp_ptr + b * K1 + offs, mask=emit & live, other=0.0)
        tl.store(logprobs_ptr + b * K1 + offs, tl.where(emit, lp, 0.0), mask=offs < K1)


SEARCH_PIVOTS: int | None = None
"""Thresholds a top-k/top-p search pass tests at once (a power of two; tests vary it).
None: 16 on the GPU, where each pivot costs a compare per vocabulary entry, and 1024 under
the interpreter, where passes (Python operations) cost and wide blocks are nearly free."""


def rejection_sample(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor | None,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    seeds: torch.Tensor | None,
    offsets: torch.Tensor | None,
    *,
    num_speculative_tokens: int,
    return_logprobs: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The CUDA implementation of ``specdec::rejection_sample`` (registered directly):
    launch the row and finalize kernels. Values are assumed validated; the op's one
    structural check (seeds and offsets with a temperature, as in the CPU path's
    ``require_seeds_and_offsets``: the layers may not share it) runs here too.

    Absent optional tensors go to the kernels as ``None`` (a constexpr there, guarded by
    its ``HAS_*`` flag). The top-k/top-p search tests ``SEARCH_PIVOTS`` thresholds per pass.
    """
    if temperature is not None and (seeds is None or offsets is None):
        raise ValueError(
            "specdec::rejection_sample needs seeds and offsets when temperature is given"
        )
    K1 = num_speculative_tokens + 1
    B = cu_num_draft_tokens.shape[0] - 1
    V = target_logits.shape[1]
    device = target_logits.device
    out = _utils._empty((B, K1), torch.int32, device)
    num_emitted = _utils._empty((B,), torch.int32, device)
    logprobs = _utils._empty((B, K1) if return_logprobs else (0,), torch.float32, device)
    if B == 0:
        return out, num_emitted, logprobs
    row_tok = _utils._empty((B, K1), torch.int32, device)
    row_acc = _utils._empty((B, K1), torch.int32, device)
    row_lp = _utils._empty((B, K1), torch.float32, device) if return_logprobs else None
    # An empty draft buffer is never read (k_b = 0 everywhere) but is dereferenced under a
    # mask, so it needs a real pointer: any int32 tensor will do.
    drafts = draft_token_ids if draft_token_ids.numel() else cu_num_draft_tokens
    if draft_probs is not None and draft_probs.numel() == 0:
        draft_probs = None  # no draft rows at all (N = 0)
    _rejection_rows_kernel[(B, K1)](
        logits_ptr=target_logits,
        stride_lr=target_logits.stride(0),
        stride_lv=target_logits.stride(1),
        drafts_ptr=drafts,
        cu_ptr=cu_num_draft_tokens,
        probs_ptr=draft_probs,
        stride_pr=draft_probs.stride(0) if draft_probs is not None else 0,
        stride_pv=draft_probs.stride(1) if draft_probs is not None else 0,
        temp_ptr=temperature,
        top_k_ptr=top_k,
        top_p_ptr=top_p,
        min_p_ptr=min_p,
        seeds_ptr=seeds,
        offsets_ptr=offsets,
        row_tok_ptr=row_tok,
        row_acc_ptr=row_acc,
        row_lp_ptr=row_lp,
        V=V,
        K1=K1,
        HAS_PROBS=draft_probs is not None,
        HAS_TEMP=temperature is not None,
        HAS_TOP_K=top_k is not None,
        HAS_TOP_P=top_p is not None,
        HAS_MIN_P=min_p is not None,
        LOGPROBS=return_logprobs,
        BLOCK=min(1024, max(16, next_pow2(V))),
        SEARCH_BLOCK=min(128, max(16, next_pow2(V))),
        NPIV=SEARCH_PIVOTS or (16 if target_logits.is_cuda else 1024),
    )
    _rejection_finalize_kernel[(B,)](
        cu_ptr=cu_num_draft_tokens,
        row_tok_ptr=row_tok,
        row_acc_ptr=row_acc,
        row_lp_ptr=row_lp,
        out_ptr=out,
        num_emitted_ptr=num_emitted,
        logprobs_ptr=logprobs if return_logprobs else None,
        K1=K1,
        LOGPROBS=return_logprobs,
        K1_BLOCK=next_pow2(K1),
    )
    return out, num_emitted, logprobs
