"""The context trie of the frequency index and corpus, as Triton device functions.

``specdec_kernels/cpu/frequency.py``'s trie (same layout, same integers): an
open-addressing table from ``(parent, first edge token)`` to nodes of four int32 fields
(count, deepest depth, latest end, best continuation), ``append_position`` counting the
contexts that end at one position. Scalar code for one program of one warp; ``while``
loops carry flags instead of ``break`` (the GPU compiler refuses a ``break``). Used by
``kernels/frequency.py`` (the index and the proposals) and ``kernels/frequency_corpus.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from specdec_kernels.constants import FREQUENCY_HASH_C0 as C0
from specdec_kernels.constants import FREQUENCY_HASH_C1 as C1
from specdec_kernels.constants import FREQUENCY_HASH_C2 as C2

_C0, _C1, _C2 = tl.constexpr(C0), tl.constexpr(C1), tl.constexpr(C2)
_NO_TOKEN = tl.constexpr(1 << 40)


@triton.jit
def _home(parent, tok, mask):
    h = ((parent + 1) * _C0 + ((tok + 1) & 0xFFFFFFFF)) & 0xFFFFFFFF
    h = ((h ^ (h >> 16)) * _C1) & 0xFFFFFFFF
    h = ((h ^ (h >> 13)) * _C2) & 0xFFFFFFFF
    return (h ^ (h >> 16)) & mask


@triton.jit
def _slot(keys, parent, tok, S):
    """``(slot, found)``: the slot of ``(parent, tok)``'s key, else the empty one; slot -1
    if a (corrupt) table has neither."""
    key = ((parent + 1) << 32) | ((tok + 1) & 0xFFFFFFFF)
    i = _home(parent, tok, S - 1)
    k = tl.load(keys + i)
    tries = tl.full((), 1, tl.int64)
    while (k != key) & (k != 0) & (tries < S):
        i = (i + 1) & (S - 1)
        k = tl.load(keys + i)
        tries += 1
    ok = (k == key) | (k == 0)
    return tl.where(ok, i, -1), k == key


@triton.jit
def _find(keys, vals, used, parent, tok, S):
    i, found = _slot(keys, parent, tok, S)
    n = tl.load(vals + tl.maximum(i, 0)).to(tl.int64)
    return tl.where(found & (n > 0) & (n < used), n, -1)


@triton.jit
def _put(keys, vals, parent, tok, node, S):
    i, found = _slot(keys, parent, tok, S)
    if i >= 0:
        tl.store(keys + i, ((parent + 1) << 32) | ((tok + 1) & 0xFFFFFFFF))
        tl.store(vals + i, node.to(tl.int32))


@triton.jit
def _at(row, i, L_max, ts):
    """``row[i]`` as int64; ``_NO_TOKEN`` outside the row."""
    ok = (i >= 0) & (i < L_max)
    return tl.where(ok, tl.load(row + tl.where(ok, i, 0) * ts).to(tl.int64), _NO_TOKEN)


@triton.jit
def _new_node(nodes, used_ptr, M, cnt, hi, pos, best):
    n = tl.load(used_ptr).to(tl.int64)
    tl.store(used_ptr, (n + 1).to(tl.int32))
    tl.store(nodes + n, cnt.to(tl.int32))
    tl.store(nodes + M + n, hi.to(tl.int32))
    tl.store(nodes + 2 * M + n, pos.to(tl.int32))
    tl.store(nodes + 3 * M + n, best.to(tl.int32))
    return n


@triton.jit
def _fill(path, a, b, node):
    for j in range(a, b):
        tl.store(path + j, node)


@triton.jit
def _insert(row, ts, L_max, keys, vals, nodes, used_ptr, path, p, Dp, S, M):
    """Count the contexts ending at ``p`` (depths ``1..Dp``); ``path[d]``: their nodes."""
    one = tl.full((), 1, tl.int64)
    none = tl.full((), -1, tl.int64)
    node = tl.zeros((), tl.int64)
    depth = tl.zeros((), tl.int64)
    going = depth < Dp
    while going:
        t = tl.load(row + (p - depth) * ts).to(tl.int64)
        lo = depth + 1
        child = _find(keys, vals, tl.load(used_ptr).to(tl.int64), node, t, S)
        if child >= 0:
            c_hi = tl.maximum(tl.load(nodes + M + child).to(tl.int64), lo)
            c_pos = tl.load(nodes + 2 * M + child).to(tl.int64)
            d = lo + 1
            lim = tl.minimum(c_hi, Dp)
            same = d <= lim
            while same:
                same = _at(row, c_pos - d + 1, L_max, ts) == tl.load(row + (p - d + 1) * ts)
                d += same.to(tl.int64)
                same = same & (d <= lim)
            if d > c_hi:  # the whole run matches
                tl.store(nodes + child, tl.load(nodes + child) + 1)
                tl.store(nodes + 2 * M + child, tl.maximum(c_pos, p).to(tl.int32))
                _fill(path, lo, c_hi + 1, child)
                node = child
                depth = tl.maximum(c_hi, depth + 1)
                going = depth < Dp
            else:  # split: the upper part lo..d-1 takes the old key
                c_cnt = tl.load(nodes + child).to(tl.int64)
                c_best = tl.load(nodes + 3 * M + child).to(tl.int64)
                up = _new_node(nodes, used_ptr, M, c_cnt + 1, d - 1, tl.maximum(c_pos, p), c_best)
                _put(keys, vals, node, t, up, S)
                _put(keys, vals, up, _at(row, c_pos - d + 1, L_max, ts), child, S)
                _fill(path, lo, d, up)
                if d <= Dp:
                    leaf = _new_node(nodes, used_ptr, M, one, Dp, p, none)
                    _put(keys, vals, up, tl.load(row + (p - d + 1) * ts).to(tl.int64), leaf, S)
                    _fill(path, d, Dp + 1, leaf)
                going = lo < 0
        else:  # a new leaf for the depths lo..Dp
            leaf = _new_node(nodes, used_ptr, M, one, Dp, p, none)
            _put(keys, vals, node, t, leaf, S)
            _fill(path, lo, Dp + 1, leaf)
            going = lo < 0


@triton.jit
def append_position(row, ts, L_max, keys, vals, nodes, used_ptr, path, p, Dp, S, M):
    """Count the ``Dp`` contexts ending at position ``p`` of ``row`` into one trie, then
    re-point the ``best`` of the contexts ending at ``p - 1`` (depths ``1 .. Dp - 1``),
    which gained the continuation ``row[p]``."""
    _insert(row, ts, L_max, keys, vals, nodes, used_ptr, path, p, Dp, S, M)
    node = tl.zeros((), tl.int64)
    depth = tl.zeros((), tl.int64)
    walking = depth < Dp - 1
    while walking:
        t = tl.load(row + (p - 1 - depth) * ts).to(tl.int64)
        used = tl.load(used_ptr).to(tl.int64)
        w = _find(keys, vals, used, node, t, S)
        walking = w >= 0
        if walking:
            x = tl.load(path + depth + 2)
            bn = tl.load(nodes + 3 * M + w).to(tl.int64)
            bad = (bn <= 0) | (bn >= used)
            bb = tl.where(bad, x, bn)
            cx, cb = tl.load(nodes + x), tl.load(nodes + bb)
            px, pb = tl.load(nodes + 2 * M + x), tl.load(nodes + 2 * M + bb)
            if (bn != x) & (bad | (cx > cb) | ((cx == cb) & (px >= pb))):
                tl.store(nodes + 3 * M + w, x.to(tl.int32))
            node = w
            depth = tl.maximum(tl.load(nodes + M + w).to(tl.int64), depth + 1)
            walking = depth < Dp - 1
