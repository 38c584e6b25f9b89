"""Triton n-gram index and shared corpus: the CUDA path of the ``ngram_index`` ops.

No host synchronisation and static grids everywhere (the loops inside read the lengths):

- ``ngram_index_build``: ``_index_clear_kernel`` empties the rows' tables, then
  ``_index_insert_kernel``, grid ``(B, N, cdiv(L_max, BLOCK))``, inserts every n-gram of
  the rows in parallel; ``_index_set_len_kernel`` records the indexed lengths.
- ``ngram_index_extend``: the same insert kernel, grid ``(B, N, 1)``, over the new starts
  only (``index_len[r] - n .. num_tokens[r] - n - 1``): O(new tokens x n range) per row.
- insertion is lock-free linear probing: ``atomic_cas(first, -1 -> i)`` claims an empty
  slot; a slot that holds another start is compared token by token with the n-gram at
  that start (the key is never stored, so it cannot collide), and the same n-gram merges
  with ``atomic_min(first)`` / ``atomic_max(last)``. A slot's n-gram never changes and no
  slot empties, so two inserts of one n-gram walk the same slots and meet in one of them,
  whatever the interleaving: the slot positions depend on the schedule, the table's
  content (one slot per n-gram with its smallest and largest start) does not.
- ``ngram_index_propose``, grid ``(B,)``: one lane per n; each lane hashes its suffix
  n-gram, probes the row's table (and the corpus's two slots), and the longest n wins.
- ``corpus_append``: ``_corpus_plan_kernel`` (one program: document starts, the new live
  window) then ``_corpus_write_kernel``, grid ``(B, cdiv(min(W, C), BLOCK))``: ring tokens,
  document bounds, and ``atomic_max`` of each occurrence's start into its two slots, which
  is order independent (the slot keeps the most recent start).

The hashes are ``specdec_kernels.reference.ngram_index``'s, in int64 arithmetic kept to
32 bits, so a table built by one path is read correctly by the others.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_kernels.constants import NGRAM_HASH_FNV_OFFSET as FNV_OFFSET
from specdec_kernels.constants import NGRAM_HASH_FNV_PRIME as FNV_PRIME
from specdec_kernels.constants import NGRAM_HASH_MIX1 as MIX1
from specdec_kernels.constants import NGRAM_HASH_MIX2 as MIX2
from specdec_kernels.kernels._utils import next_pow2

_FNV_OFFSET = tl.constexpr(FNV_OFFSET)
_FNV_PRIME = tl.constexpr(FNV_PRIME)
_MIX1 = tl.constexpr(MIX1)
_MIX2 = tl.constexpr(MIX2)
_BIG = tl.constexpr(1 << 62)

_INSERT_BLOCK = 256  # starts per program (build)
_EXTEND_BLOCK = 16  # starts per loop step (extend: k + 1 new tokens per step)
_CLEAR_BLOCK = 4096
_CORPUS_BLOCK = 256


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Output and scratch allocation (tests swap it for a poisoned fill: unwritten slots show)."""
    return torch.empty(shape, dtype=dtype, device=device)


@triton.jit
def _lo32(v):
    """The low 32 bits of an int64 (as a non-negative int64)."""
    return v - ((v >> 32) << 32)


@triton.jit
def _hash_init(n):
    return tl.full(n.shape, _FNV_OFFSET, tl.int64) ^ n.to(tl.int64)


@triton.jit
def _hash_step(h, x):
    h = _lo32((h ^ _lo32(x.to(tl.int64))) * _FNV_PRIME)
    return h ^ (h >> 15)


@triton.jit
def _mix1(h):
    h = h ^ (h >> 16)
    h = _lo32(h * _MIX1)
    return h ^ (h >> 16)


@triton.jit
def _mix2(h):
    h = h ^ (h >> 15)
    h = _lo32(h * _MIX2)
    return h ^ (h >> 13)


# ----------------------------------------------------------------------------- own history


@triton.jit(do_not_specialize=["S"])
def _index_clear_kernel(
    req_indices_ptr,
    index_ptr,
    S,
    num_blocks,
    N: tl.constexpr,
    HAS_REQ_INDICES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    blk = tl.program_id(1)
    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + b).to(tl.int64)
    else:
        r = b.to(tl.int64)
    row_size = N * S * 2
    base = index_ptr + tl.maximum(r, 0) * row_size
    for start in range(blk * BLOCK, row_size, num_blocks * BLOCK):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)
        # (the interpreter mis-types "block & scalar bool": compare blocks only)
        keep = (offs < row_size) & (offs * 0 + r >= 0)
        tl.store(base + offs, tl.full([BLOCK], -1, tl.int32), mask=keep)


