"""compute_slot_mapping and prepare_verify_inputs (family ``verify_inputs``): named cases,
CPU path == reference == Triton kernel on random batches, errors.

Contracts in ``docs/design.md``; the registration tiers (opcheck, compile, fakes, poisoned
outputs) are tests/test_conformance.py's. The Triton launchers run on CPU tensors under the
interpreter.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels.cpu import verify_inputs as cpu_verify
from specdec_kernels.kernels import verify_inputs as triton_verify
from specdec_kernels.ops import compute_slot_mapping, prepare_verify_inputs
from specdec_kernels.reference import verify_inputs as ref_verify
from tests.bookkeeping_helpers import ALL, I32, I64, IMPLS, KERNEL_DEVICE, _cpu, _i32, _to

MODULES = {"reference": ref_verify, "cpu": cpu_verify, "triton": triton_verify}


# ---------------------------------------------------------------- callers


def slot_mapping(
    impl, bt, pos, qsl, req=None, *, block_size, max_model_len=None, device=KERNEL_DEVICE
):
    if impl == "public":
        return compute_slot_mapping(
            bt, pos, qsl, req, block_size=block_size, max_model_len=max_model_len
        )
    dev = device if impl == "triton" else "cpu"
    block_size = 1 if block_size is None else block_size  # what the public wrapper passes
    fn = MODULES[impl].compute_slot_mapping
    out = fn(
        _to(bt, dev),
        _to(pos, dev),
        _to(qsl, dev),
        _to(req, dev),
        block_size=block_size,
        max_model_len=max_model_len,
    )
    return out.cpu()


def verify_inputs(
    impl, tok, nt, drafts, nd, bt, req=None, *, block_size, max_model_len, device=KERNEL_DEVICE
):
    if impl == "public":
        return tuple(
            prepare_verify_inputs(
                tok, nt, drafts, nd, bt, req, block_size=block_size, max_model_len=max_model_len
            )
        )
    dev = device if impl == "triton" else "cpu"
    block_size = 1 if block_size is None else block_size  # what the public wrapper passes
    fn = MODULES[impl].prepare_verify_inputs
    args = [_to(t, dev) for t in (tok, nt, drafts, nd, bt, req)]
    return _cpu(fn(*args, block_size=block_size, max_model_len=max_model_len))


def _assert_same(got, want, what):
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g is None or w is None:
            assert g is None and w is None, (what, i)
            continue
        assert g.dtype == w.dtype and g.shape == w.shape, (what, i, g.dtype, w.dtype)
        assert torch.equal(g, w), (what, i, g, w)


# ---------------------------------------------------------------- slot mapping: named cases


@pytest.mark.parametrize("impl", ALL)
def test_slots_cross_non_contiguous_blocks(impl, kernel_device):
    out = slot_mapping(
        impl,
        _i32([[7, 2]]),
        torch.tensor([3, 4, 5]),
        _i32([0, 3]),
        block_size=4,
        device=kernel_device,
    )
    assert out.dtype == I64 and out.tolist() == [31, 8, 9]


@pytest.mark.parametrize("impl", ALL)
def test_positions_at_or_past_max_model_len_get_pad_slot(impl, kernel_device):
    out = slot_mapping(
        impl,
        _i32([[0, 1, 2]]),
        torch.tensor([8, 9, 10, 11]),
        _i32([0, 4]),
        block_size=4,
        max_model_len=10,
        device=kernel_device,
    )
    assert out.tolist() == [8, 9, -1, -1]


@pytest.mark.parametrize("impl", ALL)
def test_padded_batch_gets_pad_slots(impl, kernel_device):
    bt = _i32([[3, 4], [6, 7], [-1, -1], [-1, -1]])
    pos = torch.tensor([6, 3, 0, 0])
    qsl = _i32([0, 1, 2, 3, 4])
    req = _i32([0, 1, -1, -1])
    out = slot_mapping(impl, bt, pos, qsl, req, block_size=4, device=kernel_device)
    assert out.tolist() == [18, 27, -1, -1]


# ---------------------------------------------------------------- slot mapping, more


@pytest.mark.parametrize("impl", ALL)
def test_slot_mapping_pads_tail_bad_positions_and_unallocated_blocks(impl, kernel_device):
    # Request 0 (state row 1): positions -1, 0, 5 (block 1 unallocated), 8 (past the
    # table's 2 blocks). Request 1 is empty; request 2 is a padding row; 2 tail tokens.
    bt = _i32([[9, 9], [5, -3]])
    pos = torch.tensor([-1, 0, 5, 8, 1, 1, 2])
    qsl = _i32([0, 4, 4, 5])
    req = _i32([1, 0, -1])
    out = slot_mapping(impl, bt, pos, qsl, req, block_size=4, device=kernel_device)
    assert out.tolist() == [-1, 20, -1, -1, -1, -1, -1]


@pytest.mark.parametrize("impl", ALL)
def test_slot_mapping_int32_positions_and_slots_past_int32(impl, kernel_device):
    # A block id near 2^31 / block_size: the slot needs int64 arithmetic.
    big = 2**31 // 16 + 5
    out = slot_mapping(
        impl,
        _i32([[big]]),
        torch.tensor([3], dtype=I32),
        _i32([0, 1]),
        block_size=16,
        device=kernel_device,
    )
    assert out.tolist() == [big * 16 + 3]


@pytest.mark.parametrize("impl", ALL)
def test_slot_mapping_empty_batch_and_no_tokens(impl, kernel_device):
    bt = _i32([[1, 2]])
    out = slot_mapping(
        impl, bt, torch.tensor([0, 1]), _i32([0]), block_size=2, device=kernel_device
    )
    assert out.tolist() == [-1, -1]
    out = slot_mapping(
        impl, bt, torch.zeros(0, dtype=I64), _i32([0, 0]), block_size=2, device=kernel_device
    )
    assert out.shape == (0,)


def test_slot_mapping_kernel_spans_several_token_blocks(kernel_device):
    # 2600 tokens over 3 programs, 33 requests (a 6-step binary search), one prefill-sized.
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(0, 40, (33,), generator=g)
    lens[7] = 1500
    qsl = torch.zeros(34, dtype=I64)
    qsl[1:] = lens.cumsum(0)
    T = int(qsl[-1]) + 11
    pos = torch.randint(-2, 2100, (T,), generator=g)
    bt = torch.randint(-1, 500, (40, 130), generator=g, dtype=I32)
    req = torch.randperm(40, generator=g)[:33].to(I32)
    req[3] = -1
    want = slot_mapping("reference", bt, pos, qsl.to(I32), req, block_size=16, max_model_len=2000)
    for impl in ("cpu", "triton"):
        got = slot_mapping(
            impl, bt, pos, qsl.to(I32), req, block_size=16, max_model_len=2000, device=kernel_device
        )
        assert torch.equal(got, want), impl


def test_slot_mapping_non_contiguous_block_table(kernel_device):
    wide = torch.arange(60, dtype=I32).reshape(6, 10)
    bt = wide[::2, 1::3]  # [3, 3], strides (20, 3)
    assert not bt.is_contiguous()
    pos = torch.tensor([0, 5, 11, 2, 3])
    qsl = _i32([0, 3, 5])
    req = _i32([2, 0])
    want = slot_mapping("reference", bt.contiguous(), pos, qsl, req, block_size=4)
    assert want.tolist() == [41 * 4, 44 * 4 + 1, 47 * 4 + 3, 1 * 4 + 2, 1 * 4 + 3]
    for impl in ("cpu", "triton", "public"):
        got = slot_mapping(impl, bt, pos, qsl, req, block_size=4, device=kernel_device)
        assert torch.equal(got, want), impl


@st.composite
def _slot_batches(draw):
    R = draw(st.integers(1, 5))
    max_blocks = draw(st.integers(1, 4))
    block_size = draw(st.sampled_from([1, 2, 3, 4, 16]))
    bt = draw(st.lists(st.integers(-1, 30), min_size=R * max_blocks, max_size=R * max_blocks))
    lens = draw(st.lists(st.integers(0, 5), min_size=0, max_size=6))
    B = len(lens)
    extra = draw(st.integers(0, 4))
    T = sum(lens) + extra
    span = block_size * max_blocks
    pos = draw(st.lists(st.integers(-2, span + 3), min_size=T, max_size=T))
    req = None
    if draw(st.booleans()) or B > R:
        req = draw(st.lists(st.integers(-1, R - 1), min_size=B, max_size=B))
    mml = draw(st.one_of(st.none(), st.integers(1, span + 2)))
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    return (
        torch.tensor(bt, dtype=I32).reshape(R, max_blocks),
        torch.tensor(pos, dtype=I64),
        _i32(qsl),
        None if req is None else _i32(req),
        block_size,
        mml,
    )


@settings(max_examples=100)
@given(_slot_batches())
def test_slot_mapping_cpu_and_triton_match_reference(case):
    bt, pos, qsl, req, bs, mml = case
    want = slot_mapping("reference", bt, pos, qsl, req, block_size=bs, max_model_len=mml)
    for impl in ("cpu", "triton", "public"):
        got = slot_mapping(impl, bt, pos, qsl, req, block_size=bs, max_model_len=mml)
        assert torch.equal(got, want), (impl, got, want)


# ---------------------------------------------------------------- contiguous KV layout


@pytest.mark.parametrize("impl", ALL)
def test_slot_mapping_without_block_table_is_contiguous_per_row(impl, kernel_device):
    # slot = r * max_model_len + pos; padding rows, pos < 0, pos >= max_model_len and
    # the tail get -1; block_size is ignored.
    out = slot_mapping(
        impl,
        None,
        torch.tensor([3, 9, 10, -1, 0, 5, 7]),
        _i32([0, 3, 4, 6]),
        _i32([2, -1, 0]),
        block_size=1,
        max_model_len=10,
        device=kernel_device,
    )
    assert out.tolist() == [23, 29, -1, -1, 0, 5, -1]


def _identity_block_table(R, mml, bs):
    """A block table whose slots are the contiguous layout's (row r owns mml slots)."""
    per_row = mml // bs
    return torch.arange(R * per_row, dtype=I32).reshape(R, per_row)


