"""Triton frequency corpus: the CUDA path of ``corpus_append`` on a ``FrequencyCorpus``.

``specdec_kernels/cpu/frequency_corpus.py``'s rules (budget, two stores, rebuild, swap)
in one program with one warp: every document changes what the next one sees, so the
whole call is sequential by nature; no atomics, nothing that depends on scheduling. The
tries are ``kernels/frequency.py``'s (``append_position``). Emptying a store's table (the
retired one at a swap, both when a store runs out of nodes) is the one vector loop,
followed by a barrier before the scalar code reads it again. Guards as on the CPU: a state
of unchecked values is left alone or kept in bounds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_kernels.constants import FREQUENCY_CORPUS_STATE as _FIELDS
from specdec_kernels.constants import (
    FREQUENCY_CORPUS_WORK,
    frequency_corpus_budget,
    frequency_corpus_piece,
)
from specdec_kernels.kernels.frequency import append_position

_ACTIVE, _SIZE, _RES0, _RES1, _REB, _FIRST, _NEXT_DOC, _NEXT_OFF, _NEW_SIZE, _HEAD, _TAIL = (
    tl.constexpr(_FIELDS.index(f)) for f in _FIELDS
)
_WORK = tl.constexpr(FREQUENCY_CORPUS_WORK)
_CLEAR_BLOCK = 1024


@triton.jit
def _count(tokens, keys, vals, nodes, used, path, s, p, Dp, T, S, M):
    """Count position ``p`` of store ``s`` if it has room for two nodes: 0 if it has not."""
    u = tl.load(used + s)
    room = (u >= 1) & (u <= M - 2)
    if room:
        append_position(tokens + s * T, 1, T, keys + s * S, vals + s * S, nodes + s * 4 * M,
                        used + s, path, p, Dp, S, M)  # fmt: skip
    return 1 - room.to(tl.int64)


@triton.jit
def _clear(keys, s, S, BLOCK: tl.constexpr):
    """Empty store ``s``'s table; a barrier before the scalar code reads it again."""
    offs = tl.arange(0, BLOCK)
    for base in range(0, S, BLOCK):
        tl.store(keys + s * S + base + offs, tl.zeros((BLOCK,), tl.int64), mask=base + offs < S)
    tl.debug_barrier()


@triton.jit
def _count_into(tokens, keys, vals, nodes, used, docs, state, path, a, b, slots, D, T, S, M, Q):
    """Copy and count up to ``slots`` slots of the waiting documents into store ``b``;
    returns the positions it had no room for."""
    lost = tl.zeros((), tl.int64)
    going = (tl.load(state + _NEXT_DOC) != tl.load(state + _TAIL)) & (slots > 0)
    while going:
        q = tl.load(state + _NEXT_DOC)
        n = tl.load(docs + q * 3)
        starting = tl.load(state + _NEXT_OFF) < 0
        room = tl.load(state + _RES0 + b) + n <= T
        fits = (n >= 0) & (room | (starting == 0))  # else: a corrupt state
        if fits & starting:  # the document starts in store b
            res = tl.load(state + _RES0 + b)
            tl.store(docs + q * 3 + 1 + b, res)
            tl.store(state + _RES0 + b, res + n)
            tl.store(state + _NEXT_OFF, 0)
            slots -= 1
        off = tl.where(fits, tl.load(state + _NEXT_OFF), -1)
        sa = tl.load(docs + q * 3 + 1 + a)
        sb = tl.load(docs + q * 3 + 1 + b)
        ok = (sa >= 0) & (sb >= 0) & (off >= 0) & (n >= 0) & (tl.maximum(sa, sb) + n <= T)
        if ok:
            end = tl.minimum(n, off + tl.maximum(slots, 0))
            for o in range(off, end):
                tl.store(tokens + b * T + sb + o, tl.load(tokens + a * T + sa + o))
                lost += _count(tokens, keys, vals, nodes, used, path, b, sb + o,
                               tl.minimum(o + 1, D), T, S, M)  # fmt: skip
            slots -= end - off
            tl.store(state + _NEXT_OFF, end)
            if end == n:
                tl.store(state + _NEW_SIZE, tl.load(state + _NEW_SIZE) + n + 1)
                tl.store(state + _NEXT_DOC, (q + 1) % Q)
                tl.store(state + _NEXT_OFF, -1)
        going = ok & (tl.load(state + _NEXT_DOC) != tl.load(state + _TAIL)) & (slots > 0)
    return lost


