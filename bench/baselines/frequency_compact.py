"""A compact structure for issue 19's frequency-scored drafting: a design prototype.

NOT the op: a numba model of the structure the op is meant to use, so its memory per
token and its drafts can be measured against the hash-table prototype
(``frequency_prototype.py``, which stores every context: ~50 slots per token) and against
SuffixDecoding before kernels are written. Same semantics, same drafts.

A store holds documents (token ids, ``SEP`` between documents). Its contexts are the
strings of ``1 <= m <= D`` consecutive tokens of one document; ``count(c)`` counts their
occurrences. Only two kinds of entry are kept, in one open-addressing table whose key is
``(entry of c[1:], c[0])`` (so a context is found from the next shorter one by prepending a
token; the empty context is ``ROOT``):

- a *node* for every context that occurs at least twice: its count, its best continuation
  (the token ``x`` of largest ``count(c + x)``; ties: the one continued most recently), the
  entry of ``c + x`` if that is a node too, and ``pos``: the end of its latest occurrence
  that has a continuation;
- a *leaf* for every context that occurs once and whose ``c[1:]`` is a node or empty:
  ``pos`` is the end of that occurrence. Each position has at most one leaf (its shortest
  unique context); every longer context ending there is unique too and is checked
  against the stored tokens instead of being stored.

An occurrence of a leaf's context is a walk through the stored tokens, so a chain that
reaches a count-1 continuation reads the document onward (each ratio is 1/1). Appending
a position visits its ``<= D`` contexts and the ``<= D - 1`` ending one position earlier
(whose best continuation it may change): O(D) table probes; when a leaf's context occurs
a second time the leaf becomes a node and the earlier occurrence gets a leaf one token
longer. Append only: no eviction here (FIFO eviction by whole documents would need one more
field, a node's latest occurrence, continued or not: the survivor when a count falls to
1; ``pos`` is the latest *continued* one).
"""

from __future__ import annotations

import math

import numba
import numpy as np

SEP = -1
ROOT = -1
_MIX = np.uint64(0x9E3779B97F4A7C15)
_SHIFT = np.uint64(24)
BYTES_PER_SLOT = 8 + 4 * 4  # key, count, pos, best, best_slot


def log2_slots_for(entries: int) -> int:
    """log2 of the smallest power-of-two table that holds ``entries`` at most 3/4 full.
    At most ``D / 2 + 1`` entries a position (nodes, one leaf) is the worst case."""
    return max(12, math.ceil(math.log2(entries * 4 / 3 + 1)))


def new_store(log2_slots: int, max_tokens: int) -> tuple[np.ndarray, ...]:
    """``(keys, count, pos, best, best_slot, tokens, meta)``; ``meta = [tokens reserved,
    entries used]``."""
    cap = 1 << log2_slots
    return (
        np.zeros(cap, np.uint64),
        np.zeros(cap, np.int32),
        np.full(cap, -1, np.int32),
        np.full(cap, -1, np.int32),
        np.full(cap, -1, np.int32),
        np.full(max_tokens, SEP, np.int32),
        np.zeros(2, np.int64),
    )


@numba.njit(cache=True, inline="always")
def _key(parent, tok):
    return (np.uint64(parent + 1) << np.uint64(32)) | np.uint64(tok + 1)


@numba.njit(cache=True)
def _slot(keys, key, meta, insert):
    """The slot of ``key`` (linear probing); -1 if absent and not ``insert``."""
    mask = np.uint64(keys.shape[0] - 1)
    i = ((key * _MIX) >> _SHIFT) & mask
    for _ in range(keys.shape[0]):
        v = keys[i]
        if v == key:
            return np.int64(i)
        if v == 0:
            if not insert:
                return np.int64(-1)
            if 4 * (meta[1] + 1) > 3 * keys.shape[0]:
                raise ValueError("frequency_compact: the table is 3/4 full")
            keys[i] = key
            meta[1] += 1
            return np.int64(i)
        i = (i + np.uint64(1)) & mask
    return np.int64(-1)


@numba.njit(cache=True, inline="always")
def _child_count(count, best, best_slot, c):
    if best[c] < 0:
        return 0
    return count[best_slot[c]] if best_slot[c] >= 0 else 1


