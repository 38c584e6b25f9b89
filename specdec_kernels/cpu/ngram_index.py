"""The CPU own-history n-gram index: ``ngram_index_build`` / ``_extend`` and the index lookup
of ``ngram_propose``, as numba kernels (``cpu/_jit.py``).

A row's table is open addressing with linear probing: an n-gram's probe starts at
``mix1(hash) % S`` and walks to the first slot that is empty (-1) or holds a start whose
n-gram equals it (compared token by token: the key is never stored). Inserts go in order of
increasing start, one after another, so the first insert of an n-gram claims its slot with
``first = last = i`` and later ones raise ``last``; a lookup walks the same probe
sequence. ``S >= L_max`` leaves an empty slot in every row, so every probe ends.

The hashes (``specdec_kernels/constants.py``) are the same 32-bit values in every path: a
table built here is read by the Triton kernels, and the other way round.
"""

from __future__ import annotations

import numpy as np

from specdec_kernels.constants import NGRAM_HASH_FNV_OFFSET as FNV_OFFSET
from specdec_kernels.constants import NGRAM_HASH_FNV_PRIME as FNV_PRIME
from specdec_kernels.constants import NGRAM_HASH_MASK as M32
from specdec_kernels.constants import NGRAM_HASH_MIX1 as MIX1
from specdec_kernels.constants import NGRAM_HASH_MIX2 as MIX2
from specdec_kernels.cpu._jit import NONE_I32, borrowed, jit, np_, opt, zeroed_i32


@jit
def ngram_hash(tokens, start, n):
    """The 32-bit hash of ``tokens[start : start + n]`` (FNV-1a, an xorshift per word)."""
    h = np.int64(FNV_OFFSET) ^ np.int64(n)
    for t in range(n):
        x = np.int64(tokens[start + t]) & M32
        h = ((h ^ x) * FNV_PRIME) & M32
        h ^= h >> 15
    return h


@jit
def mix1(h):
    h ^= h >> 16
    h = (h * MIX1) & M32
    return h ^ (h >> 16)


@jit
def mix2(h):
    h ^= h >> 15
    h = (h * MIX2) & M32
    return h ^ (h >> 13)


@jit
def same_ngram(a, i, b, j, n):
    """Whether ``a[i : i + n] == b[j : j + n]``."""
    for t in range(n):
        if a[i + t] != b[j + t]:
            return False
    return True


@jit
def _insert(slots, row, i, n):
    """Insert the n-gram at start ``i`` of ``row`` into one table ``slots`` ``[S, 2]``.

    At most ``S`` probes, and a slot whose start could not be in ``row`` never matches: a
    table of unchecked values (``validate=False``) cannot hang the call or make it read
    outside the row."""
    S = slots.shape[0]
    pos = mix1(ngram_hash(row, i, n)) % S
    for _ in range(S):
        f = slots[pos, 0]
        if f < 0:
            slots[pos, 0] = i
            slots[pos, 1] = i
            return
        if f + n <= row.shape[0] and same_ngram(row, f, row, i, n):
            slots[pos, 0] = min(f, i)
            slots[pos, 1] = max(slots[pos, 1], i)
            return
        pos += 1
        if pos == S:
            pos = 0


@jit
def own_lookup(slots, row, L, n, h):
    """``(first, last)`` starts of the suffix n-gram ``row[L-n : L]`` (hash ``h``) in one
    table, ``(-1, -1)`` if it is not there. Read only; guarded as ``_insert``."""
    S = slots.shape[0]
    pos = mix1(h) % S
    for _ in range(S):
        f = slots[pos, 0]
        if f < 0:
            break
        if f + n <= L and same_ngram(row, f, row, L - n, n):
            return f, min(max(slots[pos, 1], f), L - n - 1)
        pos += 1
        if pos == S:
            pos = 0
    return -1, -1


