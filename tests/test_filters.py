"""cpu/filters.py: the sampling filters' threshold equals the contract's walk over the fully
sorted weights (docs/design.md, "rejection_sample", "Weights"), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_kernels.cpu import filters


def walk_over_sorted(w: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.float32:
    """The threshold by the contract's statement, on the whole row sorted: the k-th largest
    weight; then, over the weights >= it, a float64 running mass largest first until it
    reaches ``top_p`` times their float64 sum; then min-p."""
    V = w.shape[0]
    f32 = np.float32
    t = f32(0.0)
    if 0 < top_k < V:
        t = np.sort(w)[::-1][top_k - 1]
    if top_p < 1.0:
        bound = np.float64(f32(top_p)) * w[w >= t].astype(np.float64).sum()
        s = np.sort(w[w >= t])[::-1]
        above, last = np.float64(0.0), s[0]
        for x in s:
            if not above < bound:
                break
            above, last = above + np.float64(x), x
        t = max(t, last)
    if min_p > 0.0:
        t = max(t, f32(min_p))
    return f32(t)


def _total(w: np.ndarray) -> np.float64:
    """The float64 sum of the weights a caller passes with them (its block sums)."""
    return w.astype(np.float64).sum()


def weights(logits: np.ndarray, T: float = 1.0) -> np.ndarray:
    """Weights as the kernels make them: exp of (l - max) / T, 1 at the maximum, 0 below the
    smallest normal float32."""
    m = logits.max()
    w = np.exp((logits.astype(np.float64) - m) / T).astype(np.float32)
    w[w < 2.0**-126] = 0.0
    w[logits == m] = 1.0
    return w


def rows():
    """Named rows: each exercises one part of the bucketed walk."""
    rng = np.random.default_rng(7)
    V = 20000
    peaked = rng.standard_normal(V)
    peaked[rng.integers(0, V, 8)] = np.log(V) + 0.5 + 3 * rng.random(8)
    yield "peaked: the nucleus in the top buckets", weights(peaked)
    yield "flat: buckets of thousands, radix-sorted", weights(rng.standard_normal(V) * 0.1)
    yield "broad: the walk crosses hundreds of buckets", weights(rng.standard_normal(V) * 3)
    yield "ties at the boundary", rng.choice(np.float32([1.0, 0.5, 0.25, 0.0]), V)
    few = np.zeros(V, np.float32)
    few[rng.integers(0, V, 3)] = [1.0, 0.3, 2.0**-125]
    yield "mostly zeros (the first bucket, comparison-sorted)", few
    yield "one token", np.float32([1.0])
    yield "no mass (all zeros)", np.zeros(500, np.float32)
    near_one = np.zeros(V, np.float32)
    near_one[:40] = rng.random(40).astype(np.float32)
    near_one[0] = 1.0
    yield "the walk reaches the zeros (top-p near 1)", near_one
    yield "uniform", np.ones(300, np.float32)


@pytest.mark.parametrize("name,w", list(rows()), ids=[n for n, _ in rows()])
@pytest.mark.parametrize(
    "top_k,top_p,min_p",
    [(0, 0.9, 0.0), (0, 0.5, 0.0), (0, 0.0, 0.0), (0, 0.999999, 0.0), (50, 0.95, 0.0),
     (0, 0.9, 0.05), (2, 1.0, 0.0), (0, 1.0, 0.0), (299, 1.0, 0.0), (1, 1.0, 0.0)],
)  # fmt: skip
def test_threshold_equals_the_walk_over_the_sorted_row(name, w, top_k, top_p, min_p):
    f32 = np.float32
    work = np.full(2 * w.shape[0], np.nan, np.float32)  # scratch: its contents must not matter
    got = filters.threshold(w.copy(), w.shape[0], top_k, f32(top_p), f32(min_p), work, _total(w))
    want = walk_over_sorted(w, top_k, top_p, min_p)
    assert f32(got).tobytes() == want.tobytes(), (got, want)


def test_random_rows_and_parameters():
    rng = np.random.default_rng(11)
    for _ in range(300):
        V = int(rng.choice([2, 9, 700, 3000]))
        kind = rng.integers(0, 3)
        scale = [0.05, 1.0, 8.0][kind]
        w = weights(rng.standard_normal(V) * scale, float(rng.choice([0.5, 1.0, 2.0])))
        top_k = int(rng.choice([0, 1, 5, V - 1, V]))
        top_p = float(np.float32(rng.choice([0.1, 0.9, 0.95, 1.0, rng.random()])))
        work = np.empty(2 * V, np.float32)
        got = filters.threshold(
            w.copy(), V, top_k, np.float32(top_p), np.float32(0.0), work, _total(w)
        )
        want = walk_over_sorted(w, top_k, top_p, 0.0)
        assert np.float32(got).tobytes() == want.tobytes(), (V, top_k, top_p)


def test_the_walk_stops_when_the_mass_reaches_the_bound_exactly():
    w = np.float32([0.5, 1.0, 0.25, 0.25])  # S = 2; top-p 1/2 -> bound 1.0 = the mass of 1.0
    work = np.empty(8, np.float32)
    assert (
        filters.threshold(w, 4, 0, np.float32(0.5), np.float32(0.0), work, _total(w)) == 1.0
    )  # the top
    # a hair more and the next weight joins
    assert (
        filters.threshold(w, 4, 0, np.float32(0.5000001), np.float32(0.0), work, _total(w)) == 0.5
    )


def test_the_nucleus_mass_is_summed_in_float64():
    # one weight of 1 and 150000 distinct weights near 1e-5: a float32 running mass over
    # this row drifts by ~1e-4 of the total and moves the boundary by dozens of ids; the
    # float64 walk keeps what exact arithmetic keeps (to an id)
    V = 150001
    w = np.empty(V, np.float32)
    w[0] = 1.0
    w[1:] = np.float32(1e-5) * (1 + np.arange(V - 1, 0, -1, dtype=np.float32) * 1e-7)
    w[1:] = np.random.default_rng(0).permutation(w[1:])  # ids in no particular order
    top_p = np.float32(0.9)
    desc = np.sort(w.astype(np.float64))[::-1]
    bound = np.float64(top_p) * desc.sum()
    exact = int(((np.cumsum(desc) - desc) < bound).sum())
    work = np.empty(2 * V, np.float32)
    t = filters.threshold(w.copy(), V, 0, top_p, np.float32(0.0), work, _total(w))
    assert abs(int((w >= t).sum()) - exact) <= 1, (int((w >= t).sum()), exact)
    # the premise (not library code): on this row the float32 sums the walk used before
    # (S in id order, a float32 running mass) miss the exact boundary by far
    S32 = np.float32(0.0)
    for x in w:
        S32 = np.float32(S32 + x)
    f32_mass, n32 = np.float32(0.0), 0
    for x in desc.astype(np.float32):
        if not f32_mass < np.float32(top_p * S32):
            break
        f32_mass, n32 = np.float32(f32_mass + x), n32 + 1
    assert abs(n32 - exact) > 50  # (149 here) what the float64 sums are for


def test_the_radix_sort_orders_a_bucket():
    rng = np.random.default_rng(3)
    x = (0.5 + rng.random(5000) * 0.06).astype(np.float32)  # one bucket: bits >> 20 equal
    assert len(set((x.view(np.int32) >> 20).tolist())) == 1
    got = x.copy()
    filters._sort_low_bits(got, np.empty(x.shape[0], np.int32))
    np.testing.assert_array_equal(got, np.sort(x))
