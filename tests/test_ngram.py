"""ngram_propose: named cases (one table, by scan and by index), CPU path == reference ==
Triton on random batches and schedules, errors.

The own-history index must give exactly the scan's drafts, so every named case runs both
ways; the corpus's semantics are tests/test_corpus.py's, the registration tiers
tests/test_conformance.py's.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels.cpu import ngram as _cpu_ngram
from specdec_kernels.ops import (
    new_corpus,
    new_ngram_index,
    ngram_index_build,
    ngram_propose,
)
from specdec_kernels.ops.ngram import _check_values
from tests.ngram_helpers import State, drafts_of, history, replay, schedules

ALL = ["reference", "cpu", "triton", "public"]
SOURCES = ["scan", "index"]


def _run(impl, tok, nt, req=None, cap=None, *, source="scan", device=None, min_n, max_n, k,
         mml=None, tie="first"):  # fmt: skip
    """One proposal by ``impl``, from a scan or from an index built over the batch's rows."""
    rows = None if req is None else torch.unique(req[req >= 0]).to(torch.int32)
    if impl == "public":
        index = None
        if source == "index":
            index = new_ngram_index(tok.shape[0], max(tok.shape[1], 1), min_n=min_n, max_n=max_n)
            ngram_index_build(tok, nt, rows, index=index)
        out = ngram_propose(
            tok, nt, req, min_n=min_n, max_n=max_n, num_speculative_tokens=k, max_model_len=mml,
            max_draft_tokens=cap, tie_break=tie, index=index,
        )  # fmt: skip
        return tuple(out)
    s = State(impl, tok.shape[0], max(tok.shape[1], 1), min_n=min_n, max_n=max_n, device=device)
    if source == "index":
        s.build(tok, nt, rows)
    return s.propose(
        tok, nt, req, cap, k=k, corpus=False, index=source == "index", mml=mml, tie=tie
    )


def _i32(x):
    return None if x is None else torch.tensor(x, dtype=torch.int32)


# name, rows, req_indices, caps, n range and k (+ max_model_len, tie), drafts, match_len
NAMED = [
    ("longer-n-wins", [[9, 2, 3, 5, 1, 2, 3, 4, 1, 2, 3]], None, None,
     dict(min_n=2, max_n=3, k=2), [[4, 1]], [3]),
    ("match-len-zero-without-drafts", [[5, 6, 7, 5, 6], [1, 2, 3], [8, 9, 8, 9, 8, 9]],
     [0, 1, 2, -1], [3, 3, 0, 3], dict(min_n=1, max_n=4, k=3), [[7, 5, 6], [], [], []],
     [2, 0, 0, 0]),
    ("req-indices-select-rows", [[1, 2, 3, 1, 2], [4, 4, 4, 4], [7, 8, 9, 7, 8]], [0, 2],
     None, dict(min_n=2, max_n=2, k=2), [[3, 1], [9, 7]], [2, 2]),
    ("max-model-len-10", [[1, 2, 3, 4, 5, 6, 1, 2]], None, None,
     dict(min_n=2, max_n=2, k=4, mml=10), [[3, 4]], [2]),
    ("max-model-len-9", [[1, 2, 3, 4, 5, 6, 1, 2]], None, None,
     dict(min_n=2, max_n=2, k=4, mml=9), [[3]], [2]),
    ("max-model-len-8", [[1, 2, 3, 4, 5, 6, 1, 2]], None, None,
     dict(min_n=2, max_n=2, k=4, mml=8), [[]], [0]),
    ("no-max-model-len", [[1, 2, 3, 4, 5, 6, 1, 2]], None, None,
     dict(min_n=2, max_n=2, k=4), [[3, 4, 5, 6]], [2]),
    ("n-range-k-not-a-power-of-two", [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5]], None, None,
     dict(min_n=2, max_n=5, k=3), [[6, 7, 1]], [5]),
    ("tie-first", [[1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3]], None, None,
     dict(min_n=3, max_n=3, k=2, tie="first"), [[100, 1]], [3]),
    ("tie-last", [[1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3]], None, None,
     dict(min_n=3, max_n=3, k=2, tie="last"), [[300, 1]], [3]),
    ("window-overlaps-the-suffix", [[1, 1, 1]], None, None, dict(min_n=2, max_n=2, k=3),
     [[1]], [2]),
    ("window-needs-a-following-token", [[5, 6]], None, None, dict(min_n=2, max_n=2, k=3),
     [[]], [0]),
    ("padding-rows-and-caps", [[1, 2, 3, 4, 1, 2], [5, 6, 7, 5, 6], [1, 2, 1, 2, 1, 2]],
     [0, -1, 1, 2], [3, 3, 0, 1], dict(min_n=1, max_n=2, k=3), [[3, 4, 1], [], [], [1]],
     [2, 0, 0, 2]),
    ("full-row-and-short-history", [[4, 5, 4, 5, 4], [4]], None, None,
     dict(min_n=2, max_n=3, k=4), [[5, 4], []], [3, 0]),
    ("k-zero-is-plain-decoding", [[1, 2, 1, 2, 1]], None, None, dict(min_n=1, max_n=2, k=0),
     [[]], [0]),
    ("empty-history", [[], [3, 3]], None, None, dict(min_n=1, max_n=2, k=2), [[], [3]],
     [0, 1]),
]  # fmt: skip


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("impl", ALL)
@pytest.mark.parametrize(
    ("rows", "req", "cap", "kw", "drafts", "match_len"),
    [c[1:] for c in NAMED],
    ids=[c[0] for c in NAMED],
)
def test_named_cases(impl, source, rows, req, cap, kw, drafts, match_len, kernel_device):
    tok, nt = history(rows)
    out = _run(impl, tok, nt, _i32(req), _i32(cap), source=source, device=kernel_device, **kw)
    assert [drafts_of(out, b) for b in range(len(drafts))] == drafts
    assert out[2].dtype == torch.int32 and out[2].tolist() == match_len
    assert out[3].tolist() == [1 if d else 0 for d in drafts]  # draft_source: own history


