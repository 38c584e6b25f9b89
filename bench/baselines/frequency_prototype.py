"""A prototype of issue 19's ``scoring="frequency"`` drafting, for measuring draft quality only.

NOT the op and not its structure: a numba model of the semantics the issue states, so the
drafting benchmark (``bench/suffix_replay.py``) can compare them with SuffixDecoding on
the same streams before the device structure is designed. Contexts are keyed by a 64-bit
polynomial hash, so it is exact only up to hash collisions; tables are unbounded in
spirit (sized by the caller, open addressing; no eviction).

Model: for every context ``c`` (the tokens ``[p-m+1, p]`` of a document, ``1 <= m <= D``,
never across a document boundary) a weighted count (occurrences, including those with no
continuation, such as a request's live tail) and its most frequent continuation (the
child ``c + x`` of largest count; ties: the child counted last, i.e. of the most recent
occurrence). Appending a position updates its ``D`` contexts and their parents' best
child, which stays exact while counts only grow. A draft from the request's last ``m``
tokens follows the best continuation while the running product of ``count(child) /
count(node)`` stays ``>= min_prob`` and its length stays ``<= min(k, floor(factor * m +
offset), D - m)``; of the match lengths, the largest score (sum of the products) wins,
ties to the longer match (SuffixDecoding's ``_speculate_path`` and ``speculate``).
"""

from __future__ import annotations

import numba
import numpy as np

P = np.uint64(1099511628211)
_MIX = np.uint64(0x9E3779B97F4A7C15)
_SHIFT = np.uint64(20)


def new_table(log2_capacity: int) -> tuple[np.ndarray, ...]:
    """``(keys, count, best, best_count)``; keep it under ~70% full (the caller's job)."""
    cap = 1 << log2_capacity
    return (
        np.zeros(cap, np.uint64),
        np.zeros(cap, np.float64),
        np.full(cap, -1, np.int32),
        np.zeros(cap, np.float64),
    )


def capacity_for(tokens: int, D: int) -> int:
    """``log2`` of a table size that holds every context of ``tokens`` positions."""
    return max(12, int(np.ceil(np.log2(2 * D * tokens + 16))))


@numba.njit(cache=True, inline="always")
def _tok(x):
    return np.uint64(x) + np.uint64(1)


@numba.njit(cache=True)
def _slot(keys, h, insert):
    mask = np.uint64(keys.shape[0] - 1)
    k = h if h != 0 else np.uint64(1)  # 0 marks an empty slot
    i = ((k * _MIX) >> _SHIFT) & mask
    while True:
        v = keys[i]
        if v == k:
            return np.int64(i)
        if v == 0:
            if insert:
                keys[i] = k
                return np.int64(i)
            return np.int64(-1)
        i = (i + np.uint64(1)) & mask


@numba.njit(cache=True)
def append(keys, count, best, best_count, tokens, start, p, D, w):
    """Count the contexts ending at ``tokens[p]`` (document from ``start``), weight ``w``."""
    g = np.uint64(0)  # the parent: tokens[p-m+1 .. p-1]
    pw = np.uint64(1)
    x = tokens[p]
    for m in range(1, D + 1):
        q = p - m + 1
        if q < start:
            break
        i = _slot(keys, g * P + _tok(x), True)
        count[i] += w
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
def _count(keys, count, h):
    i = _slot(keys, h, False)
    return count[i] if i >= 0 else 0.0


@numba.njit(cache=True)
def _chain(tabs, ws, h, node_count, max_len, min_prob, out):
    """Follow the best continuation of context ``h`` (counts pooled over ``tabs`` with
    weights ``ws``; candidates: each table's own best child)."""
    prob, score, t = 1.0, 0.0, 0
    while t < max_len:
        bx, bc = -1, 0.0
        for s in range(len(tabs)):
            keys, count, best, _ = tabs[s]
            i = _slot(keys, h, False)
            x = best[i] if i >= 0 else -1
            if x < 0 or x == bx:
                continue
            hx = h * P + _tok(x)
            c = 0.0
            for s2 in range(len(tabs)):
                c += ws[s2] * _count(tabs[s2][0], tabs[s2][1], hx)
            if c > bc:
                bx, bc = x, c
        if bx < 0:
            break
        prob *= bc / node_count
        if prob < min_prob:
            break
        out[t] = bx
        score += prob
        t += 1
        h = h * P + _tok(bx)
        node_count = bc
    return t, score


@numba.njit(cache=True)
def propose(tabs, ws, hist, L, D, k, factor, offset, min_prob, out, tmp):
    """The best-scoring draft for the history ``hist[:L]``: ``(length, score, match length)``."""
    best_t, best_score, best_m = 0, 0.0, 0
    h = np.uint64(0)
    pw = np.uint64(1)
    for m in range(1, min(D, L)):
        h = _tok(hist[L - m]) * pw + h
        pw = pw * P
        c, alive = 0.0, False
        for s in range(len(tabs)):
            keys, count, _, best_count = tabs[s]
            i = _slot(keys, h, False)
            if i >= 0:
                c += ws[s] * count[i]
                alive = alive or best_count[i] > 0
        if not alive:  # no continuation here, so none for any longer context either
            break
        max_len = min(k, int(m * factor + offset + 1e-6), D - m)
        t, score = _chain(tabs, ws, h, c, max_len, min_prob, tmp)
        if t > 0 and score >= best_score:
            best_t, best_score, best_m = t, score, m
            out[:t] = tmp[:t]
    return best_t, best_score, best_m