@pytest.mark.parametrize("impl", ALL)
def test_verify_inputs_without_block_table_equal_an_identity_block_table(impl, kernel_device):
    tok, nt, drafts, nd, _, req = _verify_example()
    want = verify_inputs(
        "reference", tok, nt, drafts, nd, _identity_block_table(3, 16, 4), req,
        block_size=4, max_model_len=16,
    )  # fmt: skip
    got = verify_inputs(
        impl, tok, nt, drafts, nd, None, req, block_size=None, max_model_len=16,
        device=kernel_device,
    )  # fmt: skip
    _assert_same(got, want, impl)
    assert got[4].tolist()[:4] == [34, 35, 36, 37]  # row 2 at positions 2..5


@settings(max_examples=40)
@given(st.data())
def test_slot_mapping_without_block_table_matches_identity_table(data):
    R = data.draw(st.integers(1, 4))
    bs = data.draw(st.sampled_from([1, 2, 4]))
    mml = bs * data.draw(st.integers(1, 5))
    lens = data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=4))
    B = len(lens)
    T = sum(lens) + data.draw(st.integers(0, 2))
    pos = torch.tensor(data.draw(st.lists(st.integers(-2, mml + 2), min_size=T, max_size=T)))
    req = _i32(data.draw(st.lists(st.integers(-1, R - 1), min_size=B, max_size=B)))
    qsl = _i32([0, *torch.tensor(lens).cumsum(0).tolist()])
    want = slot_mapping(
        "reference", _identity_block_table(R, mml, bs), pos, qsl, req,
        block_size=bs, max_model_len=mml,
    )  # fmt: skip
    for impl in IMPLS:
        got = slot_mapping(impl, None, pos, qsl, req, block_size=None, max_model_len=mml)
        assert torch.equal(got, want), (impl, got, want)


