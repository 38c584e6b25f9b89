"""ngram_propose: named cases, CPU path == reference == Triton kernel, registration, errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specdec_kernels.cpu import ngram as cpu_ngram
from specdec_kernels.kernels import ngram as triton_ngram
from specdec_kernels.ops import ngram_propose
from specdec_kernels.reference import ngram as ref_ngram

IMPLS = {
    "reference": ref_ngram.ngram_propose,
    "cpu": cpu_ngram.ngram_propose,
    "triton": triton_ngram.ngram_propose,
}


def _history(rows: list[list[int]], width: int | None = None):
    width = width or max(1, max((len(r) for r in rows), default=1))
    token_ids = torch.full((len(rows), width), 99999, dtype=torch.int32)  # poison past L
    for i, r in enumerate(rows):
        token_ids[i, : len(r)] = torch.tensor(r, dtype=torch.int32)
    num_tokens = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    return token_ids, num_tokens


def _run(
    impl,
    token_ids,
    num_tokens,
    req_indices=None,
    max_draft_tokens=None,
    *,
    device=None,
    min_n,
    max_n,
    k,
    max_model_len=None,
    tie_break="first",
):
    if impl == "public":
        return tuple(
            ngram_propose(
                token_ids,
                num_tokens,
                req_indices,
                min_n=min_n,
                max_n=max_n,
                num_speculative_tokens=k,
                max_model_len=max_model_len,
                max_draft_tokens=max_draft_tokens,
                tie_break=tie_break,
            )
        )
    fn = IMPLS[impl]
    if impl == "triton" and device is None and torch.cuda.is_available():
        device = torch.device("cuda")  # the launchers run on CPU tensors only when interpreted
    if impl == "triton" and device is not None:
        to = lambda t: None if t is None else t.to(device)  # noqa: E731
        out = fn(
            to(token_ids),
            to(num_tokens),
            to(req_indices),
            to(max_draft_tokens),
            min_n=min_n,
            max_n=max_n,
            num_speculative_tokens=k,
            max_model_len=max_model_len,
            tie_break=tie_break,
        )
        return tuple(o.cpu() for o in out)
    return fn(
        token_ids,
        num_tokens,
        req_indices,
        max_draft_tokens,
        min_n=min_n,
        max_n=max_n,
        num_speculative_tokens=k,
        max_model_len=max_model_len,
        tie_break=tie_break,
    )


def _drafts(out, b=0):
    drafts, counts = out[:2]
    n = int(counts[b])
    assert (drafts[b, n:] == -1).all(), "slots past num_draft_tokens must hold -1"
    return drafts[b, :n].tolist()


ALL = ["reference", "cpu", "triton", "public"]


@pytest.mark.parametrize("impl", ALL)
def test_longer_ngram_wins_over_shorter(impl, kernel_device):
    t, n = _history([[9, 2, 3, 5, 1, 2, 3, 4, 1, 2, 3]])
    out = _run(impl, t, n, device=kernel_device, min_n=2, max_n=3, k=2)
    assert _drafts(out) == [4, 1]
    assert out[2].tolist() == [3]  # match_len: the 3-gram "1 2 3" won


@pytest.mark.parametrize("impl", ALL)
def test_match_len_is_the_winning_n_and_zero_without_drafts(impl, kernel_device):
    # rows: a 2-gram match; no match; a match whose drafts a cap removes; a padding row
    t, n = _history([[5, 6, 7, 5, 6], [1, 2, 3], [8, 9, 8, 9, 8, 9]])
    req = torch.tensor([0, 1, 2, -1], dtype=torch.int32)
    cap = torch.tensor([3, 3, 0, 3], dtype=torch.int32)
    out = _run(impl, t, n, req, cap, device=kernel_device, min_n=1, max_n=4, k=3)
    assert out[1].tolist() == [3, 0, 0, 0]
    assert out[2].dtype == torch.int32 and out[2].tolist() == [2, 0, 0, 0]


@pytest.mark.parametrize("impl", ALL)
def test_req_indices_select_rows_and_stale_row_is_not_read(impl, kernel_device):
    t, n = _history([[1, 2, 3, 1, 2], [4, 4, 4, 4], [7, 8, 9, 7, 8]])
    req = torch.tensor([0, 2], dtype=torch.int32)
    out = _run(impl, t, n, req, device=kernel_device, min_n=2, max_n=2, k=2)
    assert out[0].shape == (2, 2)
    assert _drafts(out, 0) == [3, 1]
    assert _drafts(out, 1) == [9, 7]


def test_rows_outside_req_indices_are_never_read():
    # Row 1 has an impossible length: reading it would index far past the history.
    t, n = _history([[1, 2, 3, 1, 2], [4, 4, 4, 4], [7, 8, 9, 7, 8]])
    n[1] = 10**6
    req = torch.tensor([2, 0], dtype=torch.int32)
    for impl in ("reference", "cpu"):
        out = _run(impl, t, n, req, min_n=2, max_n=2, k=2)
        assert _drafts(out, 0) == [9, 7] and _drafts(out, 1) == [3, 1]


@pytest.mark.parametrize("impl", ALL)
@pytest.mark.parametrize(
    ("max_model_len", "expected"), [(10, [3, 4]), (9, [3]), (8, []), (None, [3, 4, 5, 6])]
)
def test_max_model_len_caps_drafts(impl, max_model_len, expected, kernel_device):
    t, n = _history([[1, 2, 3, 4, 5, 6, 1, 2]])
    out = _run(impl, t, n, device=kernel_device, min_n=2, max_n=2, k=4, max_model_len=max_model_len)
    assert _drafts(out) == expected


@pytest.mark.parametrize("impl", ALL)
def test_empty_batch_returns_static_shapes(impl, kernel_device):
    t = torch.zeros((0, 8), dtype=torch.int32)
    n = torch.zeros((0,), dtype=torch.int32)
    drafts, counts, _ = _run(impl, t, n, device=kernel_device, min_n=2, max_n=5, k=3)
    assert drafts.shape == (0, 3) and counts.shape == (0,)


@pytest.mark.parametrize("impl", ALL)
def test_range_of_n_with_k_not_power_of_two(impl, kernel_device):
    t, n = _history([[1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5]])
    out = _run(impl, t, n, device=kernel_device, min_n=2, max_n=5, k=3)
    assert _drafts(out) == [6, 7, 1]


@pytest.mark.parametrize("impl", ALL)
@pytest.mark.parametrize(("tie_break", "expected"), [("first", [100, 1]), ("last", [300, 1])])
def test_tie_break_first_and_last(impl, tie_break, expected, kernel_device):
    t, n = _history([[1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3]])
    out = _run(impl, t, n, device=kernel_device, min_n=3, max_n=3, k=2, tie_break=tie_break)
    assert _drafts(out) == expected


@pytest.mark.parametrize("impl", ALL)
@pytest.mark.parametrize(("tokens", "expected"), [([1, 1, 1], [1]), ([5, 6], [])])
def test_window_may_overlap_suffix_but_needs_a_following_token(
    impl, tokens, expected, kernel_device
):
    t, n = _history([tokens])
    out = _run(impl, t, n, device=kernel_device, min_n=2, max_n=2, k=3)
    assert _drafts(out) == expected


@pytest.mark.parametrize("impl", ALL)
def test_padding_rows_and_per_request_caps(impl, kernel_device):
    t, n = _history([[1, 2, 3, 4, 1, 2], [5, 6, 7, 5, 6], [1, 2, 1, 2, 1, 2]])
    req = torch.tensor([0, -1, 1, 2], dtype=torch.int32)
    cap = torch.tensor([3, 3, 0, 1], dtype=torch.int32)
    out = _run(impl, t, n, req, cap, device=kernel_device, min_n=1, max_n=2, k=3)
    assert [_drafts(out, b) for b in range(4)] == [[3, 4, 1], [], [], [1]]


@pytest.mark.parametrize("impl", ALL)
def test_full_row_and_short_history(impl, kernel_device):
    # L == L_max (no spare column) and L < min_n in one batch.
    t = torch.tensor([[4, 5, 4, 5, 4], [4, 0, 0, 0, 0]], dtype=torch.int32)
    n = torch.tensor([5, 1], dtype=torch.int32)
    out = _run(impl, t, n, device=kernel_device, min_n=2, max_n=3, k=4)
    assert _drafts(out, 0) == [5, 4] and _drafts(out, 1) == []


def test_non_contiguous_history_matches_contiguous(kernel_device):
    base, n = _history([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 1, 4, 1, 5]] * 3)
    wide = torch.zeros((6, base.shape[1] * 2), dtype=torch.int32)
    wide[::2, ::2] = base
    strided = wide[::2, ::2]
    assert not strided.is_contiguous()
    expected = _run("reference", base, n, min_n=1, max_n=3, k=3)
    for impl in ("cpu", "triton", "public"):
        out = _run(impl, strided, n, device=kernel_device, min_n=1, max_n=3, k=3)
        assert torch.equal(out[0], expected[0]) and torch.equal(out[1], expected[1]), impl


def test_kernel_spans_several_position_blocks(kernel_device):
    # 2500 tokens: the scan kernel uses several blocks and the winner is in a later one.
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 50, (2500,), generator=g, dtype=torch.int32)
    seq[1800:1806] = torch.tensor([7, 7, 7, 7, 7, 8], dtype=torch.int32)
    seq[-5:] = 7
    t, n = seq[None].clone(), torch.tensor([2500], dtype=torch.int32)
    for tie in ("first", "last"):
        ref = _run("reference", t, n, min_n=3, max_n=5, k=4, tie_break=tie)
        for impl in ("cpu", "triton"):
            out = _run(impl, t, n, device=kernel_device, min_n=3, max_n=5, k=4, tie_break=tie)
            assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1]), (impl, tie)


@st.composite
def _batches(draw):
    vocab = draw(st.integers(1, 5))
    num_rows = draw(st.integers(1, 5))
    width = draw(st.integers(1, 40))
    rows = [
        draw(st.lists(st.integers(0, vocab - 1), min_size=0, max_size=width))
        for _ in range(num_rows)
    ]
    min_n = draw(st.integers(1, 4))
    max_n = draw(st.integers(min_n, 6))
    k = draw(st.integers(1, 7))
    req = None
    if draw(st.booleans()):
        req = draw(st.lists(st.integers(-1, num_rows - 1), min_size=0, max_size=6))
    cap = None
    batch = num_rows if req is None else len(req)
    if draw(st.booleans()):
        cap = draw(st.lists(st.integers(0, 8), min_size=batch, max_size=batch))
    mml = draw(st.one_of(st.none(), st.integers(1, width + 8)))
    tie = draw(st.sampled_from(["first", "last"]))
    return rows, width, min_n, max_n, k, req, cap, mml, tie


@given(_batches())
def test_cpu_and_triton_match_reference_on_random_batches(case):
    rows, width, min_n, max_n, k, req, cap, mml, tie = case
    t, n = _history(rows, width)
    req_t = None if req is None else torch.tensor(req, dtype=torch.int32)
    cap_t = None if cap is None else torch.tensor(cap, dtype=torch.int32)
    kw = dict(min_n=min_n, max_n=max_n, k=k, max_model_len=mml, tie_break=tie)
    ref = _run("reference", t, n, req_t, cap_t, **kw)
    for impl in ("cpu", "triton"):
        out = _run(impl, t, n, req_t, cap_t, **kw)
        assert torch.equal(out[0], ref[0]), (impl, out[0], ref[0])
        assert torch.equal(out[1], ref[1]), (impl, out[1], ref[1])
        assert torch.equal(out[2], ref[2]), (impl, out[2], ref[2])


# ---------------------------------------------------------------- registration


def _sample_args():
    t, n = _history([[1, 2, 3, 1, 2, 3, 1], [4, 5, 4, 5]], width=10)
    return t, n, torch.tensor([1, 0], dtype=torch.int32), torch.tensor([2, 3], dtype=torch.int32)


@pytest.mark.parametrize("poison", [-77, 12345])
@pytest.mark.parametrize("tie_break", ["first", "last"])
def test_kernel_writes_every_output_slot(poison, tie_break, monkeypatch, kernel_device):
    # Rows with a match, without one, a padding row and a capped row: every draft slot,
    # every count and every scratch key the finalize kernel reads must have been written.
    t, n = _history([[1, 2, 3, 1, 2, 3, 1], [4, 5, 6], [7, 7, 7, 7, 7]], width=12)
    req = torch.tensor([0, 1, -1, 2], dtype=torch.int32)
    cap = torch.tensor([4, 4, 4, 1], dtype=torch.int32)
    kw = dict(min_n=1, max_n=3, k=4, max_model_len=11, tie_break=tie_break)
    want = _run("reference", t, n, req, cap, **kw)

    def alloc(shape, dtype, device):
        return torch.full(shape, poison, dtype=dtype, device=device)

    monkeypatch.setattr(triton_ngram, "_empty", alloc)
    got = _run("triton", t, n, req, cap, device=kernel_device, **kw)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_opcheck():
    t, n, req, cap = _sample_args()
    for args, kwargs in [
        ((t, n, req, cap), dict(min_n=1, max_n=3, num_speculative_tokens=3, max_model_len=12)),
        ((t, n, None, None), dict(min_n=2, max_n=2, num_speculative_tokens=4, max_model_len=None)),
    ]:
        kwargs["tie_break"] = "first" if kwargs["max_model_len"] else "last"
        torch.library.opcheck(torch.ops.specdec.ngram_propose.default, args, kwargs)


def test_torch_compile_fullgraph():
    t, n, req, cap = _sample_args()

    def step(t, n, req, cap):
        out = ngram_propose(
            t,
            n,
            req,
            min_n=1,
            max_n=3,
            num_speculative_tokens=3,
            max_draft_tokens=cap,
            max_model_len=12,
        )
        return out.draft_token_ids, out.num_draft_tokens

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got, want = compiled(t, n, req, cap), step(t, n, req, cap)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ---------------------------------------------------------------- errors


def _call(**overrides):
    t, n, req, cap = _sample_args()
    kw = dict(
        token_ids=t,
        num_tokens=n,
        req_indices=req,
        min_n=1,
        max_n=3,
        num_speculative_tokens=3,
        max_draft_tokens=cap,
    )
    kw.update(overrides)
    return ngram_propose(**kw)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(token_ids=torch.zeros(2, 10, dtype=torch.int64)), "token_ids must have dtype int32"),
        (dict(token_ids=torch.zeros(20, dtype=torch.int32)), "token_ids must be 2-D"),
        (dict(num_tokens=torch.zeros(3, dtype=torch.int32)), r"num_tokens must have shape \(2,\)"),
        (dict(num_tokens=torch.zeros(2, dtype=torch.int64)), "num_tokens must have dtype int32"),
        (dict(req_indices=torch.zeros(2, 1, dtype=torch.int32)), "req_indices must be 1-D"),
        (
            dict(max_draft_tokens=torch.zeros(3, dtype=torch.int32)),
            "max_draft_tokens must have shape",
        ),
        (dict(min_n=0), "min_n must be >= 1"),
        (dict(min_n=3, max_n=2), "min_n must be <= max_n"),
        (dict(num_speculative_tokens=-1), "num_speculative_tokens must be >= 0"),
        (dict(num_speculative_tokens=2.0), "num_speculative_tokens must be a Python int"),
        (dict(tie_break="middle"), "tie_break must be one of"),
        (dict(max_model_len=0), "max_model_len must be >= 1"),
        (dict(max_model_len=2**63), r"max_model_len must fit in int64"),
        (dict(max_n=2**64), r"max_n must fit in int64"),
        (
            dict(req_indices=torch.tensor([0, 2], dtype=torch.int32)),
            r"req_indices must lie in \[-1, 2\)",
        ),
        (dict(req_indices=torch.tensor([0, -2], dtype=torch.int32)), r"req_indices must lie in"),
        (
            dict(num_tokens=torch.tensor([11, 1], dtype=torch.int32)),
            r"num_tokens must lie in \[0, 10\]",
        ),
        (
            dict(max_draft_tokens=torch.tensor([-1, 1], dtype=torch.int32)),
            "max_draft_tokens must be >= 0",
        ),
    ],
)
def test_bad_input_raises_value_error(overrides, match):
    with pytest.raises(ValueError, match=match):
        _call(**overrides)


def test_value_checks_can_be_turned_off():
    # validate=False skips the value checks (what a GPU caller gets by default).
    out = _call(req_indices=torch.tensor([0, -1], dtype=torch.int32), validate=False)
    assert out.num_draft_tokens[1] == 0


def test_meta_device_mismatch_is_reported():
    t, n, req, cap = _sample_args()
    with pytest.raises(ValueError, match="num_tokens must be on"):
        ngram_propose(t, n.to("meta"), min_n=1, max_n=2, num_speculative_tokens=2)


@pytest.mark.parametrize("impl", ALL)
def test_k_zero_is_plain_decoding(impl, kernel_device):
    t, n = _history([[1, 2, 1, 2, 1]])
    drafts, counts, match_len = _run(impl, t, n, device=kernel_device, min_n=1, max_n=2, k=0)
    assert drafts.shape == (1, 0) and counts.tolist() == [0] and match_len.tolist() == [0]


@pytest.mark.parametrize("impl", ALL)
def test_all_padding_batch_without_state_rows(impl, kernel_device):
    # R = 0: nothing may be read, not even num_tokens.
    t, n = torch.zeros((0, 8), dtype=torch.int32), torch.zeros((0,), dtype=torch.int32)
    req = torch.tensor([-1, -1], dtype=torch.int32)
    drafts, counts, match_len = _run(impl, t, n, req, device=kernel_device, min_n=1, max_n=2, k=2)
    assert drafts.tolist() == [[-1, -1], [-1, -1]] and counts.tolist() == [0, 0]
    assert match_len.tolist() == [0, 0]


def test_value_checks_ignore_state_rows_outside_the_batch():
    t, n = _history([[1, 2, 1, 2, 1], [0], [3, 4, 3, 4]], width=8)
    n[1] = -1  # a stale row nobody schedules
    out = ngram_propose(
        t, n, torch.tensor([0, 2], dtype=torch.int32), min_n=1, max_n=2, num_speculative_tokens=2
    )
    assert out.draft_token_ids.tolist() == [[2, 1], [3, 4]]


@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_max_n_far_above_the_history_length(impl, kernel_device):
    t, n = _history([[5, 6, 7, 5, 6, 7, 5]])
    ref = _run("reference", t, n, min_n=2, max_n=500, k=3)
    out = _run(impl, t, n, device=kernel_device, min_n=2, max_n=500, k=3)
    assert torch.equal(out[0], ref[0]) and _drafts(out) == [6, 7, 5]
