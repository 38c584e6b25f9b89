"""The value checks' one pass over a CPU tensor (``ops/_validation.py``): minimum, maximum
and whether a NaN is present, in one numba call instead of a train of torch reductions."""

from __future__ import annotations

import numpy as np

from specdec_kernels.cpu._jit import jit


@jit
def value_range(x):
    """``(min, max, has_nan)`` of a non-empty 1-D array; NaN is left out of min and max
    (an all-NaN array: its last entry, twice)."""
    n = x.shape[0]
    i0 = 0
    while i0 < n and x[i0] != x[i0]:
        i0 += 1
    lo = hi = x[min(i0, n - 1)]
    has_nan = i0 > 0
    for i in range(i0, n):
        v = x[i]
        if v == v:
            lo = min(lo, v)
            hi = max(hi, v)
        else:
            has_nan = True
    return lo, hi, has_nan


@jit
def counts_range(cu):
    """``(cu[0], cu[-1], min, max)`` of the differences ``cu[b+1] - cu[b]`` of a non-empty
    1-D prefix sum (min and max 0 when it has one entry)."""
    lo = hi = np.int64(0)
    for b in range(cu.shape[0] - 1):
        d = np.int64(cu[b + 1]) - np.int64(cu[b])
        if b == 0 or d < lo:
            lo = d
        if b == 0 or d > hi:
            hi = d
    return np.int64(cu[0]), np.int64(cu[cu.shape[0] - 1]), lo, hi


@jit
def rows_range(values, rows, has_rows, B, other, has_other):
    """Over the batch's state rows ``r`` (``rows[b] >= 0``, or ``b < B`` without ``rows``;
    rows outside ``values`` are skipped: the ``req_indices`` check reports them):
    ``(n, min, max)`` of ``values[r]`` and ``(min, max)`` of ``values[r] - other[r]`` (0
    without ``other``). Integer arrays; ``n`` counts the rows seen."""
    n = 0
    lo = hi = dlo = dhi = np.int64(0)
    R = values.shape[0]
    for b in range(rows.shape[0] if has_rows else min(B, R)):
        r = np.int64(rows[b]) if has_rows else np.int64(b)
        if r < 0 or r >= R:
            continue
        v = np.int64(values[r])
        d = v - np.int64(other[r]) if has_other else np.int64(0)
        if n == 0:
            lo = hi = v
            dlo = dhi = d
        else:
            lo, hi = min(lo, v), max(hi, v)
            dlo, dhi = min(dlo, d), max(dhi, d)
        n += 1
    return n, lo, hi, dlo, dhi