# ---------------------------------------------------------------- prepare_verify_inputs


def _verify_example():
    # State rows 0..2 with lengths 5, 9, 3; batch [row 2 (3 drafts), padding, row 0 (2)].
    tok = torch.arange(60, dtype=I32).reshape(3, 20)
    nt = _i32([5, 9, 3])
    drafts = _i32([[100, 101, 102], [200, 201, 202], [300, 301, -1]])
    nd = _i32([3, 2, 2])  # the padding row's count is ignored
    bt = _i32([[0, 1, 2], [3, 4, 5], [6, 7, 8]])
    req = _i32([2, -1, 0])
    return tok, nt, drafts, nd, bt, req


@pytest.mark.parametrize("impl", ALL)
def test_verify_inputs_pack_queries_padding_row_and_tail(impl, kernel_device):
    out = verify_inputs(
        impl, *_verify_example(), block_size=4, max_model_len=16, device=kernel_device
    )
    ids, pos, qsl, seq_lens, slots, cu, flat = out
    assert ids.tolist() == [42, 100, 101, 102, 0, 4, 300, 301, 0, 0, 0, 0]
    assert pos.tolist() == [2, 3, 4, 5, 0, 4, 5, 6, 0, 0, 0, 0]
    assert qsl.tolist() == [0, 4, 5, 8]
    assert seq_lens.tolist() == [6, 1, 7]
    assert slots.tolist() == [26, 27, 28, 29, -1, 4, 5, 6, -1, -1, -1, -1]
    assert cu.tolist() == [0, 3, 3, 5]
    assert flat.tolist() == [100, 101, 102, 300, 301, -1, -1, -1, -1]
    assert [o.dtype for o in out] == [I32, I64, I32, I32, I64, I32, I32]


