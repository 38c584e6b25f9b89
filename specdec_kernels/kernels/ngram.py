"""Triton n-gram proposer: the CUDA path of ``ngram_propose``.

Without an index, two launches, no host synchronisation:

1. ``_ngram_scan_kernel``, grid ``(B, cdiv(L_max, BLOCK))``: each program takes a block of
   window-end positions ``j`` of one request and computes ``c[j]``, the length (capped at
   ``max_n``) of the common run of tokens ending at ``j`` and at the request's last token
   ``L-1``. A window ``[j-n+1, j]`` matches the suffix n-gram iff ``c[j] >= n``, so the
   longest matching n is the largest ``c[j]`` over ``j <= L-2`` (a following token must
   exist). The block's best candidate is written as one int64 key
   ``c << 32 | tie`` where ``tie`` orders positions by the tie-break rule.
2. ``_ngram_propose_kernel``, grid ``(B,)``: reduces the keys of one request to the
   own-history match ``(n, j)``, caps the draft count and copies the tokens after it.

With an index the scan is skipped: the same ``_ngram_propose_kernel`` finds the own-history
match with one lane per n probing the row's table (``kernels/ngram_index.py``). With a
corpus, its lanes also look the suffix n-grams up in the corpus table
(``kernels/corpus.py``), and a longer corpus match beats the own history.

Positions past a request's length are masked, so one launch serves a ragged batch; the
comparisons past the first are masked by the still-matching lanes, so on the GPU they
read memory only for positions that already match the last token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_kernels import constants
from specdec_kernels.kernels import _utils
from specdec_kernels.kernels._utils import next_pow2
from specdec_kernels.kernels.corpus import _corpus_lookup
from specdec_kernels.kernels.ngram_index import _index_lookup, _suffix_hash

_TIE_SHIFT = tl.constexpr(32)
DRAFT_SOURCE_NONE = tl.constexpr(constants.DRAFT_SOURCE_NONE)
DRAFT_SOURCE_OWN = tl.constexpr(constants.DRAFT_SOURCE_OWN)
DRAFT_SOURCE_CORPUS = tl.constexpr(constants.DRAFT_SOURCE_CORPUS)
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


@triton.jit(do_not_specialize=["hist_stride", "max_model_len", "S", "C", "H"])
def _ngram_propose_kernel(
    token_ids_ptr,
    hist_stride,
    tok_stride,
    num_tokens_ptr,
    req_indices_ptr,
    max_draft_tokens_ptr,
    keys_ptr,
    num_blocks,
    index_ptr,
    S,
    corpus_tokens_ptr,
    corpus_meta_ptr,
    corpus_index_ptr,
    corpus_state_ptr,
    C,
    H,
    drafts_ptr,
    num_drafts_ptr,
    match_len_ptr,
    source_ptr,
    k,
    max_model_len,
    MIN_N: tl.constexpr,
    N: tl.constexpr,
    NB: tl.constexpr,
    HAS_REQ_INDICES: tl.constexpr,
    HAS_MAX_DRAFT: tl.constexpr,
    HAS_MAX_MODEL_LEN: tl.constexpr,
    HAS_INDEX: tl.constexpr,
    HAS_CORPUS: tl.constexpr,
    TIE_LAST: tl.constexpr,
    KEY_BLOCK: tl.constexpr,
    K_BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    MAX_N: tl.constexpr = MIN_N + N - 1
    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + b).to(tl.int64)
    else:
        r = b
    active = r >= 0
    r = tl.maximum(r, 0)
    L = tl.load(num_tokens_ptr + r, mask=active, other=0).to(tl.int64)
    row = token_ids_ptr + r * hist_stride

    # lanes, one per n (index and corpus lookups)
    jv = tl.arange(0, NB).to(tl.int64)
    n = MIN_N + jv
    valid = (jv < N) & (n <= L)  # a padding row has L = 0
    if HAS_INDEX or HAS_CORPUS:
        h = _suffix_hash(row, tok_stride, L, n, valid, MAX_N)

    # the own-history match: n_own (0: none) and the start of its drafts
    if HAS_INDEX:
        own, first, last = _index_lookup(
            row, tok_stride, L, n, jv, valid, h, index_ptr + r * N * S * 2, S, N, MAX_N
        )
        n_own = tl.max(tl.where(own, n, 0), axis=0)
        sel = n == n_own
        if TIE_LAST:
            i_own = tl.sum(tl.where(sel, last, 0), axis=0)
        else:
            i_own = tl.sum(tl.where(sel, first, 0), axis=0)
        start_own = i_own + n_own
    else:
        best = tl.full([KEY_BLOCK], -1, dtype=tl.int64)
        for s in range(0, num_blocks, KEY_BLOCK):
            offs = s + tl.arange(0, KEY_BLOCK)
            keys = tl.load(keys_ptr + b * num_blocks + offs, mask=offs < num_blocks, other=-1)
            best = tl.maximum(best, keys)
        key = tl.max(best, axis=0)
        tie = key & _TIE_MAX
        if TIE_LAST:
            end = tie
        else:
            end = _TIE_MAX - tie
        n_own = tl.where(key >= 0, key >> _TIE_SHIFT, 0)
        start_own = end + 1  # the token after the matched window
    avail = L - start_own
    n_sel = n_own
    from_corpus = n_own < 0  # False

    # a longer match in the corpus wins (its most recent occurrence)
    if HAS_CORPUS:
        lo = tl.load(corpus_state_ptr + 1)
        p = _corpus_lookup(
            row, tok_stride, L, n, jv, valid, h, corpus_tokens_ptr, corpus_index_ptr, lo, C, H,
            MAX_N,
        )  # fmt: skip
        n_c = tl.max(tl.where(p >= 0, n, 0), axis=0)
        p_c = tl.sum(tl.where(n == n_c, p, 0), axis=0)
        from_corpus = n_c > n_own
        start_c = p_c + n_c
        doc_end = tl.load(corpus_meta_ptr + (tl.maximum(p_c, 0) % C) * 2 + 1, mask=from_corpus)
        avail = tl.where(from_corpus, doc_end - start_c, avail)
        n_sel = tl.where(from_corpus, n_c, n_own)

    m = tl.minimum(avail, k)
    if HAS_MAX_DRAFT:
        m = tl.minimum(m, tl.load(max_draft_tokens_ptr + b).to(tl.int64))
    if HAS_MAX_MODEL_LEN:
        m = tl.minimum(m, max_model_len - L)
    m = tl.where(active & (n_sel > 0), tl.maximum(m, 0), 0)

    offs = tl.arange(0, K_BLOCK)
    take = offs < m
    corpus_b = (offs * 0 + from_corpus.to(tl.int32)) > 0  # as a block (interpreter typing)
    tok = tl.load(row + (start_own + offs) * tok_stride, mask=take & ~corpus_b, other=-1)
    if HAS_CORPUS:
        ctok = tl.load(corpus_tokens_ptr + (start_c + offs) % C, mask=take & corpus_b, other=-1)
        tok = tl.where(corpus_b, ctok, tok)
    tl.store(drafts_ptr + b * k + offs, tl.where(take, tok, -1), mask=offs < k)
    tl.store(num_drafts_ptr + b, m.to(tl.int32))
    tl.store(match_len_ptr + b, tl.where(m > 0, n_sel, 0).to(tl.int32))
    source = tl.where(from_corpus, DRAFT_SOURCE_CORPUS, DRAFT_SOURCE_OWN)
    tl.store(source_ptr + b, tl.where(m > 0, source, DRAFT_SOURCE_NONE).to(tl.int8))


def ngram_propose(
    token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, *, min_n, max_n,
    num_speculative_tokens, max_model_len, tie_break,
):  # fmt: skip
    """Launch the scan (without an index) and the propose kernel; inputs are validated.

    Absent optional tensors go to the kernels as ``None`` (a constexpr there, guarded by
    its ``HAS_*`` flag).
    """
    k = num_speculative_tokens
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    device = token_ids.device
    drafts, counts, match_len, source = _utils.proposal_outputs(B, k, device)
    if B == 0:
        return drafts, counts, match_len, source
    if k == 0:
        return drafts, counts.zero_(), match_len.zero_(), source.zero_()
    L_max = token_ids.shape[1]
    tie_last = tie_break == "last"
    keys, num_blocks = None, 1
    if index is None:
        block = min(1024, max(16, next_pow2(L_max)))
        num_blocks = max(1, triton.cdiv(L_max, block))
        keys = _utils._empty((B, num_blocks), torch.int64, device)
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
    table = None if index is None else index[0]
    ctok, cmeta, cindex, cstate = (None,) * 4 if corpus is None else corpus
    N = max_n - min_n + 1
    _ngram_propose_kernel[(B,)](
        token_ids_ptr=token_ids,
        hist_stride=token_ids.stride(0),
        tok_stride=token_ids.stride(1),
        num_tokens_ptr=num_tokens,
        req_indices_ptr=req_indices,
        max_draft_tokens_ptr=max_draft_tokens,
        keys_ptr=keys,
        num_blocks=num_blocks,
        index_ptr=table,
        S=1 if table is None else table.shape[2],
        corpus_tokens_ptr=ctok,
        corpus_meta_ptr=cmeta,
        corpus_index_ptr=cindex,
        corpus_state_ptr=cstate,
        C=1 if ctok is None else ctok.shape[0],
        H=1 if cindex is None else cindex.shape[1],
        drafts_ptr=drafts,
        num_drafts_ptr=counts,
        match_len_ptr=match_len,
        source_ptr=source,
        k=k,
        max_model_len=max_model_len if max_model_len is not None else 0,
        MIN_N=min_n,
        N=N,
        NB=next_pow2(N) if table is not None or ctok is not None else 1,  # lanes for lookups
        HAS_REQ_INDICES=req_indices is not None,
        HAS_MAX_DRAFT=max_draft_tokens is not None,
        HAS_MAX_MODEL_LEN=max_model_len is not None,
        HAS_INDEX=table is not None,
        HAS_CORPUS=ctok is not None,
        TIE_LAST=tie_last,
        KEY_BLOCK=min(1024, next_pow2(num_blocks)),
        K_BLOCK=next_pow2(k),
    )
    return drafts, counts, match_len, source
