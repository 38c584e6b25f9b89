"""Triton rejection sampler: the CUDA path of ``rejection_sample``.

Two launches, no host synchronisation, no input written:

1. ``_rejection_rows_kernel``, grid ``(B, k+1)``: program ``(b, j)`` handles target row
   ``cu[b] + b + j`` of request ``b`` (nothing if ``j > k_b``). It decides, independently
   of the other rows, whether draft ``d_j`` would be accepted and which token the request
   would emit if row ``j`` were where it stops (the recovered token after a rejection, or
   the bonus token at ``j = k_b``), plus that token's log-probability. Because a
   request's uniforms depend only on ``(seed, offsets[b] + j, stream)``, rows after the
   first rejection can be evaluated in parallel and simply ignored later.
2. ``_rejection_finalize_kernel``, grid ``(B,)``: finds the first row that is not
   accepted, writes the emitted tokens (accepted drafts, then that row's token), -1
   padding, ``num_emitted`` and the log-probabilities.

Each row streams over the vocabulary in blocks of ``BLOCK`` (never a ``next_pow2(V)``
block); every pass recomputes the fp32 weights from the logits, so nothing of size ``V``
is stored. With ``l`` the logits (NaN read as ``-inf``) and ``m = max l`` the weights are
``e = 1 where l == m else exp((l - m) / T)``, so ``0 <= e <= 1``, the top token has ``e = 1``,
and ``+inf`` or all ``-inf`` rows still give a proper distribution.

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

from specdec_kernels.kernels._utils import next_pow2
from specdec_kernels.kernels.philox import philox_uniform


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Output and scratch allocation (tests swap it for a poisoned fill: unwritten slots show)."""
    return torch.empty(shape, dtype=dtype, device=device)


@triton.jit
def _load_logits(row_ptr, offs, V, stride_v):
    """fp32 logits of one block, NaN read as -inf; lanes past V are -inf."""
    l = tl.load(row_ptr + offs.to(tl.int64) * stride_v, mask=offs < V, other=float("-inf"))
    l = l.to(tl.float32)
    return tl.where(l != l, float("-inf"), l)


@triton.jit
def _weights(row_ptr, offs, V, stride_v, T, m_l):
    """Unnormalised fp32 weights ``e`` of one block (0 past V).

    With ``l`` the logits (NaN read as -inf) and ``m_l = max l``: ``e = 1`` where
    ``l == m_l``, else ``exp((l - m_l) / T)``. Subtracting before dividing keeps a tiny
    ``T`` from overflowing ``l / T`` to inf; halving first (``(l/2 - m_l/2) / T * 2``, the
    same value bit for bit) keeps ``l - m_l`` itself from overflowing near 3.4e38.
    Self-contained (no nested calls): the interpreter pays for every device-function call.
    """
    l = tl.load(row_ptr + offs.to(tl.int64) * stride_v, mask=offs < V, other=float("-inf"))
    l = l.to(tl.float32)
    l = tl.where(l != l, float("-inf"), l)
    e = tl.where(l == m_l, 1.0, tl.exp((l * 0.5 - m_l * 0.5) / T * 2.0))
    return tl.where(offs < V, e, 0.0)