@triton.jit(do_not_specialize=["hist_stride", "tok_stride", "S", "num_progs"])
def _index_insert_kernel(
    token_ids_ptr,
    hist_stride,
    tok_stride,
    num_tokens_ptr,
    req_indices_ptr,
    index_ptr,
    index_len_ptr,
    S,
    num_progs,
    MIN_N: tl.constexpr,
    N: tl.constexpr,
    HAS_REQ_INDICES: tl.constexpr,
    FROM_SCRATCH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    j = tl.program_id(1)
    g = tl.program_id(2)
    MAX_N: tl.constexpr = MIN_N + N - 1
    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + b).to(tl.int64)
    else:
        r = b.to(tl.int64)
    active = r >= 0
    r = tl.maximum(r, 0)
    L = tl.load(num_tokens_ptr + r, mask=active, other=0).to(tl.int64)
    if FROM_SCRATCH:
        old = L * 0
    else:
        old = tl.load(index_len_ptr + r, mask=active, other=0).to(tl.int64)
    n = MIN_N + j
    lo = tl.maximum(old - n, 0)  # the n-gram at i joins once token i + n exists
    hi = tl.where(active, L - n, lo)
    row = token_ids_ptr + r * hist_stride
    table = index_ptr + (r * N + j) * S * 2
    for start in range(lo + g * BLOCK, hi, num_progs * BLOCK):
        i = start + tl.arange(0, BLOCK).to(tl.int64)
        pend = i < hi
        nb = i * 0 + n  # n as a block (see _index_clear_kernel)
        h = _hash_init(nb)
        for t in tl.static_range(MAX_N):
            x = tl.load(row + (i + t) * tok_stride, mask=pend & (t < nb), other=0)
            h = tl.where(t < nb, _hash_step(h, x), h)
        pos = _mix1(h) % S
        val = i.to(tl.int32)
        while tl.max(pend.to(tl.int32), axis=0) > 0:
            ptr = table + pos * 2
            # finished lanes compare against -2, which no slot holds: a no-op
            seen = tl.atomic_cas(ptr, tl.where(pend, -1, -2), tl.where(pend, val, -2))
            claimed = pend & (seen == -1)
            same = pend & (seen >= 0)
            f = seen.to(tl.int64)
            for t in tl.static_range(MAX_N):
                m = same & (t < nb)
                a = tl.load(row + (f + t) * tok_stride, mask=m, other=0)
                c = tl.load(row + (i + t) * tok_stride, mask=m, other=0)
                same = same & ((a == c) | (t >= nb))
            tl.atomic_min(ptr, val, mask=same)
            done = claimed | same
            tl.atomic_max(ptr + 1, val, mask=done)
            pend = pend & ~done
            pos = tl.where(pend, (pos + 1) % S, pos)


@triton.jit
def _index_set_len_kernel(
    num_tokens_ptr,
    req_indices_ptr,
    index_len_ptr,
    B,
    HAS_REQ_INDICES: tl.constexpr,
    FROM_SCRATCH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = b < B
    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + b, mask=inb, other=-1).to(tl.int64)
    else:
        r = b.to(tl.int64)
    ok = inb & (r >= 0)
    r = tl.maximum(r, 0)
    L = tl.load(num_tokens_ptr + r, mask=ok, other=0)
    if not FROM_SCRATCH:
        L = tl.maximum(L, tl.load(index_len_ptr + r, mask=ok, other=0))
    tl.store(index_len_ptr + r, L, mask=ok)


