"""The CPU frequency corpus: ``corpus_append`` on a corpus made with ``scoring="frequency"``
as one numba kernel (``cpu/_jit.py``); its proposals are ``cpu/frequency.py``'s.

Two stores (token array and trie each, ``cpu/frequency.py``'s trie); the active one holds
exactly the live documents, oldest first, and answers proposals. A budget of ``C`` slots
(a document takes its tokens plus one) and ``M`` nodes a store: past ``6/8 C`` live slots
or ``6/8 M`` nodes a rebuild starts, the newest documents that fit in ``5/8 C`` (when the
nodes started it: in the slots ``4/8 M`` nodes hold) survive, and each later document added
makes the other store copy and count ``FREQUENCY_CORPUS_WORK`` (6) slots of the survivors
and of the documents added since, in order; when it has caught up the stores swap, which
evicts every older document exactly, and the retired store is emptied. The live size
never passes ``C``; a document longer than ``min(C/8, M/16) - 1`` tokens enters as pieces
of that size (no context crosses a piece). A store out of nodes (only with ``M < 2C + 1``)
empties the corpus before the piece. ``docs/design.md``, "Frequency-scored drafting".
"""

from __future__ import annotations

import numpy as np

from specdec_kernels.constants import FREQUENCY_CORPUS_STATE as _FIELDS
from specdec_kernels.constants import FREQUENCY_CORPUS_WORK as WORK
from specdec_kernels.constants import frequency_corpus_budget, frequency_corpus_piece
from specdec_kernels.cpu._jit import NONE_I32, borrowed, jit, np_, opt
from specdec_kernels.cpu.frequency import append_position

ACTIVE, SIZE, RES0, RES1, REBUILDING, FIRST, NEXT_DOC, NEXT_OFF, NEW_SIZE, HEAD, TAIL = (
    _FIELDS.index(f) for f in _FIELDS
)
LEN, START0 = 0, 1  # docs[q] = (length, start in store 0, start in store 1)


@jit
def _count(keys, vals, nodes, used, s, tokens, p, Dp, path):
    """Count position ``p`` of store ``s`` if it has room for two nodes: 0 if it has not."""
    if 1 <= used[s] <= nodes.shape[2] - 2:
        append_position(keys[s], vals[s], nodes[s], used[s : s + 1], tokens[s], p, Dp, path)
        return 0
    return 1


@jit
def _count_into(tokens, keys, vals, nodes, used, docs, state, a, b, slots, D, path):
    """Copy and count up to ``slots`` slots of the waiting documents into store ``b``;
    returns the positions it had no room for."""
    Q, lost = docs.shape[0], 0
    while state[NEXT_DOC] != state[TAIL] and slots > 0:
        q = state[NEXT_DOC]
        n = docs[q, LEN]
        if state[NEXT_OFF] < 0:  # the document starts in store b: its separator's slot
            if n < 0 or state[RES0 + b] + n > tokens.shape[1]:
                return lost  # only a state of unchecked values
            docs[q, START0 + b] = state[RES0 + b]
            state[RES0 + b] += n
            state[NEXT_OFF] = 0
            slots -= 1
        off, sa, sb = state[NEXT_OFF], docs[q, START0 + a], docs[q, START0 + b]
        if min(sa, sb, off, n) < 0 or max(sa, sb) + n > tokens.shape[1]:
            return lost  # only an entry of unchecked values
        end = min(n, off + max(slots, 0))
        for o in range(off, end):
            tokens[b, sb + o] = tokens[a, sa + o]
            lost += _count(keys, vals, nodes, used, b, tokens, sb + o, min(o + 1, D), path)
        slots -= end - off
        state[NEXT_OFF] = end
        if end == n:
            state[NEW_SIZE] += n + 1
            state[NEXT_DOC] = (q + 1) % Q
            state[NEXT_OFF] = -1
    return lost


