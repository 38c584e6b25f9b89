"""ngram_index_build and ngram_index_extend (family ``ngram_index``): table contents
against the reference, exactness when full, tables shared across paths, constructors,
huge pages, errors.

``ngram_propose``'s proposals from an index are tests/test_ngram.py's (they equal the
scan's); the registration tiers are tests/test_conformance.py's.
"""

from __future__ import annotations

import sys

import pytest
import torch

from specdec_kernels.cpu import ngram_index as _cpu_index
from specdec_kernels.cpu._jit import zeroed_i32
from specdec_kernels.ops import (
    NgramIndex,
    corpus_append,
    new_corpus,
    new_ngram_index,
    ngram_index_build,
    ngram_index_extend,
)
from specdec_kernels.ops.ngram_index import _check_values
from tests.ngram_helpers import RAW, State, drafts_of, full_scan, history, replay


def test_unchecked_garbage_tables_neither_hang_nor_read_past_the_row():
    # validate=False with a table of garbage (no empty slot; starts past the history):
    # every probe is bounded and no entry outside the row matches, so the CPU path returns
    from specdec_kernels.ops import ngram_propose

    tok, nt = history([[1, 2, 3, 1, 2, 3, 1, 2]], width=8)
    for fill in (0, 5, 10**6):
        table = torch.full((1, 2, 8, 2), fill, dtype=torch.int32)
        index = NgramIndex(table, torch.zeros(1, dtype=torch.int32), 2, 3)
        ngram_index_extend(tok, nt, index=index, validate=False)  # inserts into a full table
        out = ngram_propose(
            tok, nt, min_n=2, max_n=3, num_speculative_tokens=2, index=index, validate=False
        )
        assert out.num_draft_tokens.shape == (1,)
        if fill == 10**6:  # no start can be in an 8-token row: nothing matches
            assert int(out.num_draft_tokens[0]) == 0


@pytest.mark.parametrize("impl", RAW)
@pytest.mark.parametrize("tie", ["first", "last"])
def test_own_history_matches_full_scan_on_named_rows(impl, tie, kernel_device):
    rows = [
        [9, 2, 3, 5, 1, 2, 3, 4, 1, 2, 3],  # longer n wins
        [1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3],  # tie-break
        [1, 1, 1],  # window overlaps the suffix
        [5, 6],  # no following token
        [4],  # L < min_n
        [],
    ]
    tok, nt = history(rows, width=20)
    s = State(impl, len(rows), 20, min_n=2, max_n=3, device=kernel_device)
    s.build(tok, nt)
    got = s.propose(tok, nt, k=3, corpus=False, tie=tie)
    want = full_scan(tok, nt, min_n=2, max_n=3, k=3, tie=tie)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(got[2], want[2])  # match_len
    assert got[3].tolist() == [1 if c > 0 else 0 for c in want[1].tolist()]


@pytest.mark.parametrize("impl", RAW)
def test_extend_adds_only_the_completed_ngrams(impl, kernel_device):
    tok, _ = history([[1, 2, 3, 1, 2, 4, 1, 2]])
    s = State(impl, 1, 8, min_n=1, max_n=2, device=kernel_device)
    s.build(tok, torch.tensor([3], dtype=torch.int32))  # "1 2 3": 1-grams 1, 2; 2-gram 1 2
    assert s.content() == [(0, 0, 0, 0), (0, 0, 1, 1), (0, 1, 0, 0)]
    s.extend(tok, torch.tensor([8], dtype=torch.int32))
    assert s.length.tolist() == [8]
    # 1 at 0, 3, 6; 2 at 1, 4 (7 has no following token); 3; 4; "1 2" at 0, 3; ...
    assert s.content() == [
        (0, 0, 0, 6), (0, 0, 1, 4), (0, 0, 2, 2), (0, 0, 5, 5),
        (0, 1, 0, 3), (0, 1, 1, 1), (0, 1, 2, 2), (0, 1, 4, 4), (0, 1, 5, 5),
    ]  # fmt: skip
    assert s.content() == ref_state(tok, 8, min_n=1, max_n=2)


