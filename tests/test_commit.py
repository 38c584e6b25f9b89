"""commit_accepted_tokens (family ``commit``): named cases, CPU path == reference ==
Triton kernel on random batches, errors.

Contract in ``docs/design.md``; the registration tiers (opcheck, compile, fakes, poisoned
outputs) are tests/test_conformance.py's. The Triton launchers run on CPU tensors under the
interpreter.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels.cpu import commit as cpu_commit
from specdec_kernels.kernels import commit as triton_commit
from specdec_kernels.ops import commit_accepted_tokens
from specdec_kernels.reference import commit as ref_commit
from tests.bookkeeping_helpers import ALL, I32, I64, KERNEL_DEVICE, _cpu, _i32, _to

MODULES = {"reference": ref_commit, "cpu": cpu_commit, "triton": triton_commit}


# ---------------------------------------------------------------- callers


def commit(impl, state, out, emitted, req=None, *, device=KERNEL_DEVICE, **kw):
    """Run one commit on a copy of ``state`` (token_ids, num_tokens, num_computed or None).

    Returns ``(result, new_state)``; the copies keep the strides of the originals.
    """
    tok, nt, nc = (None if s is None else s.clone() for s in state)
    opt = {
        k: kw.get(k) for k in ("stop_token_ids", "num_prompt_tokens", "min_tokens", "max_tokens")
    }
    mml = kw["max_model_len"]
    if impl == "public":
        res = commit_accepted_tokens(
            tok, nt, out, emitted, req, max_model_len=mml, num_computed_tokens=nc, **opt
        )
        return tuple(res), (tok, nt, nc)
    dev = device if impl == "triton" else "cpu"
    if dev != "cpu":
        tok, nt, nc = (_to(s, dev) for s in (tok, nt, nc))
    res = MODULES[impl].commit_accepted_tokens(
        tok,
        nt,
        _to(out, dev),
        _to(emitted, dev),
        _to(req, dev),
        _to(opt["stop_token_ids"], dev),
        _to(opt["num_prompt_tokens"], dev),
        _to(opt["min_tokens"], dev),
        _to(opt["max_tokens"], dev),
        nc,
        max_model_len=mml,
    )
    return _cpu(res), tuple(None if s is None else s.cpu() for s in (tok, nt, nc))


def _assert_same(got, want, what):
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g is None or w is None:
            assert g is None and w is None, (what, i)
            continue
        assert g.dtype == w.dtype and g.shape == w.shape, (what, i, g.dtype, w.dtype)
        assert torch.equal(g, w), (what, i, g, w)


# ---------------------------------------------------------------- commit: named cases


def _single_row(emitted, *, prompt_done=True, L=4, width=64, num_emitted=None):
    state = (torch.full((1, width), -9, dtype=I32), _i32([L]), _i32([L - 1]))
    out = _i32([emitted])
    n = _i32([len(emitted) if num_emitted is None else num_emitted])
    return state, out, n, _i32([L if prompt_done else 0])


def _committed(new_state, L=4):
    tok, nt, _ = new_state
    return tok[0, L : int(nt[0])].tolist()


@pytest.mark.parametrize("impl", ALL)
@pytest.mark.parametrize(
    ("emitted", "expected", "reason"),
    [
        ([10, 11, 2, 20, 21, 22], [10, 11, 2], 1),  # stop inside the over-long chunk
        ([10, 11, 12, 13, 14, 15], [10, 11, 12, 13, 14], 2),  # control: length
        ([10, 11, 12, 13, 2, 15], [10, 11, 12, 13, 2], 1),  # stop wins on the budget token
    ],
)
def test_commit_stops_inside_an_over_long_chunk(impl, emitted, expected, reason, kernel_device):
    state, out, n, prompt = _single_row(emitted)
    res, new = commit(
        impl,
        state,
        out,
        n,
        device=kernel_device,
        stop_token_ids=_i32([[2]]),
        num_prompt_tokens=prompt,
        max_tokens=_i32([5]),
        max_model_len=64,
    )
    assert _committed(new) == expected
    assert res[0].tolist() == [len(expected)]
    assert res[1].tolist() == [True] and res[2].tolist() == [reason]
    assert new[1].tolist() == [4 + len(expected)] and new[2].tolist() == [3 + len(expected)]
    assert (new[0][0, 4 + len(expected) :] == -9).all()


@pytest.mark.parametrize("impl", ALL)
@pytest.mark.parametrize(
    ("emitted", "expected"), [([8, 2, 9, 4, 6], [8, 2]), ([8, 9, 4, 6, 2], [8, 9, 4, 6, 2])]
)
def test_commit_eos_accepted_mid_block_ends_the_request(impl, emitted, expected, kernel_device):
    state, out, n, _ = _single_row(emitted)
    res, new = commit(
        impl,
        state,
        out,
        n,
        device=kernel_device,
        stop_token_ids=_i32([[2, -1, -1]]),
        max_model_len=64,
    )
    assert _committed(new) == expected
    assert res[0].tolist() == [len(expected)]
    assert res[1].tolist() == [True] and res[2].tolist() == [1]


# ---------------------------------------------------------------- commit: more rules


@pytest.mark.parametrize("impl", ALL)
def test_commit_stop_before_min_tokens_does_not_count(impl, kernel_device):
    # Output indices 0..4; min_tokens 2: the 2 at index 1 is committed but does not stop,
    # the 2 at index 3 does.
    state, out, n, prompt = _single_row([7, 2, 8, 2, 9])
    res, new = commit(
        impl,
        state,
        out,
        n,
        device=kernel_device,
        stop_token_ids=_i32([[2]]),
        num_prompt_tokens=prompt,
        min_tokens=_i32([2]),
        max_model_len=64,
    )
    assert _committed(new) == [7, 2, 8, 2] and res[2].tolist() == [1]


@pytest.mark.parametrize("impl", ALL)
def test_commit_min_tokens_counts_earlier_output(impl, kernel_device):
    # Prompt 2 tokens, 2 outputs already (L = 4): the 2 at output index 2 counts for min 2.
    state, out, n, _ = _single_row([2, 5])
    res, new = commit(
        impl,
        state,
        out,
        n,
        device=kernel_device,
        stop_token_ids=_i32([[2]]),
        num_prompt_tokens=_i32([2]),
        min_tokens=_i32([2]),
        max_model_len=64,
    )
    assert _committed(new) == [2] and res[2].tolist() == [1]


@pytest.mark.parametrize("impl", ALL)
def test_commit_row_at_budget_commits_nothing_and_finishes(impl, kernel_device):
    state, out, n, prompt = _single_row([5, 6], L=6)
    res, new = commit(
        impl,
        state,
        out,
        n,
        device=kernel_device,
        num_prompt_tokens=_i32([3]),
        max_tokens=_i32([3]),
        max_model_len=64,
    )
    assert res[0].tolist() == [0] and res[1].tolist() == [True] and res[2].tolist() == [2]
    assert new[1].tolist() == [6] and (new[0] == -9).all()


@pytest.mark.parametrize("impl", ALL)
def test_commit_never_writes_past_max_model_len(impl, kernel_device):
    # token_ids is exactly max_model_len wide; 2 slots left, 4 tokens emitted.
    state, out, n, _ = _single_row([5, 6, 7, 8], L=6, width=8)
    res, new = commit(impl, state, out, n, device=kernel_device, max_model_len=8)
    assert new[0][0, 6:].tolist() == [5, 6] and new[1].tolist() == [8]
    assert res[0].tolist() == [2] and res[2].tolist() == [2]


@pytest.mark.parametrize("impl", ALL)
@pytest.mark.parametrize(
    ("emitted", "num_emitted", "expected", "reason"),
    [
        ([5, -1, 7], 3, [5], 0),  # the first -1 ends the tokens
        ([-1, 6, 7], 3, [], 0),
        ([5, 6, 7], 0, [], 0),  # nothing emitted: running, nothing committed
        ([5, 6, 7], 2, [5, 6], 0),  # entries past num_emitted are ignored
    ],
)
def test_commit_placeholders_and_num_emitted(
    impl, emitted, num_emitted, expected, reason, kernel_device
):
    state, out, n, _ = _single_row(emitted, num_emitted=num_emitted)
    res, new = commit(
        impl, state, out, n, device=kernel_device, stop_token_ids=_i32([[-1]]), max_model_len=64
    )
    assert _committed(new) == expected and res[2].tolist() == [reason]
    assert res[1].tolist() == [False]


def _commit_batch():
    # 5 state rows; batch [row 3, padding, row 0, row 4]; rows 1 and 2 are not in the batch.
    tok = torch.full((5, 12), -9, dtype=I32)
    nt = _i32([3, 5, 7, 4, 10])
    nc = nt - 1
    out = _i32([[1, 2, 3, -1], [4, 4, 4, 4], [2, 6, -1, -1], [7, 8, 9, 10]])
    emitted = _i32([3, 4, 2, 4])
    req = _i32([3, -1, 0, 4])
    kw = dict(
        stop_token_ids=_i32([[2, 99], [4, -1], [-1, -1], [-1, -1]]),
        num_prompt_tokens=_i32([1, 5, 7, 2, 3]),
        max_tokens=_i32([9, 9, 9, 9]),
        max_model_len=12,
    )
    return (tok, nt, nc), out, emitted, req, kw


@pytest.mark.parametrize("impl", ALL)
def test_commit_padding_rows_and_rows_outside_batch_are_untouched(impl, kernel_device):
    state, out, emitted, req, kw = _commit_batch()
    res, (tok, nt, nc) = commit(impl, state, out, emitted, req, device=kernel_device, **kw)
    assert res[0].tolist() == [2, 0, 2, 2]
    assert res[2].tolist() == [1, 0, 0, 2]
    assert res[1].tolist() == [True, False, False, True]
    assert tok[3, 4:6].tolist() == [1, 2] and tok[0, 3:5].tolist() == [2, 6]
    assert tok[4, 10:].tolist() == [7, 8]
    assert nt.tolist() == [5, 5, 7, 6, 12] and nc.tolist() == [4, 4, 6, 5, 11]
    untouched = torch.ones_like(tok, dtype=torch.bool)
    untouched[3, 4:6] = untouched[0, 3:5] = untouched[4, 10:] = False
    assert (tok[untouched] == -9).all()


@pytest.mark.parametrize("impl", ALL)
def test_commit_through_strided_views(impl, kernel_device):
    # token_ids, num_tokens and num_computed_tokens are views into bigger buffers; the
    # writes must land in those buffers.
    state, out, emitted, req, kw = _commit_batch()
    tok_buf = torch.full((5, 24), -9, dtype=I32)
    cnt_buf = torch.zeros((5, 2), dtype=I32)
    cnt_buf[:, 0] = state[1]
    cnt_buf[:, 1] = state[2]
    strided = (tok_buf[:, ::2], cnt_buf[:, 0], cnt_buf[:, 1])
    assert not any(t.is_contiguous() for t in strided)
    want_res, want_state = commit("reference", state, out, emitted, req, **kw)
    if impl == "public":
        res = commit_accepted_tokens(
            strided[0], strided[1], out, emitted, req, num_computed_tokens=strided[2], **kw
        )
        got_state = strided
    else:
        dev = kernel_device if impl == "triton" else "cpu"
        bufs = tok_buf.to(dev), cnt_buf.to(dev)
        views = (bufs[0][:, ::2], bufs[1][:, 0], bufs[1][:, 1])
        res = MODULES[impl].commit_accepted_tokens(
            views[0],
            views[1],
            _to(out, dev),
            _to(emitted, dev),
            _to(req, dev),
            _to(kw["stop_token_ids"], dev),
            _to(kw["num_prompt_tokens"], dev),
            None,
            _to(kw["max_tokens"], dev),
            views[2],
            max_model_len=kw["max_model_len"],
        )
        got_state = tuple(v.cpu() for v in views)
        tok_buf = bufs[0].cpu()
    _assert_same(_cpu(res), want_res, impl)
    _assert_same(got_state, want_state, impl)
    assert (tok_buf[:, 1::2] == -9).all()


@st.composite
def _commit_batches(draw):
    R = draw(st.integers(1, 6))
    L_max = draw(st.integers(1, 14))
    k = draw(st.integers(0, 4))
    vocab = draw(st.integers(1, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    nt = torch.randint(0, L_max + 1, (R,), generator=g, dtype=I32)
    prompt = (torch.rand(R, generator=g) * (nt.double() + 1)).floor().to(I32).clamp(max=nt)
    state_rows = draw(st.permutations(range(R)))
    B_real = draw(st.integers(0, R))
    req = list(state_rows[:B_real])
    for _ in range(draw(st.integers(0, 2))):
        req.insert(draw(st.integers(0, len(req))), -1)
    B = len(req)
    use_req = draw(st.booleans()) or B != R or any(r < 0 for r in req)
    if not use_req:
        req = list(range(R))
    out = torch.randint(-1, vocab, (B, k + 1), generator=g, dtype=I32)
    emitted = torch.randint(0, k + 2, (B,), generator=g, dtype=I32)
    S = draw(st.integers(0, 3))
    kw = dict(max_model_len=draw(st.integers(1, L_max)))
    if draw(st.booleans()):
        kw["stop_token_ids"] = torch.randint(-1, vocab, (B, S), generator=g, dtype=I32)
    if draw(st.booleans()):
        kw["num_prompt_tokens"] = prompt
        if draw(st.booleans()):
            kw["min_tokens"] = torch.randint(0, 4, (B,), generator=g, dtype=I32)
        if draw(st.booleans()):
            kw["max_tokens"] = torch.randint(0, 8, (B,), generator=g, dtype=I32)
    nc = (nt - 1).clamp(min=0) if draw(st.booleans()) else None
    tok = torch.randint(100, 200, (R, L_max), generator=g, dtype=I32)
    return (tok, nt, nc), out, emitted, _i32(req).reshape(B) if use_req else None, kw


@settings(max_examples=100)
@given(_commit_batches())
def test_commit_cpu_and_triton_match_reference(case):
    state, out, emitted, req, kw = case
    want_res, want_state = commit("reference", state, out, emitted, req, **kw)
    for impl in ("cpu", "triton", "public"):
        res, new_state = commit(impl, state, out, emitted, req, **kw)
        _assert_same(res, want_res, impl)
        _assert_same(new_state, want_state, impl)
    # Rules that hold whatever the inputs.
    committed, finished, reason = want_res
    assert torch.equal(finished, reason != 0)
    padding = torch.zeros_like(finished) if req is None else req < 0
    assert ((committed >= 1) | (emitted == 0) | (reason == 2) | (out[:, 0] < 0) | padding).all()
    assert not (finished & padding).any()


# ---------------------------------------------------------------- errors


def _commit_call(**overrides):
    (tok, nt, nc), out, emitted, req, kw = _commit_batch()
    args = dict(
        token_ids=tok,
        num_tokens=nt,
        output_token_ids=out,
        num_emitted=emitted,
        req_indices=req,
        num_computed_tokens=nc,
        **kw,
    )
    args.update(overrides)
    return commit_accepted_tokens(**args)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(token_ids=torch.zeros((5, 12), dtype=I64)), "token_ids must have dtype int32"),
        (dict(num_tokens=_i32([1, 2])), r"num_tokens must have shape \(5,\)"),
        (dict(output_token_ids=_i32([1, 2, 3, 4])), "output_token_ids must be 2-D"),
        (dict(output_token_ids=torch.zeros((4, 0), dtype=I32)), "k\\+1 >= 1"),
        (dict(num_emitted=_i32([1, 2])), r"num_emitted must have shape \(4,\)"),
        (dict(req_indices=_i32([0, 1])), r"req_indices must have shape \(4,\)"),
        (dict(stop_token_ids=_i32([[2]])), r"stop_token_ids must have shape \(4, S\)"),
        (dict(num_prompt_tokens=_i32([1])), r"num_prompt_tokens must have shape \(5,\)"),
        (
            dict(num_computed_tokens=torch.zeros(5, dtype=I64)),
            "num_computed_tokens must have dtype",
        ),
        (dict(max_tokens=_i32([1, 1])), r"max_tokens must have shape \(4,\)"),
        (dict(num_prompt_tokens=None), "max_tokens counts output tokens, so it needs"),
        (
            dict(num_prompt_tokens=None, max_tokens=None, min_tokens=_i32([0, 0, 0, 0])),
            "min_tokens counts output tokens, so it needs",
        ),
        (dict(max_model_len=13), r"max_model_len must be <= token_ids.shape\[1\] \(12\)"),
        (dict(max_model_len=0), "max_model_len must be >= 1"),
        (dict(req_indices=_i32([3, -1, 3, 4])), "req_indices must be unique"),
        (dict(req_indices=_i32([3, -1, 5, 4])), r"req_indices must lie in \[-1, 5\)"),
        (dict(num_emitted=_i32([3, 4, 5, 4])), r"num_emitted must lie in \[0, 4\]"),
        (dict(num_emitted=_i32([3, 4, -1, 4])), r"num_emitted must lie in \[0, 4\]"),
        (dict(num_tokens=_i32([3, 5, 7, 13, 10])), r"num_tokens must lie in \[0, 12\]"),
        (dict(num_prompt_tokens=_i32([4, 0, 0, 0, 0])), "num_prompt_tokens must lie in"),
        (dict(max_tokens=_i32([1, 1, -1, 1])), "max_tokens must be >= 0"),
        (dict(min_tokens=_i32([1, 1, -2, 1])), "min_tokens must be >= 0"),
    ],
)
def test_commit_accepted_tokens_bad_input_raises_value_error(overrides, match):
    with pytest.raises(ValueError, match=match):
        _commit_call(**overrides)


def test_commit_errors_leave_state_untouched():
    (tok, nt, nc), out, emitted, req, kw = _commit_batch()
    before = (tok.clone(), nt.clone(), nc.clone())
    with pytest.raises(ValueError, match="req_indices must be unique"):
        commit_accepted_tokens(
            tok, nt, out, emitted, _i32([3, -1, 3, 4]), num_computed_tokens=nc, **kw
        )
    _assert_same((tok, nt, nc), before, "state")