def _index_rows(token_ids, num_tokens, req_indices, index, index_len, *, min_n, max_n, scratch):
    R, N, S, _ = index.shape
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    if B == 0:
        return
    has_req = req_indices is not None
    req = req_indices if has_req else num_tokens  # never read without req_indices
    if scratch:
        row_size = N * S * 2
        nb = max(1, min(triton.cdiv(row_size, _CLEAR_BLOCK), 1024))
        _index_clear_kernel[(B, nb)](
            req_indices_ptr=req,
            index_ptr=index,
            S=S,
            num_blocks=nb,
            N=N,
            HAS_REQ_INDICES=has_req,
            BLOCK=_CLEAR_BLOCK,
        )
        block = _INSERT_BLOCK
        progs = max(1, triton.cdiv(token_ids.shape[1], block))
    else:
        block, progs = _EXTEND_BLOCK, 1
    _index_insert_kernel[(B, N, progs)](
        token_ids_ptr=token_ids,
        hist_stride=token_ids.stride(0),
        tok_stride=token_ids.stride(1),
        num_tokens_ptr=num_tokens,
        req_indices_ptr=req,
        index_ptr=index,
        index_len_ptr=index_len,
        S=S,
        num_progs=progs,
        MIN_N=min_n,
        N=N,
        HAS_REQ_INDICES=has_req,
        FROM_SCRATCH=scratch,
        BLOCK=block,
    )
    _index_set_len_kernel[(triton.cdiv(B, 256),)](
        num_tokens_ptr=num_tokens,
        req_indices_ptr=req,
        index_len_ptr=index_len,
        B=B,
        HAS_REQ_INDICES=has_req,
        FROM_SCRATCH=scratch,
        BLOCK=256,
    )


def ngram_index_build(token_ids, num_tokens, req_indices, index, index_len, *, min_n, max_n):
    """Launch clear + parallel insert + set-length; inputs are assumed validated."""
    _index_rows(
        token_ids,
        num_tokens,
        req_indices,
        index,
        index_len,
        min_n=min_n,
        max_n=max_n,
        scratch=True,
    )


def ngram_index_extend(token_ids, num_tokens, req_indices, index, index_len, *, min_n, max_n):
    """Launch the insert kernel over the new starts, then set the lengths."""
    _index_rows(
        token_ids,
        num_tokens,
        req_indices,
        index,
        index_len,
        min_n=min_n,
        max_n=max_n,
        scratch=False,
    )


# ----------------------------------------------------------------------------- corpus


