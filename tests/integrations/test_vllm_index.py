"""The proposer's own-history index follows vLLM's persistent batch: drafts identical to
vLLM's ``ngram`` method (a rescan every step) under random schedules of admissions,
growth, finished requests, condensing, swaps and preemptions; and the opt-in corpus takes
finished requests, never preempted ones.

``Batch`` plays vLLM's ``InputBatch`` as far as a proposer sees it: the rows of
``token_ids_cpu`` (stale tokens past each history), ``num_tokens_no_spec``, requests
admitted into the next free row, removed (finished or preempted) and the last row moved
into the hole (``condense``), rows swapped (``swap_states``), a preempted request admitted
again later, maybe into another row, with the same history.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_vllm_ngram import MAX_NUM_SEQS, proposers, stand_in_config

from specdec_kernels import ops
from specdec_kernels.integrations.vllm import NgramProposer

L = 96  # max_model_len


class Batch:
    def __init__(self, rng):
        self.rng = rng
        self.tok = rng.integers(0, 1000, size=(MAX_NUM_SEQS, L), dtype=np.int32)  # stale
        self.num = np.zeros(MAX_NUM_SEQS, dtype=np.int32)
        self.rows: list[int] = []  # request id per row, rows 0 .. B-1
        self.hist: dict[int, list[int]] = {}
        self.preempted: list[int] = []
        self.next_id = 0

    def admit(self, rid=None):
        if len(self.rows) == MAX_NUM_SEQS:
            return
        if rid is None:  # a new request: a prompt of a small vocabulary (n-grams repeat)
            rid, self.next_id = self.next_id, self.next_id + 1
            vocab = int(self.rng.choice([2, 3, 5, 40]))
            self.hist[rid] = self.rng.integers(
                0, vocab, size=int(self.rng.integers(1, 40))
            ).tolist()
        r = len(self.rows)
        h = self.hist[rid]
        self.tok[r, : len(h)] = h
        self.num[r] = len(h)
        self.rows.append(rid)

    def remove(self, i, *, preempt):
        rid = self.rows[i]
        last = len(self.rows) - 1
        if i != last:  # condense: the last row moves into the hole (its prefix only)
            n = self.num[last]
            self.tok[i, :n] = self.tok[last, :n]
            self.num[i] = n
            self.rows[i] = self.rows[last]
        self.rows.pop()
        if preempt:
            self.preempted.append(rid)
        return rid

    def swap(self, i, j):
        self.tok[[i, j]] = self.tok[[j, i]]
        self.num[[i, j]] = self.num[[j, i]]
        self.rows[i], self.rows[j] = self.rows[j], self.rows[i]

    def grow(self):
        for r, rid in enumerate(self.rows):
            h = self.hist[rid]
            room = L - len(h)
            for _ in range(min(room, int(self.rng.integers(0, 6)))):
                h.append(h[int(self.rng.integers(0, len(h)))])  # copies: n-grams repeat
            self.tok[r, : len(h)] = h
            self.num[r] = len(h)


def _step(batch, ours, theirs, k):
    B = len(batch.rows)
    sampled = [[] if batch.rng.random() < 0.1 else [1] for _ in range(B)]
    got = ours.propose(sampled, batch.num, batch.tok, slot_mappings=None)
    want = theirs.propose(k, sampled, batch.num, batch.tok, slot_mappings=None)
    assert got == want


def _random_schedule(batch, rng, step, steps=30):
    """Three admissions, then ``steps`` random schedule events, ``step(batch)`` after each
    one that leaves requests in the batch."""
    for _ in range(3):
        batch.admit()
    for _ in range(steps):
        op = rng.choice(["admit", "finish", "preempt", "resume", "swap", "grow", "grow"])
        if op == "admit":
            batch.admit()
        elif op in ("finish", "preempt") and batch.rows:
            batch.remove(int(rng.integers(0, len(batch.rows))), preempt=op == "preempt")
        elif op == "resume" and batch.preempted:
            batch.admit(batch.preempted.pop(int(rng.integers(0, len(batch.preempted)))))
        elif op == "swap" and len(batch.rows) > 1:
            i, j = rng.choice(len(batch.rows), 2, replace=False)
            batch.swap(int(i), int(j))
        else:
            batch.grow()
        if batch.rows:
            step(batch)


@pytest.mark.parametrize("config", [(1, 3, 4), (2, 5, 3)], ids=["min1-max3-k4", "min2-max5-k3"])
@settings(max_examples=25)
@given(seed=st.integers(0, 2**31 - 1))
def test_index_drafts_like_vllm_under_random_schedules(config, seed):
    rng = np.random.default_rng(seed)
    ours = NgramProposer(stand_in_config(*config, L, custom_class=True))  # a fresh index
    theirs = proposers(*config, L)[1]
    _random_schedule(Batch(rng), rng, lambda batch: _step(batch, ours, theirs, config[2]))


def _corpus_proposer(**extra):
    section = {"prompt_lookup_min": 2, "prompt_lookup_max": 3, "corpus_tokens": 4096, **extra}
    return NgramProposer(stand_in_config(2, 3, 4, L, custom_class=True, extra=section))


def _propose(ours, batch):
    return ours.propose([[1]] * len(batch.rows), batch.num, batch.tok, slot_mappings=None)


@pytest.mark.parametrize("documents", ["finished", "departed"])
def test_corpus_takes_finished_requests_and_never_preempted_ones(documents):
    EOS = 7
    ours = _corpus_proposer(stop_token_ids=[EOS], corpus_documents=documents)
    batch = Batch(np.random.default_rng(0))
    batch.hist = {0: [10, 11, 12, 13, 14, 15, 16, EOS], 1: [20, 21, 22, 23, 24, 25], 2: [1, 2]}
    batch.next_id = 3
    for rid in (0, 1, 2):
        batch.admit(rid)
    _propose(ours, batch)
    batch.remove(batch.rows.index(0), preempt=False)  # finished: it ends with EOS
    batch.remove(batch.rows.index(1), preempt=True)  # preempted (request 2 moved into a hole)
    _propose(ours, batch)  # the proposer sees them gone
    # a new request whose suffix occurs only in those histories
    batch.hist[3] = [9, 12, 13]
    batch.hist[4] = [9, 22, 23]
    batch.admit(3)
    batch.admit(4)
    drafts = _propose(ours, batch)
    assert drafts[1] == [14, 15, 16, EOS]  # from the finished request
    # the preempted request (no stop token at its end) joins only with "departed"
    assert drafts[2] == ([24, 25] if documents == "departed" else [])


def test_corpus_and_index_options_are_checked():
    with pytest.raises(ValueError, match="corpus_tokens needs the own-history index"):
        _corpus_proposer(index=False)
    with pytest.raises(ValueError, match="corpus_documents must be one of"):
        _corpus_proposer(corpus_documents="all")
    with pytest.raises(ValueError, match="stop_token_ids must be a list"):
        _corpus_proposer(stop_token_ids=[-1])
    with pytest.raises(ValueError, match="over max_index_bytes"):
        _corpus_proposer(max_index_bytes=1024)
    off = _corpus_proposer(corpus_tokens=0, index=False)
    assert off.settings.index is False and off.settings.corpus_tokens == 0


def test_index_takes_a_length_array_shorter_than_the_token_buffer():
    # the docstring allows token_ids_cpu [>= B, L] and num_tokens_no_spec [>= B] apart
    rows, width = 4, 64
    tokens = np.tile(np.arange(8, dtype=np.int32), (rows + 3, width // 8))
    lengths = np.array([20, 30, 17, 41], dtype=np.int32)
    sampled = [[1]] * rows
    drafts = {}
    for index in (True, False):
        extra = {"prompt_lookup_min": 2, "prompt_lookup_max": 3, "index": index}
        ours = NgramProposer(stand_in_config(2, 3, 4, width, custom_class=True, extra=extra))
        drafts[index] = ours.propose(sampled, lengths, tokens, slot_mappings=None)
    assert drafts[True] == drafts[False]
    assert all(len(d) == 4 for d in drafts[True])


def test_length_arrays_of_the_batch_size_keep_the_index_and_the_corpus():
    # num_tokens_no_spec of exactly B entries, B changing from step to step, must draft as
    # the full array does: the state is kept (not rebuilt) and the finished request joins
    EOS = 7

    def run(trim):
        ours = _corpus_proposer(stop_token_ids=[EOS])
        tok, num = np.zeros((4, L), dtype=np.int32), np.zeros(4, dtype=np.int32)
        tok[0, :6], num[0] = [10, 11, 12, 13, 14, EOS], 6  # finishes
        tok[1, :3], num[1] = [20, 21, 22], 3
        steps = []
        for B in (2, 1, 2):
            if B == 1:  # the finished request leaves; the other is condensed into row 0
                tok[0, :3], num[0], num[1] = [20, 21, 22], 3, 0
            elif steps:  # a new request whose suffix is only in the finished one
                tok[1, :3], num[1] = [30, 11, 12], 3
            lengths = num[:B] if trim else num
            steps.append(ours.propose([[1]] * B, lengths, tok, slot_mappings=None))
        return steps

    assert run(True) == run(False)
    assert run(True)[-1][1] == [13, 14, EOS]


def _fresh_frequency_drafts(batch, sampled, k, D):
    """What ``scoring="frequency"`` drafts from a frequency index built afresh this step."""
    B = len(batch.rows)
    tok, num = torch.from_numpy(batch.tok[:B].copy()), torch.from_numpy(batch.num[:B].copy())
    index = ops.new_ngram_index(B, L, min_n=1, max_n=D, scoring="frequency")
    ops.ngram_index_build(tok, num, index=index)
    caps = torch.tensor([k if s else 0 for s in sampled], dtype=torch.int32)
    out = ops.ngram_propose(tok, num, min_n=1, max_n=D, num_speculative_tokens=k,
                            max_model_len=L, max_draft_tokens=caps, index=index,
                            scoring="frequency")  # fmt: skip
    return [d[:c] for d, c in zip(out.draft_token_ids.tolist(), out.num_draft_tokens.tolist(),
                                  strict=True)]  # fmt: skip


@settings(max_examples=15)
@given(seed=st.integers(0, 2**31 - 1))
def test_frequency_scoring_follows_the_batch_under_random_schedules(seed):
    # the kept index drafts what an index built from scratch every step drafts
    rng = np.random.default_rng(seed)
    k, D = 4, 12
    section = {"scoring": "frequency", "prompt_lookup_max": D}
    ours = NgramProposer(stand_in_config(1, D, k, L, custom_class=True, extra=section))
    assert (ours.settings.min_n, ours.settings.max_n) == (1, D)
    drafted = []

    def step(batch):
        sampled = [[] if rng.random() < 0.1 else [1] for _ in batch.rows]
        got = ours.propose(sampled, batch.num, batch.tok, slot_mappings=None)
        assert got == _fresh_frequency_drafts(batch, sampled, k, D)
        drafted.append(sum(map(len, got)))

    batch = Batch(rng)
    _random_schedule(batch, rng, step)
    assert sum(drafted) > 0 or len(batch.hist) < 2


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"scoring": "often"}, "scoring must be one of"),
        ({"scoring": "frequency", "index": False}, "needs the own-history index"),
        ({"scoring": "frequency", "corpus_tokens": 23}, r"must be >= 8 \(prompt_lookup_min \+ 2\)"),
        ({"scoring": "frequency", "min_token_prob": 1.5}, r"min_token_prob must be a real number"),
        ({"scoring": "frequency", "min_token_prob": True}, r"min_token_prob must be a real number"),
        ({"scoring": "frequency", "max_spec_factor": -1}, "max_spec_factor must be a real number"),
        ({"scoring": "frequency", "prompt_lookup_max": 2000}, "must be <= 1024"),
        ({"scoring": "frequency", "prompt_lookup_min": 5, "prompt_lookup_max": 5}, "min_n < max_n"),
        ({"scoring": "frequency", "tie_break": "last"}, "tie_break is an option of scoring"),
        ({"min_token_prob": 0.2}, "options of scoring='frequency' only"),
    ],
)
def test_frequency_options_are_checked(extra, match):
    with pytest.raises(ValueError, match=match):
        NgramProposer(stand_in_config(2, 3, 4, L, custom_class=True, extra=extra))


def test_frequency_options_reach_the_proposer():
    section = {"scoring": "frequency", "min_token_prob": 0.5, "max_spec_factor": 2,
               "max_spec_offset": 1}  # fmt: skip
    s = NgramProposer(stand_in_config(1, 3, 4, L, custom_class=True, extra=section)).settings
    assert (s.scoring, s.min_n, s.max_n, s.frequency) == ("frequency", 1, 64, (0.5, 2.0, 1.0))


def test_frequency_corpus_takes_finished_requests():
    EOS = 7
    section = {"scoring": "frequency", "prompt_lookup_max": 8, "corpus_tokens": 4096,
               "stop_token_ids": [EOS], "max_spec_factor": 4}  # fmt: skip
    ours = NgramProposer(stand_in_config(1, 8, 4, L, custom_class=True, extra=section))
    batch = Batch(np.random.default_rng(0))
    batch.hist = {0: [10, 11, 12, 13, 14, 15, 16, EOS], 1: [20, 21, 22, 23, 24, 25]}
    batch.next_id = 2
    for rid in (0, 1):
        batch.admit(rid)
    _propose(ours, batch)
    batch.remove(batch.rows.index(0), preempt=False)  # finished: it ends with EOS
    batch.remove(batch.rows.index(1), preempt=True)  # preempted: never joins
    _propose(ours, batch)
    batch.hist[2], batch.hist[3] = [9, 12, 13], [9, 22, 23]
    batch.admit(2)
    batch.admit(3)
    assert _propose(ours, batch) == [[14, 15, 16, EOS], []]