def ref_state(tok, L, *, min_n, max_n):
    s = State("reference", tok.shape[0], tok.shape[1], min_n=min_n, max_n=max_n)
    s.build(tok, torch.full((tok.shape[0],), L, dtype=torch.int32))
    return s.content()


@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_table_contents_equal_the_reference_after_build_and_extends(impl, kernel_device):
    g = torch.Generator().manual_seed(3)
    tok = torch.randint(0, 3, (3, 30), generator=g, dtype=torch.int32)
    nt = torch.tensor([30, 17, 0], dtype=torch.int32)
    states = {
        n: State(n, 3, 30, min_n=1, max_n=4, device=kernel_device) for n in (impl, "reference")
    }
    for s in states.values():
        s.build(tok, nt // 3)
        s.extend(tok, nt // 2)
        s.extend(tok, nt)
    assert states[impl].content() == states["reference"].content()
    assert states[impl].length.cpu().tolist() == nt.tolist()


@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_a_full_table_stays_exact(impl, kernel_device):
    # S = L_max, all n-grams distinct: every slot but one is taken, probes wrap around.
    tok, nt = history([list(range(16)) + [0]], width=17)
    s = State(impl, 1, 17, min_n=1, max_n=1, slots=17, device=kernel_device)
    s.build(tok, nt)
    assert len(s.content()) == 16
    got = s.propose(tok, nt, k=4, corpus=False)
    assert drafts_of(got) == [1, 2, 3, 4]


@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_padding_rows_permuted_rows_and_caps(impl, kernel_device):
    tok, nt = history([[1, 2, 3, 4, 1, 2], [5, 6, 7, 5, 6], [1, 2, 1, 2, 1, 2]], width=9)
    s = State(impl, 3, 9, min_n=1, max_n=2, device=kernel_device)
    req = torch.tensor([2, -1, 0], dtype=torch.int32)
    s.build(tok, nt, req)
    assert s.length.cpu().tolist() == [6, 0, 6]  # row 1 was not in the batch
    req = torch.tensor([0, -1, 2, -1], dtype=torch.int32)
    cap = torch.tensor([3, 3, 1, 2], dtype=torch.int32)
    got = s.propose(tok, nt, req, cap, k=3, corpus=False, mml=8)
    want = full_scan(tok, nt, req, cap, min_n=1, max_n=2, k=3, mml=8)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert [drafts_of(got, b) for b in range(4)] == [[3, 4], [], [1], []]


@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_tables_built_by_one_path_are_read_by_the_other(impl, kernel_device):
    # Same hash functions everywhere: a CPU-built table serves the Triton lookup and back.
    g = torch.Generator().manual_seed(5)
    tok = torch.randint(0, 4, (2, 40), generator=g, dtype=torch.int32)
    nt = torch.tensor([40, 33], dtype=torch.int32)
    other = "triton" if impl == "cpu" else "cpu"
    a = State(impl, 2, 40, min_n=2, max_n=4, device=kernel_device)
    b = State(other, 2, 40, min_n=2, max_n=4, device=kernel_device)
    a.build(tok, nt)
    b.table, b.length = a.table.to(b.dev).clone(), a.length.to(b.dev).clone()
    for tie in ("first", "last"):
        want = full_scan(tok, nt, min_n=2, max_n=4, k=5, tie=tie)
        got = b.propose(tok, nt, k=5, corpus=False, tie=tie)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_triton_insert_is_order_independent_with_many_duplicates(kernel_device):
    # One n-gram repeated in every lane of a block: all lanes meet in one slot.
    tok, nt = history([[7] * 300 + [8]], width=301)
    for impl in ("triton", "cpu"):
        s = State(impl, 1, 301, min_n=1, max_n=3, device=kernel_device)
        s.build(tok, nt)
        # 7 -> starts 0..299, 7 7 -> 0..298, 7 7 7 -> 0..297; 8 and the n-grams ending in 8
        # have no following token
        assert s.content() == [(0, 0, 0, 299), (0, 1, 0, 298), (0, 2, 0, 297)], impl


@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_table_narrower_than_the_probe_window(impl):
    # max_model_len 1 gives a 2-slot table, narrower than the CPU path's 4-slot probe
    # window: the window must wrap more than once (found by hypothesis in CI's
    # derandomized run: an IndexError).
    case = (1, 1, 1, 1, 1, [("admit", [0], [[0]], 1, "first", None, None)])
    got, _ = replay(impl, case, None, with_corpus=True)
    want, _ = replay("reference", case, None, with_corpus=True)
    for g_, w in zip(got, want, strict=True):
        for x, y in zip(g_, w, strict=True):
            assert torch.equal(x, y), (g_, w)


# ----------------------------------------------------------------------------- errors


def _bad(fn, match, **kw):
    """``fn`` on a built index with ``kw`` changed raises ``match``; the index is unchanged."""
    tok, nt = history([[1, 2, 3, 1, 2, 3, 1], [4, 5, 4, 5]], width=10)
    index = new_ngram_index(2, 10, min_n=1, max_n=3)
    ngram_index_build(tok, nt, index=index)
    before = index.table.clone(), index.length.clone()
    base = {"token_ids": tok, "num_tokens": nt, "index": index}
    base.update(kw)
    with pytest.raises(ValueError, match=match):
        fn(**base)
    assert torch.equal(index.table, before[0]) and torch.equal(index.length, before[1])


_IX = new_ngram_index(2, 10, min_n=1, max_n=3)


@pytest.mark.parametrize(
    ("fn", "overrides", "match"),
    [
        (ngram_index_build, dict(token_ids=torch.zeros(2, 10)), "token_ids must have dtype int32"),
        (
            ngram_index_build,
            dict(num_tokens=torch.zeros(3, dtype=torch.int32)),
            r"num_tokens must have shape \(2,\)",
        ),
        (ngram_index_build, dict(index=(1, 2)), "index must be an NgramIndex"),
        (
            ngram_index_build,
            dict(index=NgramIndex(_IX.table[:1], _IX.length, 1, 3)),
            r"index.table must have shape \(2, 3, S, 2\)",
        ),
        (
            ngram_index_build,
            dict(index=NgramIndex(_IX.table[:, :, :9].contiguous(), _IX.length, 1, 3)),
            "S >= token_ids.shape",
        ),
        (
            ngram_index_build,
            dict(index=NgramIndex(_IX.table, _IX.length, 1, 2)),
            r"index.table must have shape \(2, 2",
        ),
        (
            ngram_index_build,
            dict(index=NgramIndex(_IX.table.transpose(0, 1), _IX.length, 1, 3)),
            "must be contiguous",
        ),
        (
            ngram_index_build,
            dict(req_indices=torch.tensor([0, 0], dtype=torch.int32)),
            "req_indices must be unique",
        ),
        (
            ngram_index_build,
            dict(req_indices=torch.tensor([0, 2], dtype=torch.int32)),
            r"req_indices must lie in \[-1, 2\)",
        ),
        (
            ngram_index_build,
            dict(num_tokens=torch.tensor([11, 1], dtype=torch.int32)),
            r"num_tokens must lie in \[0, 10\]",
        ),
        (
            ngram_index_extend,
            dict(num_tokens=torch.tensor([1, 1], dtype=torch.int32)),
            "num_tokens must be >= index.length",
        ),
    ],
)
def test_bad_input_raises_value_error_and_leaves_the_index_unchanged(fn, overrides, match):
    _bad(fn, match, **overrides)


@pytest.mark.parametrize("extend", [False, True])
def test_the_kernels_value_checks_agree_with_the_wrappers(extend):
    # random batches, half of them with one bad value: the CPU kernel refuses exactly what
    # the wrapper's checks refuse (leaving the index unchanged) and indexes the others as
    # the op does; its scratch of seen rows stays zero
    g = torch.Generator().manual_seed(1)
    rand = lambda lo, hi, *s: torch.randint(lo, hi, s, generator=g, dtype=torch.int32)  # noqa: E731
    refused = 0
    for trial in range(300):
        R, L_max = int(rand(1, 5)), int(rand(1, 9))
        tok = rand(0, 3, R, L_max)
        old = rand(0, L_max + 1, R)
        nt = torch.minimum(old + rand(0, 3, R), torch.tensor(L_max, dtype=torch.int32))
        req = torch.randperm(R, generator=g)[: int(rand(0, R + 1))].to(torch.int32)
        req = torch.cat([req, torch.full((int(rand(0, 2)),), -1, dtype=torch.int32)])
        req = None if trial % 3 == 0 else req
        if trial % 2:  # one bad value
            what = int(rand(0, 3))
            if what == 0 and req is not None and req.numel():
                req[int(rand(0, req.numel()))] = [-2, R, int(req.max())][trial % 3]
            elif what == 1 or not extend:
                nt[int(rand(0, R))] = -1 if trial % 4 == 1 else L_max + 1
            else:  # a history that shrank below the index
                r = int(rand(0, R))
                nt[r] = old[r] - 1
        index = new_ngram_index(R, L_max, min_n=1, max_n=2)
        ngram_index_build(tok, old, index=index)
        before = index.table.clone(), index.length.clone()
        B = R if req is None else req.shape[0]
        state = [index.table, index.length]
        fn = (
            _cpu_index.ngram_index_extend_checked
            if extend
            else _cpu_index.ngram_index_build_checked
        )
        ok = fn(tok, nt, req, state, min_n=1, max_n=2)
        try:
            _check_values(nt, req, index, B, R, L_max, extend)
        except ValueError:
            assert ok is None, trial
            assert torch.equal(index.table, before[0]) and torch.equal(index.length, before[1])
            refused += 1
            continue
        assert ok is True, trial
        want = NgramIndex(before[0].clone(), before[1].clone(), 1, 2)
        op = torch.ops.specdec.ngram_index_extend if extend else torch.ops.specdec.ngram_index_build
        op(tok, nt, req, [want.table, want.length], min_n=1, max_n=2)
        assert torch.equal(index.table, want.table) and torch.equal(index.length, want.length)
    assert 50 < refused < 250, refused
    assert not zeroed_i32(8).any()


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(num_rows=2, max_model_len=8, min_n=0, max_n=2), "min_n must be >= 1"),
        (dict(num_rows=2, max_model_len=8, min_n=3, max_n=2), "min_n must be <= max_n"),
        (dict(num_rows=2, max_model_len=8, min_n=1, max_n=2, slots=7), "slots must be >="),
    ],
)
def test_bad_constructor_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        new_ngram_index(**kw)
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        new_corpus(0, min_n=1, max_n=2)


