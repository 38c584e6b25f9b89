"""The frequency corpus (family ``frequency_corpus``): ``corpus_append`` on a
``FrequencyCorpus`` against the reference, its budget and FIFO eviction, the cost bound
per call, proposals from the corpus (own history vs corpus), shared across paths, errors.

The registration tiers are tests/test_conformance.py's; proposals without a corpus are
tests/test_frequency.py's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec_kernels import ops
from specdec_kernels.constants import (
    FREQUENCY_CORPUS_STATE,
    FREQUENCY_CORPUS_WORK,
    frequency_corpus_piece,
)
from specdec_kernels.kernels import frequency as _triton
from specdec_kernels.kernels import frequency_corpus as _triton_corpus
from specdec_kernels.reference import frequency_corpus as _ref_corpus
from tests.ngram_helpers import history

I32 = torch.int32
F = {name: i for i, name in enumerate(FREQUENCY_CORPUS_STATE)}


def _random_calls(rng, calls, V, width=30):
    """``calls`` batches of 1-3 documents (strided rows, ragged lengths, padding rows)."""
    out = []
    for _ in range(calls):
        nd, W = int(rng.integers(1, 4)), int(rng.integers(1, width))
        full = torch.tensor(rng.integers(0, V, (nd, W + 2)), dtype=I32)
        req = torch.tensor([*range(nd)][::-1] + [-1], dtype=I32) if rng.random() < 0.5 else None
        out.append((full[:, 1 : W + 1], torch.tensor(rng.integers(0, W + 1, nd), dtype=I32), req))
    return out


def _pieces(calls, C, M=None):
    """Every piece appended, oldest first (a document of n tokens: pieces of
    ``min(C // 8, M // 16) - 1``)."""
    size, out = frequency_corpus_piece(C, 2 * C + 1 if M is None else M), []
    for docs, lens, req in calls:
        for r in range(docs.shape[0]) if req is None else req.tolist():
            if r >= 0:
                d = docs[r, : int(lens[r])].tolist()
                out += [d[s : s + size] for s in range(0, len(d), size)]
    return out


def _sizes(rng, short):
    """``(C, dict(nodes=M, index_slots=S), V, calls)``: the default budgets on small
    repetitive streams, or a node budget short of what the text needs (2 token ids: few
    nodes; 50: up to 2 a token), so that rebuilds start on nodes, with half the time the
    smallest table that holds it (full when the nodes are)."""
    if not short:
        C, V = int(rng.choice([24, 25, 40, 64, 100])), int(rng.integers(1, 4))
        return C, {}, V, _random_calls(rng, int(rng.integers(1, 12)), V)
    C, V, M = int(rng.choice([128, 256])), int(rng.choice([2, 50])), int(rng.integers(48, 100))
    size = dict(nodes=M, index_slots=1 << (M - 1).bit_length() if rng.random() < 0.5 else None)
    return C, size, V, _random_calls(rng, int(rng.integers(4, 16)), V, 80)


@pytest.mark.parametrize("short", [False, True], ids=["nodes-2C+1", "nodes-short"])
@pytest.mark.parametrize("seed", range(25))
def test_cpu_state_and_proposals_equal_the_reference(seed, short):
    rng = np.random.default_rng(seed)
    C, size, V, calls = _sizes(rng, short)
    D = int(rng.integers(2, 8))
    corpus = ops.new_corpus(C, min_n=1, max_n=D, scoring="frequency", **size)
    state = [t.clone() for t in corpus[:7]]
    for docs, lens, req in calls:
        ops.corpus_append(docs, lens, req, corpus=corpus)
        _ref_corpus.frequency_corpus_append(docs, lens, req, state, min_n=1, max_n=D)
        assert all(torch.equal(a, b) for a, b in zip(state, corpus[:7], strict=True))
        live = _ref_corpus.live_documents(corpus[:7])
        assert sum(len(d) + 1 for d in live) <= C  # the budget holds after every call
        assert int(corpus.num_nodes.max()) <= corpus.nodes.shape[2]
    # FIFO: the live documents are the newest pieces, whole and in order
    pieces = _pieces(calls, C, size.get("nodes"))
    assert live == pieces[len(pieces) - len(live) :]
    tok, nt = history([rng.integers(0, V, int(rng.integers(0, 20))).tolist() for _ in range(3)],
                      width=20)  # fmt: skip
    index = ops.new_ngram_index(3, 20, min_n=1, max_n=D, scoring="frequency")
    ops.ngram_index_build(tok, nt, index=index)
    from tests.test_frequency import _propose

    kw = dict(k=int(rng.integers(0, 6)), corpus=corpus, min_token_prob=float(rng.choice([0, 0.3])),
              max_spec_factor=float(rng.choice([0.5, 1.0, 4.0])))  # fmt: skip
    assert _propose("ops", tok, nt, index, **kw) == _propose("reference", tok, nt, index, **kw)


@pytest.mark.parametrize("short", [False, True], ids=["nodes-2C+1", "nodes-short"])
@pytest.mark.parametrize("seed", range(4))
def test_triton_equals_the_cpu_bit_for_bit(seed, short, kernel_device):
    rng = np.random.default_rng(100 + seed)
    C, size, V, calls = _sizes(rng, short)
    D = int(rng.integers(2, 7))
    cpu = ops.new_corpus(C, min_n=1, max_n=D, scoring="frequency", **size)
    dev = ops.new_corpus(C, min_n=1, max_n=D, scoring="frequency", **size, device=kernel_device)
    for docs, lens, req in calls[: 4 if short else 7]:
        ops.corpus_append(docs, lens, req, corpus=cpu)
        on = [None if t is None else t.to(kernel_device) for t in (docs, lens, req)]
        _triton_corpus.frequency_corpus_append(*on, list(dev[:7]), min_n=1, max_n=D)
        assert all(torch.equal(a.cpu(), b) for a, b in zip(dev[:7], cpu[:7], strict=True))
    tok, nt = history([rng.integers(0, V, 12).tolist() for _ in range(3)], width=12)
    index = ops.new_ngram_index(3, 12, min_n=1, max_n=D, scoring="frequency")
    ops.ngram_index_build(tok, nt, index=index)
    kw = dict(min_n=1, max_n=D, num_speculative_tokens=4, max_model_len=None, min_token_prob=0.1,
              max_spec_factor=2.0, max_spec_offset=0.0)  # fmt: skip
    on = [t.to(kernel_device) for t in (tok, nt)]
    got = _triton.frequency_propose(*on, None, None, [t.to(kernel_device) for t in index[:5]],
                                    list(dev[:7]), **kw)  # fmt: skip
    want = ops.ngram_propose(tok, nt, index=index, corpus=cpu, scoring="frequency",
                             **{k: v for k, v in kw.items() if k != "max_model_len"})  # fmt: skip
    assert all(torch.equal(a.cpu(), b) for a, b in zip(got, want, strict=True))


def test_the_corpus_wins_on_a_higher_score_and_ties_go_to_the_own_history():
    corpus = ops.new_corpus(64, min_n=1, max_n=6, scoring="frequency")
    ops.corpus_append(*history([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]]), corpus=corpus)
    # "2 3" -> 4 5 in the corpus twice (probabilities 1, 1); the own history has "2 3" -> 9
    # once, before its own tail (1/2)
    tok, nt = history([[2, 3, 9, 2, 3], [7, 7]], width=6)
    index = ops.new_ngram_index(2, 6, min_n=1, max_n=6, scoring="frequency")
    ops.ngram_index_build(tok, nt, index=index)
    out = ops.ngram_propose(tok, nt, min_n=1, max_n=6, num_speculative_tokens=2, index=index,
                            corpus=corpus, scoring="frequency")  # fmt: skip
    assert out.draft_token_ids.tolist() == [[4, 5], [7, -1]]
    assert out.draft_source.tolist() == [2, 1] and out.match_len.tolist() == [2, 1]
    # a corpus that scores the same as the own history loses: "7" -> 7 at 1/2 in both
    ops.corpus_append(*history([[7, 7]]), corpus=corpus)
    out = ops.ngram_propose(tok[1:], nt[1:], min_n=1, max_n=6, num_speculative_tokens=1,
                            index=ops.FrequencyIndex(*(t[1:] for t in index[:5]), 1, 6),
                            corpus=corpus, scoring="frequency")  # fmt: skip
    assert out.draft_source.tolist() == [1]


def test_each_call_costs_at_most_work_plus_one_appends_per_added_slot(monkeypatch):
    counted = []
    real = _ref_corpus._Corpus._count

    def count(self, s, p, Dp):
        counted.append(1)
        return real(self, s, p, Dp)

    monkeypatch.setattr(_ref_corpus._Corpus, "_count", count)
    rng = np.random.default_rng(7)
    C = 64
    state = list(ops.new_corpus(C, min_n=1, max_n=4, scoring="frequency")[:7])
    swaps = 0
    for docs, lens, req in _random_calls(rng, 40, 3):
        counted.clear()
        active = int(state[6][F["active"]])
        _ref_corpus.frequency_corpus_append(docs, lens, req, state, min_n=1, max_n=4)
        swaps += int(state[6][F["active"]]) != active
        pieces = _pieces([(docs, lens, req)], C)
        added = sum(len(p) + 1 for p in pieces)
        assert len(counted) <= (1 + FREQUENCY_CORPUS_WORK) * added
    assert swaps > 3  # evictions happened
    # a short node budget: a piece that empties the corpus is counted once more
    events = _count_events(monkeypatch)
    C, M = 1024, 144
    state = list(ops.new_corpus(C, min_n=1, max_n=4, scoring="frequency", nodes=M)[:7])
    for doc in _mixed_stream(0):
        counted.clear()
        _ref_corpus.frequency_corpus_append(*history([doc]), None, state, min_n=1, max_n=4)
        added = sum(len(p) + 1 for p in _pieces([(*history([doc]), None)], C, M))
        assert len(counted) <= (2 + FREQUENCY_CORPUS_WORK) * added
    assert "emptied" in events


def _mixed_stream(seed):
    """Documents of one repeated token (few nodes) and of random tokens (up to 2 a token):
    with a short node budget, a store runs out of nodes (seed 0, C = 1024, M = 144)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1 if rng.random() < 0.5 else 1000, int(rng.integers(1, 60))).tolist()
            for _ in range(int(rng.integers(5, 30)))]  # fmt: skip


def _count_events(monkeypatch):
    """Record the reference's rebuild starts (by slots or nodes) and emptied corpora."""
    events = []
    try_piece, maybe_rebuild = _ref_corpus._Corpus._try_piece, _ref_corpus._Corpus._maybe_rebuild

    def spy_try(self, piece):
        lost = try_piece(self, piece)
        if lost:
            events.append("emptied")
        return lost

    def spy_rebuild(self):
        was = self.st[F["rebuilding"]]
        maybe_rebuild(self)
        if not was and self.st[F["rebuilding"]]:
            events.append("slots" if 8 * self.st[F["size"]] > 6 * self.C else "nodes")

    monkeypatch.setattr(_ref_corpus._Corpus, "_try_piece", spy_try)
    monkeypatch.setattr(_ref_corpus._Corpus, "_maybe_rebuild", spy_rebuild)
    return events


def test_a_store_out_of_nodes_empties_the_corpus_and_the_piece_starts_it(
    monkeypatch, kernel_device
):
    events = _count_events(monkeypatch)
    C, M = 1024, 144
    cpu = ops.new_corpus(C, min_n=1, max_n=4, scoring="frequency", nodes=M)
    dev = ops.new_corpus(C, min_n=1, max_n=4, scoring="frequency", nodes=M, device=kernel_device)
    state = [t.clone() for t in cpu[:7]]
    piece = frequency_corpus_piece(C, M)
    for doc in _mixed_stream(0):
        before = len(events)
        ops.corpus_append(*history([doc]), corpus=cpu)
        on = [t.to(kernel_device) for t in history([doc])]
        _triton_corpus.frequency_corpus_append(*on, None, list(dev[:7]), min_n=1, max_n=4)
        _ref_corpus.frequency_corpus_append(*history([doc]), None, state, min_n=1, max_n=4)
        assert all(torch.equal(a, b) for a, b in zip(state, cpu[:7], strict=True))
        assert all(torch.equal(a.cpu(), b) for a, b in zip(dev[:7], cpu[:7], strict=True))
        assert int(cpu.num_nodes.max()) <= M
        if "emptied" in events[before:]:  # only this document's newest pieces are left
            live = _ref_corpus.live_documents(cpu[:7])
            pieces = [doc[s : s + piece] for s in range(0, len(doc), piece)]
            assert live == pieces[len(pieces) - len(live) :]
    assert "emptied" in events and "nodes" in events


def test_the_default_node_budget_never_decides(monkeypatch):
    # 2 C + 1 nodes: a rebuild starts on slots only and no store runs out, whatever the text
    events = _count_events(monkeypatch)
    for seed in range(6):
        state = list(ops.new_corpus(256, min_n=1, max_n=4, scoring="frequency")[:7])
        for doc in _mixed_stream(seed) * 3:
            _ref_corpus.frequency_corpus_append(*history([doc]), None, state, min_n=1, max_n=4)
    assert set(events) == {"slots"}


def test_a_document_longer_than_the_budget_keeps_its_newest_pieces():
    corpus = ops.new_corpus(32, min_n=1, max_n=4, scoring="frequency")
    doc = list(range(100))
    ops.corpus_append(*history([doc]), corpus=corpus)
    live = _ref_corpus.live_documents(corpus[:7])
    flat = [t for d in live for t in d]
    assert flat == doc[len(doc) - len(flat) :] and 0 < sum(len(d) + 1 for d in live) <= 32
    assert all(len(d) <= 3 for d in live)  # pieces of C // 8 - 1 tokens


def test_unchecked_garbage_state_neither_hangs_nor_writes_outside_its_arrays():
    docs, lens = history([[1, 2, 1, 2, 1, 2]])
    for fill in (0, 5, -3, 10**6):
        corpus = ops.new_corpus(24, min_n=1, max_n=4, scoring="frequency")
        for t in corpus[:7]:
            t.fill_(fill)
        ops.corpus_append(docs, lens, corpus=corpus, validate=False)
        tok, nt = history([[1, 2, 1]], width=4)
        index = ops.new_ngram_index(1, 4, min_n=1, max_n=4, scoring="frequency")
        out = ops.ngram_propose(tok, nt, min_n=1, max_n=4, num_speculative_tokens=2, index=index,
                                corpus=corpus, scoring="frequency", validate=False)  # fmt: skip
        assert out.draft_token_ids.shape == (1, 2)


@pytest.mark.parametrize("impl", ["ops", "triton"])
def test_counters_that_would_overflow_a_store_stop_the_call_inside_the_arrays(impl, kernel_device):
    # found by review: counters in range at the call's start, but a second piece would be
    # staged past the token array (validate=False); the kernels re-check before each piece
    dev = kernel_device if impl == "triton" else torch.device("cpu")
    corpus = ops.new_corpus(32, min_n=1, max_n=3, scoring="frequency", device=dev)
    corpus.state[F["active"]], corpus.state[F["reserved1"]] = 1, 32  # T - C // 8
    docs, lens = torch.arange(6, dtype=I32, device=dev)[None], torch.tensor([6], dtype=I32)
    lens = lens.to(dev)
    if impl == "ops":
        ops.corpus_append(docs, lens, corpus=corpus, validate=False)
    else:
        _triton_corpus.frequency_corpus_append(docs, lens, None, list(corpus[:7]), min_n=1,
                                               max_n=3)  # fmt: skip
    assert int(corpus.state[F["reserved1"]]) <= corpus.tokens.shape[1]


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(capacity=23), r"must be >= 8 \(min_n \+ 2\) = 24 slots"),
        (dict(index_slots=96), "index_slots must be a power of two >= the node budget"),
        (dict(index_slots=64, nodes=100), r"must be a power of two >= the node budget \(100\)"),
        (dict(nodes=47), r"must be in \[16 \(min_n \+ 2\), 2 C \+ 1\] = \[48, 129\]"),
        (dict(nodes=130), r"= \[48, 129\]"),
        (dict(nodes=64, scoring="longest"), 'nodes sizes a corpus of scoring="frequency" only'),
        (dict(max_n=1025), "must be <= 1024"),
        (dict(scoring="often"), "scoring must be one of"),
    ],
)
def test_bad_constructor_arguments(kw, match):
    args = {"capacity": 64, "min_n": 1, "max_n": 4, "scoring": "frequency", **kw}
    with pytest.raises(ValueError, match=match):
        ops.new_corpus(args.pop("capacity"), **args)


