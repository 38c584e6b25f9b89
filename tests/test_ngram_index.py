"""ngram_index family: own-history index == ngram_propose, shared corpus, registration, errors.

Three implementations of every op (reference, CPU path, Triton under the interpreter) are
compared on named edge cases and random schedules; the own-history proposals are compared
with ``ngram_propose`` (the full scan) under random admissions and commits.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels.cpu import ngram_index as cpu_ix
from specdec_kernels.kernels import ngram_index as triton_ix
from specdec_kernels.ops import (
    NgramIndex,
    corpus_append,
    new_corpus,
    new_ngram_index,
    ngram_index_build,
    ngram_index_extend,
    ngram_index_propose,
    ngram_propose,
)
from specdec_kernels.reference import ngram_index as ref_ix

IMPLS = {"reference": ref_ix, "cpu": cpu_ix, "triton": triton_ix}
RAW = ["reference", "cpu", "triton"]


# ----------------------------------------------------------------------------- helpers


def _history(rows: list[list[int]], width: int | None = None):
    width = width or max(1, max((len(r) for r in rows), default=1))
    token_ids = torch.full((len(rows), width), 99999, dtype=torch.int32)  # poison past L
    for i, r in enumerate(rows):
        token_ids[i, : len(r)] = torch.tensor(r, dtype=torch.int32)
    return token_ids, torch.tensor([len(r) for r in rows], dtype=torch.int32)


def _dev(impl, device):
    if impl == "triton" and device is None and torch.cuda.is_available():
        return torch.device("cuda")
    return device if impl == "triton" else torch.device("cpu")


def _to(x, device):
    return None if x is None else x.to(device)


class State:
    """One implementation's own-history index and corpus, driven through the raw functions."""

    def __init__(self, impl, R, width, *, min_n, max_n, C=16, H=None, slots=None, device=None):
        self.impl, self.mod = impl, IMPLS[impl]
        self.dev = _dev(impl, device) or torch.device("cpu")
        self.min_n, self.max_n = min_n, max_n
        ix = new_ngram_index(R, width, min_n=min_n, max_n=max_n, slots=slots, device=self.dev)
        self.table, self.length = ix.table, ix.length
        c = new_corpus(C, min_n=min_n, max_n=max_n, index_slots=H, device=self.dev)
        self.corpus = (c.tokens, c.meta, c.index, c.state)

    @property
    def nk(self):
        return {"min_n": self.min_n, "max_n": self.max_n}

    def build(self, tok, nt, req=None):
        self.mod.ngram_index_build(
            _to(tok, self.dev), _to(nt, self.dev), _to(req, self.dev), self.table, self.length,
            **self.nk,
        )  # fmt: skip

    def extend(self, tok, nt, req=None):
        self.mod.ngram_index_extend(
            _to(tok, self.dev), _to(nt, self.dev), _to(req, self.dev), self.table, self.length,
            **self.nk,
        )  # fmt: skip

    def append(self, docs, lens, req=None):
        self.mod.corpus_append(
            _to(docs, self.dev), _to(lens, self.dev), _to(req, self.dev), *self.corpus, **self.nk
        )

    def propose(self, tok, nt, req=None, cap=None, *, k, corpus=True, mml=None, tie="first"):
        out = self.mod.ngram_index_propose(
            _to(tok, self.dev),
            _to(nt, self.dev),
            self.table,
            self.length,
            _to(req, self.dev),
            _to(cap, self.dev),
            *(self.corpus if corpus else (None,) * 4),
            num_speculative_tokens=k,
            max_model_len=mml,
            tie_break=tie,
            **self.nk,
        )
        return tuple(o.cpu() for o in out)

    def content(self):
        """The table as a set: (row, n index, first, last) of every occupied slot."""
        t = self.table.cpu()
        occ = (t[..., 0] >= 0).nonzero()
        return sorted(
            (int(r), int(j), int(t[r, j, s, 0]), int(t[r, j, s, 1])) for r, j, s in occ.tolist()
        )

    def corpus_live(self):
        """Ring contents of the live window, tables and state (comparable across paths)."""
        tokens, meta, index, state = (x.cpu() for x in self.corpus)
        end, lo = state.tolist()
        C = tokens.shape[0]
        slots = [p % C for p in range(lo, end)]
        return tokens[slots].tolist(), meta[slots].tolist(), index, state


