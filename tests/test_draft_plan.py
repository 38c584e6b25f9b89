"""Draft-length planning: named cases, exactness by brute force, CPU == reference == Triton.

``plan_draft_lengths`` and ``update_acceptance_stats`` (``docs/design.md``, "Draft-length
planning"); the registration tiers are tests/test_conformance.py's. The Triton launchers
run on CPU tensors under the interpreter.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels.constants import DRAFT_GAIN_SCALE
from specdec_kernels.cpu import draft_plan as cpu_plan
from specdec_kernels.kernels import draft_plan as triton_plan
from specdec_kernels.ops import (
    new_acceptance_stats,
    plan_draft_lengths,
    update_acceptance_stats,
)
from specdec_kernels.reference import draft_plan as ref_plan

I32 = torch.int32
MODULES = {"reference": ref_plan, "cpu": cpu_plan, "triton": triton_plan}
ALL = (*MODULES, "public")


def _i32(x):
    return torch.tensor(x, dtype=I32)


# the Triton launchers' device where no fixture reaches (hypothesis tests): CUDA when present
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def plan(impl, nd, ml, acc, cost, req=None, *, max_num_tokens=None, device=KERNEL_DEVICE):
    if impl == "public":
        return tuple(
            plan_draft_lengths(nd, ml, cost, req, acceptance=acc, max_num_tokens=max_num_tokens)
        )
    dev = device if impl == "triton" else "cpu"
    to = lambda t: None if t is None else t.to(dev)  # noqa: E731
    out = MODULES[impl].plan_draft_lengths(
        to(nd), to(ml), to(cost), to(req), to(acc), max_num_tokens=max_num_tokens
    )
    return tuple(o.cpu() for o in out)


def update(impl, acc, drafts, nd, ml, out, ne, req=None, *, decay=0.8, device=KERNEL_DEVICE):
    """Run one update on a copy of ``acc``; returns the new estimates."""
    acc = acc.clone()
    if impl == "public":
        update_acceptance_stats(drafts, nd, ml, out, ne, req, acceptance=acc, decay=decay)
        return acc
    dev = device if impl == "triton" else "cpu"
    to = lambda t: None if t is None else t.to(dev)  # noqa: E731
    a = to(acc)
    MODULES[impl].update_acceptance_stats(
        to(drafts), to(nd), to(ml), to(out), to(ne), to(req), a, decay=decay
    )
    return a.cpu()


def _linear_cost(n_max, base=1.0, per_token=0.1):
    return base + per_token * torch.arange(n_max + 1, dtype=torch.float32)


def _objective(planned, acc, nd, ml, cost, req):
    """The quantity the plan maximises, from the plan alone (float64, exact integers)."""
    B, M = nd.shape[0], acc.shape[1]
    rows = list(range(B)) if req is None else req.tolist()
    total = B * DRAFT_GAIN_SCALE
    for b, r in enumerate(rows):
        if r < 0:
            continue
        c = min(max(int(ml[b]), 1), M) - 1
        g = torch.tensor(1.0)
        for j in range(int(planned[b])):
            g = g * acc[r, c, j]
            total += int(torch.floor(g * DRAFT_GAIN_SCALE))
    return total / float(cost[B + int(sum(planned))])


# ---------------------------------------------------------------- named cases


@pytest.mark.parametrize("impl", ALL)
def test_cheap_drafts_are_all_verified(impl, kernel_device):
    # Batch 1, a verify token costs 1% of a pass: every proposed draft pays.
    acc = torch.full((1, 1, 4), 0.5)
    out = plan(impl, _i32([3]), _i32([2]), acc, _linear_cost(5, 1.0, 0.01), device=kernel_device)
    assert out[0].tolist() == [3]
    assert out[1].tolist() == pytest.approx([1 + 0.5 + 0.25 + 0.125])


@pytest.mark.parametrize("impl", ALL)
def test_drafting_that_cannot_pay_is_turned_off(impl, kernel_device):
    # Each verify token costs as much as the whole pass: even a sure draft (a = 1) only
    # doubles the tokens for double the cost, and no estimate is above 0.9.
    acc = torch.full((3, 1, 4), 0.9)
    cost = _linear_cost(15, 0.0, 1.0)
    cost[0] = 1.0
    out = plan(impl, _i32([4, 4, 2]), _i32([1, 1, 1]), acc, cost, device=kernel_device)
    assert out[0].tolist() == [0, 0, 0] and out[1].tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("impl", ALL)
def test_the_best_drafts_go_first_across_requests(impl, kernel_device):
    # Row 0 accepts well, row 1 badly: with a moderate per-token cost only row 0 drafts,
    # and never more than it proposed.
    acc = torch.tensor([[[0.9, 0.9, 0.9, 0.9]], [[0.05, 0.05, 0.05, 0.05]]])
    out = plan(impl, _i32([2, 4]), _i32([3, 3]), acc, _linear_cost(10, 1.0, 0.2),
               device=kernel_device)  # fmt: skip
    assert out[0].tolist() == [2, 0]


@pytest.mark.parametrize("impl", ALL)
def test_max_num_tokens_caps_the_pass(impl, kernel_device):
    acc = torch.full((2, 1, 4), 1.0)
    out = plan(impl, _i32([4, 4]), _i32([1, 1]), acc, _linear_cost(10, 1.0, 0.01),
               max_num_tokens=5, device=kernel_device)  # fmt: skip
    # equal gains: position 0 of both rows before position 1 of either, then the lower row
    assert out[0].tolist() == [2, 1]


@pytest.mark.parametrize("impl", ALL)
def test_padding_rows_get_nothing_and_count_one_token(impl, kernel_device):
    acc = torch.full((2, 2, 3), 0.8)
    req = _i32([1, -1, 0])
    cost = _linear_cost(9, 1.0, 0.01)
    out = plan(impl, _i32([3, 3, 1]), _i32([2, 2, 7]), acc, cost, req, device=kernel_device)
    assert out[0].tolist() == [3, 0, 1]
    assert out[1][1] == 0.0


@pytest.mark.parametrize("impl", ALL)
def test_match_length_classes_select_their_estimates(impl, kernel_device):
    # class 0 (match_len <= 1) never accepts, class 1 (match_len >= 2) always does
    acc = torch.zeros((1, 2, 2))
    acc[0, 1] = 1.0
    acc = acc.expand(2, 2, 2).contiguous()
    out = plan(impl, _i32([2, 2]), _i32([1, 5]), acc, _linear_cost(6, 1.0, 0.1),
               device=kernel_device)  # fmt: skip
    assert out[0].tolist() == [0, 2]


@pytest.mark.parametrize("impl", ALL)
def test_empty_batch_k_zero_and_no_state_rows(impl, kernel_device):
    out = plan(impl, _i32([]), _i32([]), torch.zeros((2, 1, 3)), _linear_cost(3),
               device=kernel_device)  # fmt: skip
    assert out[0].shape == (0,) and out[1].shape == (0,)
    out = plan(impl, _i32([0, 0]), _i32([0, 0]), torch.zeros((2, 1, 0)), _linear_cost(3),
               device=kernel_device)  # fmt: skip
    assert out[0].tolist() == [0, 0] and out[1].tolist() == [1.0, 1.0]
    out = plan(impl, _i32([0]), _i32([0]), torch.zeros((0, 1, 2)), _linear_cost(3), _i32([-1]),
               device=kernel_device)  # fmt: skip
    assert out[0].tolist() == [0] and out[1].tolist() == [0.0]


# ---------------------------------------------------------------- exactness


@st.composite
def _plans(draw):
    B = draw(st.integers(1, 4))
    K = draw(st.integers(1, 3))
    M = draw(st.integers(1, 2))
    R = draw(st.integers(B, B + 2))
    levels = st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.5, 0.7, 0.9, 1.0])
    acc = torch.tensor(draw(st.lists(levels, min_size=R * M * K, max_size=R * M * K)))
    acc = acc.reshape(R, M, K)
    nd = _i32(draw(st.lists(st.integers(0, K), min_size=B, max_size=B)))
    ml = _i32(draw(st.lists(st.integers(0, 3), min_size=B, max_size=B)))
    req = None
    if draw(st.booleans()):
        perm = torch.randperm(R, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
        req = perm[:B].to(I32)
        if draw(st.booleans()):
            req[draw(st.integers(0, B - 1))] = -1
    per_token = draw(st.sampled_from([0.0, 0.05, 0.3, 0.8, 1.5]))
    n_max = B * (K + 1) + draw(st.integers(0, 2))
    cost = _linear_cost(n_max, 1.0, per_token)
    if draw(st.booleans()):  # a step-shaped table, as CUDA-graph buckets make it
        cost = torch.ceil(cost * 2) / 2
    cap = draw(st.one_of(st.none(), st.integers(B, n_max)))
    return nd, ml, acc, cost, req, cap


@settings(max_examples=60)
@given(_plans())
def test_plan_is_the_exact_optimum_by_brute_force(case):
    nd, ml, acc, cost, req, cap = case
    got = plan("cpu", nd, ml, acc, cost, req, max_num_tokens=cap)
    planned = got[0]
    B = nd.shape[0]
    rows = list(range(B)) if req is None else req.tolist()
    live = [b for b, r in enumerate(rows) if r >= 0]
    assert all(planned[b] == 0 for b in range(B) if b not in live)
    assert bool((planned <= nd).all()) and bool((planned >= 0).all())
    n_max = cost.shape[0] - 1 if cap is None else min(cap, cost.shape[0] - 1)
    assert B + int(planned.sum()) <= n_max
    best = max(
        _objective(torch.tensor(ks), acc, nd, ml, cost, req)
        for ks in itertools.product(*(range(int(nd[b]) + 1) if b in live else [0]
                                      for b in range(B)))
        if B + sum(ks) <= n_max
    )  # fmt: skip
    assert _objective(planned, acc, nd, ml, cost, req) == best


@settings(max_examples=40)
@given(_plans())
def test_plan_cpu_and_triton_match_reference(case):
    nd, ml, acc, cost, req, cap = case
    want = plan("reference", nd, ml, acc, cost, req, max_num_tokens=cap)
    for impl in ("cpu", "triton"):
        got = plan(impl, nd, ml, acc, cost, req, max_num_tokens=cap)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (impl, got, want)


@pytest.mark.parametrize("B", [127, 128, 300])
def test_plan_kernel_sums_past_int32_at_large_batches(B, kernel_device):
    # B * 2**24 passes 2**31 at B = 128: the kernel's totals must be int64 (found by a
    # review: the kernel planned 130 drafts where the CPU path planned 54).
    g = torch.Generator().manual_seed(B)
    acc = torch.rand((B, 1, 2), generator=g)
    nd = torch.randint(0, 3, (B,), generator=g, dtype=I32)
    cost = 1 + 0.002 * torch.arange(B * 3 + 1, dtype=torch.float32) ** 1.2
    want = plan("cpu", nd, torch.ones(B, dtype=I32), acc, cost)
    got = plan("triton", nd, torch.ones(B, dtype=I32), acc, cost, device=kernel_device)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ---------------------------------------------------------------- update_acceptance_stats


@pytest.mark.parametrize("impl", ALL)
def test_update_observes_up_to_the_first_mismatch(impl, kernel_device):
    acc = torch.full((2, 1, 3), 0.5)
    drafts = _i32([[5, 6, 7], [1, 2, 3]])
    out = _i32([[5, 6, 9, -1], [4, -1, -1, -1]])
    got = update(impl, acc, drafts, _i32([3, 3]), _i32([1, 1]), out, _i32([3, 1]),
                 decay=0.5, device=kernel_device)  # fmt: skip
    # row 0: hit, hit, miss; row 1: miss at 0, positions 1 and 2 not observed
    assert got[0, 0].tolist() == [0.75, 0.75, 0.25]
    assert got[1, 0].tolist() == [0.25, 0.5, 0.5]


@pytest.mark.parametrize("impl", ALL)
def test_update_of_a_throttled_request_still_sees_its_first_draft(impl, kernel_device):
    # Planned 0 drafts, so one token was emitted: proposed draft 0 is compared with it.
    acc = torch.full((1, 1, 4), 0.2)
    got = update(impl, acc, _i32([[8, 9, 8, 9]]), _i32([4]), _i32([2]), _i32([[8, -1, -1, -1, -1]]),
                 _i32([1]), decay=0.5, device=kernel_device)  # fmt: skip
    assert got[0, 0].tolist() == pytest.approx([0.6, 0.2, 0.2, 0.2])


@pytest.mark.parametrize("impl", ALL)
def test_update_uses_the_class_and_skips_padding_rows(impl, kernel_device):
    acc = torch.full((2, 3, 2), 0.5)
    req = _i32([-1, 1])
    got = update(impl, acc, _i32([[1, 2], [3, 4]]), _i32([2, 2]), _i32([2, 9]),
                 _i32([[1, 2, 0], [3, 4, 0]]), _i32([3, 3]), req, decay=0.0,
                 device=kernel_device)  # fmt: skip
    want = torch.full((2, 3, 2), 0.5)
    want[1, 2] = 1.0  # match_len 9 -> the last class
    assert torch.equal(got, want)


@st.composite
def _updates(draw):
    B = draw(st.integers(0, 4))
    K = draw(st.integers(0, 3))
    M = draw(st.integers(1, 3))
    R = draw(st.integers(B, B + 2))
    acc = torch.tensor(draw(st.lists(st.floats(0, 1, width=32), min_size=R * M * K,
                                     max_size=R * M * K))).reshape(R, M, K)  # fmt: skip
    vocab = st.integers(-1, 2)
    drafts = _i32(draw(st.lists(vocab, min_size=B * K, max_size=B * K))).reshape(B, K)
    out = _i32(draw(st.lists(vocab, min_size=B * (K + 1), max_size=B * (K + 1))))
    nd = _i32(draw(st.lists(st.integers(0, K), min_size=B, max_size=B)))
    ne = _i32(draw(st.lists(st.integers(0, K + 1), min_size=B, max_size=B)))
    ml = _i32(draw(st.lists(st.integers(0, 4), min_size=B, max_size=B)))
    req = None
    if B and draw(st.booleans()):
        req = torch.randperm(R)[:B].to(I32)
        req[0] = -1 if draw(st.booleans()) else req[0]
    decay = draw(st.sampled_from([0.0, 0.3, 0.8, 0.95]))
    return acc, drafts, nd, ml, out.reshape(B, K + 1), ne, req, decay


@settings(max_examples=40)
@given(_updates())
def test_update_cpu_and_triton_match_reference(case):
    acc, drafts, nd, ml, out, ne, req, decay = case
    want = update("reference", acc, drafts, nd, ml, out, ne, req, decay=decay)
    for impl in ("cpu", "triton"):
        got = update(impl, acc, drafts, nd, ml, out, ne, req, decay=decay)
        assert torch.equal(got, want), (impl, got, want)


def test_new_acceptance_stats_is_the_prior():
    acc = new_acceptance_stats(3, 4, num_classes=2, prior=0.25)
    assert acc.shape == (3, 2, 4) and acc.dtype == torch.float32 and bool((acc == 0.25).all())


# ---------------------------------------------------------------- errors: inputs


def _plan_args():
    acc = torch.full((3, 2, 3), 0.6)
    return (_i32([3, 1, 0]), _i32([2, 1, 0]), acc, _linear_cost(12), _i32([2, 0, -1]))


def _update_args():
    return (
        torch.full((3, 2, 3), 0.6),
        _i32([[1, 2, 3], [4, 5, 6], [-1, -1, -1]]),
        _i32([3, 2, 0]),
        _i32([2, 1, 0]),
        _i32([[1, 2, 0, 0], [4, 0, 0, 0], [0, 0, 0, 0]]),
        _i32([3, 2, 1]),
        _i32([2, 0, -1]),
    )


# ---------------------------------------------------------------- errors


def _plan_call(**overrides):
    nd, ml, acc, cost, req = _plan_args()
    kw = dict(num_draft_tokens=nd, match_len=ml, acceptance=acc, verify_cost=cost,
              req_indices=req)  # fmt: skip
    kw.update(overrides)
    return plan_draft_lengths(**kw)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(num_draft_tokens=torch.zeros(3, dtype=torch.int64)), "num_draft_tokens must have"),
        (dict(match_len=_i32([1, 2])), r"match_len must have shape \(3,\)"),
        (dict(acceptance=torch.zeros((3, 3))), "acceptance must be 3-D"),
        (dict(acceptance=torch.zeros((3, 0, 3))), "M >= 1"),
        (dict(verify_cost=torch.ones(3)), "verify_cost must have more than B = 3"),
        (dict(verify_cost=torch.ones(5, dtype=torch.float64)), "verify_cost must have dtype"),
        (dict(max_num_tokens=2), "max_num_tokens must be >= 3"),
        (dict(max_num_tokens=2**63), "max_num_tokens must fit in int64"),
        (dict(req_indices=_i32([0, 1])), r"req_indices must have shape \(3,\)"),
        (dict(req_indices=_i32([0, 3, 1])), r"req_indices must lie in \[-1, 3\)"),
        (dict(num_draft_tokens=_i32([4, 0, 0])), r"num_draft_tokens must lie in \[0, 3\]"),
        (dict(acceptance=torch.full((3, 2, 3), 1.5)), r"acceptance must lie in \[0, 1\]"),
        (dict(verify_cost=torch.zeros(12)), "verify_cost.* must be positive and finite"),
        (
            dict(
                num_draft_tokens=torch.zeros(6000, dtype=I32),
                match_len=torch.zeros(6000, dtype=I32),
                req_indices=None,
                acceptance=torch.zeros((6000, 1, 3)),
                verify_cost=torch.ones(6001),
            ),
            "B \\* k must be <= 16384",
        ),  # fmt: skip
    ],
)
def test_plan_bad_input_raises_value_error(overrides, match):
    with pytest.raises(ValueError, match=match):
        _plan_call(**overrides)


@pytest.mark.parametrize(
    ("index", "value", "decay", "match"),
    [
        (1, _i32([[1, 2], [4, 5], [0, 0]]), 0.8, r"draft_token_ids must have shape \(3, 3\)"),
        (4, _i32([[1, 2, 0], [4, 0, 0], [0, 0, 0]]), 0.8, r"output_token_ids must have shape"),
        (5, _i32([3, 2, 5]), 0.8, r"num_emitted must lie in \[0, 4\]"),
        (6, _i32([2, 2, -1]), 0.8, "req_indices must be unique"),
        (0, None, 1.0, r"decay must be a float in \[0, 1\)"),
    ],
)
def test_update_bad_input_raises_value_error(index, value, decay, match):
    args = list(_update_args())
    if value is not None:
        args[index] = value
    before = args[0].clone()
    with pytest.raises(ValueError, match=match):
        update_acceptance_stats(*args[1:], acceptance=args[0], decay=decay)
    assert torch.equal(args[0], before)
