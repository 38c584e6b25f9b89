"""The threshold of the sampling filters (top-k, top-p, min-p) on one row's weights, for the
CPU path of sampled verification (``cpu/rejection.py``).

The kept set is ``{e >= t}`` for one threshold ``t`` (``docs/design.md``, "Weights"). Top-k
selects the k-th largest weight inside the one bucket (below) that holds it. Top-p
walks the weights largest first with a float64 running mass and stops once that mass
reaches ``top_p`` times their float64 sum; the contract fixes that order, so the walk
needs the nucleus in sorted order, but only the nucleus. Sorting the whole row (numba's
quicksort: ~2.4 ms at V = 32000, ~13 ms at V = 151936) cost more than everything else in a
sampled row. Here the weights are bucketed by their top bits (``bits >> 20``: an eighth of
an octave; the order of non-negative float32 values is the order of their bits), so one
counting pass and one scatter pass put them in bucket order, largest bucket first, and the
walk sorts only the buckets it reaches (large ones by a radix sort of their low 20 bits).
The walk, and so ``t``, is the same as over the fully sorted row: the same values in the
same order.
"""

from __future__ import annotations

import numpy as np

from specdec_kernels.cpu._jit import jit, jit_with
from specdec_kernels.cpu.sampling import block_sums, sampled_weights

_SHIFT = 20
_NB = 1024
"""Buckets of ``bits >> 20``: weights lie in ``[0, 1]`` (bits ``<= 0x3f800000``, so ``<=
0x3f8``); anything else is clamped into the first or last bucket, which are sorted by
comparison (their entries need not share their top bits)."""
_RADIX_MIN = 256
"""Buckets with more entries than this are sorted by radix (two passes over 10 bits)."""


@jit
def kept_weights(f32, u16, bf16, g, V, T, top_k, top_p, min_p, w, blocks, refs, buf, work):
    """Row ``g``'s weights in ``w`` as the sampler draws from them (``sampled_weights``), zero
    below the filters' threshold ``t``, their block sums in ``blocks``; returns ``(t, S)``,
    ``S`` the kept weights' float64 sum (``rejection_sample``'s rows and ``top_logprobs``'
    processed modes)."""
    filtered = 0 < top_k < V or top_p < 1.0 or min_p > 0.0
    S = sampled_weights(f32, u16, bf16, g, V, T, w, blocks, refs, buf, filtered)
    t = np.float32(0.0)
    if filtered:
        t = threshold(w, V, top_k, top_p, min_p, work, S)
        for i in range(V):
            if w[i] < t:
                w[i] = 0.0
        S = block_sums(w, V, blocks)
    return t, S


@jit
def threshold(w, V, top_k, top_p, min_p, work, total):
    """The threshold ``t`` of the kept set ``{e >= t}`` (top-k, then top-p, then min-p on the
    weights ``w[:V]``, max 1); 0 when no filter is on. ``work``: float32 scratch of ``2 V``
    entries when top-k or top-p is on; ``total``: the float64 sum of ``w[:V]`` (the caller's
    block sums: top-p without top-k needs no pass of its own for it)."""
    t = np.float32(0.0)
    if 0 < top_k < V:
        t = _kth_largest(w, V, top_k, work)
    if top_p < 1.0:
        S = total if t == 0.0 else _kept_sum(w, V, t)
        t = max(t, _nucleus_last(w, V, t, np.float64(top_p) * S, work))
    if min_p > 0.0:
        t = max(t, np.float32(min_p))
    return t


@jit
def _bucket(bits):
    return min(max(bits >> _SHIFT, 0), _NB - 1)


