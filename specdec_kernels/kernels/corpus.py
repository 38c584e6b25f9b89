"""Triton shared corpus: the CUDA path of ``corpus_append`` and the corpus lookup.

No host synchronisation and static grids:

- ``corpus_append``: ``_corpus_plan_kernel`` (one program: the documents' absolute starts
  and the new live window, three passes over the batch in blocks of documents) then
  ``_corpus_write_kernel``, grid ``(B, cdiv(min(W, C), BLOCK))``: ring tokens, document
  bounds, and ``atomic_max`` of each occurrence's start into its two slots, which is order
  independent (a slot keeps the most recent start).
- ``_corpus_lookup``: the read side, used by ``ngram_propose``'s kernel
  (``kernels/ngram.py``): per lane (one n each), the most recent live occurrence of the
  suffix n-gram that one of its two slots keeps.

The hashes are ``kernels/ngram_index.py``'s (the reference's, bit for bit).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_kernels.kernels import _utils
from specdec_kernels.kernels._utils import next_pow2
from specdec_kernels.kernels.ngram_index import _hash_init, _hash_step, _mix1, _mix2

_BIG = tl.constexpr(1 << 62)
_CORPUS_BLOCK = 256


@triton.jit
def _kept_lengths(
    doc_lens_ptr, req_indices_ptr, s, B, C, HAS_REQ_INDICES: tl.constexpr, BLOCK: tl.constexpr
):
    """Batch rows ``s .. s + BLOCK - 1``: in range, and the tokens each document keeps."""
    bi = s + tl.arange(0, BLOCK)
    inb = bi < B
    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + bi, mask=inb, other=-1).to(tl.int64)
    else:
        r = bi.to(tl.int64)
    ok = inb & (r >= 0)
    D = tl.load(doc_lens_ptr + tl.maximum(r, 0), mask=ok, other=0).to(tl.int64)
    return bi, inb, tl.minimum(D, C)


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
        _, _, kept = _kept_lengths(doc_lens_ptr, req_indices_ptr, s, B, C, HAS_REQ_INDICES, BLOCK)
        total += tl.sum(kept, axis=0)
    new_end = end + total
    q = new_end - C  # live tokens lie in [q, new_end): the oldest whole documents go
    qs = tl.maximum(q, 0) % C
    ds = tl.load(corpus_meta_ptr + qs * 2)
    de = tl.load(corpus_meta_ptr + qs * 2 + 1)
    first_new = zero + _BIG
    run = end
    for s in range(0, B, BLOCK):
        _, _, kept = _kept_lengths(doc_lens_ptr, req_indices_ptr, s, B, C, HAS_REQ_INDICES, BLOCK)
        starts = run + tl.cumsum(kept, axis=0) - kept
        cand = tl.where((kept > 0) & (starts >= q), starts, _BIG)
        first_new = tl.minimum(first_new, tl.min(cand, axis=0))
        run += tl.sum(kept, axis=0)
    new_lo = tl.where(q <= lo, lo, tl.where(q < end, tl.where(ds == q, q, de), first_new))
    run = end
    for s in range(0, B, BLOCK):
        bi, inb, kept = _kept_lengths(
            doc_lens_ptr, req_indices_ptr, s, B, C, HAS_REQ_INDICES, BLOCK
        )
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
    # (the interpreter mis-types "block & scalar bool": compare blocks only)
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


def corpus_append(doc_tokens, doc_lens, req_indices, corpus, *, min_n, max_n):
    """Launch the plan and write kernels; inputs are assumed validated."""
    corpus_tokens, corpus_meta, corpus_index, corpus_state = corpus
    B = doc_lens.shape[0] if req_indices is None else req_indices.shape[0]
    if B == 0:
        return
    C = corpus_tokens.shape[0]
    N, H = corpus_index.shape
    has_req = req_indices is not None
    plan = _utils._empty((B, 2), torch.int64, doc_lens.device)
    _corpus_plan_kernel[(1,)](
        doc_lens_ptr=doc_lens,
        req_indices_ptr=req_indices,
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
        req_indices_ptr=req_indices,
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


# ----------------------------------------------------------------------------- lookup


@triton.jit
def _corpus_probe(row, tok_stride, L, n, valid, p, lo, corpus_tokens_ptr, C, MAX_N: tl.constexpr):
    """Whether the start ``p`` a slot keeps is live and holds the suffix n-gram."""
    ok = valid & (p >= lo)
    for t in tl.static_range(MAX_N):
        m = ok & (t < n)
        a = tl.load(corpus_tokens_ptr + (tl.maximum(p, 0) + t) % C, mask=m, other=0)
        c = tl.load(row + (L - n + t) * tok_stride, mask=m, other=0)
        ok = ok & ((a == c) | (t >= n))
    return ok


@triton.jit
def _corpus_lookup(
    row, tok_stride, L, n, jv, valid, h, corpus_tokens_ptr, corpus_index_ptr, lo, C, H,
    MAX_N: tl.constexpr,
):  # fmt: skip
    """Per lane: the most recent live start of the suffix n-gram kept by one of its two
    slots, or -1."""
    best = jv * 0 - 1
    p1 = tl.load(corpus_index_ptr + jv * H + _mix1(h) % H, mask=valid, other=-1)
    ok1 = _corpus_probe(row, tok_stride, L, n, valid, p1, lo, corpus_tokens_ptr, C, MAX_N)
    best = tl.where(ok1, tl.maximum(best, p1), best)
    p2 = tl.load(corpus_index_ptr + jv * H + _mix2(h) % H, mask=valid, other=-1)
    ok2 = _corpus_probe(row, tok_stride, L, n, valid, p2, lo, corpus_tokens_ptr, C, MAX_N)
    return tl.where(ok2, tl.maximum(best, p2), best)
