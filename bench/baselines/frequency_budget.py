"""A token budget for the frequency trie's corpus: eviction by amortised rebuilding (issue 19).

NOT the op: a model of how the shared corpus can evict whole documents exactly, at a
bounded cost per call, on a structure that cannot remove counts cheaply (the trie cannot
list a node's continuations, so a removed occurrence cannot re-choose a best
continuation; ``bench/notes/suffix_drafting.md``).

Two tries. ``active`` answers every proposal and holds the live documents exactly. When
the live size passes ``(1 - 2 r) C`` (``C`` = ``budget``, ``r`` = ``slack``), the newest
documents that fit in ``(1 - 3 r) C`` are chosen to survive and a second trie starts
counting them, then every document added after them, ``work`` positions per added token
(``ceil(1 + (1 - 3 r) / r)``: 6 at ``r = 1/8``). The moment it has counted everything, it
becomes the active trie: the older documents leave the counts then, all at once and
exactly, oldest first. Sizes count a document's tokens plus one separator. So:

- the live size never exceeds ``C`` (proof in ``_add_piece``'s comments); right after an
  eviction it is between ``(1 - 4r) C`` and ``(1 - r) C``;
- adding ``n`` tokens in ``p`` pieces costs at most ``(1 + work)(n + p)`` trie appends
  (O(D) each); evicting even a huge document costs no appends at its eviction. Not
  counted there: allocating the second trie when a rebuild starts and the O(pieces)
  bookkeeping at its start and at the switch (a device version would clear the retired
  trie over the next calls instead of at once);
- memory: two tries for ``C`` slots each (the trie's bound: two nodes a position);
- a document longer than ``r C - 1`` tokens enters as consecutive pieces of at most that
  length (no context crosses a piece boundary), so a huge one is kept by its newest
  pieces, never refused.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from bench.baselines import frequency_trie as ft


class BudgetCorpus:
    """Finished documents under a budget of ``budget`` slots (tokens + one a document)."""

    def __init__(self, budget: int, D: int, slack: float = 1 / 8):
        if not 0 < slack < 1 / 4:
            raise ValueError(f"slack must be in (0, 1/4), got {slack}")
        if math.floor(slack * budget) < 2:
            raise ValueError(f"budget must be >= {math.ceil(2 / slack)} (2 / slack), got {budget}")
        self.C, self.D, self.r = budget, D, slack
        self.max_piece = math.floor(slack * budget) - 1  # a piece's slots <= r C
        self.work = math.ceil(1 + (1 - 3 * slack) / slack)
        self.active, self.docs, self.size = self._new(), deque(), 0  # live pieces, oldest first
        self.new = None  # while rebuilding: (trie, pieces counted, [piece, start, done] to count)
        self.appended = 0  # trie appends so far (the cost bound's test reads it)

    def _new(self):
        return ft.store_for(self.C, self.C)

    def add(self, doc: np.ndarray) -> None:
        """Add a finished document (int32 tokens), as pieces of at most ``max_piece``."""
        for a in range(0, doc.shape[0], self.max_piece):
            self._add_piece(np.array(doc[a : a + self.max_piece], np.int32))  # a copy

    def _add_piece(self, piece: np.ndarray) -> None:
        n = piece.shape[0] + 1
        if self.new is not None:
            trie, counted, todo = self.new
            todo.append([piece, -1, 0])
            self._count(self.work * n)
            if not todo:  # caught up: the survivors and everything since are the live set
                self.active, self.docs, self.new = trie, deque(counted), None
                self.size = sum(p.shape[0] + 1 for p in counted)
                self._maybe_rebuild()
                return
        # The live size stays <= C: a rebuild starts as soon as it passes (1 - 2r) C, so
        # (a piece is <= r C slots) at <= (1 - r) C; the new trie has S <= (1 - 3r) C slots
        # of survivors and counts `work` slots per slot added, so while it has not caught
        # up the slots added since the start (this piece included) are < S / (work - 1)
        # <= r C: the old trie never passes C. The piece that completes the new trie never
        # enters the old one, and the new one then holds < S + r C + r C <= (1 - r) C.
        start = ft.reserve(self.active, piece.shape[0])
        self._append(self.active, piece, 0, piece.shape[0], start)
        self.docs.append(piece)
        self.size += n
        self._maybe_rebuild()

    def _maybe_rebuild(self) -> None:
        if self.new is None and self.size > (1 - 2 * self.r) * self.C:
            kept, total = [], 0
            for p in reversed(self.docs):  # the newest that fit in (1 - 3r) C survive
                if total + p.shape[0] + 1 > (1 - 3 * self.r) * self.C:
                    break
                kept.append([p, -1, 0])
                total += p.shape[0] + 1
            self.new = (self._new(), [], deque(reversed(kept)))

    def _append(self, store, piece, a, b, start) -> None:
        ft.append(*store, piece, a, b, start + a, self.D)
        self.appended += b - a

    def _count(self, slots: int) -> None:
        """Count up to ``slots`` slots of the pieces waiting for the new trie, in order."""
        trie, counted, todo = self.new
        while todo and slots > 0:
            item = todo[0]
            piece, start, done = item
            if start < 0:
                item[1] = start = ft.reserve(trie, piece.shape[0])
                slots -= 1  # the separator's slot
            b = min(piece.shape[0], done + slots)
            self._append(trie, piece, done, b, start)
            slots -= b - done
            item[2] = b
            if b == piece.shape[0]:
                counted.append(todo.popleft()[0])

    def propose(self, hist, L, k, factor, min_prob, out, tmp):
        """``frequency_trie.propose`` on the live documents."""
        return ft.propose(*self.active, hist, L, self.D, k, factor, min_prob, out, tmp)
