"""The frequency-scored drafters of the drafting benchmark (``bench/suffix_replay.py``).

:class:`Frequency` (the hash-table prototype, ``bench/baselines/frequency_prototype.py``),
:class:`Compact` (the same drafts from the compact structure,
``bench/baselines/frequency_compact.py``), :class:`Trie` (the same from the path-compressed
trie, ``bench/baselines/frequency_trie.py``), :class:`TrieBudget` (its corpus under a
token budget), :class:`FrequencyOp` (the op itself, ``ngram_propose(scoring=
"frequency")``) and :class:`Adaptive` (the prototype with its
factor chosen per request online), with the replay's drafter interface: ``admit``,
``propose``, ``commit``, ``finish`` per slot.
"""

from __future__ import annotations

import numpy as np

from bench.baselines import frequency_compact as fc
from bench.baselines import frequency_prototype as fp
from bench.baselines import frequency_trie as ft
from bench.baselines.frequency_budget import BudgetCorpus


class Frequency:
    """The prototype: a count table per request and one shared (sized for
    ``shared_positions`` appended positions), combined as SuffixDecoding combines its
    trees."""

    def __init__(self, shared: bool, store: str, factor: float = 1.0, D: int = 64,
                 shared_positions: int = 1 << 20):  # fmt: skip
        self.D, self.factor, self.shared, self.live = D, factor, shared, store == "native"
        self.glob = fp.new_table(fp.capacity_for(shared_positions, D)) if shared else None
        self.own, self.prompt_len = {}, {}
        self.out, self.tmp = np.zeros(D, np.int32), np.zeros(D, np.int32)

    def admit(self, s, h, n):
        self.own[s], self.prompt_len[s] = fp.new_table(fp.capacity_for(h.shape[0], self.D)), n
        fp.extend(*self.own[s], h, 0, 0, n, self.D)

    def _draft(self, table, h, n, k):
        t, score = fp.propose(*table, h, n, self.D, k, self.factor, 0.1, self.out, self.tmp)
        return self.out[:t].tolist(), score

    def propose(self, s, h, n, k):
        draft, score = self._draft(self.own[s], h, n, k)
        if self.shared:
            other, other_score = self._draft(self.glob, h, n, k)
            draft = other if other_score > score else draft
        return draft

    def commit(self, s, h, n0, n1):
        fp.extend(*self.own[s], h, 0, n0, n1, self.D)
        if self.shared and self.live:  # the response only, as its own document
            fp.extend(*self.glob, h, self.prompt_len[s], n0, n1, self.D)

    def finish(self, s, h):
        del self.own[s]
        if self.shared and not self.live:
            fp.extend(*self.glob, h, 0, 0, h.shape[0], self.D)


class Adaptive(Frequency):
    """The prototype with the factor chosen per request, online, from ``factors``.

    Every step drafts once per factor (the same counts and contexts: only the length cap
    and so the choice of match differ). Once the history is known past a step's longest
    draft (or the request ends), each factor is credited with the tokens its draft would
    have had accepted: the greedy oracle's acceptance is a prefix match against committed
    tokens, so every alternative is scored exactly, from committed tokens only, one to
    ``k`` steps late. Credits decay by ``decay`` per scored step; the factor with the most
    credit drafts (``factors[1]`` until one has any). One setting for every stream: what a
    fixed factor cannot be when streams prefer different ones."""

    def __init__(self, shared: bool, store: str, factors=(0.5, 1.0, 2.0, 4.0),
                 decay: float = 0.999, **kw):  # fmt: skip
        super().__init__(shared, store, factor=factors[0], **kw)
        self.factors, self.decay = tuple(factors), decay
        self.credit, self.pending = {}, {}

    def admit(self, s, h, n):
        super().admit(s, h, n)
        self.credit[s], self.pending[s] = np.zeros(len(self.factors)), []

    def propose(self, s, h, n, k):
        drafts = []
        for f in self.factors:
            self.factor = f
            drafts.append(Frequency.propose(self, s, h, n, k))
        self.pending[s].append((n, drafts))
        c = self.credit[s]
        return drafts[int(np.argmax(c))] if c.any() else drafts[min(1, len(drafts) - 1)]

    def commit(self, s, h, n0, n1):
        super().commit(s, h, n0, n1)
        waiting = []
        for n, drafts in self.pending[s]:
            if n + max(map(len, drafts)) > n1 and n1 < h.shape[0]:
                waiting.append((n, drafts))  # not yet known how far each would match
                continue
            self.credit[s] = self.credit[s] * self.decay + [accepted(d, h, n, n1) for d in drafts]
        self.pending[s] = waiting

    def finish(self, s, h):
        super().finish(s, h)
        del self.credit[s], self.pending[s]