@triton.jit
def _kept_sum(row_ptr, V, stride_v, T, m_z, t, BLOCK: tl.constexpr):
    """Sum of the weights whose bit pattern is ``>= t``."""
    total = 0.0
    for s in range(0, V, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        e = _weights(row_ptr, offs, V, stride_v, T, m_z)
        total += tl.sum(tl.where(e.to(tl.int32, bitcast=True) >= t, e, 0.0), axis=0)
    return total


@triton.jit
def _search_threshold(
    row_ptr,
    V,
    stride_v,
    T,
    m_z,
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
            e = _weights(row_ptr, offs, V, stride_v, T, m_z)
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

        T = 1.0
        if HAS_TEMP:
            T = tl.load(temp_ptr + b).to(tl.float32)

        # Pass A: the max logit and its lowest index (greedy; the weights' reference).
        m_raw = float("-inf")
        arg = 0
        for s in range(0, V, BLOCK):
            offs = s + tl.arange(0, BLOCK)
            l = _load_logits(row_ptr, offs, V, stride_lv)
            bm = tl.max(l, axis=0)
            bi = tl.min(tl.where(l == bm, offs, V), axis=0)
            arg = tl.where(bm > m_raw, bi, arg)
            m_raw = tl.maximum(m_raw, bm)
        m_z = m_raw  # weights are exp((l - max l) / T)
        tok = arg
        acc = is_draft & (x == arg)

        if HAS_TEMP:
            if T != 0.0:
                # Pass B: the total weight and the draft's weight.
                S_z = 0.0
                e_x = 0.0
                for s in range(0, V, BLOCK):
                    offs = s + tl.arange(0, BLOCK)
                    e = _weights(row_ptr, offs, V, stride_lv, T, m_z)
                    S_z += tl.sum(e, axis=0)
                    e_x += tl.sum(tl.where(offs == xs, e, 0.0), axis=0)

                # Filters: the kept set is {e >= t} (t as an int32 bit pattern).
                t = 0
                S_k = S_z
                if HAS_TOP_K:
                    K = tl.load(top_k_ptr + b)
                    if (K > 0) & (K < V):
                        t, S_k = _search_threshold(
                            row_ptr,
                            V,
                            stride_lv,
                            T,
                            m_z,
                            t,
                            S_k,
                            K.to(tl.float32),
                            USE_SUM=False,
                            BLOCK=SEARCH_BLOCK,
                            NPIV=NPIV,
                        )
                S = S_k
                if HAS_TOP_P:
                    P = tl.load(top_p_ptr + b).to(tl.float32)
                    if P < 1.0:
                        t, S = _search_threshold(
                            row_ptr,
                            V,
                            stride_lv,
                            T,
                            m_z,
                            t,
                            S_k,
                            P * S_k,
                            USE_SUM=True,
                            BLOCK=SEARCH_BLOCK,
                            NPIV=NPIV,
                        )
                if HAS_MIN_P:
                    t_min = tl.load(min_p_ptr + b).to(tl.float32).to(tl.int32, bitcast=True)
                    if t_min > t:
                        t = t_min
                        S = _kept_sum(row_ptr, V, stride_lv, T, m_z, t, BLOCK)
                w_x = tl.where(valid & (e_x.to(tl.int32, bitcast=True) >= t), e_x, 0.0)

                # Acceptance: u < p(x) / q(x), q(x) > 0.
                seed = tl.load(seeds_ptr + b)
                counter = tl.load(offsets_ptr + b) + j
                q_x = 1.0
                if HAS_PROBS:
                    q_x = tl.load(
                        probs_ptr + (start + j) * stride_pr + xs.to(tl.int64) * stride_pv,
                        mask=valid,
                        other=0.0,
                    ).to(tl.float32)
                acc = valid & (q_x > 0.0)
                if acc:
                    acc = philox_uniform(seed, counter, 0) < (w_x / S) / q_x

                if not acc:
                    # The distribution to sample: the residual after a rejection, else p.
                    total = S
                    excl = -1
                    resid = False
                    if valid:
                        if HAS_PROBS:
                            R = 0.0
                            q_row = probs_ptr + (start + j) * stride_pr
                            for s in range(0, V, BLOCK):
                                offs = s + tl.arange(0, BLOCK)
                                e = _weights(row_ptr, offs, V, stride_lv, T, m_z)
                                w = tl.where(e.to(tl.int32, bitcast=True) >= t, e, 0.0)
                                q = tl.load(
                                    q_row + offs.to(tl.int64) * stride_pv, mask=offs < V, other=0.0
                                ).to(tl.float32)
                                r = tl.where(offs < V, tl.maximum(w / S - q, 0.0), 0.0)
                                R += tl.sum(r, axis=0)
                            if R > 0.0:
                                resid = True
                                total = R
                        else:
                            rest = S - w_x
                            if rest > 0.0:
                                excl = x
                                total = rest

                    # Inverse CDF: the first id whose running mass exceeds u * total.
                    thr = philox_uniform(seed, counter, 1) * total
                    found = V
                    last = -1
                    carry = 0.0
                    s = 0
                    while (s < V) & (found == V):
                        offs = s + tl.arange(0, BLOCK)
                        e = _weights(row_ptr, offs, V, stride_lv, T, m_z)
                        mass = tl.where(e.to(tl.int32, bitcast=True) >= t, e, 0.0)
                        if HAS_PROBS:
                            q = tl.load(
                                probs_ptr + (start + j) * stride_pr + offs.to(tl.int64) * stride_pv,
                                mask=(offs < V) & resid,
                                other=0.0,
                            ).to(tl.float32)
                            mass = tl.where(resid, tl.maximum(mass / S - q, 0.0), mass)
                            mass = tl.where(offs < V, mass, 0.0)
                        else:
                            mass = tl.where(offs == excl, 0.0, mass)
                        run = carry + tl.cumsum(mass, axis=0)
                        hit = (run > thr) & (mass > 0.0)
                        found = tl.minimum(found, tl.min(tl.where(hit, offs, V), axis=0))
                        last = tl.maximum(last, tl.max(tl.where(mass > 0.0, offs, -1), axis=0))
                        carry += tl.sum(mass, axis=0)
                        s += BLOCK
                    tok = tl.where(found < V, found, tl.where(last >= 0, last, arg))
                else:
                    tok = x.to(tl.int32)

        lp = 0.0
        if LOGPROBS:
            S_raw = 0.0
            for s in range(0, V, BLOCK):
                offs = s + tl.arange(0, BLOCK)
                l = _load_logits(row_ptr, offs, V, stride_lv)
                e = tl.where(l == m_raw, 1.0, tl.exp(l - m_raw))
                S_raw += tl.sum(tl.where(offs < V, e, 0.0), axis=0)
            l_tok = tl.load(row_ptr + tok.to(tl.int64) * stride_lv).to(tl.float32)
            l_tok = tl.where(l_tok != l_tok, float("-inf"), l_tok)
            lp = l_tok - (m_raw + tl.log(S_raw))

        out = b * K1 + j
        tl.store(row_tok_ptr + out, tok.to(tl.int32))
        tl.store(row_acc_ptr + out, acc.to(tl.int32))
        tl.store(row_lp_ptr + out, lp)


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
    search_pivots: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the row and finalize kernels; inputs are assumed validated (seeds and offsets
    present whenever ``temperature`` is).

    ``search_pivots`` (a power of two) is the number of thresholds a top-k/top-p search
    pass tests at once. Default: 16 on the GPU, where each pivot costs a compare per
    vocabulary entry, and 1024 under the interpreter, where passes (Python operations) cost
    and wide blocks are nearly free.
    """
    K1 = num_speculative_tokens + 1
    B = cu_num_draft_tokens.shape[0] - 1
    V = target_logits.shape[1]
    device = target_logits.device
    out = _empty((B, K1), torch.int32, device)
    num_emitted = _empty((B,), torch.int32, device)
    logprobs = _empty((B, K1) if return_logprobs else (0,), torch.float32, device)
    if B == 0:
        return out, num_emitted, logprobs
    row_tok = _empty((B, K1), torch.int32, device)
    row_acc = _empty((B, K1), torch.int32, device)
    row_lp = _empty((B, K1), torch.float32, device)
    dummy = cu_num_draft_tokens  # never read when the matching HAS_* flag is False
    # An empty draft buffer is never read (k_b = 0 everywhere) but needs a valid pointer.
    drafts = draft_token_ids if draft_token_ids.numel() else dummy
    if draft_probs is not None and draft_probs.numel() == 0:
        draft_probs = None  # no draft rows at all (N = 0); an empty tensor has no pointer
    probs = draft_probs if draft_probs is not None else target_logits
    _rejection_rows_kernel[(B, K1)](
        logits_ptr=target_logits,
        stride_lr=target_logits.stride(0),
        stride_lv=target_logits.stride(1),
        drafts_ptr=drafts,
        cu_ptr=cu_num_draft_tokens,
        probs_ptr=probs,
        stride_pr=probs.stride(0),
        stride_pv=probs.stride(1),
        temp_ptr=temperature if temperature is not None else dummy,
        top_k_ptr=top_k if top_k is not None else dummy,
        top_p_ptr=top_p if top_p is not None else dummy,
        min_p_ptr=min_p if min_p is not None else dummy,
        seeds_ptr=seeds if seeds is not None else dummy,
        offsets_ptr=offsets if offsets is not None else dummy,
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
        NPIV=search_pivots or (16 if target_logits.is_cuda else 1024),
    )
    _rejection_finalize_kernel[(B,)](
        cu_ptr=cu_num_draft_tokens,
        row_tok_ptr=row_tok,
        row_acc_ptr=row_acc,
        row_lp_ptr=row_lp,
        out_ptr=out,
        num_emitted_ptr=num_emitted,
        logprobs_ptr=logprobs if return_logprobs else row_lp,
        K1=K1,
        LOGPROBS=return_logprobs,
        K1_BLOCK=next_pow2(K1),
    )
    return out, num_emitted, logprobs