@jit
def _maybe_rebuild(docs, state, used, C, M):
    """Past 6/8 C live slots, the newest documents that fit in 5/8 C start the new store;
    past 6/8 M nodes (slots below 6/8 C), those that fit in the slots 4/8 M nodes hold at
    the store's density (at most 5/8 C). With ``M = 2C + 1`` the nodes never decide (at
    most 2 a token: the slots pass 6/8 C first)."""
    u = max(np.int64(used[state[ACTIVE]]), 1)
    if state[REBUILDING] or (8 * state[SIZE] <= 6 * C and 8 * u <= 6 * M):
        return
    Q = docs.shape[0]
    q, total = state[TAIL], 0
    budget = 5 * C if 8 * state[SIZE] > 6 * C else min(5 * C, 4 * (M * state[SIZE] // u))
    while q != state[HEAD]:  # the newest documents whose slots fit in budget / 8
        prev = (q - 1) % Q
        if 8 * (total + docs[prev, LEN] + 1) > budget:
            break
        total += docs[prev, LEN] + 1
        q = prev
    state[REBUILDING], state[FIRST], state[NEXT_DOC] = 1, q, q
    state[NEXT_OFF], state[NEW_SIZE] = -1, 0


@jit
def _try_piece(tokens, keys, vals, nodes, used, docs, state, src, n, C, D, path):
    """Add one piece; returns the positions a store had no room for (then the state is
    only fit to be emptied)."""
    Q, M = docs.shape[0], nodes.shape[2]
    a = state[ACTIVE]
    b = 1 - a
    pa, q = state[RES0 + a], state[TAIL]
    tokens[a, pa : pa + n] = src[:n]  # staged: the waiting documents are read from here
    docs[q, LEN], docs[q, START0 + a], docs[q, START0 + b] = n, pa, -1
    state[TAIL] = (q + 1) % Q
    lost = 0
    if state[REBUILDING]:
        lost = _count_into(tokens, keys, vals, nodes, used, docs, state, a, b, WORK * (n + 1),
                           D, path)  # fmt: skip
        if state[NEXT_DOC] == state[TAIL]:  # caught up: store b holds the live documents
            state[ACTIVE], state[HEAD], state[SIZE] = b, state[FIRST], state[NEW_SIZE]
            state[REBUILDING] = 0
            keys[a] = 0  # the retired store, emptied for the next rebuild
            used[a] = 1
            state[RES0 + a] = 0
            _maybe_rebuild(docs, state, used, C, M)
            return lost
    state[RES0 + a] = pa + n
    for o in range(n):
        lost += _count(keys, vals, nodes, used, a, tokens, pa + o, min(o + 1, D), path)
    state[SIZE] += n + 1
    _maybe_rebuild(docs, state, used, C, M)
    return lost


@jit
def _add_piece(tokens, keys, vals, nodes, used, docs, state, src, n, C, D, path):
    """Add one piece; a store out of nodes for it empties the corpus, and the piece then
    starts it (an empty store holds a piece: ``M >= 16 (piece + 1)``)."""
    q = state[TAIL]
    if _try_piece(tokens, keys, vals, nodes, used, docs, state, src, n, C, D, path):
        keys[:] = 0
        used[:] = 1
        state[SIZE], state[REBUILDING], state[RES0], state[RES1] = 0, 0, 0, 0
        state[HEAD], state[TAIL] = q, q
        _try_piece(tokens, keys, vals, nodes, used, docs, state, src, n, C, D, path)


@jit
def _state_ok(tokens, docs, state, C):
    """Whether the counters are in range, so that the next piece stays inside the arrays
    (a state of unchecked values is left alone from there on; a valid one always is)."""
    Q, T = docs.shape[0], tokens.shape[1]
    ok = 0 <= state[ACTIVE] <= 1 and 0 <= state[SIZE] <= C and 0 <= state[REBUILDING] <= 1
    for f in (HEAD, TAIL, FIRST, NEXT_DOC):
        ok = ok and 0 <= state[f] < Q
    for f in (RES0, RES1):
        ok = ok and 0 <= state[f] <= T - C // 8
    return ok


@jit
def _append_docs(doc_tokens, doc_lens, rows, has_rows, tokens, keys, vals, nodes, used, docs,
                 state, C, D, piece):  # fmt: skip
    R, W = doc_tokens.shape
    B = rows.shape[0] if has_rows else R
    doc_tokens, tokens, keys, vals, nodes, used, docs, state = borrowed(
        (doc_tokens, tokens, keys, vals, nodes, used, docs, state)
    )  # passed per position: without reference counts
    path = np.zeros(D + 2, np.int64)
    buf = np.empty(piece, np.int32)
    for i in range(B):
        r = rows[i] if has_rows else i
        if r < 0 or r >= R:
            continue
        n = min(max(np.int64(doc_lens[r]), 0), W)
        for s in range(0, n, piece):
            m = min(piece, n - s)
            if not _state_ok(tokens, docs, state, C):  # before every piece: see _state_ok
                return
            for t in range(m):  # a copy: the document may be strided
                buf[t] = doc_tokens[r, s + t]
            _add_piece(tokens, keys, vals, nodes, used, docs, state, buf, m, C, D, path)


def frequency_corpus_append(doc_tokens, doc_lens, req_indices, corpus, *, min_n, max_n):
    tokens, keys, vals, nodes, used, docs, state = (np_(t) for t in corpus)
    C = frequency_corpus_budget(tokens.shape[1])
    _append_docs(np_(doc_tokens), np_(doc_lens), opt(req_indices, NONE_I32),
                 req_indices is not None, tokens, keys, vals, nodes, used, docs, state, C,
                 max_n, frequency_corpus_piece(C, nodes.shape[2]))  # fmt: skip