@jit
def _kth_largest(w, V, k, work):
    """The ``k``-th largest of ``w[:V]`` (``0 < k < V``): count the buckets, then select
    inside the one that holds it (numba's ``np.partition`` of the whole row was ~1.4 ms at
    V = 151936)."""
    bits = w[:V].view(np.int32)
    count = np.zeros(_NB, dtype=np.int64)
    for i in range(V):
        count[_bucket(bits[i])] += 1
    above = 0  # entries in the buckets above b
    b = _NB - 1
    while above + count[b] < k:
        above += count[b]
        b -= 1
    seg = work[: count[b]]
    n = 0
    for i in range(V):
        if _bucket(bits[i]) == b:
            seg[n] = w[i]
            n += 1
    return np.partition(seg, n - (k - above))[n - (k - above)]


@jit_with("reassoc")  # reordered: it vectorises (the sum is float64, so order hardly matters)
def _kept_sum(w, V, t):
    """The float64 sum of the weights ``>= t``."""
    S = np.float64(0.0)
    for i in range(V):
        S += np.float64(w[i]) if w[i] >= t else 0.0
    return S


@jit
def _nucleus_last(w, V, t, bound, work):
    """Top-p over the weights ``>= t``: with ``S`` their float64 sum and
    ``bound = top_p * S`` (float64), walk them largest first adding each to a float64 running mass
    until the mass is ``>= bound`` (ties at the boundary: the first one's mass decides);
    returns the last weight added (the largest if none was). The last bucket it can reach
    holds only zeros (the kernels' weights have no subnormals): adding them changes nothing,
    so it is not sorted (that sort was 10x the rest at V = 151936 with ``top_p`` near 1).
    (Float32 sums here drifted by up to ~6e-4 of the mass at V = 151936 on flat rows, moving
    the boundary by 3-5 ids on the bench's rows and ~150 on a constructed one: more than the
    float rounding the paths may differ by.)"""
    bits = w[:V].view(np.int32)
    count = np.zeros(_NB, dtype=np.int64)
    for i in range(V):
        if w[i] >= t:
            count[_bucket(bits[i])] += 1
    start = np.empty(_NB, dtype=np.int64)  # bucket b at start[b] .. start[b] + count[b] - 1
    n = 0
    for b in range(_NB - 1, -1, -1):
        start[b] = n
        n += count[b]
    buf, tmp = work[:n], work[V : V + n].view(np.int32)
    fill = start.copy()
    for i in range(V):
        if w[i] >= t:
            b = _bucket(bits[i])
            buf[fill[b]] = w[i]
            fill[b] += 1
    above = np.float64(0.0)
    last = np.float32(0.0)
    started = False
    for b in range(_NB - 1, -1, -1):
        if count[b] == 0:
            continue
        if started and not above < bound:
            return last
        seg = buf[start[b] : start[b] + count[b]]
        if b == 0 and seg.max() == 0.0:  # zeros: the mass stays below the bound (0 if
            return np.float32(0.0)  # nothing was added yet: then S = 0), the last is 0
        if 0 < b < _NB - 1 and count[b] > _RADIX_MIN:
            _sort_low_bits(seg, tmp)
        else:
            seg.sort()
        if not started:  # nothing added yet: the largest weight
            last, started = seg[count[b] - 1], True
        for i in range(count[b] - 1, -1, -1):
            if not above < bound:
                return last
            above += seg[i]
            last = seg[i]
    return last


@jit
def _sort_low_bits(seg, tmp):
    """Sort non-negative float32 values that share their ``bits >> 20`` (one bucket), in
    place (``tmp``: int32 scratch of as many entries): a stable counting sort by bits 0-9,
    then by bits 10-19."""
    keys = seg.view(np.int32)
    n = keys.shape[0]
    src, dst = keys, tmp[:n]
    for shift in (0, 10):  # an even number of passes: the result ends in ``keys``
        pos = np.zeros(1025, dtype=np.int64)
        for i in range(n):
            pos[((src[i] >> shift) & 1023) + 1] += 1
        for d in range(1024):
            pos[d + 1] += pos[d]
        for i in range(n):
            d = (src[i] >> shift) & 1023
            dst[pos[d]] = src[i]
            pos[d] += 1
        src, dst = dst, src
