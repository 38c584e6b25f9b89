"""Triton own-history n-gram index: the CUDA path of ``ngram_index_build`` / ``_extend``.

No host synchronisation and static grids (the loops inside read the lengths):

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
- ``_suffix_hash`` and ``_index_lookup`` are the read side, used by ``ngram_propose``'s
  kernel (``kernels/ngram.py``): one lane per n, each hashes its suffix n-gram and probes
  the row's table.

The hashes are ``specdec_kernels.reference.ngram_index``'s, in int64 arithmetic kept to
32 bits, so a table built by one path is read correctly by the others.
"""

from __future__ import annotations

import triton
import triton.language as tl

from specdec_kernels.constants import NGRAM_HASH_FNV_OFFSET as FNV_OFFSET
from specdec_kernels.constants import NGRAM_HASH_FNV_PRIME as FNV_PRIME
from specdec_kernels.constants import NGRAM_HASH_MIX1 as MIX1
from specdec_kernels.constants import NGRAM_HASH_MIX2 as MIX2

_FNV_OFFSET = tl.constexpr(FNV_OFFSET)
_FNV_PRIME = tl.constexpr(FNV_PRIME)
_MIX1 = tl.constexpr(MIX1)
_MIX2 = tl.constexpr(MIX2)

_INSERT_BLOCK = 256  # starts per program (build)
_EXTEND_BLOCK = 16  # starts per loop step (extend: k + 1 new tokens per step)
_CLEAR_BLOCK = 4096


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


def _index_rows(token_ids, num_tokens, req_indices, index, *, min_n, scratch):
    table, length = index
    R, N, S, _ = table.shape
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    if B == 0:
        return
    has_req = req_indices is not None
    if scratch:
        row_size = N * S * 2
        nb = max(1, min(triton.cdiv(row_size, _CLEAR_BLOCK), 1024))
        _index_clear_kernel[(B, nb)](
            req_indices_ptr=req_indices,
            index_ptr=table,
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
        req_indices_ptr=req_indices,
        index_ptr=table,
        index_len_ptr=length,
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
        req_indices_ptr=req_indices,
        index_len_ptr=length,
        B=B,
        HAS_REQ_INDICES=has_req,
        FROM_SCRATCH=scratch,
        BLOCK=256,
    )


def ngram_index_build(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    """Launch clear + parallel insert + set-length; inputs are assumed validated."""
    _index_rows(token_ids, num_tokens, req_indices, index, min_n=min_n, scratch=True)


def ngram_index_extend(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    """Launch the insert kernel over the new starts, then set the lengths."""
    _index_rows(token_ids, num_tokens, req_indices, index, min_n=min_n, scratch=False)


# ----------------------------------------------------------------------------- lookup


@triton.jit
def _suffix_hash(row, tok_stride, L, n, valid, MAX_N: tl.constexpr):
    """The hash of each lane's suffix n-gram ``row[L - n : L]`` (lanes: a block of n)."""
    h = _hash_init(n)
    for t in tl.static_range(MAX_N):
        x = tl.load(row + (L - n + t) * tok_stride, mask=valid & (t < n), other=0)
        h = tl.where(t < n, _hash_step(h, x), h)
    return h


@triton.jit
def _index_lookup(row, tok_stride, L, n, jv, valid, h, table_ptr, S, N, MAX_N: tl.constexpr):
    """Per lane: whether the suffix n-gram is in the row's table for its n, with its
    ``(first, last)`` starts (-1 where absent). Read-only linear probing; the table always
    has an empty slot, so every probe ends."""
    table = table_ptr + tl.minimum(jv, N - 1) * S * 2
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
    return own, first, last