def test_large_tables_are_the_same_tensors_on_huge_pages(monkeypatch):
    # The madvise is advice: values, shape and dtype are torch.full's, with the advice,
    # without it (small table) and when the call fails.
    from specdec_kernels.ops import _memory

    big = (9 * 2**20) // 8  # int64 elements: over the 16 MiB threshold
    for shape, dtype in [((3, 5), torch.int32), ((2, big), torch.int64)]:
        t = _memory.full(shape, -1, dtype=dtype, device="cpu")
        assert t.shape == shape and t.dtype == dtype and bool((t == -1).all())
    advised = []
    monkeypatch.setattr(_memory, "_madvise_huge", lambda t: advised.append(t.nbytes))
    _memory.full((2, big), 7, dtype=torch.int64, device="cpu")
    _memory.full((3, 5), 7, dtype=torch.int64, device="cpu")
    assert advised == ([2 * big * 8] if sys.platform == "linux" else [])

    def broken(t):
        raise OSError("no libc here")

    monkeypatch.setattr(_memory, "_madvise_huge", broken)
    t = _memory.full((2, big), 3, dtype=torch.int64, device="cpu")
    assert bool((t == 3).all())
    # the constructors use it: a 2-row index of 2**20 tokens is 16 MiB per n
    advised.clear()
    monkeypatch.setattr(_memory, "_madvise_huge", lambda t: advised.append(t.nbytes))
    index = new_ngram_index(2, 2**20, min_n=2, max_n=2)
    assert bool((index.table == -1).all())
    assert advised == ([index.table.nbytes] if sys.platform == "linux" else [])