@triton.jit
def _maybe_rebuild(docs, state, used, C, M, Q):
    """Past 6/8 C live slots, the newest documents that fit in 5/8 C start the new store;
    past 6/8 M nodes (slots below 6/8 C), those that fit in the slots 4/8 M nodes hold at
    the store's density (at most 5/8 C)."""
    u = tl.maximum(tl.load(used + tl.load(state + _ACTIVE)).to(tl.int64), 1)
    size = tl.load(state + _SIZE)
    C, M = C.to(tl.int64), M.to(tl.int64)  # int32 arguments: 6 M wraps past 357M nodes
    if (tl.load(state + _REB) == 0) & ((8 * size > 6 * C) | (8 * u > 6 * M)):
        q = tl.load(state + _TAIL)
        head = tl.load(state + _HEAD)
        total = tl.zeros((), tl.int64)
        budget = tl.where(8 * size > 6 * C, 5 * C, tl.minimum(5 * C, 4 * (M * size // u)))
        going = q != head
        while going:
            prev = (q + Q - 1) % Q
            n = tl.load(docs + prev * 3)
            fits = 8 * (total + n + 1) <= budget
            if fits:
                total += n + 1
                q = prev
            going = fits & (q != head)
        tl.store(state + _REB, 1)
        tl.store(state + _FIRST, q)
        tl.store(state + _NEXT_DOC, q)
        tl.store(state + _NEXT_OFF, -1)
        tl.store(state + _NEW_SIZE, 0)


@triton.jit
def _try_piece(doc, ds, n, tokens, keys, vals, nodes, used, docs, state, path, C, D, T, S, M, Q,
               BLOCK: tl.constexpr):  # fmt: skip
    """Add one piece; returns the positions a store had no room for."""
    a = tl.load(state + _ACTIVE)
    b = 1 - a
    pa = tl.load(state + _RES0 + a)
    q = tl.load(state + _TAIL)
    for t in range(0, n):  # staged: the waiting documents are read from the active store
        tl.store(tokens + a * T + pa + t, tl.load(doc + t * ds))
    tl.store(docs + q * 3, n)
    tl.store(docs + q * 3 + 1 + a, pa)
    tl.store(docs + q * 3 + 1 + b, -1)
    tl.store(state + _TAIL, (q + 1) % Q)
    swapped = pa < 0  # False
    lost = tl.zeros((), tl.int64)
    if tl.load(state + _REB) != 0:
        lost = _count_into(tokens, keys, vals, nodes, used, docs, state, path, a, b,
                           _WORK * (n + 1), D, T, S, M, Q)  # fmt: skip
        if tl.load(state + _NEXT_DOC) == tl.load(state + _TAIL):  # caught up: swap
            tl.store(state + _ACTIVE, b)
            tl.store(state + _HEAD, tl.load(state + _FIRST))
            tl.store(state + _SIZE, tl.load(state + _NEW_SIZE))
            tl.store(state + _REB, 0)
            _clear(keys, a, S, BLOCK)  # the retired store, emptied
            tl.store(used + a, 1)
            tl.store(state + _RES0 + a, 0)
            _maybe_rebuild(docs, state, used, C, M, Q)
            swapped = pa >= 0  # True
    if not swapped:
        tl.store(state + _RES0 + a, pa + n)
        for o in range(0, n):
            lost += _count(tokens, keys, vals, nodes, used, path, a, pa + o,
                           tl.minimum(o + 1, D), T, S, M)  # fmt: skip
        tl.store(state + _SIZE, tl.load(state + _SIZE) + n + 1)
        _maybe_rebuild(docs, state, used, C, M, Q)
    return lost


@triton.jit
def _add_piece(doc, ds, n, tokens, keys, vals, nodes, used, docs, state, path, C, D, T, S, M, Q,
               BLOCK: tl.constexpr):  # fmt: skip
    """Add one piece; a store out of nodes for it empties the corpus, and the piece then
    starts it."""
    q = tl.load(state + _TAIL)
    lost = _try_piece(doc, ds, n, tokens, keys, vals, nodes, used, docs, state, path, C, D, T,
                      S, M, Q, BLOCK)  # fmt: skip
    if lost > 0:
        _clear(keys, 0, S, BLOCK)
        _clear(keys, 1, S, BLOCK)
        tl.store(used, 1)
        tl.store(used + 1, 1)
        tl.store(state + _SIZE, 0)
        tl.store(state + _REB, 0)
        tl.store(state + _RES0, 0)
        tl.store(state + _RES1, 0)
        tl.store(state + _HEAD, q)
        tl.store(state + _TAIL, q)
        _try_piece(doc, ds, n, tokens, keys, vals, nodes, used, docs, state, path, C, D, T, S,
                   M, Q, BLOCK)  # fmt: skip


@triton.jit
def _in(v, n):
    return (v >= 0) & (v < n)


@triton.jit
def _state_ok(st, C, T, Q):
    """``cpu/frequency_corpus.py``'s ``_state_ok``: the counters in range, so that the next
    piece stays inside the arrays."""
    ok = (tl.load(st + _ACTIVE) >= 0) & (tl.load(st + _ACTIVE) <= 1)
    ok = ok & (tl.load(st + _SIZE) >= 0) & (tl.load(st + _SIZE) <= C)
    ok = ok & (tl.load(st + _REB) >= 0) & (tl.load(st + _REB) <= 1)
    ok = ok & _in(tl.load(st + _HEAD), Q) & _in(tl.load(st + _TAIL), Q)
    ok = ok & _in(tl.load(st + _FIRST), Q) & _in(tl.load(st + _NEXT_DOC), Q)
    return ok & _in(tl.load(st + _RES0), T - C // 8 + 1) & _in(tl.load(st + _RES1), T - C // 8 + 1)


@triton.jit(do_not_specialize=["B", "R", "W", "doc_s0", "doc_s1"])
def _corpus_append_kernel(doc_ptr, doc_s0, doc_s1, lens_ptr, req_indices_ptr, B, R, W,
                          tokens_ptr, keys_ptr, vals_ptr, nodes_ptr, used_ptr, docs_ptr,
                          state_ptr, path_ptr, C, D, T, S, M, Q, piece,
                          HAS_REQ_INDICES: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """Append the batch's documents in order, one program (``grid = (1,)``)."""
    ok = _state_ok(state_ptr, C, T, Q)
    for i in range(0, B):
        r = i
        if HAS_REQ_INDICES:
            r = tl.load(req_indices_ptr + i)
        if (r >= 0) & (r < R):
            n = tl.minimum(tl.maximum(tl.load(lens_ptr + r).to(tl.int64), 0), W)
            for s in range(0, n, piece):
                ok = ok & _state_ok(state_ptr, C, T, Q)  # before every piece
                if ok:
                    m = tl.minimum(piece, n - s)
                    _add_piece(doc_ptr + r * doc_s0 + s * doc_s1, doc_s1, m, tokens_ptr,
                               keys_ptr, vals_ptr, nodes_ptr, used_ptr, docs_ptr, state_ptr,
                               path_ptr, C, D, T, S, M, Q, BLOCK)  # fmt: skip


def frequency_corpus_append(doc_tokens, doc_lens, req_indices, corpus, *, min_n, max_n):
    """Launch the single-program append kernel; inputs are validated."""
    tokens, keys, vals, nodes, used, docs, state = corpus
    R, W = doc_tokens.shape
    B = R if req_indices is None else req_indices.shape[0]
    if B == 0:
        return
    path = torch.zeros((max_n + 2,), dtype=torch.int64, device=doc_tokens.device)  # scratch
    C, M = frequency_corpus_budget(tokens.shape[1]), nodes.shape[2]
    _corpus_append_kernel[(1,)](
        doc_tokens, doc_tokens.stride(0), doc_tokens.stride(1), doc_lens, req_indices, B, R, W,
        tokens, keys, vals, nodes, used, docs, state, path, C, max_n, tokens.shape[1],
        keys.shape[1], M, docs.shape[0], frequency_corpus_piece(C, M),
        HAS_REQ_INDICES=req_indices is not None, BLOCK=_CLEAR_BLOCK, num_warps=1,
    )  # fmt: skip
