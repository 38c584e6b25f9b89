"""Plain-Python frequency-scored drafting: the oracle for ``ngram_propose(scoring="frequency")``.

The **frequency index** (``docs/design.md``, "Frequency-scored drafting"): per state row a
path-compressed trie of the row's contexts read backwards. Its layout is part of the
contract (a trie one path built reads the same on another), so ``frequency_index_build``
/ ``_extend`` below fill it with the same sequential algorithm as the fast paths, in plain
Python, and the tables are compared slot for slot. The proposals of
:func:`frequency_propose` are derived from the tokens on every call by counting
occurrences, independent of the trie.
"""

from __future__ import annotations

import math

import torch

from specdec_kernels.constants import (
    DRAFT_SOURCE_CORPUS,
    DRAFT_SOURCE_OWN,
    FREQUENCY_HASH_C0,
    FREQUENCY_HASH_C1,
    FREQUENCY_HASH_C2,
    NGRAM_HASH_MASK,
)


def trie_key(parent: int, tok: int) -> int:
    """The int64 key of ``(parent node, first edge token)``; never 0 (an empty slot)."""
    return ((parent + 1) << 32) | ((tok + 1) & NGRAM_HASH_MASK)


def trie_home(parent: int, tok: int, mask: int) -> int:
    """The home slot of ``(parent, tok)``: a 32-bit murmur3-style mix."""
    h = ((parent + 1) * FREQUENCY_HASH_C0 + ((tok + 1) & NGRAM_HASH_MASK)) & NGRAM_HASH_MASK
    h = ((h ^ (h >> 16)) * FREQUENCY_HASH_C1) & NGRAM_HASH_MASK
    h = ((h ^ (h >> 13)) * FREQUENCY_HASH_C2) & NGRAM_HASH_MASK
    return (h ^ (h >> 16)) & mask


class _Trie:
    """One row's trie as Python lists (``keys``, ``vals``, ``cnt``, ``hi``, ``pos``,
    ``best``, ``used``), written back by :meth:`store`."""

    def __init__(self, index, r, seq):
        keys, vals, nodes, used, _ = index
        self.keys, self.vals = keys[r].tolist(), vals[r].tolist()
        self.cnt, self.hi, self.pos, self.best = nodes[r].tolist()
        self.used, self.seq, self.mask = int(used[r]), seq, len(self.keys) - 1

    def store(self, index, r):
        keys, vals, nodes, used, _ = index
        keys[r] = torch.tensor(self.keys, dtype=torch.int64)
        vals[r] = torch.tensor(self.vals, dtype=torch.int32)
        nodes[r] = torch.tensor([self.cnt, self.hi, self.pos, self.best], dtype=torch.int32)
        used[r] = self.used

    def _slot(self, parent, tok):
        key, i = trie_key(parent, tok), trie_home(parent, tok, self.mask)
        while self.keys[i] not in (key, 0):
            i = (i + 1) & self.mask
        return i

    def find(self, parent, tok):
        i = self._slot(parent, tok)
        return self.vals[i] if self.keys[i] != 0 else -1

    def put(self, parent, tok, node):
        i = self._slot(parent, tok)
        self.keys[i], self.vals[i] = trie_key(parent, tok), node

    def new_node(self, cnt, hi, pos, best):
        n = self.used
        self.used += 1
        self.cnt[n], self.hi[n], self.pos[n], self.best[n] = cnt, hi, pos, best
        return n

    def insert(self, p, Dp, path):
        """Count the contexts ending at ``p`` (depths ``1..Dp``); ``path[d]``: their nodes."""
        seq, node, depth = self.seq, 0, 0
        while depth < Dp:
            t, lo = seq[p - depth], depth + 1
            child = self.find(node, t)
            if child < 0:
                leaf = self.new_node(1, Dp, p, -1)
                self.put(node, t, leaf)
                path[lo : Dp + 1] = [leaf] * (Dp + 1 - lo)
                return
            c_hi, c_pos = self.hi[child], self.pos[child]
            d = lo + 1
            while d <= min(c_hi, Dp) and seq[c_pos - d + 1] == seq[p - d + 1]:
                d += 1
            if d > c_hi:
                self.cnt[child] += 1
                self.pos[child] = max(c_pos, p)
                path[lo : c_hi + 1] = [child] * (c_hi + 1 - lo)
                node, depth = child, c_hi
                continue
            up = self.new_node(self.cnt[child] + 1, d - 1, max(c_pos, p), self.best[child])
            self.put(node, t, up)
            self.put(up, seq[c_pos - d + 1], child)
            path[lo:d] = [up] * (d - lo)
            if d <= Dp:
                leaf = self.new_node(1, Dp, p, -1)
                self.put(up, seq[p - d + 1], leaf)
                path[d : Dp + 1] = [leaf] * (Dp + 1 - d)
            return

    def append(self, p, D):
        Dp = min(p + 1, D)
        path = [0] * (Dp + 2)
        self.insert(p, Dp, path)
        self.walk_previous(p, Dp, path)

    def walk_previous(self, p, Dp, path):
        """The contexts ending at ``p - 1`` gained the continuation ``seq[p]``: re-point
        their ``best``."""
        node, depth = 0, 0
        while depth < Dp - 1:
            w = self.find(node, self.seq[p - 1 - depth])
            x, b = path[depth + 2], self.best[w]
            cnt, pos = self.cnt, self.pos
            if b != x and (b < 0 or cnt[x] > cnt[b] or (cnt[x] == cnt[b] and pos[x] >= pos[b])):
                self.best[w] = x
            node, depth = w, self.hi[w]


