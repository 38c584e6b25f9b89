"""Plain-Python frequency corpus: the oracle for ``corpus_append`` on a ``FrequencyCorpus``.

The state's layout is part of the contract (``docs/design.md``, "Frequency-scored
drafting"), so this fills it with the same sequential rules as the fast paths, on Python
lists: a budget of ``C`` slots, two stores, the rebuild that evicts the oldest documents
exactly, and the node budget's early rebuild and emptying. Proposals from the corpus
(``reference/frequency.py``) count occurrences in the live documents
(:func:`live_documents`), independent of the tries.
"""

from __future__ import annotations

import torch

from specdec_kernels.constants import FREQUENCY_CORPUS_STATE as FIELDS
from specdec_kernels.constants import FREQUENCY_CORPUS_WORK as WORK
from specdec_kernels.constants import frequency_corpus_budget, frequency_corpus_piece
from specdec_kernels.reference.frequency import _Trie

F = {name: i for i, name in enumerate(FIELDS)}


class _Corpus:
    def __init__(self, corpus, D):
        tokens, keys, vals, nodes, used, docs, state = corpus
        self.tensors, self.D = corpus, D
        self.C, self.M = frequency_corpus_budget(tokens.shape[1]), nodes.shape[2]
        self.tokens = tokens.tolist()
        self.docs = docs.tolist()
        self.st = state.tolist()
        self.tries = [_Trie((keys, vals, nodes, used, None), s, self.tokens[s]) for s in (0, 1)]

    def store(self):
        tokens, keys, vals, nodes, used, docs, state = self.tensors
        for s in (0, 1):
            self.tries[s].store((keys, vals, nodes, used, None), s)
        tokens.copy_(torch.tensor(self.tokens, dtype=torch.int32))
        docs.copy_(torch.tensor(self.docs, dtype=torch.int64))
        state.copy_(torch.tensor(self.st, dtype=torch.int64))

    def _count(self, s, p, Dp) -> int:
        """Count position ``p`` into store ``s``; 1 if the store has no room for 2 nodes."""
        trie = self.tries[s]
        if trie.used > self.M - 2:
            return 1
        trie.seq = self.tokens[s]
        path = [0] * (Dp + 2)
        trie.insert(p, Dp, path)
        trie.walk_previous(p, Dp, path)
        return 0

    def _count_into(self, a, b, slots) -> int:
        st, Q, lost = self.st, len(self.docs), 0
        while st[F["next_doc"]] != st[F["tail"]] and slots > 0:
            q = st[F["next_doc"]]
            doc = self.docs[q]
            n = doc[0]
            if st[F["next_offset"]] < 0:
                doc[1 + b] = st[F["reserved0"] + b]
                st[F["reserved0"] + b] += n
                st[F["next_offset"]] = 0
                slots -= 1
            off = st[F["next_offset"]]
            end = min(n, off + max(slots, 0))
            for o in range(off, end):
                self.tokens[b][doc[1 + b] + o] = self.tokens[a][doc[1 + a] + o]
                lost += self._count(b, doc[1 + b] + o, min(o + 1, self.D))
            slots -= end - off
            st[F["next_offset"]] = end
            if end == n:
                st[F["new_size"]] += n + 1
                st[F["next_doc"]] = (q + 1) % Q
                st[F["next_offset"]] = -1
        return lost

    def _maybe_rebuild(self):
        st, Q, C, M = self.st, len(self.docs), self.C, self.M
        used = max(self.tries[st[F["active"]]].used, 1)
        if st[F["rebuilding"]] or (8 * st[F["size"]] <= 6 * C and 8 * used <= 6 * M):
            return
        q, total = st[F["tail"]], 0
        budget = 5 * C  # by slots: 5/8 C; by nodes: the slots 4/8 M nodes hold (<= 5/8 C)
        if 8 * st[F["size"]] <= 6 * C:
            budget = min(5 * C, 4 * (M * st[F["size"]] // used))
        while q != st[F["head"]]:  # the newest documents that fit in budget / 8 survive
            prev = (q - 1) % Q
            if 8 * (total + self.docs[prev][0] + 1) > budget:
                break
            total += self.docs[prev][0] + 1
            q = prev
        st[F["rebuilding"]], st[F["first_survivor"]], st[F["next_doc"]] = 1, q, q
        st[F["next_offset"]], st[F["new_size"]] = -1, 0

    def add_piece(self, piece):
        """A store out of nodes for the piece empties the corpus; the piece starts it."""
        q = self.st[F["tail"]]
        if self._try_piece(piece):
            for trie in self.tries:
                trie.keys = [0] * len(trie.keys)
                trie.used = 1
            for f in ("size", "rebuilding", "reserved0", "reserved1"):
                self.st[F[f]] = 0
            self.st[F["head"]] = self.st[F["tail"]] = q
            self._try_piece(piece)

    def _try_piece(self, piece) -> int:
        st, Q, n = self.st, len(self.docs), len(piece)
        a = st[F["active"]]
        b = 1 - a
        pa, q = st[F["reserved0"] + a], st[F["tail"]]
        self.tokens[a][pa : pa + n] = piece
        self.docs[q][0], self.docs[q][1 + a], self.docs[q][1 + b] = n, pa, -1
        st[F["tail"]] = (q + 1) % Q
        lost = 0
        if st[F["rebuilding"]]:
            lost = self._count_into(a, b, WORK * (n + 1))
            if st[F["next_doc"]] == st[F["tail"]]:  # caught up: swap, the older ones leave
                st[F["active"]], st[F["head"]] = b, st[F["first_survivor"]]
                st[F["size"]], st[F["rebuilding"]] = st[F["new_size"]], 0
                trie = self.tries[a]
                trie.keys = [0] * len(trie.keys)
                trie.used = 1
                st[F["reserved0"] + a] = 0
                self._maybe_rebuild()
                return lost
        st[F["reserved0"] + a] = pa + n
        for o in range(n):
            lost += self._count(a, pa + o, min(o + 1, self.D))
        st[F["size"]] += n + 1
        self._maybe_rebuild()
        return lost


def frequency_corpus_append(doc_tokens, doc_lens, req_indices, corpus, *, min_n, max_n):
    """Append one document per batch row, as pieces of at most ``min(C // 8, M // 16) - 1``
    tokens."""
    c = _Corpus(corpus, max_n)
    piece = frequency_corpus_piece(c.C, c.M)
    rows = range(doc_lens.shape[0]) if req_indices is None else req_indices.tolist()
    for r in rows:
        if r < 0:
            continue
        doc = doc_tokens[r, : int(doc_lens[r])].tolist()
        for s in range(0, len(doc), piece):
            c.add_piece(doc[s : s + piece])
    c.store()


def live_documents(corpus) -> list[list[int]]:
    """The live documents of a corpus state, oldest first (the active store's)."""
    tokens, _, _, _, _, docs, state = corpus
    st, Q = state.tolist(), docs.shape[0]
    a, q, out = st[F["active"]], st[F["head"]], []
    while q != st[F["tail"]]:
        n, start = int(docs[q, 0]), int(docs[q, 1 + a])
        out.append(tokens[a, start : start + n].tolist())
        q = (q + 1) % Q
    return out
