"""corpus_append and the corpus lookup (family ``corpus``): what a corpus returns through
``ngram_propose``, eviction, the ring seam, stale entries, the stated loss rate, random
streams on every path (with and without an own-history index), errors.

The registration tiers are tests/test_conformance.py's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from specdec_kernels.cpu import corpus as cpu_corpus
from specdec_kernels.cpu import ngram_index as cpu_ix
from specdec_kernels.ops import (
    corpus_append,
    new_corpus,
    new_ngram_index,
    ngram_index_build,
    ngram_index_extend,
    ngram_propose,
)
from tests.ngram_helpers import RAW, State, drafts_of, history, replay, schedules


def _corpus_state(impl, device, *, C, H=None, min_n=1, max_n=3):
    return State(impl, 1, 8, min_n=min_n, max_n=max_n, C=C, H=H, device=device)


def _one(s, tokens, *, k=4, index=True):
    """Propose for one request with ``tokens`` (from the index, or scanning without one)."""
    tok, nt = history([tokens], width=8)
    s.build(tok, nt)
    return s.propose(tok, nt, k=k, index=index)


@pytest.mark.parametrize("index", [True, False], ids=["index", "scan"])
@pytest.mark.parametrize("impl", RAW)
def test_corpus_drafts_when_own_history_has_nothing(impl, index, kernel_device):
    s = _corpus_state(impl, kernel_device, C=32)
    d, n = history([[5, 6, 7, 8, 9, 10]])
    s.append(d, n)
    out = _one(s, [1, 6, 7], index=index)
    assert drafts_of(out) == [8, 9, 10] and out[3].tolist() == [2]  # stops at the document end


@pytest.mark.parametrize("index", [True, False], ids=["index", "scan"])
@pytest.mark.parametrize("impl", RAW)
def test_corpus_empty_gives_own_history_only(impl, index, kernel_device):
    s = _corpus_state(impl, kernel_device, C=8)
    out = _one(s, [1, 2, 1], index=index)
    assert drafts_of(out) == [2, 1] and out[3].tolist() == [1]


@pytest.mark.parametrize("index", [True, False], ids=["index", "scan"])
@pytest.mark.parametrize("impl", RAW)
def test_same_n_own_history_wins_longer_corpus_n_wins(impl, index, kernel_device):
    s = _corpus_state(impl, kernel_device, C=32)
    d, n = history([[3, 4, 50, 51], [2, 3, 4, 60]])
    s.append(d, n)
    # own has "3 4" -> 70; corpus has "2 3 4" -> 60 (n = 3 beats n = 2)
    assert drafts_of(_one(s, [3, 4, 70, 2, 3, 4], index=index)) == [60]
    # own has "3 4" -> 70, corpus has "3 4" too (n = 2 both): own wins
    assert drafts_of(_one(s, [3, 4, 70, 9, 3, 4], index=index)) == [70, 9, 3, 4]


@pytest.mark.parametrize("index", [True, False], ids=["index", "scan"])
@pytest.mark.parametrize("impl", RAW)
def test_most_recent_corpus_occurrence_wins(impl, index, kernel_device):
    s = _corpus_state(impl, kernel_device, C=64)
    d, n = history([[1, 2, 10], [1, 2, 20]])  # row 1 is more recent than row 0
    s.append(d, n)
    assert drafts_of(_one(s, [9, 1, 2], index=index)) == [20]
    d, n = history([[1, 2, 30, 31]])  # a later call is more recent still
    s.append(d, n)
    assert drafts_of(_one(s, [9, 1, 2], index=index)) == [30, 31]
    d, n = history([[1, 2, 40], [1, 2, 41, 42], [0]])
    s.append(d, n, torch.tensor([1, 0, -1], dtype=torch.int32))  # order of req_indices
    assert drafts_of(_one(s, [9, 1, 2], index=index)) == [40]


@pytest.mark.parametrize("index", [True, False], ids=["index", "scan"])
@pytest.mark.parametrize("impl", RAW)
def test_no_ngram_crosses_a_document_boundary(impl, index, kernel_device):
    s = _corpus_state(impl, kernel_device, C=32)
    d, n = history([[5, 1], [2, 7, 8], [4]])  # "1 2" only across the boundary
    s.append(d, n)
    assert drafts_of(_one(s, [9, 1, 2], k=3, index=index)) == [7, 8]  # n = 1 ("2"), not n = 2
    assert drafts_of(_one(s, [8], index=index)) == []  # 8 ends its document: nothing follows
    assert drafts_of(_one(s, [9, 8, 4], index=index)) == []  # a 1-token document: no n-grams


@pytest.mark.parametrize("index", [True, False], ids=["index", "scan"])
@pytest.mark.parametrize("impl", RAW)
def test_documents_shorter_than_min_n_take_room_but_add_no_ngrams(impl, index, kernel_device):
    s = _corpus_state(impl, kernel_device, C=6, min_n=3, max_n=3)
    d, n = history([[1, 2, 3, 4], [1, 2]])
    s.append(d, n)
    assert s.corpus_live()[3].tolist() == [6, 0]
    assert drafts_of(_one(s, [0, 1, 2, 3], index=index)) == [4]
    d, n = history([[7]])  # evicts [1 2 3 4]: the window is now [4, 7)
    s.append(d, n)
    assert s.corpus_live()[3].tolist() == [7, 4]
    assert drafts_of(_one(s, [0, 1, 2, 3], index=index)) == []


@pytest.mark.parametrize("index", [True, False], ids=["index", "scan"])
@pytest.mark.parametrize("impl", RAW)
def test_eviction_is_whole_documents_oldest_first(impl, index, kernel_device):
    s = _corpus_state(impl, kernel_device, C=10, min_n=2, max_n=2)
    d, n = history([[1, 2, 3, 4], [5, 6, 7, 8]])
    s.append(d, n)
    d, n = history([[9, 9, 9]])  # 11 tokens > 10: [1 2 3 4] goes, whole
    s.append(d, n)
    tokens, meta, _, state = s.corpus_live()
    assert state.tolist() == [11, 4] and tokens == [5, 6, 7, 8, 9, 9, 9]
    assert meta[0] == [4, 8] and meta[-1] == [8, 11]
    assert drafts_of(_one(s, [0, 2, 3], index=index)) == []  # evicted, though its entry remains
    assert drafts_of(_one(s, [0, 6, 7], index=index)) == [8]


@pytest.mark.parametrize("index", [True, False], ids=["index", "scan"])
@pytest.mark.parametrize("impl", RAW)
def test_a_document_longer_than_the_corpus_keeps_its_last_tokens(impl, index, kernel_device):
    s = _corpus_state(impl, kernel_device, C=5, min_n=1, max_n=1)
    d, n = history([[1, 2, 3, 4, 5, 6, 7]])
    s.append(d, n)
    tokens, meta, _, state = s.corpus_live()
    assert tokens == [3, 4, 5, 6, 7] and state.tolist() == [5, 0] and meta[0] == [0, 5]
    assert drafts_of(_one(s, [0, 2], index=index)) == []
    assert drafts_of(_one(s, [0, 3], index=index)) == [4, 5, 6, 7]


@pytest.mark.parametrize("index", [True, False], ids=["index", "scan"])
@pytest.mark.parametrize("impl", RAW)
def test_documents_of_one_call_evict_each_other(impl, index, kernel_device):
    s = _corpus_state(impl, kernel_device, C=6, min_n=1, max_n=1)
    d, n = history([[1, 2, 3], [4, 5], [6, 7, 8]])  # 8 tokens: the first document goes
    s.append(d, n)
    tokens, _, _, state = s.corpus_live()
    assert tokens == [4, 5, 6, 7, 8] and state.tolist() == [8, 3]
    assert drafts_of(_one(s, [0, 1], index=index)) == [] and drafts_of(
        _one(s, [0, 4], index=index)
    ) == [5]


@pytest.mark.parametrize("index", [True, False], ids=["index", "scan"])
@pytest.mark.parametrize("impl", RAW)
def test_a_document_wrapping_the_ring_reads_across_the_seam(impl, index, kernel_device):
    s = _corpus_state(impl, kernel_device, C=8, min_n=2, max_n=2)
    d, n = history([[1, 1, 1, 1, 1]])
    s.append(d, n)
    d, n = history([[6, 7, 8, 9, 10, 11]])  # absolute 5..10: slots 5, 6, 7, 0, 1, 2
    s.append(d, n)
    tokens, _, _, state = s.corpus_live()
    assert state.tolist() == [11, 5] and tokens == [6, 7, 8, 9, 10, 11]
    assert drafts_of(_one(s, [0, 7, 8], index=index)) == [9, 10, 11]  # the 2-gram 8 9 spans 7 -> 0
    assert drafts_of(_one(s, [0, 8, 9], index=index)) == [10, 11]


@pytest.mark.parametrize("index", [True, False], ids=["index", "scan"])
@pytest.mark.parametrize("impl", RAW)
def test_stale_entry_whose_slots_now_hold_the_same_ngram_is_not_returned(
    impl, index, kernel_device
):
    # [1 2 3 4] at absolute 0..3 is evicted; the new document [1 2] lands on slots 0, 1
    # (absolute 8, 9) with nothing after it, so its "1 2" is not indexed. The old entry
    # (start 0) still verifies against the ring, but it is stale (0 < lo = 4): returning
    # it would draft the old "3 4" and run past the new document's end.
    s = _corpus_state(impl, kernel_device, C=8, min_n=1, max_n=2)
    for doc in ([1, 2, 3, 4], [5, 5, 5, 5], [1, 2]):
        d, n = history([doc])
        s.append(d, n)
    assert s.corpus_live()[3].tolist() == [10, 4]
    assert drafts_of(_one(s, [0, 1, 2], index=index)) == []
    assert drafts_of(_one(s, [0, 0, 1], index=index)) == [2]  # the new document's own 1 -> 2


@pytest.mark.parametrize("index", [True, False], ids=["index", "scan"])
@pytest.mark.parametrize("impl", RAW)
def test_corpus_full_and_padding_rows(impl, index, kernel_device):
    s = State(impl, 3, 8, min_n=1, max_n=2, C=4, device=kernel_device)
    d, n = history([[1, 2, 3, 4]])  # exactly full
    s.append(d, n)
    assert s.corpus_live()[3].tolist() == [4, 0]
    tok, nt = history([[9, 1], [9, 9, 9], [2]], width=8)
    s.build(tok, nt)
    req = torch.tensor([-1, 0, 1, 2], dtype=torch.int32)
    out = s.propose(tok, nt, req, k=3, index=index)
    assert [drafts_of(out, b) for b in range(4)] == [[], [2, 3, 4], [9], [3, 4]]
    assert out[3].tolist() == [0, 2, 1, 2] and out[2].tolist() == [0, 1, 2, 1]


def _random_corpus_run(impl, seed, device, *, calls=4):
    g = torch.Generator().manual_seed(seed)
    C = int(torch.randint(4, 40, (1,), generator=g))
    H = int(torch.randint(3, 64, (1,), generator=g))
    s = State(impl, 3, 12, min_n=1, max_n=3, C=C, H=H, device=device)
    outs = []
    for _ in range(calls):
        B = int(torch.randint(1, 4, (1,), generator=g))
        docs = torch.randint(0, 3, (B, 20), generator=g, dtype=torch.int32)
        lens = torch.randint(0, 21, (B,), generator=g, dtype=torch.int32)
        req = None
        if bool(torch.randint(0, 2, (1,), generator=g)):
            req = torch.randint(-1, B, (B + 1,), generator=g, dtype=torch.int32)
        s.append(docs, lens, req)
        tok = torch.randint(0, 3, (3, 12), generator=g, dtype=torch.int32)
        nt = torch.randint(0, 13, (3,), generator=g, dtype=torch.int32)
        s.build(tok, nt)
        for tie in ("first", "last"):
            outs.append(s.propose(tok, nt, k=5, mml=14, tie=tie))
            # without an index (the histories are scanned): the same proposals
            scan = s.propose(tok, nt, k=5, mml=14, tie=tie, index=False)
            assert all(torch.equal(x, y) for x, y in zip(scan, outs[-1], strict=True))
    return s, outs


@pytest.mark.parametrize("seed", range(6))
def test_corpus_paths_agree_on_random_streams(seed, kernel_device):
    runs = {impl: _random_corpus_run(impl, seed, kernel_device) for impl in RAW}
    ref_state_, ref_out = runs["reference"]
    for impl in ("cpu", "triton"):
        s, outs = runs[impl]
        a, b = s.corpus_live(), ref_state_.corpus_live()
        assert a[0] == b[0] and a[1] == b[1], impl
        assert torch.equal(a[2], b[2]) and torch.equal(a[3], b[3]), impl
        for got, want in zip(outs, ref_out, strict=True):
            for x, y in zip(got, want, strict=True):
                assert torch.equal(x, y), (impl, got, want)


def test_corpus_hits_are_exact_and_misses_follow_the_stated_rate():
    # Random text (vocabulary 64, n = 3: mostly distinct n-grams), a full corpus, H = 4C.
    # Every hit is the most recent occurrence (exact); the miss rate by age follows
    # new_corpus's formula P(miss) ~= (1 - exp(-2a/H))^2 within sampling noise.
    C = 4096
    g = torch.Generator().manual_seed(0)
    corpus = new_corpus(C, min_n=3, max_n=3)
    docs = torch.randint(0, 64, (16, 512), generator=g, dtype=torch.int32)
    for i in range(0, 16, 4):
        corpus_append(docs[i : i + 4], torch.full((4,), 512, dtype=torch.int32), corpus=corpus)
    end, lo = corpus.state.tolist()
    assert (end, lo) == (8192, 4096)
    ring = corpus.tokens.tolist()
    latest = {}
    for p in range(lo, end):
        if p + 3 < int(corpus.meta[p % C, 1]):
            latest[tuple(ring[(p + t) % C] for t in range(3))] = p
    occ = torch.tensor(
        [p for p in range(lo, end) if p + 3 < int(corpus.meta[p % C, 1])], dtype=torch.long
    )
    c = [t.numpy() for t in corpus[:4]]
    got = []
    for key in latest:  # the CPU path's lookup of each n-gram (as a 3-token history)
        row = np.array(key, dtype=np.int32)
        h = cpu_ix.ngram_hash(row, 0, 3)
        got.append(cpu_corpus.corpus_lookup(*c[:3], lo, 0, row, 3, 3, h)[0])
    p = torch.tensor(got)
    found = p >= 0
    want = torch.tensor(list(latest.values()))
    assert torch.equal(p[found], want[found])  # never a wrong or older occurrence
    H = corpus.index.shape[1]
    # age a = how many occurrences were inserted after it
    ages = occ.numel() - 1 - torch.searchsorted(occ, want)
    for lo_a, hi_a in ((0, 400), (1500, 2500), (3000, occ.numel())):
        sel = (ages >= lo_a) & (ages < hi_a)
        miss = 1 - float(found[sel].float().mean())
        a = float(ages[sel].float().mean())
        expect = (1 - math.exp(-2 * a / H)) ** 2
        sd = math.sqrt(max(expect * (1 - expect), 1e-4) / int(sel.sum()))
        assert abs(miss - expect) < 4 * sd + 0.005, (lo_a, miss, expect)


@settings(max_examples=25)
@given(schedules(max_steps=5))
def test_cpu_scan_with_corpus_equals_reference_under_any_schedule(case):
    got, _ = replay("cpu", case, None, with_corpus=True, with_index=False)
    want, _ = replay("reference", case, None, with_corpus=True)
    for g_, w in zip(got, want, strict=True):
        for x, y in zip(g_, w, strict=True):
            assert torch.equal(x, y), (g_, w)


@settings(max_examples=25)
@given(schedules(max_steps=5))
def test_cpu_with_corpus_equals_reference_under_any_schedule(case):
    got, _ = replay("cpu", case, None, with_corpus=True)
    want, _ = replay("reference", case, None, with_corpus=True)
    for g_, w in zip(got, want, strict=True):
        for x, y in zip(g_, w, strict=True):
            assert torch.equal(x, y), (g_, w)


def _public_setup():
    tok, nt = history([[1, 2, 3, 1, 2, 3, 1], [4, 5, 4, 5]], width=10)
    index = new_ngram_index(2, 10, min_n=1, max_n=3)
    corpus = new_corpus(16, min_n=1, max_n=3)
    return tok, nt, index, corpus


def test_public_step_with_corpus():
    tok, nt, index, corpus = _public_setup()
    ngram_index_build(tok, nt, index=index)
    corpus_append(*history([[4, 5, 6, 7]]), corpus=corpus)
    kw = dict(min_n=1, max_n=3, num_speculative_tokens=3, corpus=corpus)
    out = ngram_propose(tok, nt, index=index, **kw)
    assert drafts_of(out, 0) == [2, 3, 1] and drafts_of(out, 1) == [4, 5]
    # row 1 commits "6": the own history has no "5 6", the corpus does
    tok[1, 4] = 6
    nt[1] = 5
    ngram_index_extend(tok, nt, torch.tensor([1], dtype=torch.int32), index=index)
    out = ngram_propose(tok, nt, index=index, **kw)
    assert drafts_of(out, 1) == [7] and out.draft_source.tolist() == [1, 2]
    assert all(torch.equal(a, b) for a, b in zip(ngram_propose(tok, nt, **kw), out, strict=True))


# ----------------------------------------------------------------------------- errors


_BAD_CORPUS = new_corpus(4, min_n=1, max_n=3)._replace(index=torch.zeros(3, 5, dtype=torch.int32))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(doc_lens=torch.tensor([11, 1]).int()), r"doc_lens must lie in \[0, 10\]"),
        (dict(doc_lens=torch.zeros(2, dtype=torch.int64)), "doc_lens must have dtype int32"),
        (dict(corpus=_BAD_CORPUS), "corpus.index must have dtype int64"),
        (dict(corpus=(1, 2)), "corpus must be a Corpus"),
        (dict(req_indices=torch.tensor([0, 2], dtype=torch.int32)), r"req_indices must lie in"),
    ],
)
def test_bad_input_raises_value_error_and_leaves_the_corpus_unchanged(overrides, match):
    tok, nt, _, corpus = _public_setup()
    before = [t.clone() for t in corpus[:4]]
    kw = dict(doc_tokens=tok, doc_lens=nt, corpus=corpus)
    kw.update(overrides)
    with pytest.raises(ValueError, match=match):
        corpus_append(**kw)
    assert all(torch.equal(a, b) for a, b in zip(corpus[:4], before, strict=True))


def test_bad_capacity_raises_value_error():
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        new_corpus(0, min_n=1, max_n=2)
    with pytest.raises(ValueError, match="index_slots must be >= 1"):
        new_corpus(4, min_n=1, max_n=2, index_slots=0)
