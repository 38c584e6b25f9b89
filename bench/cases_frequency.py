"""``frequency`` cases: one decoding step with frequency-scored drafting (extend + propose).

A step commits ``k + 1`` real tokens to every request (what a verify step commits at most),
counts them into the request's frequency index (``ngram_index_extend`` on a
``FrequencyIndex``) and proposes (``ngram_propose(..., scoring="frequency")``, D = 64,
SuffixDecoding's default depth and stop rules). Baseline in the same run: ``longest_index``,
the same step on the n-gram index (n in 2..5, ``scoring="longest"``): what frequency
scoring costs over today's drafts. Each implementation grows its own copy of
``num_tokens`` inside its timed call (the same ``add_`` for both), so each sees its
``k + 1`` new tokens per call; rows are re-indexed, untimed, when their room is used up.
SuffixDecoding's own speculate + update costs are ``bench/suffix_memory.py``'s.
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

OP_NAME = "frequency step"
D = 64
SPECS = [{"B": b, "L": L, "k": 8} for b in (1, 8, 64) for L in (1024, 8192)]
# added with the frequency corpus: the step drafting from a corpus of 256k slots too, and
# appending one finished request (2048 tokens) to a full corpus
SPECS += [{"B": b, "L": 8192, "k": 8, "corpus": 1 << 18} for b in (1, 64)]
SPECS += [{"append": 2048, "corpus": 1 << 18}]
QUICK_SPECS = [{"B": 2, "L": 256, "k": 4}, {"B": 2, "L": 256, "k": 4, "corpus": 4096},
               {"append": 256, "corpus": 4096}]  # fmt: skip
DOC_TOKENS = 4096  # the documents that fill a corpus
MAX_ROUNDS = 100
ROOM = 2 * (MAX_ROUNDS + 8)  # steps of headroom per implementation
BASELINES = ["longest_index", "longest_corpus"]


def bytes_moved(B: int, k: int) -> int:
    """Touched per step: per new token ~2 D node visits (16 B) and probes (12 B); per
    proposal ~D descent steps and k chain steps per context length (an upper bound)."""
    return B * ((k + 1) * 2 * D * 28 + D * 28 + D * k * 16)


class _Impl:
    """One implementation's step on its own index and its own ``num_tokens``."""

    def __init__(self, tok, L, cap, k, corpus=None, **index_kw):
        self.tok, self.L0, self.cap, self.k = tok, L, cap, k
        self.nt = torch.full((tok.shape[0],), L, dtype=torch.int32)
        self.index = new_ngram_index(tok.shape[0], tok.shape[1], **index_kw)
        t0 = time.perf_counter()
        ngram_index_build(tok, self.nt, index=self.index)
        self.build_s = time.perf_counter() - t0
        self.kw = dict(min_n=self.index.min_n, max_n=self.index.max_n, num_speculative_tokens=k,
                       corpus=corpus)  # fmt: skip
        if index_kw.get("scoring") == "frequency":
            self.kw["scoring"] = "frequency"

    def reset_if_full(self):
        if int(self.nt[0]) + self.k + 1 > self.cap:
            self.nt.fill_(self.L0)
            ngram_index_build(self.tok, self.nt, index=self.index)

    def step(self):
        self.nt.add_(self.k + 1)
        ngram_index_extend(self.tok, self.nt, index=self.index)
        return ngram_propose(self.tok, self.nt, index=self.index, **self.kw)


def _documents(count: int, n: int) -> torch.Tensor:
    """``count`` windows of ``n`` real tokens from well spread offsets of the stream."""
    stream = data.token_stream()
    offs = (np.arange(count) * 7919 * 13 + 1_000_003) % (stream.shape[0] - n)
    return torch.from_numpy(np.stack([stream[o : o + n] for o in offs]))