# ----------------------------------------------------------------------------- one-call step


def _step_state(g, R, L_max, *, frequency=False, device="cpu"):
    """Random histories, an index built from their first part, a corpus of two documents."""
    tok = torch.randint(0, 4, (R, L_max), generator=g, dtype=torch.int32)
    old = torch.randint(0, L_max + 1, (R,), generator=g, dtype=torch.int32)
    scoring = {"scoring": "frequency"} if frequency else {}
    index = new_ngram_index(R, L_max, min_n=1, max_n=3, device=device, **scoring)
    ngram_index_build(tok.to(device), old.to(device), index=index)
    corpus = new_corpus(64, min_n=1, max_n=3, device=device, **scoring)
    docs = torch.randint(0, 4, (2, 12), generator=g, dtype=torch.int32)
    corpus_append(docs.to(device), torch.tensor([12, 7], dtype=torch.int32, device=device),
                  corpus=corpus)  # fmt: skip
    return tok, old, index, corpus


def _copy(index):
    return type(index)(*(t.clone() for t in index[:-2]), index.min_n, index.max_n)


@pytest.mark.parametrize("route", ["one kernel", "two ops", "device"])
@pytest.mark.parametrize("frequency", [False, True])
def test_extend_index_equals_extend_then_propose(route, frequency, kernel_device, monkeypatch):
    # random steps (rows grow by 0-3 tokens, padding rows, permuted rows, caps, a corpus):
    # ngram_propose(..., extend_index=True) leaves the index and returns the drafts that
    # ngram_index_extend then ngram_propose give, on each route the wrapper can take
    from specdec_kernels.ops import ngram as ops_ngram
    from specdec_kernels.ops import ngram_propose

    # "device": the Triton kernels on CUDA (bench/gpu_check.sh); without CUDA, as "one kernel"
    if route == "two ops":  # what every call that needs the dispatcher runs
        monkeypatch.setattr(ops_ngram, "calls_cpu_directly", lambda kwargs: False)
    dev = kernel_device if route == "device" else torch.device("cpu")
    g = torch.Generator().manual_seed(7)
    kw = dict(min_n=1, max_n=3, num_speculative_tokens=3)
    if frequency:
        kw.update(scoring="frequency")
    for trial in range(6 if route == "device" else 25):
        R, L_max = int(torch.randint(1, 5, (1,), generator=g)), 16
        tok, nt, index, corpus = _step_state(g, R, L_max, frequency=frequency, device=dev)
        want_index = _copy(index)
        tok = tok.to(dev)
        for _ in range(3):
            nt = torch.clamp(nt + torch.randint(0, 4, (R,), generator=g, dtype=torch.int32),
                             max=L_max)  # fmt: skip
            req = torch.randperm(R, generator=g)[: int(torch.randint(1, R + 1, (1,), generator=g))]
            req = torch.cat([req, torch.tensor([-1])]).to(torch.int32)
            caps = torch.randint(0, 4, (req.shape[0],), generator=g, dtype=torch.int32)
            args = dict(req_indices=req.to(dev), max_draft_tokens=caps.to(dev),
                        corpus=corpus if trial % 2 else None, **kw)  # fmt: skip
            ngram_index_extend(tok, nt.to(dev), req.to(dev), index=want_index)
            want = ngram_propose(tok, nt.to(dev), index=want_index, **args)
            got = ngram_propose(tok, nt.to(dev), index=index, extend_index=True, **args)
            for a, b in zip(got, want, strict=True):
                assert torch.equal(a.cpu(), b.cpu()), (trial, a, b)
            assert torch.equal(index.length.cpu(), want_index.length.cpu())
            if dev.type == "cpu":  # device tables hold the same entries in other slots
                for a, b in zip(index[:-2], want_index[:-2], strict=True):
                    assert torch.equal(a, b)