@triton.jit(do_not_specialize=["B", "C"])
def _corpus_plan_kernel(
    doc_lens_ptr,
    req_indices_ptr,
    B,
    corpus_meta_ptr,
    corpus_state_ptr,
    plan_ptr,
    C,
    HAS_REQ_INDICES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    end = tl.load(corpus_state_ptr)
    lo = tl.load(corpus_state_ptr + 1)
    zero = end * 0
    total = zero
    for s in range(0, B, BLOCK):
        bi = s + tl.arange(0, BLOCK)
        inb = bi < B
        if HAS_REQ_INDICES:
            r = tl.load(req_indices_ptr + bi, mask=inb, other=-1).to(tl.int64)
        else:
            r = bi.to(tl.int64)
        ok = inb & (r >= 0)
        D = tl.load(doc_lens_ptr + tl.maximum(r, 0), mask=ok, other=0).to(tl.int64)
        total += tl.sum(tl.minimum(D, C), axis=0)
    new_end = end + total
    q = new_end - C  # live tokens lie in [q, new_end): the oldest whole documents go
    qs = tl.maximum(q, 0) % C
    ds = tl.load(corpus_meta_ptr + qs * 2)
    de = tl.load(corpus_meta_ptr + qs * 2 + 1)
    first_new = zero + _BIG
    run = end
    for s in range(0, B, BLOCK):
        bi = s + tl.arange(0, BLOCK)
        inb = bi < B
        if HAS_REQ_INDICES:
            r = tl.load(req_indices_ptr + bi, mask=inb, other=-1).to(tl.int64)
        else:
            r = bi.to(tl.int64)
        ok = inb & (r >= 0)
        kept = tl.minimum(tl.load(doc_lens_ptr + tl.maximum(r, 0), mask=ok, other=0), C)
        kept = kept.to(tl.int64)
        starts = run + tl.cumsum(kept, axis=0) - kept
        cand = tl.where((kept > 0) & (starts >= q), starts, _BIG)
        first_new = tl.minimum(first_new, tl.min(cand, axis=0))
        run += tl.sum(kept, axis=0)
    new_lo = tl.where(q <= lo, lo, tl.where(q < end, tl.where(ds == q, q, de), first_new))
    run = end
    for s in range(0, B, BLOCK):
        bi = s + tl.arange(0, BLOCK)
        inb = bi < B
        if HAS_REQ_INDICES:
            r = tl.load(req_indices_ptr + bi, mask=inb, other=-1).to(tl.int64)
        else:
            r = bi.to(tl.int64)
        ok = inb & (r >= 0)
        kept = tl.minimum(tl.load(doc_lens_ptr + tl.maximum(r, 0), mask=ok, other=0), C)
        kept = kept.to(tl.int64)
        starts = run + tl.cumsum(kept, axis=0) - kept
        live = (kept > 0) & (starts >= new_lo)
        tl.store(plan_ptr + bi * 2, tl.where(live, starts, -1), mask=inb)
        tl.store(plan_ptr + bi * 2 + 1, tl.where(live, kept, 0), mask=inb)
        run += tl.sum(kept, axis=0)
    tl.store(corpus_state_ptr, new_end)
    tl.store(corpus_state_ptr + 1, new_lo)


@triton.jit(do_not_specialize=["doc_stride", "doc_tok_stride", "C", "H"])
def _corpus_write_kernel(
    doc_tokens_ptr,
    doc_stride,
    doc_tok_stride,
    doc_lens_ptr,
    req_indices_ptr,
    plan_ptr,
    corpus_tokens_ptr,
    corpus_meta_ptr,
    corpus_index_ptr,
    C,
    H,
    MIN_N: tl.constexpr,
    N: tl.constexpr,
    HAS_REQ_INDICES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    blk = tl.program_id(1)
    start = tl.load(plan_ptr + b * 2)
    kept = tl.load(plan_ptr + b * 2 + 1)
    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + b).to(tl.int64)
    else:
        r = b.to(tl.int64)
    r = tl.maximum(r, 0)
    live = start >= 0
    D = tl.load(doc_lens_ptr + r, mask=live, other=0).to(tl.int64)
    t = blk * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    inb = (t < kept) & (t * 0 + start >= 0)
    src = doc_tokens_ptr + r * doc_stride + (D - kept + t) * doc_tok_stride
    x = tl.load(src, mask=inb, other=0)
    p = start + t
    slot = p % C
    tl.store(corpus_tokens_ptr + slot, x, mask=inb)
    tl.store(corpus_meta_ptr + slot * 2, p * 0 + start, mask=inb)
    tl.store(corpus_meta_ptr + slot * 2 + 1, p * 0 + start + kept, mask=inb)
    for jj in tl.static_range(N):
        # n = MIN_N + jj; a following token in the same document
        ok = inb & (t + (MIN_N + jj) < kept)
        h = _hash_init(t * 0 + (MIN_N + jj))
        for tt in tl.static_range(MIN_N + jj):
            y = tl.load(src + tt * doc_tok_stride, mask=ok, other=0)
            h = _hash_step(h, y)
        tab = corpus_index_ptr + jj * H
        tl.atomic_max(tab + _mix1(h) % H, p, mask=ok)
        tl.atomic_max(tab + _mix2(h) % H, p, mask=ok)


def corpus_append(
    doc_tokens,
    doc_lens,
    req_indices,
    corpus_tokens,
    corpus_meta,
    corpus_index,
    corpus_state,
    *,
    min_n,
    max_n,
):
    """Launch the plan and write kernels; inputs are assumed validated."""
    B = doc_lens.shape[0] if req_indices is None else req_indices.shape[0]
    if B == 0:
        return
    C = corpus_tokens.shape[0]
    N, H = corpus_index.shape
    has_req = req_indices is not None
    req = req_indices if has_req else doc_lens
    plan = _empty((B, 2), torch.int64, doc_lens.device)
    _corpus_plan_kernel[(1,)](
        doc_lens_ptr=doc_lens,
        req_indices_ptr=req,
        B=B,
        corpus_meta_ptr=corpus_meta,
        corpus_state_ptr=corpus_state,
        plan_ptr=plan,
        C=C,
        HAS_REQ_INDICES=has_req,
        BLOCK=min(1024, next_pow2(B)),
    )
    width = min(doc_tokens.shape[1], C)
    if width == 0:
        return
    _corpus_write_kernel[(B, triton.cdiv(width, _CORPUS_BLOCK))](
        doc_tokens_ptr=doc_tokens,
        doc_stride=doc_tokens.stride(0),
        doc_tok_stride=doc_tokens.stride(1),
        doc_lens_ptr=doc_lens,
        req_indices_ptr=req,
        plan_ptr=plan,
        corpus_tokens_ptr=corpus_tokens,
        corpus_meta_ptr=corpus_meta,
        corpus_index_ptr=corpus_index,
        C=C,
        H=H,
        MIN_N=min_n,
        N=N,
        HAS_REQ_INDICES=has_req,
        BLOCK=_CORPUS_BLOCK,
    )


# ----------------------------------------------------------------------------- propose


@triton.jit
def _corpus_probe(
    row,
    tok_stride,
    L,
    n,
    valid,
    slot,
    jv,
    corpus_tokens_ptr,
    corpus_index_ptr,
    lo,
    C,
    H,
    best,
    MAX_N: tl.constexpr,
):
    """The start kept in corpus slot ``slot`` if it is live and holds the suffix n-gram."""
    p = tl.load(corpus_index_ptr + jv * H + slot, mask=valid, other=-1)
    ok = valid & (p >= lo)
    for t in tl.static_range(MAX_N):
        m = ok & (t < n)
        a = tl.load(corpus_tokens_ptr + (tl.maximum(p, 0) + t) % C, mask=m, other=0)
        c = tl.load(row + (L - n + t) * tok_stride, mask=m, other=0)
        ok = ok & ((a == c) | (t >= n))
    return tl.where(ok, tl.maximum(best, p), best)


@triton.jit(do_not_specialize=["hist_stride", "tok_stride", "S", "C", "H", "max_model_len"])
def _index_propose_kernel(
    token_ids_ptr,
    hist_stride,
    tok_stride,
    num_tokens_ptr,
    req_indices_ptr,
    max_draft_tokens_ptr,
    index_ptr,
    S,
    corpus_tokens_ptr,
    corpus_meta_ptr,
    corpus_index_ptr,
    corpus_state_ptr,
    C,
    H,
    drafts_ptr,
    counts_ptr,
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
    HAS_CORPUS: tl.constexpr,
    TIE_LAST: tl.constexpr,
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

    jv = tl.arange(0, NB).to(tl.int64)  # one lane per n
    n = MIN_N + jv
    valid = (jv < N) & (n <= L)
    h = _hash_init(n)
    for t in tl.static_range(MAX_N):
        x = tl.load(row + (L - n + t) * tok_stride, mask=valid & (t < n), other=0)
        h = tl.where(t < n, _hash_step(h, x), h)

    # own history: linear probing, read only (the table always has an empty slot)
    table = index_ptr + (r * N + tl.minimum(jv, N - 1)) * S * 2
    pos = _mix1(h) % S
    pend = valid
    own = jv < 0
    first = jv * 0 - 1
    last = jv * 0 - 1
    while tl.max(pend.to(tl.int32), axis=0) > 0:
        f = tl.load(table + pos * 2, mask=pend, other=-1).to(tl.int64)
        occ = pend & (f >= 0)
        same = occ
        for t in tl.static_range(MAX_N):
            m = same & (t < n)
            a = tl.load(row + (f + t) * tok_stride, mask=m, other=0)
            c = tl.load(row + (L - n + t) * tok_stride, mask=m, other=0)
            same = same & ((a == c) | (t >= n))
        la = tl.load(table + pos * 2 + 1, mask=same, other=-1).to(tl.int64)
        own = own | same
        first = tl.where(same, f, first)
        last = tl.where(same, la, last)
        pend = occ & ~same
        pos = tl.where(pend, (pos + 1) % S, pos)
    prio = tl.where(own, 2 * jv + 2, 0)

    best = jv * 0 - 1
    if HAS_CORPUS:
        lo = tl.load(corpus_state_ptr + 1)
        best = _corpus_probe(
            row, tok_stride, L, n, valid, _mix1(h) % H, jv, corpus_tokens_ptr,
            corpus_index_ptr, lo, C, H, best, MAX_N,
        )  # fmt: skip
        best = _corpus_probe(
            row, tok_stride, L, n, valid, _mix2(h) % H, jv, corpus_tokens_ptr,
            corpus_index_ptr, lo, C, H, best, MAX_N,
        )  # fmt: skip
        prio = tl.where(~own & (best >= 0), 2 * jv + 1, prio)

    # the longest n wins; on the same n the own history (even priority) wins
    top = tl.max(prio, axis=0)
    sel = jv == (top - 1) // 2
    from_own = (top > 0) & (top % 2 == 0)
    from_corpus = (top > 0) & (top % 2 == 1)
    n_sel = tl.sum(tl.where(sel, n, 0), axis=0)
    if TIE_LAST:
        i_sel = tl.sum(tl.where(sel, last, 0), axis=0)
    else:
        i_sel = tl.sum(tl.where(sel, first, 0), axis=0)
    start_own = i_sel + n_sel
    avail = L - start_own
    start_c = L * 0
    if HAS_CORPUS:
        p_sel = tl.sum(tl.where(sel, best, 0), axis=0)
        start_c = p_sel + n_sel
        doc_end = tl.load(corpus_meta_ptr + (tl.maximum(p_sel, 0) % C) * 2 + 1, mask=from_corpus)
        avail = tl.where(from_corpus, doc_end - start_c, avail)
    m = tl.minimum(avail, k)
    if HAS_MAX_DRAFT:
        m = tl.minimum(m, tl.load(max_draft_tokens_ptr + b).to(tl.int64))
    if HAS_MAX_MODEL_LEN:
        m = tl.minimum(m, max_model_len - L)
    m = tl.where(from_own | from_corpus, tl.maximum(m, 0), 0)

    offs = tl.arange(0, K_BLOCK)
    take = offs < m
    top_b = offs * 0 + top  # as a block (see _index_clear_kernel)
    own_b = (top_b > 0) & (top_b % 2 == 0)
    tok = tl.load(row + (start_own + offs) * tok_stride, mask=take & own_b, other=-1)
    if HAS_CORPUS:
        corpus_b = (top_b > 0) & (top_b % 2 == 1)
        ctok = tl.load(corpus_tokens_ptr + (start_c + offs) % C, mask=take & corpus_b, other=-1)
        tok = tl.where(own_b, tok, ctok)
    tl.store(drafts_ptr + b * k + offs, tl.where(take, tok, -1), mask=offs < k)
    tl.store(counts_ptr + b, m.to(tl.int32))
    tl.store(match_len_ptr + b, tl.where(m > 0, n_sel, 0).to(tl.int32))
    src = tl.where(from_own, 1, 2)
    tl.store(source_ptr + b, tl.where(m > 0, src, 0).to(tl.int8))


def ngram_index_propose(
    token_ids,
    num_tokens,
    index,
    index_len,
    req_indices,
    max_draft_tokens,
    corpus_tokens,
    corpus_meta,
    corpus_index,
    corpus_state,
    *,
    min_n,
    max_n,
    num_speculative_tokens,
    max_model_len,
    tie_break,
):
    """Launch the propose kernel; inputs are assumed validated."""
    k = num_speculative_tokens
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    device = token_ids.device
    drafts = _empty((B, k), torch.int32, device)
    counts = _empty((B,), torch.int32, device)
    match_len = _empty((B,), torch.int32, device)
    source = _empty((B,), torch.int8, device)
    if B == 0:
        return drafts, counts, match_len, source
    if k == 0:
        return drafts, counts.zero_(), match_len.zero_(), source.zero_()
    N = max_n - min_n + 1
    has_corpus = corpus_tokens is not None
    dummy = num_tokens  # never read when the matching HAS_* flag is False
    _index_propose_kernel[(B,)](
        token_ids_ptr=token_ids,
        hist_stride=token_ids.stride(0),
        tok_stride=token_ids.stride(1),
        num_tokens_ptr=num_tokens,
        req_indices_ptr=req_indices if req_indices is not None else dummy,
        max_draft_tokens_ptr=max_draft_tokens if max_draft_tokens is not None else dummy,
        index_ptr=index,
        S=index.shape[2],
        corpus_tokens_ptr=corpus_tokens if has_corpus else dummy,
        corpus_meta_ptr=corpus_meta if has_corpus else dummy,
        corpus_index_ptr=corpus_index if has_corpus else dummy,
        corpus_state_ptr=corpus_state if has_corpus else dummy,
        C=corpus_tokens.shape[0] if has_corpus else 1,
        H=corpus_index.shape[1] if has_corpus else 1,
        drafts_ptr=drafts,
        counts_ptr=counts,
        match_len_ptr=match_len,
        source_ptr=source,
        k=k,
        max_model_len=max_model_len if max_model_len is not None else 0,
        MIN_N=min_n,
        N=N,
        NB=next_pow2(N),
        HAS_REQ_INDICES=req_indices is not None,
        HAS_MAX_DRAFT=max_draft_tokens is not None,
        HAS_MAX_MODEL_LEN=max_model_len is not None,
        HAS_CORPUS=has_corpus,
        TIE_LAST=tie_break == "last",
        K_BLOCK=next_pow2(k),
    )
    return drafts, counts, match_len, source