def _filled(C: int, scoring: str, depth: int = D):
    """A corpus of ``C`` slots (``"longest"``: tokens) filled with real documents, and the
    time it took."""
    nk = dict(min_n=1, max_n=depth) if scoring == "frequency" else dict(min_n=2, max_n=5)
    corpus = new_corpus(C, scoring=scoring, **nk)
    doc = min(DOC_TOKENS, C // 2)
    docs = _documents(max(1, C // doc), doc)
    t0 = time.perf_counter()
    for i in range(0, docs.shape[0], 16):  # 16 finished requests per call
        part = docs[i : i + 16]
        corpus_append(part, torch.full((part.shape[0],), doc, dtype=torch.int32), corpus=corpus)
    return corpus, time.perf_counter() - t0


def _append_case(spec: dict) -> Case:
    n, C = spec["append"], spec["corpus"]
    corpora = {name: _filled(C, name)[0] for name in ("frequency", "longest")}
    docs = _documents(64, n)
    lens = torch.full((1,), n, dtype=torch.int32)
    turn = {name: 0 for name in corpora}

    def appender(name):
        def call():
            i = turn[name] = (turn[name] + 1) % docs.shape[0]
            corpus_append(docs[i : i + 1], lens, corpus=corpora[name])

        return call

    impls = {OP: appender("frequency"), "longest_corpus": appender("longest")}

    def check() -> str:
        from specdec_kernels.reference.frequency_corpus import live_documents

        live = live_documents(list(corpora["frequency"][:7]))
        slots = sum(len(d) + 1 for d in live)
        assert slots <= C, "the budget holds"
        return f"a full corpus: {len(live)} live pieces, {slots} of {C} slots"

    return Case("frequency corpus_append", dict(spec), impls, check, n * 4 * 7)


def build(spec: dict) -> Case:
    if "append" in spec:
        return _append_case(spec)
    B, L, k, C = spec["B"], spec["L"], spec["k"], spec.get("corpus", 0)
    cap = L + ROOM * (k + 1)
    tok, _ = data.ngram_histories(B, cap)  # real text past L: the committed tokens
    fc, fill_s = _filled(C, "frequency") if C else (None, 0.0)
    freq = _Impl(tok, L, cap, k, fc, min_n=1, max_n=D, scoring="frequency")
    longest = _Impl(tok, L, cap, k, _filled(C, "longest")[0] if C else None, min_n=2, max_n=5)
    impls = {OP: freq.step, "longest_index": longest.step}

    def setup():
        freq.reset_if_full()
        longest.reset_if_full()

    def check() -> str:
        out = freq.step()
        fresh = new_ngram_index(B, cap, min_n=1, max_n=D, scoring="frequency")
        ngram_index_build(tok, freq.nt, index=fresh)  # one build == the extends
        again = ngram_propose(tok, freq.nt, index=fresh, **freq.kw)
        for a, b in zip(out, again, strict=True):
            assert torch.equal(a, b), "the extended index proposes as a fresh build"
        got = out.num_draft_tokens
        nodes = float(freq.index.num_nodes.float().mean()) / float(freq.nt.float().mean())
        extra = ""
        if fc is not None:
            extra = (f"; {float((out.draft_source == 2).float().mean()):.0%} of rows draft from "
                     f"the corpus (filling it: {fill_s:.1f} s)")  # fmt: skip
        return (
            f"an index extended step by step proposes as one built from scratch{extra}; "
            f"{float((got > 0).float().mean()):.0%} of rows draft, {float(got.float().mean()):.2f}"
            f" drafts a row; {nodes:.2f} nodes a token; build of {B} x {L} tokens "
            f"{freq.build_s:.2f} s (the n-gram index's {longest.build_s:.2f} s)"
        )

    return Case(OP_NAME, dict(spec), impls, check, bytes_moved(B, k), setup)


def cases(quick: bool = False):
    for spec in QUICK_SPECS if quick else SPECS:
        yield build(spec)


def run_case(case: Case, budget_s: float, log=print) -> list[Result]:
    """Time a (checked) case with at most MAX_ROUNDS rounds, so the histories stay near L."""
    timings = measure_interleaved(case.impls, setup=case.setup, budget_s=budget_s,
                                  max_rounds=MAX_ROUNDS)  # fmt: skip
    results = []
    for name, t in timings.items():
        results.append(Result(case.op, case.spec, name, t, case.bytes_moved))
        if log is not None:
            log(
                f"  {case.op:24s} {case.label:42s} {name:14s} median {t.median:10.1f} us  "
                f"IQR {t.q25:.1f}-{t.q75:.1f}  ({t.rounds} rounds)"
            )
    return results