@pytest.mark.parametrize("impl", ALL)
def test_verify_inputs_with_k_zero_is_plain_decoding(impl, kernel_device):
    tok = torch.arange(30, dtype=I32).reshape(3, 10)
    nt = _i32([4, 10, 1])
    bt = _i32([[0, 1, 2], [3, 4, 5], [6, 7, 8]])
    drafts = torch.zeros((3, 0), dtype=I32)
    out = verify_inputs(
        impl,
        tok,
        nt,
        drafts,
        _i32([0, 0, 0]),
        bt,
        _i32([1, 2, 0]),
        block_size=4,
        max_model_len=12,
        device=kernel_device,
    )
    ids, pos, qsl, seq_lens, slots, cu, flat = out
    assert ids.tolist() == [19, 20, 3]
    assert pos.tolist() == [9, 0, 3]
    assert qsl.tolist() == [0, 1, 2, 3] and cu.tolist() == [0, 0, 0, 0]
    assert seq_lens.tolist() == [10, 1, 4]
    assert slots.tolist() == [5 * 4 + 1, 6 * 4, 3]
    assert flat.shape == (0,)


@pytest.mark.parametrize("impl", ALL)
def test_verify_inputs_drafts_past_max_model_len_get_pad_slot(impl, kernel_device):
    tok = torch.arange(8, dtype=I32)[None]
    out = verify_inputs(
        impl,
        tok,
        _i32([7]),
        _i32([[50, 51, 52]]),
        _i32([3]),
        _i32([[1, 2]]),
        block_size=4,
        max_model_len=8,
        device=kernel_device,
    )
    assert out[1].tolist() == [6, 7, 8, 9]
    assert out[4].tolist() == [10, 11, -1, -1]


@pytest.mark.parametrize("impl", ALL)
def test_verify_inputs_empty_batch(impl, kernel_device):
    tok = torch.zeros((2, 4), dtype=I32)
    out = verify_inputs(
        impl,
        tok,
        _i32([1, 1]),
        torch.zeros((0, 3), dtype=I32),
        torch.zeros(0, dtype=I32),
        _i32([[0], [1]]),
        block_size=4,
        max_model_len=4,
        device=kernel_device,
    )
    assert [tuple(o.shape) for o in out] == [(0,), (0,), (1,), (0,), (0,), (1,), (0,)]
    assert out[2].tolist() == [0] and out[5].tolist() == [0]


def test_verify_inputs_non_contiguous_inputs(kernel_device):
    tok, nt, drafts, nd, bt, req = _verify_example()
    tok_s = torch.zeros((3, 40), dtype=I32)
    tok_s[:, ::2] = tok
    d_s = torch.zeros((3, 6), dtype=I32)
    d_s[:, ::2] = drafts
    bt_s = bt.t().contiguous().t()
    for t in (tok_s[:, ::2], d_s[:, ::2], bt_s):
        assert not t.is_contiguous()
    want = verify_inputs("reference", tok, nt, drafts, nd, bt, req, block_size=4, max_model_len=16)
    for impl in ("cpu", "triton", "public"):
        got = verify_inputs(
            impl,
            tok_s[:, ::2],
            nt,
            d_s[:, ::2],
            nd,
            bt_s,
            req,
            block_size=4,
            max_model_len=16,
            device=kernel_device,
        )
        _assert_same(got, want, impl)


def test_verify_inputs_kernel_spans_several_row_blocks(kernel_device):
    # B = 150 rows: three programs, each summing the draft counts of the rows before it.
    g = torch.Generator().manual_seed(2)
    R, B, k = 200, 150, 3
    tok = torch.randint(0, 1000, (R, 64), generator=g, dtype=I32)
    nt = torch.randint(1, 60, (R,), generator=g, dtype=I32)
    drafts = torch.randint(0, 1000, (B, k), generator=g, dtype=I32)
    nd = torch.randint(0, k + 1, (B,), generator=g, dtype=I32)
    bt = torch.randint(-1, 300, (R, 16), generator=g, dtype=I32)
    req = torch.randperm(R, generator=g)[:B].to(I32)
    req[::7] = -1
    want = verify_inputs("reference", tok, nt, drafts, nd, bt, req, block_size=4, max_model_len=62)
    for impl in ("cpu", "triton"):
        got = verify_inputs(
            impl, tok, nt, drafts, nd, bt, req, block_size=4, max_model_len=62, device=kernel_device
        )
        _assert_same(got, want, impl)