def test_rows_outside_req_indices_are_never_read():
    # Row 1 has an impossible length: reading it would index far past the history.
    tok, nt = history([[1, 2, 3, 1, 2], [4, 4, 4, 4], [7, 8, 9, 7, 8]])
    nt[1] = 10**6
    for impl in ("reference", "cpu"):
        for source in SOURCES:
            out = _run(impl, tok, nt, _i32([2, 0]), source=source, min_n=2, max_n=2, k=2)
            assert drafts_of(out, 0) == [9, 7] and drafts_of(out, 1) == [3, 1]


@pytest.mark.parametrize("impl", ALL)
def test_empty_batch_and_all_padding_batch_without_state_rows(impl, kernel_device):
    tok, nt = torch.zeros((0, 8), dtype=torch.int32), torch.zeros((0,), dtype=torch.int32)
    drafts, counts, match_len, source = _run(impl, tok, nt, device=kernel_device, min_n=2,
                                             max_n=5, k=3)  # fmt: skip
    assert drafts.shape == (0, 3) and counts.shape == match_len.shape == source.shape == (0,)
    # R = 0 with padding rows: nothing may be read, not even num_tokens
    out = _run(impl, tok, nt, _i32([-1, -1]), device=kernel_device, min_n=1, max_n=2, k=2)
    assert out[0].tolist() == [[-1, -1], [-1, -1]]
    assert out[1].tolist() == out[2].tolist() == out[3].tolist() == [0, 0]


@pytest.mark.parametrize("source", SOURCES)
def test_non_contiguous_history_matches_contiguous(source, kernel_device):
    base, nt = history([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 1, 4, 1, 5]] * 3)
    wide = torch.zeros((6, base.shape[1] * 2), dtype=torch.int32)
    wide[::2, ::2] = base
    strided = wide[::2, ::2]
    assert not strided.is_contiguous()
    want = _run("reference", base, nt, min_n=1, max_n=3, k=3)
    for impl in ("cpu", "triton", "public"):
        out = _run(impl, strided, nt, source=source, device=kernel_device, min_n=1, max_n=3, k=3)
        assert all(torch.equal(a, b) for a, b in zip(out, want, strict=True)), impl


def test_kernel_spans_several_position_blocks(kernel_device):
    # 2500 tokens: the scan kernel uses several blocks and the winner is in a later one.
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 50, (2500,), generator=g, dtype=torch.int32)
    seq[1800:1806] = torch.tensor([7, 7, 7, 7, 7, 8], dtype=torch.int32)
    seq[-5:] = 7
    tok, nt = seq[None].clone(), torch.tensor([2500], dtype=torch.int32)
    for tie in ("first", "last"):
        want = _run("reference", tok, nt, min_n=3, max_n=5, k=4, tie=tie)
        for impl in ("cpu", "triton"):
            out = _run(impl, tok, nt, device=kernel_device, min_n=3, max_n=5, k=4, tie=tie)
            assert all(torch.equal(a, b) for a, b in zip(out, want, strict=True)), (impl, tie)