class Compact(Frequency):
    """:class:`Frequency` on the compact structure (``bench/baselines/frequency_compact.py``,
    a request's live response reserved in the shared store at admission): the same drafts,
    so the same tokens per step, if that structure is right."""

    def __init__(self, shared: bool, store: str, factor: float = 1.0, D: int = 64,
                 shared_positions: int = 1 << 20):  # fmt: skip
        self.D, self.factor, self.shared, self.live = D, factor, shared, store == "native"
        self.glob = self._new_store(shared_positions, 2 * shared_positions) if shared else None
        self.own, self.prompt_len, self.start = {}, {}, {}
        self.out, self.tmp = np.zeros(D, np.int32), np.zeros(D, np.int32)

    mod = fc

    def _new_store(self, positions: int, tokens: int):
        """A store for ``positions`` counted positions in ``tokens`` token slots."""
        return fc.new_store(fc.log2_slots_for(positions * (self.D // 2 + 1)), tokens)

    def admit(self, s, h, n):
        mod = self.mod
        self.own[s] = self._new_store(h.shape[0], h.shape[0])
        self.prompt_len[s] = n
        mod.append(*self.own[s], h, 0, n, mod.reserve(self.own[s], h.shape[0]), self.D)
        if self.shared and self.live:
            self.start[s] = mod.reserve(self.glob, h.shape[0] - n) - n

    def _draft(self, store, h, n, k):
        t, score = self.mod.propose(*store, h, n, self.D, k, self.factor, 0.1, self.out,
                                    self.tmp)  # fmt: skip
        return self.out[:t].tolist(), score

    def commit(self, s, h, n0, n1):
        self.mod.append(*self.own[s], h, n0, n1, n0, self.D)
        if self.shared and self.live:
            self.mod.append(*self.glob, h, n0, n1, self.start[s] + n0, self.D)

    def finish(self, s, h):
        del self.own[s]
        if self.shared and not self.live:
            mod = self.mod
            mod.append(*self.glob, h, 0, h.shape[0], mod.reserve(self.glob, h.shape[0]), self.D)


class Trie(Compact):
    """:class:`Compact` on the path-compressed trie (``bench/baselines/frequency_trie.py``):
    the same drafts except where two continuations tie in count and the live store's
    reserved slots make "latest by position" and "latest counted" differ."""

    mod = ft

    def _new_store(self, positions: int, tokens: int):
        return ft.store_for(positions, tokens)


class TrieBudget(Trie):
    """:class:`Trie` with the finished store under a budget of ``budget`` slots
    (``bench/baselines/frequency_budget.py``: eviction by amortised rebuilding)."""

    stores = ("finished",)

    def __init__(self, shared: bool, store: str, budget: int = 1 << 16, **kw):
        super().__init__(False, store, **kw)
        self.shared, self.corpus = shared, BudgetCorpus(budget, self.D) if shared else None

    def propose(self, s, h, n, k):
        draft, score = self._draft(self.own[s], h, n, k)
        if self.shared:
            t, other = self.corpus.propose(h, n, k, self.factor, 0.1, self.out, self.tmp)
            draft = self.out[:t].tolist() if other > score else draft
        return draft

    def finish(self, s, h):
        del self.own[s]
        if self.shared:
            self.corpus.add(h)


class TrieGenerations(Trie):
    """:class:`Trie` with the finished store as ``generations`` tries of ``budget /
    generations`` slots each (tokens + one a document): documents fill the newest, a full
    one starts the next, and the oldest is dropped whole (an exact FIFO eviction without
    rebuilding). A proposal drafts from the own trie and from each generation alone; the
    highest score wins (ties: own, then the newer generation)."""

    stores = ("finished",)

    def __init__(self, shared: bool, store: str, budget: int = 1 << 16, generations: int = 4,
                 **kw):  # fmt: skip
        super().__init__(False, store, **kw)
        self.shared, self.G = shared, generations
        self.cap = budget // generations
        self.gens = []  # oldest first: (store, slots used)

    def propose(self, s, h, n, k):
        draft, score = self._draft(self.own[s], h, n, k)
        for g, _ in reversed(self.gens) if self.shared else ():
            other, other_score = self._draft(g, h, n, k)
            if other_score > score:
                draft, score = other, other_score
        return draft

    def finish(self, s, h):
        del self.own[s]
        if not self.shared:
            return
        for a in range(0, h.shape[0], self.cap - 1):  # pieces that fit a generation
            piece = np.array(h[a : a + self.cap - 1], np.int32)
            if not self.gens or self.gens[-1][1] + piece.shape[0] + 1 > self.cap:
                self.gens.append((ft.store_for(self.cap, self.cap), 0))
                if len(self.gens) > self.G:
                    self.gens.pop(0)
            g, used = self.gens[-1]
            ft.append(*g, piece, 0, piece.shape[0], ft.reserve(g, piece.shape[0]), self.D)
            self.gens[-1] = (g, used + piece.shape[0] + 1)


class FrequencyOp:
    """The op: ``ngram_propose(scoring="frequency")`` on a ``FrequencyIndex`` with a row per
    slot (one call per slot and step, as the replay asks) and, when ``shared``, a
    ``FrequencyCorpus`` of ``budget`` slots that every finished request joins (the finished
    store: the op's corpus holds finished documents only)."""

    stores = ("finished",)

    def __init__(self, shared: bool, store: str, factor: float = 1.0, D: int = 64,
                 rows: int = 32, width: int = 4096, budget: int = 1 << 16):  # fmt: skip
        import torch

        from specdec_kernels import ops

        self.t, self.ops, self.factor, self.D = torch, ops, factor, D
        self.tok = torch.zeros((rows, width), dtype=torch.int32)
        self.nt = torch.zeros(rows, dtype=torch.int32)
        self.index = ops.new_ngram_index(rows, width, min_n=1, max_n=D, scoring="frequency")
        self.corpus = None
        if shared:
            self.corpus = ops.new_corpus(budget, min_n=1, max_n=D, scoring="frequency")

    def _row(self, s):
        return self.t.tensor([s], dtype=self.t.int32)

    def admit(self, s, h, n):
        self.tok[s, : h.shape[0]] = self.t.from_numpy(h)  # only the first n are ever read
        self.nt[s] = n
        self.ops.ngram_index_build(self.tok, self.nt, self._row(s), index=self.index)

    def propose(self, s, h, n, k):
        out = self.ops.ngram_propose(
            self.tok, self.nt, self._row(s), min_n=1, max_n=self.D, num_speculative_tokens=k,
            index=self.index, corpus=self.corpus, scoring="frequency",
            max_spec_factor=self.factor,
        )  # fmt: skip
        return out.draft_token_ids[0, : int(out.num_draft_tokens[0])].tolist()

    def commit(self, s, h, n0, n1):
        self.nt[s] = n1
        self.ops.ngram_index_extend(self.tok, self.nt, self._row(s), index=self.index)

    def finish(self, s, h):
        if self.corpus is not None:
            t = self.t
            doc = t.from_numpy(np.ascontiguousarray(h, np.int32))[None]
            self.ops.corpus_append(doc, t.tensor([h.shape[0]], dtype=t.int32), corpus=self.corpus)


class TrieOracle(Trie):
    """Not a drafter: ``frequency_trie.oracle``, the upper bound of every rule that drafts
    one match length's chain of most frequent continuations (it reads the truth, ``h[n:]``):
    the own history's, and with a shared store the corpus's too (the better of the two)."""

    def _draft(self, store, h, n, k):
        t = ft.oracle(*store, h, n, self.D, k, h[n:], self.out)
        return self.out[:t].tolist(), 0.0

    def propose(self, s, h, n, k):
        own = self._draft(self.own[s], h, n, k)[0]
        if not self.shared:
            return own
        shared = self._draft(self.glob, h, n, k)[0]
        better = accepted(shared, h, n, h.shape[0]) > accepted(own, h, n, h.shape[0])
        return shared if better else own


def accepted(draft, h, n: int, n1: int) -> int:
    """How many leading tokens of ``draft`` equal the committed ``h[n:n1]``."""
    a = 0
    while a < len(draft) and n + a < n1 and draft[a] == h[n + a]:
        a += 1
    return a