def test_malformed_corpus_and_rejected_calls_leave_it_unchanged():
    corpus = ops.new_corpus(32, min_n=1, max_n=4, scoring="frequency")
    docs, lens = history([[1, 2, 3], [4, 5]])
    ops.corpus_append(docs, lens, corpus=corpus)
    before = [t.clone() for t in corpus[:7]]
    with pytest.raises(ValueError, match="doc_lens"):
        ops.corpus_append(docs, lens + 5, corpus=corpus)
    with pytest.raises(ValueError, match="corpus.docs must have shape"):
        ops.corpus_append(docs, lens, corpus=corpus._replace(docs=corpus.docs[:-1]))
    with pytest.raises(ValueError, match=r"corpus.nodes.shape\[2\] \(the node budget"):
        ops.corpus_append(
            docs, lens, corpus=corpus._replace(nodes=corpus.nodes[:, :, :47].contiguous())
        )
    assert all(torch.equal(a, b) for a, b in zip(before, corpus[:7], strict=True))
    tok, nt = history([[1, 2]], width=3)
    with pytest.raises(ValueError, match="a FrequencyIndex or FrequencyCorpus serves"):
        ops.ngram_propose(tok, nt, min_n=1, max_n=4, num_speculative_tokens=2, corpus=corpus)