def _drafts(out, b=0):
    drafts, counts = out[0], out[1]
    n = int(counts[b])
    assert (drafts[b, n:] == -1).all(), "slots past num_draft_tokens must hold -1"
    return drafts[b, :n].tolist()


def _docs(docs: list[list[int]], width=None):
    return _history(docs, width)


def _full_scan(tok, nt, req=None, cap=None, *, min_n, max_n, k, mml=None, tie="first"):
    out = ngram_propose(
        tok,
        nt,
        req,
        min_n=min_n,
        max_n=max_n,
        num_speculative_tokens=k,
        max_model_len=mml,
        max_draft_tokens=cap,
        tie_break=tie,
    )
    return out.draft_token_ids, out.num_draft_tokens, out.match_len


# ----------------------------------------------------------------------------- own history


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
    tok, nt = _history(rows, width=20)
    s = State(impl, len(rows), 20, min_n=2, max_n=3, device=kernel_device)
    s.build(tok, nt)
    got = s.propose(tok, nt, k=3, corpus=False, tie=tie)
    want = _full_scan(tok, nt, min_n=2, max_n=3, k=3, tie=tie)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(got[2], want[2])  # match_len
    assert got[3].tolist() == [1 if c > 0 else 0 for c in want[1].tolist()]


@pytest.mark.parametrize("impl", RAW)
def test_extend_adds_only_the_completed_ngrams(impl, kernel_device):
    tok, _ = _history([[1, 2, 3, 1, 2, 4, 1, 2]])
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
    tok, nt = _history([list(range(16)) + [0]], width=17)
    s = State(impl, 1, 17, min_n=1, max_n=1, slots=17, device=kernel_device)
    s.build(tok, nt)
    assert len(s.content()) == 16
    got = s.propose(tok, nt, k=4, corpus=False)
    assert _drafts(got) == [1, 2, 3, 4]


@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_padding_rows_permuted_rows_and_caps(impl, kernel_device):
    tok, nt = _history([[1, 2, 3, 4, 1, 2], [5, 6, 7, 5, 6], [1, 2, 1, 2, 1, 2]], width=9)
    s = State(impl, 3, 9, min_n=1, max_n=2, device=kernel_device)
    req = torch.tensor([2, -1, 0], dtype=torch.int32)
    s.build(tok, nt, req)
    assert s.length.cpu().tolist() == [6, 0, 6]  # row 1 was not in the batch
    req = torch.tensor([0, -1, 2, -1], dtype=torch.int32)
    cap = torch.tensor([3, 3, 1, 2], dtype=torch.int32)
    got = s.propose(tok, nt, req, cap, k=3, corpus=False, mml=8)
    want = _full_scan(tok, nt, req, cap, min_n=1, max_n=2, k=3, mml=8)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert [_drafts(got, b) for b in range(4)] == [[3, 4], [], [1], []]


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
        want = _full_scan(tok, nt, min_n=2, max_n=4, k=5, tie=tie)
        got = b.propose(tok, nt, k=5, corpus=False, tie=tie)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_triton_insert_is_order_independent_with_many_duplicates(kernel_device):
    # One n-gram repeated in every lane of a block: all lanes meet in one slot.
    tok, nt = _history([[7] * 300 + [8]], width=301)
    for impl in ("triton", "cpu"):
        s = State(impl, 1, 301, min_n=1, max_n=3, device=kernel_device)
        s.build(tok, nt)
        # 7 -> starts 0..299, 7 7 -> 0..298, 7 7 7 -> 0..297; 8 and the n-grams ending in 8
        # have no following token
        assert s.content() == [(0, 0, 0, 299), (0, 1, 0, 298), (0, 2, 0, 297)], impl


# ----------------------------------------------------------------------------- corpus


def _corpus_state(impl, device, *, C, H=None, min_n=1, max_n=3):
    return State(impl, 1, 8, min_n=min_n, max_n=max_n, C=C, H=H, device=device)


def _propose_one(s, history, *, k=4):
    tok, nt = _history([history], width=8)
    s.build(tok, nt)
    return s.propose(tok, nt, k=k)


