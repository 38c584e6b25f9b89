"""A prototype of issue 19's ``scoring="frequency"`` drafting, for measuring draft quality only.

NOT the op and not its structure: a numba model of the semantics the issue states, so the
drafting benchmark (``bench/suffix_replay.py``) can compare them with SuffixDecoding on
the same streams before the device structure is designed. Contexts are keyed by a 64-bit
polynomial hash, so it is exact only up to hash collisions; a table is sized by the
caller (``capacity_for``) and never evicts; a full table raises instead of looping.

Model: for every context ``c`` (the tokens ``[p-m+1, p]`` of a document, ``1 <= m <= D``,
never across a document boundary) a count (occurrences, including those with no
continuation, such as a request's live tail) and its most frequent continuation (the
child ``c + x`` of largest count; ties: the child counted last, i.e. of the most recent
occurrence). Appending a position updates its ``D`` contexts and their parents' best
child, which stays exact while counts only grow. A draft from the request's last ``m``
tokens (``1 <= m < min(D, L)``: as in SuffixDecoding, never the whole history) follows
the best continuation while the running product of ``count(child) / count(node)`` stays
``>= min_prob`` and its length stays ``<= min(k, floor(factor * m), D - m)``; of the match
lengths, the largest score (sum of the products) wins, ties to the longer match
(SuffixDecoding's ``_speculate_path`` and ``speculate``).
"""

from __future__ import annotations

import math

import numba
import numpy as np

P = np.uint64(1099511628211)
_MIX = np.uint64(0x9E3779B97F4A7C15)
_SHIFT = np.uint64(20)


def capacity_for(positions: int, D: int) -> int:
    """``log2`` of a table size that holds every context of ``positions`` appended
    positions at most 3/4 full (at most ``D`` contexts each)."""
    return max(12, math.ceil(math.log2(D * positions * 4 / 3 + 16)))


def new_table(log2_capacity: int) -> tuple[np.ndarray, ...]:
    """``(keys, count, best, best_count)``: 20 bytes a slot."""
    cap = 1 << log2_capacity
    return (
        np.zeros(cap, np.uint64),
        np.zeros(cap, np.int32),
        np.full(cap, -1, np.int32),
        np.zeros(cap, np.int32),
    )


@numba.njit(cache=True, inline="always")
def _tok(x):
    return np.uint64(x) + np.uint64(1)


@numba.njit(cache=True)
def _slot(keys, h, insert):
    """The slot of key ``h`` (linear probing); -1 if absent and not ``insert``."""
    mask = np.uint64(keys.shape[0] - 1)
    k = h if h != 0 else np.uint64(1)  # 0 marks an empty slot
    i = ((k * _MIX) >> _SHIFT) & mask
    for _ in range(keys.shape[0]):
        v = keys[i]
        if v == k:
            return np.int64(i)
        if v == 0:
            if insert:
                keys[i] = k
                return np.int64(i)
            return np.int64(-1)
        i = (i + np.uint64(1)) & mask
    if insert:
        raise ValueError("frequency prototype: the table is full (size it with capacity_for)")
    return np.int64(-1)


@numba.njit(cache=True)
def append(keys, count, best, best_count, tokens, start, p, D):
    """Count the contexts ending at ``tokens[p]`` (a document that starts at ``start``)."""
    g = np.uint64(0)  # the parent: tokens[p-m+1 .. p-1]
    pw = np.uint64(1)
    x = tokens[p]
    for m in range(1, D + 1):
        q = p - m + 1
        if q < start:
            break
        i = _slot(keys, g * P + _tok(x), True)
        count[i] += 1
        if m >= 2:
            j = _slot(keys, g, False)
            if j >= 0 and count[i] >= best_count[j]:
                best[j] = x
                best_count[j] = count[i]
        if q - 1 < start:
            break
        g = _tok(tokens[q - 1]) * pw + g
        pw = pw * P


@numba.njit(cache=True)
def extend(keys, count, best, best_count, tokens, start, p0, p1, D):
    """``append`` every position ``p0 <= p < p1`` of a document that starts at ``start``."""
    for p in range(p0, p1):
        append(keys, count, best, best_count, tokens, start, p, D)


@numba.njit(cache=True)
def _chain(keys, count, best, h, node_count, max_len, min_prob, out):
    """Follow the best continuation of context ``h``: ``(length, score)``."""
    prob, score, t = 1.0, 0.0, 0
    while t < max_len:
        i = _slot(keys, h, False)
        x = best[i] if i >= 0 else -1
        if x < 0:
            break
        hx = h * P + _tok(x)
        c = count[_slot(keys, hx, False)]
        prob *= c / node_count
        if prob < min_prob:
            break
        out[t] = x
        score += prob
        t += 1
        h, node_count = hx, c
    return t, score


@numba.njit(cache=True)
def propose(keys, count, best, best_count, hist, L, D, k, factor, min_prob, out, tmp):
    """The best-scoring draft for the history ``hist[:L]`` into ``out``: ``(length,
    score)``. ``out`` and ``tmp`` hold at least ``min(k, D)`` tokens."""
    best_t, best_score = 0, 0.0
    h = np.uint64(0)
    pw = np.uint64(1)
    for m in range(1, min(D, L)):
        h = _tok(hist[L - m]) * pw + h
        pw = pw * P
        i = _slot(keys, h, False)
        if i < 0 or best_count[i] == 0:  # no continuation, so none for longer contexts
            break
        max_len = min(k, int(m * factor + 1e-6), D - m)
        t, score = _chain(keys, count, best, h, count[i], max_len, min_prob, tmp)
        if t > 0 and score >= best_score:
            best_t, best_score = t, score
            out[:t] = tmp[:t]
    return best_t, best_score