@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_max_n_far_above_the_history_length(impl, kernel_device):
    tok, nt = history([[5, 6, 7, 5, 6, 7, 5]])
    want = _run("reference", tok, nt, min_n=2, max_n=500, k=3)
    out = _run(impl, tok, nt, device=kernel_device, min_n=2, max_n=500, k=3)
    assert torch.equal(out[0], want[0]) and drafts_of(out) == [6, 7, 5]


# ----------------------------------------------------------------------------- random


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
    tok, nt = history(rows, width)
    kw = dict(min_n=min_n, max_n=max_n, k=k, mml=mml, tie=tie)
    want = _run("reference", tok, nt, _i32(req), _i32(cap), **kw)
    for impl in ("cpu", "triton"):
        out = _run(impl, tok, nt, _i32(req), _i32(cap), **kw)
        assert all(torch.equal(a, b) for a, b in zip(out, want, strict=True)), (impl, out, want)


@settings(max_examples=25)
@given(_batches())
def test_index_proposals_equal_the_scan_on_random_batches(case):
    rows, width, min_n, max_n, k, req, cap, mml, tie = case
    tok, nt = history(rows, width)
    kw = dict(min_n=min_n, max_n=max_n, k=k, mml=mml, tie=tie)
    want = _run("cpu", tok, nt, _i32(req), _i32(cap), **kw)
    for impl in ("cpu", "triton"):
        out = _run(impl, tok, nt, _i32(req), _i32(cap), source="index", **kw)
        assert all(torch.equal(a, b) for a, b in zip(out, want, strict=True)), (impl, out, want)


@given(schedules())
def test_index_equals_the_scan_under_any_schedule(case):
    got, want = replay("cpu", case, None, with_corpus=False)
    for g, w in zip(got, want, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(g, w, strict=True)), (g, w)


@settings(max_examples=12)
@given(schedules(max_steps=4))
def test_triton_index_equals_the_scan_under_any_schedule(case):
    got, want = replay("triton", case, None, with_corpus=False)
    for g, w in zip(got, want, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(g, w, strict=True)), (g, w)


# ----------------------------------------------------------------------------- errors


def _call(**overrides):
    tok, nt = history([[1, 2, 3, 1, 2, 3, 1], [4, 5, 4, 5]], width=10)
    index = new_ngram_index(2, 10, min_n=1, max_n=3)
    ngram_index_build(tok, nt, index=index)
    kw = dict(
        token_ids=tok, num_tokens=nt, req_indices=_i32([1, 0]), min_n=1, max_n=3,
        num_speculative_tokens=3, max_draft_tokens=_i32([2, 3]),
    )  # fmt: skip
    if overrides.pop("with_index", False):
        kw["index"] = index
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
        (dict(max_draft_tokens=_i32([0, 0, 0])), "max_draft_tokens must have shape"),
        (dict(min_n=0), "min_n must be >= 1"),
        (dict(min_n=3, max_n=2), "min_n must be <= max_n"),
        (dict(num_speculative_tokens=-1), "num_speculative_tokens must be >= 0"),
        (dict(num_speculative_tokens=2.0), "num_speculative_tokens must be a Python int"),
        (dict(tie_break="middle"), "tie_break must be one of"),
        (dict(max_model_len=0), "max_model_len must be >= 1"),
        (dict(max_model_len=2**63), r"max_model_len must fit in int64"),
        (dict(max_n=2**64), r"max_n must fit in int64"),
        (dict(req_indices=_i32([0, 2])), r"req_indices must lie in \[-1, 2\)"),
        (dict(req_indices=_i32([0, -2])), r"req_indices must lie in"),
        (dict(num_tokens=_i32([11, 1])), r"num_tokens must lie in \[0, 10\]"),
        (dict(max_draft_tokens=_i32([-1, 1])), "max_draft_tokens must be >= 0"),
        (dict(index=(1, 2)), "index must be an NgramIndex"),
        (dict(with_index=True, min_n=2), r"index was made for n in \[1, 3\]"),
        (dict(with_index=True, num_tokens=_i32([7, 3])), "index.length must equal num_tokens"),
        (dict(corpus="corpus"), "corpus must be a Corpus"),
        (dict(corpus=new_corpus(4, min_n=2, max_n=3)), r"corpus was made for n in \[2, 3\]"),
    ],
)
def test_bad_input_raises_value_error(overrides, match):
    with pytest.raises(ValueError, match=match):
        _call(**overrides)