@pytest.mark.parametrize("impl", RAW)
def test_corpus_drafts_when_own_history_has_nothing(impl, kernel_device):
    s = _corpus_state(impl, kernel_device, C=32)
    d, n = _docs([[5, 6, 7, 8, 9, 10]])
    s.append(d, n)
    out = _propose_one(s, [1, 6, 7])
    assert _drafts(out) == [8, 9, 10] and out[3].tolist() == [2]  # stops at the document end


@pytest.mark.parametrize("impl", RAW)
def test_corpus_empty_gives_own_history_only(impl, kernel_device):
    s = _corpus_state(impl, kernel_device, C=8)
    out = _propose_one(s, [1, 2, 1])
    assert _drafts(out) == [2, 1] and out[3].tolist() == [1]


@pytest.mark.parametrize("impl", RAW)
def test_same_n_own_history_wins_longer_corpus_n_wins(impl, kernel_device):
    s = _corpus_state(impl, kernel_device, C=32)
    d, n = _docs([[3, 4, 50, 51], [2, 3, 4, 60]])
    s.append(d, n)
    # own has "3 4" -> 70; corpus has "2 3 4" -> 60 (n = 3 beats n = 2)
    assert _drafts(_propose_one(s, [3, 4, 70, 2, 3, 4])) == [60]
    # own has "3 4" -> 70, corpus has "3 4" too (n = 2 both): own wins
    assert _drafts(_propose_one(s, [3, 4, 70, 9, 3, 4])) == [70, 9, 3, 4]


@pytest.mark.parametrize("impl", RAW)
def test_most_recent_corpus_occurrence_wins(impl, kernel_device):
    s = _corpus_state(impl, kernel_device, C=64)
    d, n = _docs([[1, 2, 10], [1, 2, 20]])  # row 1 is more recent than row 0
    s.append(d, n)
    assert _drafts(_propose_one(s, [9, 1, 2])) == [20]
    d, n = _docs([[1, 2, 30, 31]])  # a later call is more recent still
    s.append(d, n)
    assert _drafts(_propose_one(s, [9, 1, 2])) == [30, 31]
    d, n = _docs([[1, 2, 40], [1, 2, 41, 42], [0]])
    s.append(d, n, torch.tensor([1, 0, -1], dtype=torch.int32))  # order of req_indices
    assert _drafts(_propose_one(s, [9, 1, 2])) == [40]


@pytest.mark.parametrize("impl", RAW)
def test_no_ngram_crosses_a_document_boundary(impl, kernel_device):
    s = _corpus_state(impl, kernel_device, C=32)
    d, n = _docs([[5, 1], [2, 7, 8], [4]])  # "1 2" only across the boundary
    s.append(d, n)
    assert _drafts(_propose_one(s, [9, 1, 2], k=3)) == [7, 8]  # n = 1 ("2"), not n = 2
    assert _drafts(_propose_one(s, [8])) == []  # 8 ends its document: nothing follows
    assert _drafts(_propose_one(s, [9, 8, 4])) == []  # a 1-token document: no n-grams


@pytest.mark.parametrize("impl", RAW)
def test_documents_shorter_than_min_n_take_room_but_add_no_ngrams(impl, kernel_device):
    s = _corpus_state(impl, kernel_device, C=6, min_n=3, max_n=3)
    d, n = _docs([[1, 2, 3, 4], [1, 2]])
    s.append(d, n)
    assert s.corpus_live()[3].tolist() == [6, 0]
    assert _drafts(_propose_one(s, [0, 1, 2, 3])) == [4]
    d, n = _docs([[7]])  # evicts [1 2 3 4]: the window is now [4, 7)
    s.append(d, n)
    assert s.corpus_live()[3].tolist() == [7, 4]
    assert _drafts(_propose_one(s, [0, 1, 2, 3])) == []