def _index_rows(token_ids, num_tokens, req_indices, index, *, max_n, from_scratch):
    keys, length = index[0], index[4]
    rows = range(num_tokens.shape[0]) if req_indices is None else req_indices.tolist()
    for r in rows:
        if r < 0:
            continue
        L = int(num_tokens[r])
        if from_scratch:
            keys[r] = 0
            index[3][r] = 1
        old = 0 if from_scratch else int(length[r])
        trie = _Trie(index, r, token_ids[r].tolist())
        for p in range(old, L):
            trie.append(p, max_n)
        trie.store(index, r)
        length[r] = max(L, old)


def frequency_index_build(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    """Empty rows ``r = req_indices[b]`` and count every context of ``token_ids[r, :L]``."""
    _index_rows(token_ids, num_tokens, req_indices, index, max_n=max_n, from_scratch=True)


def frequency_index_extend(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    """Count the contexts ending at positions ``length[r] .. num_tokens[r]-1``."""
    _index_rows(token_ids, num_tokens, req_indices, index, max_n=max_n, from_scratch=False)


# ----------------------------------------------------------------------------- proposals


def _continuations(docs: list[list[int]], c: tuple[int, ...], D: int):
    """``(count(c), {x: (count(c + x), latest end of c + x)})`` over the documents (in
    order; an occurrence lies inside one): every occurrence of ``c`` counts, continued or
    not; a continuation needs ``len(c) < D``. "Latest" orders by document, then position."""
    m, count, nxt = len(c), 0, {}
    for i, seq in enumerate(docs):
        for e in range(m - 1, len(seq)):
            if tuple(seq[e - m + 1 : e + 1]) != c:
                continue
            count += 1
            if e + 1 < len(seq) and m < D:
                n, _ = nxt.get(seq[e + 1], (0, (0, 0)))
                nxt[seq[e + 1]] = (n + 1, (i, e + 1))
    return count, nxt


def draft_chain(docs, c, D, max_len, min_token_prob):
    """The chain of most frequent continuations of ``c`` (ties: the latest): drafts and
    their running probabilities (float64), stopped below ``min_token_prob`` or at
    ``max_len``."""
    drafts, probs, prob = [], [], 1.0
    count, nxt = _continuations(docs, c, D)
    while len(drafts) < max_len and nxt:
        x = max(nxt, key=lambda t: nxt[t])
        nxt_prob = prob * (nxt[x][0] / count)
        if nxt_prob < min_token_prob:
            break
        prob = nxt_prob
        drafts.append(x)
        probs.append(prob)
        c = (*c, x)
        count, nxt = _continuations(docs, c, D)
    return drafts, probs


def draft_cap(m, cap, D, factor, offset):
    """``min(cap, D - m, floor(factor * m + offset))`` (the product and sum in float64)."""
    lim = min(cap, D - m)
    c = m * factor + offset
    return lim if c >= lim else int(math.floor(c))


def best_chain(docs, seq, *, min_n, D, cap, factor, offset, min_token_prob):
    """``(drafts, probs, m, score)`` of the best-scoring chain of the contexts ending
    ``seq``, counted in ``docs``; ties to the longer ``m``."""
    best, best_score = ([], [], 0), 0.0
    for m in range(1, min(D - 1, len(seq)) + 1):
        c = tuple(seq[len(seq) - m :])
        if not _continuations(docs, c, D)[1]:
            break  # a longer context has no continuation either
        if m < min_n:
            continue
        got, p = draft_chain(docs, c, D, draft_cap(m, cap, D, factor, offset), min_token_prob)
        if got and sum(p) >= best_score:
            best, best_score = (got, p, m), sum(p)
    return (*best, best_score)


def frequency_propose(
    token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, *, min_n, max_n,
    num_speculative_tokens, max_model_len, min_token_prob, max_spec_factor, max_spec_offset,
):  # fmt: skip
    """Per request, every context length ``m`` from 1 up: the chain of most frequent
    continuations of the last ``m`` tokens, in its own history and in the corpus's live
    documents; the highest score (sum of running probabilities; ties to the longer ``m``,
    then to the own history) gives the drafts."""
    from specdec_kernels.reference.frequency_corpus import live_documents

    k = num_speculative_tokens
    rows = list(range(num_tokens.shape[0])) if req_indices is None else req_indices.tolist()
    drafts = torch.full((len(rows), k), -1, dtype=torch.int32)
    probs = torch.zeros((len(rows), k), dtype=torch.float32)
    counts = torch.zeros(len(rows), dtype=torch.int32)
    match_len = torch.zeros(len(rows), dtype=torch.int32)
    source = torch.zeros(len(rows), dtype=torch.int8)
    shared = live_documents(corpus) if corpus is not None else None
    kw = dict(min_n=min_n, D=max_n, factor=max_spec_factor, offset=max_spec_offset,
              min_token_prob=min_token_prob)  # fmt: skip
    for b, r in enumerate(rows):
        if r < 0:
            continue
        L = int(num_tokens[r])
        seq = token_ids[r, :L].tolist()
        cap = k if max_draft_tokens is None else min(k, int(max_draft_tokens[b]))
        if max_model_len is not None:
            cap = min(cap, max_model_len - L)
        got, p, m, score = best_chain([seq], seq, cap=cap, **kw)
        src = DRAFT_SOURCE_OWN
        if shared is not None:
            other = best_chain(shared, seq, cap=cap, **kw)
            if other[0] and other[3] > score:
                (got, p, m, score), src = other, DRAFT_SOURCE_CORPUS
        if got:
            drafts[b, : len(got)] = torch.tensor(got, dtype=torch.int32)
            probs[b, : len(got)] = torch.tensor(p, dtype=torch.float64).float()
            counts[b], match_len[b], source[b] = len(got), m, src
    return drafts, counts, match_len, source, probs