@pytest.mark.parametrize("path", ["kernel", "dispatcher"])
def test_bad_values_raise_on_both_check_paths(path):
    # the CPU call runs the value checks inside the kernel's pass; through the dispatcher
    # (here: under a torch-function mode) the wrapper's own checks run: the same errors
    cases = [
        (dict(req_indices=_i32([0, 2])), r"req_indices must lie in \[-1, 2\)"),
        (dict(num_tokens=_i32([11, 1])), r"num_tokens must lie in \[0, 10\]"),
        (dict(num_tokens=_i32([4, -1])), r"num_tokens must lie in \[0, 10\]"),
        (dict(max_draft_tokens=_i32([2, -1])), "max_draft_tokens must be >= 0"),
        (dict(with_index=True, num_tokens=_i32([7, 3])), "index.length must equal num_tokens"),
    ]
    for overrides, match in cases:
        with pytest.raises(ValueError, match=match):
            if path == "kernel":
                _call(**overrides)
            else:
                with _Passthrough():
                    _call(**overrides)


class _Passthrough(torch.overrides.TorchFunctionMode):
    """A torch-function mode that changes nothing: ops go through the dispatcher under it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_the_kernels_value_checks_agree_with_the_wrappers():
    # random batches, half of them with one bad value: the kernel refuses exactly the
    # inputs the wrapper's checks refuse, and computes the op's result for the others
    g = torch.Generator().manual_seed(0)
    rand = lambda lo, hi, *s: torch.randint(lo, hi, s, generator=g, dtype=torch.int32)  # noqa: E731
    refused = 0
    for trial in range(300):
        R, L_max, B = int(rand(1, 5)), int(rand(1, 9)), int(rand(0, 6))
        tok = rand(0, 3, R, L_max)
        nt = rand(0, L_max + 1, R)
        req = rand(-1, R, B) if trial % 3 else None
        B = R if req is None else B
        caps = rand(0, 4, B) if trial % 2 else None
        index = None
        if trial % 5 == 0:
            index = new_ngram_index(R, L_max, min_n=1, max_n=2)
            ngram_index_build(tok, nt, index=index)
        if trial % 2 and B:  # one bad value
            what = int(rand(0, 4))
            if what == 0 and req is not None:
                req[int(rand(0, B))] = int(rand(R, R + 3)) if trial % 4 == 1 else -2
            elif what == 1 or (what == 0 and req is None):
                nt[int(rand(0, R))] = L_max + 1 if trial % 4 == 1 else -1
            elif what == 2 and caps is not None:
                caps[int(rand(0, B))] = -1
            elif index is not None:
                index.length[int(rand(0, R))] += 1
        kw = dict(min_n=1, max_n=2, num_speculative_tokens=2, max_model_len=None,
                  tie_break="first")  # fmt: skip
        state = None if index is None else [index.table, index.length]
        got = _cpu_ngram.ngram_propose_checked(tok, nt, req, caps, state, None, **kw)
        try:
            _check_values(nt, req, caps, index, B, R, L_max)
        except ValueError:
            assert got is None, trial
            refused += 1
            continue
        assert got is not None, trial
        want = torch.ops.specdec.ngram_propose(tok, nt, req, caps, state, None, **kw)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), trial
    assert 50 < refused < 250, refused


def test_value_checks_can_be_turned_off():
    # validate=False skips the value checks (what a GPU caller gets by default).
    out = _call(req_indices=_i32([0, -1]), validate=False)
    assert out.num_draft_tokens[1] == 0


def test_meta_device_mismatch_is_reported():
    tok, nt = history([[1, 2, 1]])
    with pytest.raises(ValueError, match="num_tokens must be on"):
        ngram_propose(tok, nt.to("meta"), min_n=1, max_n=2, num_speculative_tokens=2)


def test_value_checks_ignore_state_rows_outside_the_batch():
    tok, nt = history([[1, 2, 1, 2, 1], [0], [3, 4, 3, 4]], width=8)
    nt[1] = -1  # a stale row nobody schedules
    out = ngram_propose(tok, nt, _i32([0, 2]), min_n=1, max_n=2, num_speculative_tokens=2)
    assert out.draft_token_ids.tolist() == [[2, 1], [3, 4]]