@pytest.mark.parametrize("impl", RAW)
def test_eviction_is_whole_documents_oldest_first(impl, kernel_device):
    s = _corpus_state(impl, kernel_device, C=10, min_n=2, max_n=2)
    d, n = _docs([[1, 2, 3, 4], [5, 6, 7, 8]])
    s.append(d, n)
    d, n = _docs([[9, 9, 9]])  # 11 tokens > 10: [1 2 3 4] goes, whole
    s.append(d, n)
    tokens, meta, _, state = s.corpus_live()
    assert state.tolist() == [11, 4] and tokens == [5, 6, 7, 8, 9, 9, 9]
    assert meta[0] == [4, 8] and meta[-1] == [8, 11]
    assert _drafts(_propose_one(s, [0, 2, 3])) == []  # evicted, though its entry remains
    assert _drafts(_propose_one(s, [0, 6, 7])) == [8]


@pytest.mark.parametrize("impl", RAW)
def test_a_document_longer_than_the_corpus_keeps_its_last_tokens(impl, kernel_device):
    s = _corpus_state(impl, kernel_device, C=5, min_n=1, max_n=1)
    d, n = _docs([[1, 2, 3, 4, 5, 6, 7]])
    s.append(d, n)
    tokens, meta, _, state = s.corpus_live()
    assert tokens == [3, 4, 5, 6, 7] and state.tolist() == [5, 0] and meta[0] == [0, 5]
    assert _drafts(_propose_one(s, [0, 2])) == []
    assert _drafts(_propose_one(s, [0, 3])) == [4, 5, 6, 7]


@pytest.mark.parametrize("impl", RAW)
def test_documents_of_one_call_evict_each_other(impl, kernel_device):
    s = _corpus_state(impl, kernel_device, C=6, min_n=1, max_n=1)
    d, n = _docs([[1, 2, 3], [4, 5], [6, 7, 8]])  # 8 tokens: the first document goes
    s.append(d, n)
    tokens, _, _, state = s.corpus_live()
    assert tokens == [4, 5, 6, 7, 8] and state.tolist() == [8, 3]
    assert _drafts(_propose_one(s, [0, 1])) == [] and _drafts(_propose_one(s, [0, 4])) == [5]


@pytest.mark.parametrize("impl", RAW)
def test_a_document_wrapping_the_ring_reads_across_the_seam(impl, kernel_device):
    s = _corpus_state(impl, kernel_device, C=8, min_n=2, max_n=2)
    d, n = _docs([[1, 1, 1, 1, 1]])
    s.append(d, n)
    d, n = _docs([[6, 7, 8, 9, 10, 11]])  # absolute 5..10: slots 5, 6, 7, 0, 1, 2
    s.append(d, n)
    tokens, _, _, state = s.corpus_live()
    assert state.tolist() == [11, 5] and tokens == [6, 7, 8, 9, 10, 11]
    assert _drafts(_propose_one(s, [0, 7, 8])) == [9, 10, 11]  # the 2-gram 8 9 spans 7 -> 0
    assert _drafts(_propose_one(s, [0, 8, 9])) == [10, 11]


@pytest.mark.parametrize("impl", RAW)
def test_stale_entry_whose_slots_now_hold_the_same_ngram_is_not_returned(impl, kernel_device):
    # [1 2 3 4] at absolute 0..3 is evicted; the new document [1 2] lands on slots 0, 1
    # (absolute 8, 9) with nothing after it, so its "1 2" is not indexed. The old entry
    # (start 0) still verifies against the ring, but it is stale (0 < lo = 4): returning
    # it would draft the old "3 4" and run past the new document's end.
    s = _corpus_state(impl, kernel_device, C=8, min_n=1, max_n=2)
    for doc in ([1, 2, 3, 4], [5, 5, 5, 5], [1, 2]):
        d, n = _docs([doc])
        s.append(d, n)
    assert s.corpus_live()[3].tolist() == [10, 4]
    assert _drafts(_propose_one(s, [0, 1, 2])) == []
    assert _drafts(_propose_one(s, [0, 0, 1])) == [2]  # the new document's own 1 -> 2


