"""A path-compressed context trie for issue 19's frequency-scored drafting: a design prototype.

NOT the op: a numba model of the structure ``bench/notes/suffix_drafting.md`` says the op
needs, to measure its memory and check its drafts against the brute-force semantics
before kernels are written. Same semantics and drafts as ``frequency_compact.py``, but a
context seen twice no longer costs an entry per length: at most two entries a position.

A store holds documents (token ids, ``SEP`` between them). The contexts ending at
position ``p`` (``tokens[p-m+1 .. p]``, ``1 <= m <= D``, inside one document) read
backwards are one root-to-leaf path of a trie keyed by prepending a token. A *node* is a
maximal run of depths ``lo..hi`` along such a path whose contexts have the same
occurrences (every occurrence of the depth-``d`` context is preceded by the same token, for
``lo <= d < hi``); its edge tokens are read from the stored tokens at any occurrence
(``tokens[pos - d + 1]`` at depth ``d``). All contexts of a node share one count and one
set of continuations, so one entry stands for the whole run:

- ``cnt``: occurrences (end positions), continued or not (the live tail counts);
- ``hi``: its deepest depth (``lo`` is the parent's ``hi + 1``); ``par``: the parent;
- ``pos``: the end of its latest occurrence (the largest store position);
- ``best``: the node of its best continuation ``c + x`` (largest count, ties: the latest
  occurrence); the continuations of the depths ``lo..hi`` (below D) are the depths
  ``lo+1..hi+1`` of one node (their occurrences coincide), so one pointer serves the run.
  -1: none.

A hash table maps ``(parent, first edge token)`` to a node. Appending position ``p``
inserts its path (walk down comparing stored tokens; where it diverges inside a node,
split the node: the new upper part takes the old key, the lower part keeps its id, so
nothing else has to be re-keyed; then add a leaf) and then walks the path of ``p - 1``,
whose contexts gained the continuation ``tokens[p]``, updating their ``best``: O(D)
tokens compared per append, at most two new nodes. A pointer to a node whose upper depths a
later split moved to a new node always belongs to a node on the splitting position's
``p - 1`` path, and the new node counts one more occurrence than the old one, so the
second walk re-points it (``bench/notes/suffix_drafting.md``). Append only:
no eviction here.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from bench.baselines.frequency_compact import reserve  # noqa: F401  (the same token store)

SEP = -1
_C0, _C1, _C2 = np.int64(0x9E3779B1), np.int64(0x85EBCA6B), np.int64(0xC2B2AE35)
_LO32 = np.int64(0xFFFFFFFF)
NODE_FIELDS = 5  # cnt, hi, par, pos, best (int32 each)
BYTES_PER_NODE = 4 * NODE_FIELDS
BYTES_PER_SLOT = 8 + 4  # key, node


def log2_slots_for(nodes: int) -> int:
    """log2 of the smallest power-of-two table that holds ``nodes`` keys at most 3/4 full."""
    return max(12, math.ceil(math.log2(nodes * 4 / 3 + 1)))


def nodes_for(positions: int) -> int:
    """Nodes that ``positions`` counted positions can need: two a position, the root, and
    the two an append checks for before it counts a position."""
    return 2 * positions + 3


def store_for(positions: int, max_tokens: int) -> tuple[np.ndarray, ...]:
    """:func:`new_store` that can never run out of nodes or slots for ``positions``."""
    nodes = nodes_for(positions)
    return new_store(log2_slots_for(nodes), max_tokens, nodes)


def new_store(log2_slots: int, max_tokens: int, max_nodes: int) -> tuple[np.ndarray, ...]:
    """``(keys, vals, nodes, tokens, meta)``: ``nodes`` is int32 ``[5, max_nodes]`` (cnt,
    hi, par, pos, best; node 0 is the root), ``meta = [tokens reserved, keys, nodes]``."""
    cap = 1 << log2_slots
    nodes = np.zeros((NODE_FIELDS, max_nodes), np.int32)
    nodes[4, :] = -1
    return (
        np.zeros(cap, np.int64),
        np.zeros(cap, np.int32),
        nodes,
        np.full(max_tokens, SEP, np.int32),
        np.array([0, 0, 1], np.int64),
    )


@numba.njit(cache=True, inline="always")
def _key(parent, tok):
    """A non-zero int64 (0 marks an empty slot): node ids and tokens are < 2**31 - 1."""
    return (np.int64(parent + 1) << 32) | np.int64(tok + 1)


@numba.njit(cache=True, inline="always")
def _home(parent, tok, mask):
    """The home slot of ``(parent, tok)``: a 32-bit murmur3-style mix in int64 lanes
    (products wrap; only their low 32 bits are kept), the same integers in a Triton
    kernel (``specdec_kernels/kernels/frequency_trie.py``, the op's)."""
    h = (np.int64(parent + 1) * _C0 + np.int64(tok + 1)) & _LO32
    h = ((h ^ (h >> 16)) * _C1) & _LO32
    h = ((h ^ (h >> 13)) * _C2) & _LO32
    return (h ^ (h >> 16)) & mask


@numba.njit(cache=True)
def _probe(keys, parent, tok):
    """The slot of ``(parent, tok)``'s key, else the empty slot where it would go (linear
    probing; the table is never more than 3/4 full, so one exists)."""
    key = _key(parent, tok)
    mask = np.int64(keys.shape[0] - 1)
    i = _home(parent, tok, mask)
    while keys[i] != key and keys[i] != 0:
        i = (i + 1) & mask
    return i


@numba.njit(cache=True)
def _find(keys, vals, parent, tok):
    """The node under ``parent`` whose edge starts with ``tok``; -1: none."""
    i = _probe(keys, parent, tok)
    return np.int64(vals[i]) if keys[i] == _key(parent, tok) else np.int64(-1)


@numba.njit(cache=True)
def _put(keys, vals, meta, parent, tok, node):
    """Map ``(parent, tok)`` to ``node`` (insert, or overwrite the existing key)."""
    i = _probe(keys, parent, tok)
    if keys[i] == 0:  # room checked by _append_position
        keys[i] = _key(parent, tok)
        meta[1] += 1
    vals[i] = node


@numba.njit(cache=True)
def _new_node(nodes, meta, cnt, hi, par, pos, best):
    n = meta[2]  # room checked by _append_position
    meta[2] += 1
    nodes[0, n], nodes[1, n], nodes[2, n], nodes[3, n], nodes[4, n] = cnt, hi, par, pos, best
    return n


@numba.njit(cache=True)
def _insert(keys, vals, nodes, toks, meta, p, Dp, path):
    """Insert the path of position ``p`` (its ``Dp`` contexts); ``path[d]`` becomes the node
    holding depth ``d`` (``1 <= d <= Dp``)."""
    cnt, hi, par, pos = nodes[0], nodes[1], nodes[2], nodes[3]
    node, depth = 0, 0
    while depth < Dp:
        t = toks[p - depth]
        child = _find(keys, vals, node, t)
        lo = depth + 1
        if child < 0:  # a new leaf for the depths lo..Dp
            leaf = _new_node(nodes, meta, 1, Dp, node, p, -1)
            _put(keys, vals, meta, node, t, leaf)
            path[lo : Dp + 1] = leaf
            return
        c_hi, c_pos = hi[child], pos[child]
        d, lim = lo + 1, min(c_hi, Dp)
        while d <= lim and toks[c_pos - d + 1] == toks[p - d + 1]:
            d += 1
        if d > c_hi:  # the whole run matches
            cnt[child] += 1
            pos[child] = max(c_pos, p)
            path[lo : c_hi + 1] = child
            node, depth = child, c_hi
            continue
        # p leaves the run at depth d (a different token, or its own contexts end): the
        # upper part lo..d-1 becomes a new node under the old key; the child keeps its id
        # (its children's keys and the pointers to it stay valid) and the depths d..c_hi
        up = _new_node(nodes, meta, cnt[child] + 1, d - 1, node, max(c_pos, p), nodes[4, child])
        _put(keys, vals, meta, node, t, up)
        par[child] = up
        _put(keys, vals, meta, up, toks[c_pos - d + 1], child)
        path[lo:d] = up
        if d <= Dp:
            leaf = _new_node(nodes, meta, 1, Dp, up, p, -1)
            _put(keys, vals, meta, up, toks[p - d + 1], leaf)
            path[d : Dp + 1] = leaf
        return


@numba.njit(cache=True)
def _append_position(keys, vals, nodes, toks, meta, p, D, path):
    """Count the contexts that end at ``p`` (``toks[p]`` already stored)."""
    # a position adds two keys and two nodes at most: refuse before anything is written
    if 4 * (meta[1] + 2) > 3 * keys.shape[0]:
        raise ValueError("frequency_trie: the table is 3/4 full")
    if meta[2] + 2 > nodes.shape[1]:
        raise ValueError("frequency_trie: no node left")
    Dp = 0
    while Dp < D and p - Dp >= 0 and toks[p - Dp] != SEP:
        Dp += 1
    _insert(keys, vals, nodes, toks, meta, p, Dp, path)
    # the contexts ending at p - 1 (depths 1..Dp-1) gained the continuation toks[p]
    cnt, hi, pos, best = nodes[0], nodes[1], nodes[3], nodes[4]
    node, depth = 0, 0
    while depth < Dp - 1:
        w = _find(keys, vals, node, toks[p - 1 - depth])
        if w < 0:
            raise ValueError("frequency_trie: the path of p - 1 is missing (a bug)")
        x = path[depth + 2]  # the continuation of depth lo = depth + 1 is depth lo + 1
        b = best[w]
        if b != x and (b < 0 or cnt[x] > cnt[b] or (cnt[x] == cnt[b] and pos[x] >= pos[b])):
            best[w] = x
        node, depth = w, hi[w]


@numba.njit(cache=True)
def append(keys, vals, nodes, toks, meta, src, a, b, dst, D):
    """Store ``src[a:b]`` at ``toks[dst:]`` (inside one document's reserved slots, right
    after its earlier tokens: not checked) and count the contexts ending there. A full
    store raises before the position that would not fit is counted."""
    if dst < 0 or dst + (b - a) > meta[0]:
        raise ValueError("frequency_trie: append outside the reserved tokens")
    path = np.empty(D + 2, np.int64)
    for i in range(a, b):
        toks[dst + i - a] = src[i]
        _append_position(keys, vals, nodes, toks, meta, dst + i - a, D, path)


@numba.njit(cache=True)
def _context(keys, vals, nodes, toks, hist, L, m, node):
    """The node of ``hist[L-m:L]`` from ``node``, that of ``hist[L-m+1:L]``; -1 where it
    does not occur or has no continuation (then no longer context has one either)."""
    t_q = hist[L - m]
    if m > nodes[1, node]:
        node = _find(keys, vals, node, t_q)
        if node < 0:
            return -1
    elif toks[nodes[3, node] - m + 1] != t_q:
        return -1
    return node if nodes[4, node] >= 0 else -1


@numba.njit(cache=True)
def propose(keys, vals, nodes, toks, meta, hist, L, D, k, factor, min_prob, out, tmp):
    """The best-scoring draft for ``hist[:L]`` into ``out``: ``(length, score)``
    (``frequency_prototype.propose``'s semantics)."""
    if min(out.shape[0], tmp.shape[0]) < min(k, D):
        raise ValueError("frequency_trie: out and tmp must hold min(k, D) tokens")
    cnt, pos, best = nodes[0], nodes[3], nodes[4]
    best_t, best_score = 0, 0.0
    node = 0
    for m in range(1, min(D, L)):
        node = _context(keys, vals, nodes, toks, hist, L, m, node)
        if node < 0:
            break
        max_len = min(k, int(m * factor + 1e-6), D - m)
        n, prob, score, t = node, 1.0, 0.0, 0
        while t < max_len:
            x = best[n]
            if x < 0:
                break
            prob *= cnt[x] / cnt[n]
            if prob < min_prob:
                break
            tmp[t] = toks[pos[x]]
            score += prob
            t += 1
            n = x
        if t > 0 and score >= best_score:
            best_t, best_score = t, score
            out[:t] = tmp[:t]
    return best_t, best_score


@numba.njit(cache=True)
def oracle(keys, vals, nodes, toks, meta, hist, L, D, k, truth, out):
    """An upper bound, not a drafter: of every match length's chain of most frequent
    continuations, as long as ``k`` and ``D`` allow (no ``min_token_prob``, no length
    cap), the one of which ``truth`` accepts the most drafts, into ``out``; returns its
    length. Every rule that picks one match length's chain and stops it somewhere (the
    issue's "frequency", whatever its parameters) accepts at most as many tokens."""
    pos, best = nodes[3], nodes[4]
    best_acc, best_t = -1, 0
    node = 0
    for m in range(1, min(D, L)):
        node = _context(keys, vals, nodes, toks, hist, L, m, node)
        if node < 0:
            break
        n, t, acc, matching = node, 0, 0, True
        while t < min(k, D - m):
            x = best[n]
            if x < 0:
                break
            tok = toks[pos[x]]
            matching = matching and t < truth.shape[0] and truth[t] == tok
            acc += matching
            t += 1
            n = x
        if acc > best_acc:
            best_acc, best_t = acc, t
            n = node
            for i in range(t):
                n = best[n]
                out[i] = toks[pos[n]]
    return best_t