def test_the_triggers_do_not_wrap_for_a_corpus_of_hundreds_of_millions_of_slots():
    # found by review: C and M reach the Triton kernel as int32, so 6 M wrapped past 357M
    # nodes (the default M of C >= 179M slots) and a nearly empty store started rebuilding
    import triton

    from specdec_kernels.cpu import frequency_corpus as _cpu_corpus

    @triton.jit
    def maybe_rebuild(docs, state, used, C, M, Q):
        _triton_corpus._maybe_rebuild(docs, state, used, C, M, Q)

    C, Q = 180_000_000, 8
    for impl in ("triton", "cpu"):
        docs = torch.zeros((Q, 3), dtype=torch.int64)
        docs[0, 0] = 5  # one document of 5 tokens: 6 slots, 12 nodes
        state = torch.zeros(len(FREQUENCY_CORPUS_STATE), dtype=torch.int64)
        state[F["size"]], state[F["tail"]] = 6, 1
        used = torch.tensor([12, 1], dtype=I32)
        if impl == "triton":
            maybe_rebuild[(1,)](docs, state, used, C, 2 * C + 1, Q)
        else:
            _cpu_corpus._maybe_rebuild(docs.numpy(), state.numpy(), used.numpy(), C, 2 * C + 1)
        assert int(state[F["rebuilding"]]) == 0, impl


def test_a_state_of_a_budget_below_its_min_n_is_refused_by_name():
    corpus = ops.new_corpus(32, min_n=1, max_n=4, scoring="frequency")
    with pytest.raises(ValueError, match=r"budget of C = 32 slots, below 8 \(min_n \+ 2\) = 40"):
        ops.corpus_append(*history([[1, 2]]), corpus=corpus._replace(min_n=3))