@pytest.mark.parametrize("impl", RAW)
def test_corpus_full_and_padding_rows(impl, kernel_device):
    s = State(impl, 3, 8, min_n=1, max_n=2, C=4, device=kernel_device)
    d, n = _docs([[1, 2, 3, 4]])  # exactly full
    s.append(d, n)
    assert s.corpus_live()[3].tolist() == [4, 0]
    tok, nt = _history([[9, 1], [9, 9, 9], [2]], width=8)
    s.build(tok, nt)
    req = torch.tensor([-1, 0, 1, 2], dtype=torch.int32)
    out = s.propose(tok, nt, req, k=3)
    assert [_drafts(out, b) for b in range(4)] == [[], [2, 3, 4], [9], [3, 4]]
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
        corpus_append(corpus, docs[i : i + 4], torch.full((4,), 512, dtype=torch.int32))
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
    keys = torch.tensor(list(latest), dtype=torch.long)
    h = cpu_ix.hash_ngrams(keys, 3)
    found, p, _ = cpu_ix._corpus_lookup(
        corpus.tokens, corpus.meta, corpus.index, corpus.state,
        torch.zeros(len(latest), dtype=torch.long), keys, torch.full((len(latest),), 3), h,
    )  # fmt: skip
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


# ----------------------------------------------------------------------------- schedules


@st.composite
def _schedules(draw, max_steps=6):
    vocab = draw(st.integers(1, 4))
    R = draw(st.integers(1, 4))
    width = draw(st.integers(1, 24))
    min_n = draw(st.integers(1, 3))
    max_n = draw(st.integers(min_n, 5))
    steps = []
    for _ in range(draw(st.integers(1, max_steps))):
        kind = draw(st.sampled_from(["admit", "commit", "commit", "doc"]))
        rows = draw(st.lists(st.integers(0, R - 1), min_size=1, max_size=R, unique=True))
        if draw(st.booleans()):
            rows = rows + [-1]
        toks = [draw(st.lists(st.integers(0, vocab - 1), max_size=width)) for _ in rows]
        k = draw(st.integers(0, 6))
        tie = draw(st.sampled_from(["first", "last"]))
        mml = draw(st.one_of(st.none(), st.integers(1, width + 6)))
        caps = draw(st.one_of(st.none(), st.lists(st.integers(0, 7), min_size=R, max_size=R)))
        steps.append((kind, rows, toks, k, tie, mml, caps))
    return vocab, R, width, min_n, max_n, steps


def _replay(impl, case, device, *, with_corpus):
    """Run a schedule; after every step propose for all rows (random caps, padding)."""
    _, R, width, min_n, max_n, steps = case
    s = State(impl, R, width, min_n=min_n, max_n=max_n, C=13, H=17, device=device)
    tok = torch.zeros((R, width), dtype=torch.int32)
    nt = torch.zeros((R,), dtype=torch.int32)
    s.build(tok, nt)
    got, want = [], []
    for kind, rows, toks, k, tie, mml, caps in steps:
        req = torch.tensor(rows, dtype=torch.int32)
        if kind == "doc":
            d, n = _docs(toks, width)
            s.append(d, n)
        for r, new in zip(rows, toks, strict=True):
            if r < 0:
                continue
            if kind == "admit":  # a new request takes the row
                nt[r] = min(len(new), width)
                tok[r, : nt[r]] = torch.tensor(new[: nt[r]], dtype=torch.int32)
            elif kind == "commit":  # append (what commit_accepted_tokens does)
                m = min(len(new), width - int(nt[r]))
                tok[r, nt[r] : nt[r] + m] = torch.tensor(new[:m], dtype=torch.int32)
                nt[r] += m
        if kind == "admit":
            s.build(tok, nt, req)
        elif kind == "commit":
            s.extend(tok, nt, req)
        cap = None if caps is None else torch.tensor(caps, dtype=torch.int32)
        preq = torch.arange(R, dtype=torch.int32).flip(0)
        preq = torch.cat([preq, torch.tensor([-1], dtype=torch.int32)])
        cap = (
            None if cap is None else torch.cat([cap.flip(0), torch.tensor([3], dtype=torch.int32)])
        )
        got.append(s.propose(tok, nt, preq, cap, k=k, mml=mml, tie=tie, corpus=with_corpus))
        if not with_corpus:
            kw = dict(min_n=min_n, max_n=max_n, k=k, mml=mml, tie=tie)
            want.append(_full_scan(tok, nt, preq, cap, **kw))
    return got, want