@pytest.mark.parametrize("frequency", [False, True])
def test_extend_index_takes_one_kernel_call_on_cpu(frequency, monkeypatch):
    # the "one kernel" route above is the one-call function, for either index kind (if the
    # wrapper fell back to the two ops, that test would compare the two ops with themselves)
    from specdec_kernels.cpu import frequency as cpu_frequency
    from specdec_kernels.cpu import ngram as cpu_ngram
    from specdec_kernels.ops import ngram_propose

    module = cpu_frequency if frequency else cpu_ngram
    calls = []
    real = module.extend_and_propose
    monkeypatch.setattr(
        module, "extend_and_propose", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    tok, old, index, corpus = _step_state(
        torch.Generator().manual_seed(5), 3, 16, frequency=frequency
    )
    kw = dict(min_n=1, max_n=3, num_speculative_tokens=3, corpus=corpus)
    if frequency:
        kw["scoring"] = "frequency"
    ngram_propose(tok, torch.clamp(old + 2, max=16), index=index, extend_index=True, **kw)
    assert calls == [1]


def _bad_step(match, frequency=False, **kw):
    from specdec_kernels.ops import ngram_propose

    tok, nt = history([[1, 2, 3, 1, 2, 3, 1], [4, 5, 4, 5]], width=10)
    scoring = {"scoring": "frequency"} if frequency else {}
    index = new_ngram_index(2, 10, min_n=1, max_n=3, **scoring)
    ngram_index_build(tok, torch.tensor([5, 2], dtype=torch.int32), index=index)
    before = [t.clone() for t in index[:-2]]
    args = dict(min_n=1, max_n=3, num_speculative_tokens=2, index=index, extend_index=True,
                **scoring)  # fmt: skip
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        ngram_propose(tok, args.pop("num_tokens", nt), **args)
    assert all(torch.equal(a, b) for a, b in zip(index[:-2], before, strict=True))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(num_tokens=torch.tensor([7, 1], dtype=torch.int32)), "num_tokens must be >= index"),
        (dict(req_indices=torch.tensor([1, 1], dtype=torch.int32)), "req_indices must be unique"),
        (dict(req_indices=torch.tensor([0, 2], dtype=torch.int32)), r"lie in \[-1, 2\)"),
        (dict(num_tokens=torch.tensor([7, 11], dtype=torch.int32)), r"lie in \[0, 10\]"),
        (dict(max_draft_tokens=torch.tensor([1, -1], dtype=torch.int32)), "max_draft_tokens"),
        (dict(index=None), "extend_index=True brings an index up to date"),
        (dict(extend_index=1), "extend_index must be a bool"),
    ],
)
@pytest.mark.parametrize("route", ["one kernel", "two ops"])
@pytest.mark.parametrize("frequency", [False, True])
def test_extend_index_refusals_leave_the_index_unchanged(
    route, frequency, overrides, match, monkeypatch
):
    # every route checks every value before the extend writes (found by review: the two-op
    # route raised for a negative cap after it had extended the index)
    from specdec_kernels.ops import ngram as ops_ngram

    if route == "two ops":
        monkeypatch.setattr(ops_ngram, "calls_cpu_directly", lambda kwargs: False)
    if frequency and "index" in overrides:
        match = 'scoring="frequency" needs index='  # refused for that first
    _bad_step(match, frequency=frequency, **overrides)


