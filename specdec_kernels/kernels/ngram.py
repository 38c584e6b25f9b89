"""Triton n-gram proposer: the CUDA path of ``ngram_propose``.

Two launches, no host synchronisation:

1. ``_ngram_scan_kernel``, grid ``(B, cdiv(L_max, BLOCK))``: each program takes a block of
   window-end positions ``j`` of one request and computes ``c[j]``, the length (capped at
   ``max_n``) of the common run of tokens ending at ``j`` and at the request's last token
   ``L-1``. A window ``[j-n+1, j]`` matches the suffix n-gram iff ``c[j] >= n``, so the
   longest matching n is the largest ``c[j]`` over ``j <= L-2`` (a following token must
   exist). The block's best candidate is written as one int64 key
   ``c << 32 | tie`` where ``tie`` orders positions by the tie-break rule.
2. ``_ngram_finalize_kernel``, grid ``(B,)``: reduces the keys of one request, decodes
   ``(n, j)``, caps the draft count and copies the tokens after the match.

Positions past a request's length are masked, so one launch serves a ragged batch; the
comparisons past the first are masked by the still-matching lanes, so on the GPU they
read memory only for positions that already match the last token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_kernels.kernels._utils import next_pow2

_TIE_SHIFT = tl.constexpr(32)
_TIE_MAX = tl.constexpr(0x7FFFFFFF)


@triton.jit(do_not_specialize=["hist_stride"])
def _ngram_scan_kernel(
    token_ids_ptr,
    hist_stride,
    tok_stride,
    num_tokens_ptr,
    req_indices_ptr,
    keys_ptr,
    num_blocks,
    MIN_N: tl.constexpr,
    MAX_N: tl.constexpr,
    HAS_REQ_INDICES: tl.constexpr,
    TIE_LAST: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    blk = tl.program_id(1)
    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + b)
    else:
        r = b
    r = r.to(tl.int64)
    length = tl.load(num_tokens_ptr + tl.maximum(r, 0), mask=r >= 0, other=0).to(tl.int64)
    row = token_ids_ptr + r * hist_stride

    j = blk * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    alive = j <= length - 2
    run = tl.zeros([BLOCK], dtype=tl.int32)
    for t in tl.static_range(MAX_N):
        s_pos = length - 1 - t
        s_tok = tl.load(row + tl.maximum(s_pos, 0) * tok_stride, mask=s_pos >= 0, other=0)
        back = j - t
        # back >= 0 together with j <= L-2 implies s_pos > back >= 0.
        ok = alive & (back >= 0)
        tok = tl.load(row + back * tok_stride, mask=ok, other=0)
        alive = ok & (tok == s_tok)
        run += alive.to(tl.int32)

    if TIE_LAST:
        tie = j
    else:
        tie = _TIE_MAX - j
    key = (run.to(tl.int64) << _TIE_SHIFT) | tie
    key = tl.where(run >= MIN_N, key, -1)
    best = tl.max(key, axis=0)
    tl.store(keys_ptr + b.to(tl.int64) * num_blocks + blk, best)


@triton.jit(do_not_specialize=["hist_stride", "max_model_len"])
def _ngram_finalize_kernel(
    token_ids_ptr,
    hist_stride,
    tok_stride,
    num_tokens_ptr,
    req_indices_ptr,
    max_draft_tokens_ptr,
    keys_ptr,
    num_blocks,
    drafts_ptr,
    num_drafts_ptr,
    match_len_ptr,
    k,
    max_model_len,
    HAS_REQ_INDICES: tl.constexpr,
    HAS_MAX_DRAFT: tl.constexpr,
    HAS_MAX_MODEL_LEN: tl.constexpr,
    TIE_LAST: tl.constexpr,
    KEY_BLOCK: tl.constexpr,
    K_BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + b)
    else:
        r = b
    r = r.to(tl.int64)
    length = tl.load(num_tokens_ptr + tl.maximum(r, 0), mask=r >= 0, other=0).to(tl.int64)

    best = tl.full([KEY_BLOCK], -1, dtype=tl.int64)
    for start in range(0, num_blocks, KEY_BLOCK):
        offs = start + tl.arange(0, KEY_BLOCK)
        keys = tl.load(keys_ptr + b * num_blocks + offs, mask=offs < num_blocks, other=-1)
        best = tl.maximum(best, keys)
    key = tl.max(best, axis=0)

    tie = key & _TIE_MAX
    if TIE_LAST:
        end = tie
    else:
        end = _TIE_MAX - tie
    first = end + 1  # the token after the matched window
    m = tl.minimum(length - first, k)
    if HAS_MAX_DRAFT:
        m = tl.minimum(m, tl.load(max_draft_tokens_ptr + b).to(tl.int64))
    if HAS_MAX_MODEL_LEN:
        m = tl.minimum(m, max_model_len - length)
    m = tl.where(key >= 0, tl.maximum(m, 0), 0)

    offs = tl.arange(0, K_BLOCK)
    take = offs < m
    tok = tl.load(
        token_ids_ptr + r * hist_stride + (first + offs) * tok_stride, mask=take, other=-1
    )
    tl.store(drafts_ptr + b * k + offs, tl.where(take, tok, -1), mask=offs < k)
    tl.store(num_drafts_ptr + b, m.to(tl.int32))
    tl.store(match_len_ptr + b, tl.where(m > 0, key >> 32, 0).to(tl.int32))


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Output and scratch allocation (tests swap it for a poisoned fill: unwritten slots show)."""
    return torch.empty(shape, dtype=dtype, device=device)