@given(_schedules())
def test_own_history_index_equals_full_scan_under_any_schedule(case):
    got, want = _replay("cpu", case, None, with_corpus=False)
    for g_, w in zip(got, want, strict=True):
        assert torch.equal(g_[0], w[0]) and torch.equal(g_[1], w[1]), (g_, w)
        assert torch.equal(g_[2], w[2]) and torch.equal(g_[3] > 0, w[1] > 0)


@settings(max_examples=12)
@given(_schedules(max_steps=4))
def test_triton_own_history_index_equals_full_scan_under_any_schedule(case):
    got, want = _replay("triton", case, None, with_corpus=False)
    for g_, w in zip(got, want, strict=True):
        assert torch.equal(g_[0], w[0]) and torch.equal(g_[1], w[1]), (g_, w)
        assert torch.equal(g_[2], w[2]), (g_, w)


@settings(max_examples=25)
@given(_schedules(max_steps=5))
def test_cpu_with_corpus_equals_reference_under_any_schedule(case):
    got, _ = _replay("cpu", case, None, with_corpus=True)
    want, _ = _replay("reference", case, None, with_corpus=True)
    for g_, w in zip(got, want, strict=True):
        for x, y in zip(g_, w, strict=True):
            assert torch.equal(x, y), (g_, w)


@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_table_narrower_than_the_probe_window(impl):
    # max_model_len 1 gives a 2-slot table, narrower than the CPU path's 4-slot probe
    # window: the window must wrap more than once (found by hypothesis in CI's
    # derandomized run: an IndexError).
    case = (1, 1, 1, 1, 1, [("admit", [0], [[0]], 1, "first", None, None)])
    got, _ = _replay(impl, case, None, with_corpus=True)
    want, _ = _replay("reference", case, None, with_corpus=True)
    for g_, w in zip(got, want, strict=True):
        for x, y in zip(g_, w, strict=True):
            assert torch.equal(x, y), (g_, w)


# ----------------------------------------------------------------------------- public API


def _public_setup():
    tok, nt = _history([[1, 2, 3, 1, 2, 3, 1], [4, 5, 4, 5]], width=10)
    index = new_ngram_index(2, 10, min_n=1, max_n=3)
    corpus = new_corpus(16, min_n=1, max_n=3)
    return tok, nt, index, corpus


def test_public_step_with_corpus():
    tok, nt, index, corpus = _public_setup()
    ngram_index_build(tok, nt, index)
    d, n = _docs([[4, 5, 6, 7]])
    corpus_append(corpus, d, n)
    out = ngram_index_propose(tok, nt, index, num_speculative_tokens=3, corpus=corpus)
    assert _drafts(out, 0) == [2, 3, 1] and _drafts(out, 1) == [4, 5]
    # row 1 commits "6": the own history has no "5 6", the corpus does
    tok[1, 4] = 6
    nt[1] = 5
    ngram_index_extend(tok, nt, index, torch.tensor([1], dtype=torch.int32))
    out = ngram_index_propose(tok, nt, index, num_speculative_tokens=3, corpus=corpus)
    assert _drafts(out, 1) == [7] and out.draft_source.tolist() == [1, 2]


def test_poisoned_outputs_are_all_written(monkeypatch, kernel_device):
    def alloc(shape, dtype, device):
        return torch.full(shape, 77, dtype=dtype, device=device)

    monkeypatch.setattr(triton_ix, "_empty", alloc)
    tok, nt = _history([[1, 2, 1], [5], [3, 3, 3, 3]], width=6)
    for impl in ("triton", "reference"):
        s = State(impl, 3, 6, min_n=1, max_n=2, C=8, device=kernel_device)
        s.append(*_docs([[5, 9, 9], [2, 2]]))
        s.build(tok, nt)
        req = torch.tensor([0, -1, 1, 2], dtype=torch.int32)
        out = s.propose(tok, nt, req, k=3)
        if impl == "triton":
            got = out
    assert all(torch.equal(a, b) for a, b in zip(got, out, strict=True))