@pytest.mark.parametrize("frequency", [False, True])
def test_extend_index_kernel_refuses_what_the_wrappers_refuse(frequency, monkeypatch):
    # random steps, half with one bad value: the one-kernel call raises exactly where the two
    # ops in turn raise, with the same error, and leaves the index unchanged; otherwise
    # equal outputs and index
    from specdec_kernels.ops import ngram as ops_ngram
    from specdec_kernels.ops import ngram_propose

    g = torch.Generator().manual_seed(3)
    direct = ops_ngram.calls_cpu_directly
    refused = 0
    same = lambda a, b: all(torch.equal(x, y) for x, y in zip(a[:-2], b[:-2], strict=True))  # noqa: E731
    for trial in range(200):
        R, L_max = int(torch.randint(1, 5, (1,), generator=g)), 9
        tok, old, index, _ = _step_state(g, R, L_max, frequency=frequency)
        nt = torch.clamp(old + torch.randint(0, 3, (R,), generator=g, dtype=torch.int32),
                         max=L_max)  # fmt: skip
        req = torch.randperm(R, generator=g)[: int(torch.randint(0, R + 1, (1,), generator=g))]
        req = req.to(torch.int32) if trial % 3 else None
        B = R if req is None else req.shape[0]
        caps = None if trial % 3 == 2 else torch.ones(B, dtype=torch.int32)  # bad trials too
        if trial % 2:  # one bad value
            what, r = trial % 5, int(torch.randint(0, R, (1,), generator=g))
            if what == 0 and req is not None and req.numel():
                req[0] = [-2, R, int(req.max())][trial % 3]
            elif what == 1 and caps is not None and caps.numel():
                caps[0] = -1
            elif what == 2:
                nt[r] = old[r] - 1
            else:
                nt[r] = [-1, L_max + 1][trial % 2]
        kw = dict(req_indices=req, max_draft_tokens=caps, min_n=1, max_n=3,
                  num_speculative_tokens=2)  # fmt: skip
        if frequency:
            kw["scoring"] = "frequency"
        results = []
        for route in ("one kernel", "two ops"):
            ix = _copy(index)
            two_ops = lambda kwargs: False  # noqa: E731
            monkeypatch.setattr(
                ops_ngram, "calls_cpu_directly", direct if route == "one kernel" else two_ops
            )
            try:
                out = ngram_propose(tok, nt, index=ix, extend_index=True, **kw)
            except ValueError as e:
                assert same(ix, index)
                results.append(str(e))
                continue
            results.append((tuple(out), ix))
        if isinstance(results[0], str) or isinstance(results[1], str):
            assert results[0] == results[1], (trial, results)
            refused += 1
            continue
        (a, ia), (b, ib) = results
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), trial
        assert same(ia, ib), trial
    assert 40 < refused < 160, refused


def test_extend_index_compiles_to_the_two_ops():
    # under torch.compile the wrapper takes the dispatcher route: the extend (in place) then
    # the proposal, traced as one graph; drafts and index equal the eager one-kernel call's
    from specdec_kernels.ops import ngram_propose

    g = torch.Generator().manual_seed(11)
    tok, old, eager_index, _ = _step_state(g, 3, 16)
    compiled_index = _copy(eager_index)
    nt = torch.clamp(old + 3, max=16)
    kw = dict(min_n=1, max_n=3, num_speculative_tokens=3, extend_index=True)
    want = ngram_propose(tok, nt, index=eager_index, **kw)
    step = torch.compile(
        lambda t, n, index: tuple(ngram_propose(t, n, index=index, **kw)),
        backend="aot_eager",
        fullgraph=True,
    )
    got = step(tok, nt, compiled_index)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert torch.equal(compiled_index.table, eager_index.table)
    assert torch.equal(compiled_index.length, eager_index.length)