def ngram_propose(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    req_indices: torch.Tensor | None,
    max_draft_tokens: torch.Tensor | None,
    *,
    min_n: int,
    max_n: int,
    num_speculative_tokens: int,
    max_model_len: int | None,
    tie_break: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the scan and finalize kernels; inputs are assumed validated.

    Absent optional tensors go to the kernels as ``None`` (a constexpr there, guarded by
    its ``HAS_*`` flag).
    """
    k = num_speculative_tokens
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    device = token_ids.device
    drafts = _empty((B, k), torch.int32, device)
    counts = _empty((B,), torch.int32, device)
    match_len = _empty((B,), torch.int32, device)
    if B == 0:
        return drafts, counts, match_len
    if k == 0:
        return drafts, counts.zero_(), match_len.zero_()
    L_max = token_ids.shape[1]
    block = min(1024, max(16, next_pow2(L_max)))
    num_blocks = max(1, triton.cdiv(L_max, block))
    keys = _empty((B, num_blocks), torch.int64, device)
    tie_last = tie_break == "last"
    _ngram_scan_kernel[(B, num_blocks)](
        token_ids_ptr=token_ids,
        hist_stride=token_ids.stride(0),
        tok_stride=token_ids.stride(1),
        num_tokens_ptr=num_tokens,
        req_indices_ptr=req_indices,
        keys_ptr=keys,
        num_blocks=num_blocks,
        MIN_N=min_n,  # a min_n > MAX_N finds nothing, as it should
        # n never exceeds L - 1 <= L_max - 1: no need to unroll further
        MAX_N=max(1, min(max_n, L_max - 1)),
        HAS_REQ_INDICES=req_indices is not None,
        TIE_LAST=tie_last,
        BLOCK=block,
    )
    _ngram_finalize_kernel[(B,)](
        token_ids_ptr=token_ids,
        hist_stride=token_ids.stride(0),
        tok_stride=token_ids.stride(1),
        num_tokens_ptr=num_tokens,
        req_indices_ptr=req_indices,
        max_draft_tokens_ptr=max_draft_tokens,
        keys_ptr=keys,
        num_blocks=num_blocks,
        drafts_ptr=drafts,
        num_drafts_ptr=counts,
        match_len_ptr=match_len,
        k=k,
        max_model_len=max_model_len if max_model_len is not None else 0,
        HAS_REQ_INDICES=req_indices is not None,
        HAS_MAX_DRAFT=max_draft_tokens is not None,
        HAS_MAX_MODEL_LEN=max_model_len is not None,
        TIE_LAST=tie_last,
        KEY_BLOCK=min(1024, next_pow2(num_blocks)),
        K_BLOCK=next_pow2(k),
    )
    return drafts, counts, match_len