def test_opcheck():
    tok, nt, index, corpus = _public_setup()
    req = torch.tensor([1, 0], dtype=torch.int32)
    cap = torch.tensor([2, 3], dtype=torch.int32)
    for op, args, kw in [
        ("ngram_index_build", (tok, nt, req, index.table, index.length), {}),
        ("ngram_index_extend", (tok, nt, None, index.table, index.length), {}),
    ]:
        torch.library.opcheck(
            getattr(torch.ops.specdec, op).default, args, {"min_n": 1, "max_n": 3, **kw}
        )
    d, n = _docs([[4, 5, 6, 7], [1, 2]])
    cargs = (corpus.tokens, corpus.meta, corpus.index, corpus.state)
    torch.library.opcheck(
        torch.ops.specdec.corpus_append.default, (d, n, None, *cargs), {"min_n": 1, "max_n": 3}
    )
    ngram_index_build(tok, nt, index)
    for ctensors in [cargs, (None,) * 4]:
        torch.library.opcheck(
            torch.ops.specdec.ngram_index_propose.default,
            (tok, nt, index.table, index.length, req, cap, *ctensors),
            dict(min_n=1, max_n=3, num_speculative_tokens=3, max_model_len=12, tie_break="last"),
        )


def test_torch_compile_fullgraph_step():
    tok, nt, index, corpus = _public_setup()
    ngram_index_build(tok, nt, index)
    d, n = _docs([[4, 5, 6, 7]])
    done = torch.tensor([-1, 0], dtype=torch.int32)

    def step(tok, nt, d, n, done):
        ngram_index_extend(tok, nt, index)
        out = ngram_index_propose(tok, nt, index, num_speculative_tokens=3, corpus=corpus)
        corpus_append(corpus, d, n, done)
        return out.draft_token_ids, out.num_draft_tokens, out.draft_source

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    first = compiled(tok, nt, d, n, done)
    assert _drafts(first, 0) == [2, 3, 1]
    assert corpus.state.tolist() == [4, 0]
    eager = step(tok, nt, d, n, done)  # the corpus now holds the document twice
    again = compiled(tok, nt, d, n, done)
    assert all(torch.equal(a, b) for a, b in zip(again, eager, strict=True))
    assert corpus.state.tolist() == [12, 0]


def _bad(fn, **kw):
    tok, nt, index, corpus = _public_setup()
    ngram_index_build(tok, nt, index)
    base = {"token_ids": tok, "num_tokens": nt, "index": index}
    if fn is ngram_index_propose:
        base.update(num_speculative_tokens=2, corpus=corpus)
    if fn is corpus_append:
        base = {"corpus": corpus, "doc_tokens": tok, "doc_lens": nt}
    base.update(kw)
    return fn(**base)


_IX = new_ngram_index(2, 10, min_n=1, max_n=3)
_BAD_CORPUS = new_corpus(4, min_n=1, max_n=3)._replace(index=torch.zeros(3, 5, dtype=torch.int32))


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
        (
            ngram_index_propose,
            dict(num_tokens=torch.tensor([7, 3], dtype=torch.int32)),
            "index.length must equal num_tokens",
        ),
        (
            ngram_index_propose,
            dict(num_speculative_tokens=-1),
            "num_speculative_tokens must be >= 0",
        ),
        (ngram_index_propose, dict(tie_break="middle"), "tie_break must be one of"),
        (ngram_index_propose, dict(max_model_len=0), "max_model_len must be >= 1"),
        (
            ngram_index_propose,
            dict(max_draft_tokens=torch.tensor([1, -1], dtype=torch.int32)),
            "max_draft_tokens must be >= 0",
        ),
        (ngram_index_propose, dict(corpus=new_corpus(4, min_n=2, max_n=3)), "corpus n range"),
        (ngram_index_propose, dict(corpus="corpus"), "corpus must be a Corpus"),
        (
            corpus_append,
            dict(doc_lens=torch.tensor([11, 1], dtype=torch.int32)),
            r"doc_lens must lie in \[0, 10\]",
        ),
        (
            corpus_append,
            dict(doc_lens=torch.zeros(2, dtype=torch.int64)),
            "doc_lens must have dtype int32",
        ),
        (corpus_append, dict(corpus=_BAD_CORPUS), "corpus.index must have dtype int64"),
    ],
)
def test_bad_input_raises_value_error(fn, overrides, match):
    with pytest.raises(ValueError, match=match):
        _bad(fn, **overrides)


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
