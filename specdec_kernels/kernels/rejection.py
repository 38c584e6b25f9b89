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

The weights, the filters' threshold search and the inverse CDF are
``kernels/sampling.py``'s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_kernels.kernels import _utils
from specdec_kernels.kernels._utils import next_pow2
from specdec_kernels.kernels.philox import philox_uniform
from specdec_kernels.kernels.sampling import (
    LOG2E,
    _filter_threshold,
    _inverse_cdf,
    _log_prob,
    _raw_sum,
    _residual_total,
    _row_max,
    _row_sums,
)


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
                    row_ptr, V, stride_lv, scale2, m, S_z, S_min, b, top_k_ptr, top_p_ptr, t_min,
                    HAS_TOP_K=HAS_TOP_K, HAS_TOP_P=HAS_TOP_P, HAS_MIN_P=HAS_MIN_P, BLOCK=BLOCK,
                    SEARCH_BLOCK=SEARCH_BLOCK, NPIV=NPIV,
                )  # fmt: skip
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
    target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k, top_p,
    min_p, seeds, offsets, *, num_speculative_tokens, return_logprobs,
):  # fmt: skip
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