@st.composite
def _verify_batches(draw):
    R = draw(st.integers(1, 5))
    L_max = draw(st.integers(1, 12))
    k = draw(st.integers(0, 4))
    B = draw(st.integers(0, 6))
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    max_blocks = draw(st.integers(1, 5))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    tok = torch.randint(0, 50, (R, L_max), generator=g, dtype=I32)
    nt = torch.randint(1, L_max + 1, (R,), generator=g, dtype=I32)
    drafts = torch.randint(0, 50, (B, k), generator=g, dtype=I32)
    nd = torch.randint(0, k + 1, (B,), generator=g, dtype=I32)
    bt = torch.randint(-1, 20, (R, max_blocks), generator=g, dtype=I32)
    req = None
    if draw(st.booleans()) or B > R:
        req = draw(st.lists(st.integers(-1, R - 1), min_size=B, max_size=B))
        req = _i32(req).reshape(B)
    mml = draw(st.integers(1, L_max + k + 2))
    return tok, nt, drafts, nd, bt, req, block_size, mml


@settings(max_examples=100)
@given(_verify_batches())
def test_verify_inputs_cpu_and_triton_match_reference(case):
    *args, bs, mml = case
    want = verify_inputs("reference", *args, block_size=bs, max_model_len=mml)
    for impl in ("cpu", "triton", "public"):
        got = verify_inputs(impl, *args, block_size=bs, max_model_len=mml)
        _assert_same(got, want, impl)
    # Its slot mapping is compute_slot_mapping's on its own positions and query layout.
    tok, nt, drafts, nd, bt, req = args
    again = slot_mapping("cpu", bt, want[1], want[2], req, block_size=bs, max_model_len=mml)
    assert torch.equal(again, want[4])


# ---------------------------------------------------------------- errors


def _slot_call(**overrides):
    kw = dict(
        block_table=_i32([[3, 4], [6, 7]]),
        positions=torch.tensor([6, 3, 0]),
        query_start_loc=_i32([0, 1, 2]),
        req_indices=_i32([1, 0]),
        block_size=4,
    )
    kw.update(overrides)
    return compute_slot_mapping(**kw)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(block_table=_i32([3, 4])), "block_table must be 2-D"),
        (dict(block_table=torch.zeros((2, 2), dtype=I64)), "block_table must have dtype int32"),
        (dict(positions=torch.zeros(3)), "positions must have dtype int64 or int32"),
        (dict(query_start_loc=torch.tensor([0, 1, 2])), "query_start_loc must have dtype int32"),
        (dict(query_start_loc=_i32([])), r"query_start_loc must have shape \(B\+1,\)"),
        (dict(req_indices=_i32([0])), r"req_indices must have shape \(2,\)"),
        (dict(req_indices=None, query_start_loc=_i32([0, 1, 2, 3])), "must be <= the number"),
        (dict(block_size=0), "block_size must be >= 1"),
        (dict(block_size=4.0), "block_size must be a Python int"),
        (dict(max_model_len=0), "max_model_len must be >= 1"),
        (dict(block_size=None), "block_size is required with a block_table"),
        (dict(block_table=None), "max_model_len is required without a block_table"),
        (dict(block_table=None, max_model_len=2**40), r"max_model_len must be <= 2\*\*32"),
        (dict(block_size=2**63), "block_size must fit in int64"),
        (dict(query_start_loc=_i32([0, 2, 1])), "query_start_loc must be non-decreasing"),
        (dict(query_start_loc=_i32([0, 1, 4])), r"query_start_loc must lie in \[0, 3\]"),
        (dict(req_indices=_i32([2, 0])), r"req_indices must lie in \[-1, 2\)"),
    ],
)
def test_compute_slot_mapping_bad_input_raises_value_error(overrides, match):
    with pytest.raises(ValueError, match=match):
        _slot_call(**overrides)


