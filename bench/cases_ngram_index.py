"""``ngram_index`` cases: one decoding step (extend + propose) vs a full rescan of the history.

A step appends ``k + 1`` tokens to every request (what a verify step commits at most),
extends the own-history index with them and proposes (``ngram_index_extend`` +
``ngram_propose`` on the index, optionally with a shared corpus; ``one_call``: the same as
``ngram_propose(..., extend_index=True)``). Baselines in the same run:
``numba`` (single-pass KMP over every history, the kind of proposer a CPU engine runs) and
``full_scan`` (the library's ``ngram_propose`` CPU path), both over the same histories.
Their cost grows with the history length; the step's does not.

The timed op call itself mutates the state: ``setup`` (untimed) commits the next ``k + 1``
real tokens of each row before every op call, so the history grows by at most
``(MAX_ROUNDS + warm-up) x (k + 1)`` tokens during a case (reported). Initial indexing
(``ngram_index_build`` over ``B x L`` tokens) and filling the corpus are timed once, when a
case is built, and reported in its note.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from bench import data
from bench.harness import OP, Case, Result, measure_interleaved
from specdec_kernels.ops import (
    corpus_append,
    new_corpus,
    new_ngram_index,
    ngram_index_build,
    ngram_index_extend,
    ngram_propose,
)

OP_NAME = "ngram_index step"
MIN_N, MAX_N = 2, 5
B = 256
HISTORIES = (1024, 8192, 32768, 131072)
CORPUS_TOKENS = (0, 1 << 20)
K = 4
DOC_TOKENS = 4096  # corpus documents (finished requests) of this many tokens
SPECS = [{"B": B, "L": L, "k": K, "corpus": c} for L in HISTORIES for c in CORPUS_TOKENS]
# added with the numba CPU path: the small batches of a host-side proposer or a CPU engine
SPECS += [{"B": b, "L": L, "k": K, "corpus": 0} for b in (1, 8) for L in (1024, 32768)]
# added with ngram_propose(extend_index=True): the same step as one call
SPECS += [
    {"B": b, "L": L, "k": K, "corpus": 0, "one_call": True}
    for b, L in ((1, 1024), (1, 32768), (8, 1024), (8, 32768), (256, 1024), (256, 32768))
]
QUICK_SPECS = [{"B": 4, "L": 256, "k": 4, "corpus": 0}, {"B": 4, "L": 256, "k": 4, "corpus": 8192}]
BASELINES = ["numba", "full_scan"]
MAX_ROUNDS = 100  # timed rounds per implementation and case (each op call grows L by k + 1)
GROWTH = 2 * (MAX_ROUNDS + 8)  # steps of headroom: both corpus settings share one state


def numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def bytes_moved(B: int, k: int, corpus: bool) -> int:
    """Touched per step: per row and n one probe per new token (8 B slot + 4 B x max_n
    verification), one suffix probe (+ two corpus slots), and the drafts."""
    N = MAX_N - MIN_N + 1
    probe = 8 + 4 * MAX_N
    return B * (N * (k + 1) * probe + N * probe * (3 if corpus else 1) + 4 * (k + 1) + 4 * k)


class _History:
    """One set of persistent histories and its index, shared by the cases of one ``(B, L)``."""

    current: _History | None = None

    def __init__(self, B: int, L: int, k: int):
        room = GROWTH * (k + 1)
        self.token_ids, _ = data.ngram_histories(B, L + room)  # real text past L too
        self.num_tokens = torch.full((B,), L, dtype=torch.int32)
        self.L0, self.cap = L, L + room
        self.index = new_ngram_index(B, L + room, min_n=MIN_N, max_n=MAX_N)
        t0 = time.perf_counter()
        ngram_index_build(self.token_ids, self.num_tokens, index=self.index)
        self.build_s = time.perf_counter() - t0

    @classmethod
    def get(cls, B: int, L: int, k: int) -> _History:
        cur = cls.current
        if cur is None or cur.token_ids.shape[0] != B or cur.L0 != L:
            cls.current = None  # free the previous state first
            cls.current = cls(B, L, k)
        return cls.current

    def grow(self, k: int) -> None:
        """Commit the next k + 1 tokens of every row (rebuild from L0 if the room is used up)."""
        if int(self.num_tokens[0]) + k + 1 > self.cap:
            self.num_tokens.fill_(self.L0)
            ngram_index_build(self.token_ids, self.num_tokens, index=self.index)
        self.num_tokens.add_(k + 1)


def _corpus(C: int):
    """A corpus filled with C tokens of real text, documents of DOC_TOKENS tokens."""
    stream = data.token_stream()
    corpus = new_corpus(C, min_n=MIN_N, max_n=MAX_N)
    doc = min(DOC_TOKENS, C)
    count = max(1, C // doc)
    offs = (np.arange(count) * 7919 * 13 + 1_000_003) % (stream.shape[0] - doc)
    docs = torch.from_numpy(np.stack([stream[o : o + doc] for o in offs]))
    t0 = time.perf_counter()
    for i in range(0, count, 64):  # 64 finished requests per call
        part = docs[i : i + 64]
        corpus_append(part, torch.full((part.shape[0],), doc, dtype=torch.int32), corpus=corpus)
    return corpus, time.perf_counter() - t0


def build(spec: dict) -> Case:
    B_, L, k, C = spec["B"], spec["L"], spec["k"], spec["corpus"]
    hist = _History.get(B_, L, k)
    tok, nt, index = hist.token_ids, hist.num_tokens, hist.index
    corpus, corpus_s = _corpus(C) if C else (None, 0.0)
    kw = {"min_n": MIN_N, "max_n": MAX_N, "num_speculative_tokens": k}
    pending = [False]  # the op's last call consumed the committed tokens

    def setup():
        if pending[0]:
            hist.grow(k)
            pending[0] = False

    def op():
        if spec.get("one_call"):  # extend and propose in one call
            out = ngram_propose(tok, nt, **kw, index=index, corpus=corpus, extend_index=True)
        else:
            ngram_index_extend(tok, nt, index=index)
            out = ngram_propose(tok, nt, **kw, index=index, corpus=corpus)
        pending[0] = True
        return out

    impls = {OP: op}
    if numba_available():
        from bench.baselines.ngram_numba import ngram_propose_numba

        tok_np, nt_np = tok.numpy(), nt.numpy()  # views: they see the growth
        impls["numba"] = lambda: ngram_propose_numba(tok_np, nt_np, **kw)
    impls["full_scan"] = lambda: ngram_propose(tok, nt, **kw)

    def check() -> str:
        hist.grow(k)
        out = op()
        own = ngram_propose(tok, nt, **kw, index=index)
        want = ngram_propose(tok, nt, **kw)
        assert torch.equal(own.draft_token_ids, want.draft_token_ids), "index != ngram_propose"
        assert torch.equal(own.num_draft_tokens, want.num_draft_tokens), "index != ngram_propose"
        if "numba" in impls:
            nd, nc = impls["numba"]()
            assert np.array_equal(want.draft_token_ids.numpy(), nd), "ngram_propose != numba"
            assert np.array_equal(want.num_draft_tokens.numpy(), nc), "ngram_propose != numba"
        if corpus is None:
            assert torch.equal(out.draft_token_ids, want.draft_token_ids)
        src = out.draft_source
        what = "own-history proposals == ngram_propose == numba exactly"
        if corpus is not None:
            what += (
                f"; with the corpus {float((src == 2).float().mean()):.0%} of rows draft from "
                f"it ({float((src > 0).float().mean()):.0%} draft at all, "
                f"{float((want.num_draft_tokens > 0).float().mean()):.0%} without it)"
            )
        n_grams = B_ * (MAX_N - MIN_N + 1) * L
        what += (
            f"; initial indexing of {B_} x {L} tokens: {hist.build_s:.2f} s "
            f"({n_grams / hist.build_s / 1e6:.1f} M n-grams/s)"
        )
        if corpus is not None:
            what += f"; filling the corpus with {C} tokens: {corpus_s:.2f} s"
        return what

    return Case(OP_NAME, dict(spec), impls, check, bytes_moved(B_, k, corpus is not None), setup)


def cases(quick: bool = False):
    for spec in QUICK_SPECS if quick else SPECS:
        yield build(spec)
    _History.current = None


def run_case(case: Case, budget_s: float, log=print) -> list[Result]:
    """Time a (checked) case with at most MAX_ROUNDS rounds, so the histories stay near L."""
    hist = _History.current
    start = int(hist.num_tokens[0])
    timings = measure_interleaved(case.impls, setup=case.setup, budget_s=budget_s,
                                  max_rounds=MAX_ROUNDS)  # fmt: skip
    grew = f"L {start} -> {int(hist.num_tokens[0])} while timed"
    results = []
    for name, t in timings.items():
        results.append(Result(case.op, case.spec, name, t, case.bytes_moved, grew))
        if log is not None:
            log(
                f"  {case.op:24s} {case.label:42s} {name:10s} median {t.median:10.1f} us  "
                f"IQR {t.q25:.1f}-{t.q75:.1f}  ({t.rounds} rounds; {grew})"
            )
    return results