@numba.njit(cache=True)
def _append_position(keys, count, pos, best, best_slot, toks, meta, p, D):
    """Count the contexts that end at ``p`` (``toks[p]`` already stored)."""
    x = toks[p]
    q_par, c_par = ROOT, ROOT  # entries of Q_{m-1} (ending at p) and C_{m-2} (at p - 1)
    q_done, c_done = False, False  # Q_m / C_{m-1} known unique from here on
    for m in range(1, D + 1):
        q = p - m + 1
        if q < 0 or toks[q] == SEP:
            break
        t = toks[q]
        e, n = np.int64(-1), 1
        if not q_done:
            e = _slot(keys, _key(q_par, t), meta, True)
            if count[e] == 0:  # new: the shortest unique context ending at p
                count[e], pos[e], q_done = 1, p, True
            elif count[e] >= 2:
                count[e] += 1
            else:  # a leaf: its context now occurs twice
                p0 = pos[e]
                count[e], best[e], best_slot[e], pos[e] = 2, -1, -1, -1
                if toks[p0 + 1] != SEP:  # p0 < p, so p0 + 1 is stored
                    best[e], pos[e] = toks[p0 + 1], p0
                if m < D and p0 - m >= 0 and toks[p0 - m] != SEP:
                    f = _slot(keys, _key(e, toks[p0 - m]), meta, True)
                    count[f], pos[f] = 1, p0
            n = count[e]
            q_par = e
        if m >= 2 and not c_done:  # C_{m-1} = toks[q .. p-1] gains the child Q_m
            c = _slot(keys, _key(c_par, t), meta, False)
            if c < 0 or count[c] < 2:
                c_done = True
            else:
                pos[c] = p - 1
                if n >= _child_count(count, best, best_slot, c):
                    best[c] = x
                    best_slot[c] = e if n >= 2 else -1
                c_par = c
        if q_done and c_done:
            break


def reserve(store: tuple[np.ndarray, ...], n: int) -> int:
    """The start of ``n`` token slots for a new document (a ``SEP`` before it). Any store
    that ends with ``(tokens, meta)``, ``meta[0]`` the tokens reserved (``frequency_trie``'s
    too)."""
    toks, meta = store[-2], store[-1]
    start = int(meta[0]) + (1 if meta[0] > 0 else 0)
    if start + n > toks.shape[0]:
        raise ValueError("frequency store: the token store is full")
    meta[0] = start + n
    return start


@numba.njit(cache=True)
def append(keys, count, pos, best, best_slot, toks, meta, src, a, b, dst, D):
    """Store ``src[a:b]`` at ``toks[dst:]`` (inside one document's reserved slots, after
    its earlier tokens) and count the contexts ending there."""
    if dst < 0 or dst + (b - a) > meta[0]:
        raise ValueError("frequency_compact: append outside the reserved tokens")
    for i in range(a, b):
        toks[dst + i - a] = src[i]
        _append_position(keys, count, pos, best, best_slot, toks, meta, dst + i - a, D)


@numba.njit(cache=True)
def _read_on(toks, n_toks, p, t, max_len, prob, score, out):
    """A count-1 chain: the tokens after position ``p`` (ratio 1 each)."""
    while t < max_len and p + 1 < n_toks and toks[p + 1] != SEP:
        p += 1
        out[t] = toks[p]
        score += prob
        t += 1
    return t, score


@numba.njit(cache=True)
def propose(keys, count, pos, best, best_slot, toks, meta, hist, L, D, k, factor, min_prob,
            out, tmp):  # fmt: skip
    """``frequency_prototype.propose`` on this store: ``(length, score)`` into ``out``."""
    n_toks = meta[0]  # <= toks.shape[0]: reserve refuses more
    best_t, best_score = 0, 0.0
    q_par, leaf = ROOT, -1
    for m in range(1, min(D, L)):
        t_q = hist[L - m]
        if leaf < 0:
            e = _slot(keys, _key(q_par, t_q), meta, False)
            if e < 0:
                break
            q_par = e
            if count[e] == 1:
                leaf = pos[e]
        elif leaf - m + 1 < 0 or toks[leaf - m + 1] != t_q:
            break
        max_len = min(k, int(m * factor + 1e-6), D - m)
        if leaf >= 0:  # the context occurs once: its chain reads the document onward
            if leaf + 1 >= n_toks or toks[leaf + 1] == SEP:
                break
            t, score = _read_on(toks, n_toks, leaf, 0, max_len, 1.0, 0.0, tmp)
        else:
            if best[e] < 0:
                break
            node, nc, prob, score, t = e, count[e], 1.0, 0.0, 0
            while t < max_len:
                x = best[node]
                if x < 0:
                    break
                c = count[best_slot[node]] if best_slot[node] >= 0 else 1
                prob *= c / nc
                if prob < min_prob:
                    break
                tmp[t] = x
                score += prob
                t += 1
                if best_slot[node] < 0:
                    t, score = _read_on(toks, n_toks, pos[node] + 1, t, max_len, prob, score,
                                        tmp)  # fmt: skip
                    break
                node, nc = best_slot[node], c
        if t > 0 and score >= best_score:
            best_t, best_score = t, score
            out[:t] = tmp[:t]
    return best_t, best_score