def _verify_call(**overrides):
    tok, nt, drafts, nd, bt, req = _verify_example()
    kw = dict(
        token_ids=tok,
        num_tokens=nt,
        draft_token_ids=drafts,
        num_draft_tokens=nd,
        block_table=bt,
        req_indices=req,
        block_size=4,
        max_model_len=16,
    )
    kw.update(overrides)
    return prepare_verify_inputs(**kw)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(token_ids=torch.zeros((3, 20), dtype=I64)), "token_ids must have dtype int32"),
        (dict(num_tokens=_i32([1, 2])), r"num_tokens must have shape \(3,\)"),
        (dict(draft_token_ids=_i32([1, 2, 3])), "draft_token_ids must be 2-D"),
        (dict(num_draft_tokens=_i32([1, 2])), r"num_draft_tokens must have shape \(3,\)"),
        (dict(block_table=_i32([[0, 1]])), "block_table must have 3 rows"),
        (dict(req_indices=_i32([0, 1])), r"req_indices must have shape \(3,\)"),
        (dict(block_size=0), "block_size must be >= 1"),
        (dict(max_model_len=None), "max_model_len must be a Python int"),
        (dict(max_model_len=2**63), "max_model_len must fit in int64"),
        (dict(block_size=None), "block_size is required with a block_table"),
        (dict(req_indices=_i32([0, 3, 1])), r"req_indices must lie in \[-1, 3\)"),
        (dict(num_draft_tokens=_i32([4, 0, 0])), r"num_draft_tokens must lie in \[0, 3\]"),
        (dict(num_draft_tokens=_i32([-1, 0, 0])), r"num_draft_tokens must lie in \[0, 3\]"),
        (dict(num_tokens=_i32([0, 9, 3])), r"num_tokens must lie in \[1, 20\]"),
        (dict(num_tokens=_i32([5, 9, 21])), r"num_tokens must lie in \[1, 20\]"),
    ],
)
def test_prepare_verify_inputs_bad_input_raises_value_error(overrides, match):
    with pytest.raises(ValueError, match=match):
        _verify_call(**overrides)


def test_prepare_verify_inputs_ignores_padding_rows_in_value_checks():
    # The padding row's draft count (5 > k) and a never-scheduled row's length are not read.
    out = _verify_call(num_draft_tokens=_i32([3, 5, 2]), num_tokens=_i32([5, 0, 3]))
    assert out.cu_num_draft_tokens.tolist() == [0, 3, 3, 5]


def test_value_checks_can_be_turned_off_and_counts_are_clamped():
    # validate=False skips the value checks (what a GPU caller gets by default); a draft
    # count past k is then clamped to k, so the packed layout stays inside its buffers.
    out = _verify_call(num_draft_tokens=_i32([7, 0, 2]), validate=False)
    assert out.cu_num_draft_tokens.tolist() == [0, 3, 3, 5]
    tok, nt, drafts, _, bt, req = _verify_example()
    got = verify_inputs(
        "triton", tok, nt, drafts, _i32([7, 0, 2]), bt, req, block_size=4, max_model_len=16
    )
    _assert_same(got, tuple(out), "triton")


def test_prepare_verify_inputs_rejects_lengths_whose_seq_lens_overflow_int32():
    # A stride-0 history of 2**31 - 1 columns costs no memory; L + k would wrap in int32.
    width = 2**31 - 1
    token_ids = torch.zeros(1, 1, dtype=torch.int32).expand(1, width)
    with pytest.raises(ValueError, match=r"token_ids.shape\[1\] \+ k must be <= 2147483647"):
        prepare_verify_inputs(
            token_ids,
            torch.tensor([width], dtype=torch.int32),
            torch.zeros(1, 3, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32),
            torch.zeros(1, 1, dtype=torch.int32),
            block_size=16,
            max_model_len=width,
        )


# ---------------------------------------------------------------- vLLM's inclusive cu


def test_exclusive_cu_num_draft_tokens_converts_vllms_inclusive_array():
    from specdec_kernels.ops import exclusive_cu_num_draft_tokens

    inclusive = torch.tensor([2, 2, 5], dtype=I64)  # vLLM: k_b = 2, 0, 3
    got = exclusive_cu_num_draft_tokens(inclusive)
    assert got.dtype == I32 and got.tolist() == [0, 2, 2, 5]
    assert exclusive_cu_num_draft_tokens(_i32([])).tolist() == [0]
    with pytest.raises(ValueError, match="cu_inclusive must be 1-D"):
        exclusive_cu_num_draft_tokens(_i32([[1]]))