@jit
def index_rows(token_ids, num_tokens, rows, has_rows, table, length, min_n, scratch):
    R, N = table.shape[0], table.shape[1]
    L_max = token_ids.shape[1]
    B = rows.shape[0] if has_rows else R
    token_ids, table = borrowed((token_ids, table))  # passed per n-gram: not counted
    for b in range(B):
        r = rows[b] if has_rows else b
        if r < 0 or r >= R:
            continue
        L = min(max(num_tokens[r], 0), L_max)
        old = 0 if scratch else length[r]
        if scratch:
            table[r] = -1
        row = token_ids[r]
        for j in range(N):
            n = min_n + j
            # the n-gram at i joins once token i + n exists: i + n in [old, L)
            for i in range(max(old - n, 0), L - n):
                _insert(table[r, j], row, i, n)
        length[r] = max(L, old)


@jit
def index_values_ok(num_tokens, L_max, rows, has_rows, length, extend, seen):
    """The wrappers' value checks (``ops/ngram_index.py``) as one pass: ``req_indices`` in
    ``[-1, R)`` and unique, the batch rows' lengths in ``[0, L_max]`` and, to extend, not
    below the index's. ``seen``: R zeros, left zero."""
    R = num_tokens.shape[0]
    B = rows.shape[0] if has_rows else R
    ok = True
    b_end = B
    for b in range(B):
        r = np.int64(rows[b]) if has_rows else np.int64(b)
        if r == -1:
            continue
        L = num_tokens[r] if 0 <= r < R else -1
        if r < -1 or r >= R or seen[r] or L < 0 or L > L_max or (extend and L < length[r]):
            ok, b_end = False, b
            break
        seen[r] = 1
    for b in range(b_end):  # leave seen zero again
        r = np.int64(rows[b]) if has_rows else np.int64(b)
        if r >= 0:
            seen[r] = 0
    return ok


@jit
def extend_values_ok(num_tokens, L_max, rows, has_rows, length, caps, has_caps, seen):
    """The value checks of an extend followed by a proposal in one call (``ngram_propose(...,
    extend_index=True)``): :func:`index_values_ok` to extend, and no negative draft cap."""
    if not index_values_ok(num_tokens, L_max, rows, has_rows, length, True, seen):
        return False
    for b in range(caps.shape[0] if has_caps else 0):
        if caps[b] < 0:
            return False
    return True


@jit
def _checked_index_rows(token_ids, num_tokens, rows, has_rows, table, length, min_n, scratch,
                        check, seen):  # fmt: skip
    """:func:`index_rows` after :func:`index_values_ok` (``check``); False: refused, nothing
    written."""
    if check and not index_values_ok(num_tokens, token_ids.shape[1], rows, has_rows, length,
                                     not scratch, seen):  # fmt: skip
        return False
    index_rows(token_ids, num_tokens, rows, has_rows, table, length, min_n, scratch)
    return True


def _run(token_ids, num_tokens, req_indices, index, min_n, scratch, check):
    table, length = (np_(t) for t in index)
    rows = opt(req_indices, NONE_I32)
    seen = zeroed_i32(num_tokens.shape[0]) if check else NONE_I32
    return _checked_index_rows(
        np_(token_ids), np_(num_tokens), rows, req_indices is not None, table, length, min_n,
        scratch, check, seen,
    )  # fmt: skip


def ngram_index_build(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    _run(token_ids, num_tokens, req_indices, index, min_n, True, False)


def ngram_index_extend(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    _run(token_ids, num_tokens, req_indices, index, min_n, False, False)


def ngram_index_build_checked(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    """:func:`ngram_index_build` after the wrapper's value checks, run in the kernel before
    it writes anything; None if one fails (``ops/_library.py``'s ``call``), else True."""
    return _run(token_ids, num_tokens, req_indices, index, min_n, True, True) or None


def ngram_index_extend_checked(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    """:func:`ngram_index_extend` after the wrapper's value checks (as
    :func:`ngram_index_build_checked`)."""
    return _run(token_ids, num_tokens, req_indices, index, min_n, False, True) or None
