"""The CPU frequency index and proposer: ``frequency_index_build`` / ``_extend`` and
``ngram_propose(scoring="frequency")`` as numba kernels (``cpu/_jit.py``).

A row's trie (``docs/design.md``, "Frequency-scored drafting"): node ``n`` is a maximal run
of context depths ``lo..hi[n]`` (``lo`` one past its parent's ``hi``) whose contexts have
the same occurrences, with their count ``cnt``, the end ``pos`` of their latest occurrence
and ``best``, the node of their most frequent continuation (ties: the latest); an
open-addressing table maps ``(parent, first edge token)`` to the node. Edge tokens are
read from the row at any occurrence, so the trie stores no tokens. Appending position
``p`` walks its path (splitting the node where it leaves a run: the new upper part takes
the old key, the lower part keeps its id, so nothing is re-keyed) and then the path of
``p - 1``, whose contexts gained a continuation: O(D) per token, at most two new nodes.

Values read from the state are guarded (probes bounded, node ids and positions inside
their arrays), so a state of unchecked values (``validate=False``) cannot make a kernel
touch memory outside them; the trie a valid state gives is exact.
"""

from __future__ import annotations

import numpy as np

from specdec_kernels.constants import DRAFT_SOURCE_CORPUS, DRAFT_SOURCE_NONE, DRAFT_SOURCE_OWN
from specdec_kernels.constants import FREQUENCY_HASH_C0 as C0
from specdec_kernels.constants import FREQUENCY_HASH_C1 as C1
from specdec_kernels.constants import FREQUENCY_HASH_C2 as C2
from specdec_kernels.constants import NGRAM_HASH_MASK as M32
from specdec_kernels.cpu import ngram as _ngram
from specdec_kernels.cpu import ngram_index as _index
from specdec_kernels.cpu._jit import (
    NONE_I32,
    NONE_I32_2D,
    NONE_I64,
    NONE_I64_2D,
    borrowed,
    jit,
    np_,
    opt,
    outputs,
    zeroed_i32,
)

CNT, HI, POS, BEST = 0, 1, 2, 3
ACTIVE = 0  # the corpus state's active store (``cpu/frequency_corpus.py``)
_NO_TOKEN = np.int64(1) << 40  # outside int32: equals no stored token
_NO_CORPUS = (NONE_I32_2D, NONE_I64_2D, NONE_I32_2D, np.zeros((0, 4, 0), np.int32), NONE_I32,
              NONE_I64)  # fmt: skip


@jit
def _key(parent, tok):
    return (np.int64(parent + 1) << 32) | ((np.int64(tok) + 1) & M32)


@jit
def _home(parent, tok, mask):
    h = (np.int64(parent + 1) * C0 + ((np.int64(tok) + 1) & M32)) & M32
    h = ((h ^ (h >> 16)) * C1) & M32
    h = ((h ^ (h >> 13)) * C2) & M32
    return (h ^ (h >> 16)) & mask


@jit
def _slot(keys, parent, tok):
    """The slot of ``(parent, tok)``'s key, else the empty slot where it goes; -1 if a
    (corrupt) table has neither."""
    key, mask = _key(parent, tok), np.int64(keys.shape[0] - 1)
    i = _home(parent, tok, mask)
    for _ in range(keys.shape[0]):
        if keys[i] == key or keys[i] == 0:
            return i
        i = (i + 1) & mask
    return np.int64(-1)


@jit
def _find(keys, vals, used, parent, tok):
    """The child of ``parent`` whose edge starts with ``tok``; -1: none."""
    i = _slot(keys, parent, tok)
    if i < 0 or keys[i] == 0:
        return np.int64(-1)
    n = np.int64(vals[i])
    return n if 0 < n < used else np.int64(-1)


@jit
def _put(keys, vals, parent, tok, node):
    i = _slot(keys, parent, tok)
    if i >= 0:
        keys[i] = _key(parent, tok)
        vals[i] = node


@jit
def _at(row, i):
    return np.int64(row[i]) if 0 <= i < row.shape[0] else _NO_TOKEN


@jit
def _new_node(nodes, used, cnt, hi, pos, best):
    n = used[0]
    used[0] += 1
    nodes[CNT, n], nodes[HI, n], nodes[POS, n], nodes[BEST, n] = cnt, hi, pos, best
    return np.int64(n)


@jit
def _insert(keys, vals, nodes, used, row, p, Dp, path):
    """Count the contexts ending at ``p`` (depths ``1..Dp``); ``path[d]``: their nodes."""
    node, depth = np.int64(0), np.int64(0)
    while depth < Dp:
        t, lo = row[p - depth], depth + 1
        child = _find(keys, vals, used[0], node, t)
        if child < 0:
            leaf = _new_node(nodes, used, 1, Dp, p, -1)
            _put(keys, vals, node, t, leaf)
            path[lo : Dp + 1] = leaf
            return
        c_hi, c_pos = max(np.int64(nodes[HI, child]), lo), np.int64(nodes[POS, child])
        d = lo + 1
        while d <= min(c_hi, Dp) and _at(row, c_pos - d + 1) == row[p - d + 1]:
            d += 1
        if d > c_hi:
            nodes[CNT, child] += 1
            nodes[POS, child] = max(c_pos, p)
            path[lo : c_hi + 1] = child
            node, depth = child, max(c_hi, depth + 1)  # max: a corrupt hi cannot loop
            continue
        up = _new_node(nodes, used, nodes[CNT, child] + 1, d - 1, max(c_pos, p),
                       nodes[BEST, child])  # fmt: skip
        _put(keys, vals, node, t, up)
        _put(keys, vals, up, _at(row, c_pos - d + 1), child)
        path[lo:d] = up
        if d <= Dp:
            leaf = _new_node(nodes, used, 1, Dp, p, -1)
            _put(keys, vals, up, row[p - d + 1], leaf)
            path[d : Dp + 1] = leaf
        return


@jit
def append_position(keys, vals, nodes, used, row, p, Dp, path):
    """Count the ``Dp`` contexts ending at position ``p`` of ``row`` (``Dp`` stops at ``D``
    and at the document's start) into one trie."""
    _insert(keys, vals, nodes, used, row, p, Dp, path)
    node, depth = np.int64(0), np.int64(0)  # the contexts ending at p - 1 gained row[p]
    while depth < Dp - 1:
        w = _find(keys, vals, used[0], node, row[p - 1 - depth])
        if w < 0:  # only in a corrupt trie
            return
        x, b = path[depth + 2], np.int64(nodes[BEST, w])
        if b != x and (
            b <= 0 or b >= used[0] or nodes[CNT, x] > nodes[CNT, b]
            or (nodes[CNT, x] == nodes[CNT, b] and nodes[POS, x] >= nodes[POS, b])
        ):  # fmt: skip
            nodes[BEST, w] = x
        node, depth = w, max(np.int64(nodes[HI, w]), depth + 1)


@jit
def _index_rows(token_ids, num_tokens, rows, has_rows, keys, vals, nodes, used, length, D,
                scratch, check, seen):  # fmt: skip
    """Count the new positions of every batch row (``scratch``: from an empty trie).
    ``check``: the wrapper's value checks first (False: refused, nothing written)."""
    R, L_max = token_ids.shape
    M = nodes.shape[2]
    if check and not _index.index_values_ok(num_tokens, L_max, rows, has_rows, length,
                                            not scratch, seen):  # fmt: skip
        return False
    path = np.zeros(D + 2, np.int64)  # node 0 where a corrupt trie leaves a depth unfilled
    B = rows.shape[0] if has_rows else R
    token_ids, keys, vals, nodes, used = borrowed((token_ids, keys, vals, nodes, used))
    for b in range(B):
        r = rows[b] if has_rows else b
        if r < 0 or r >= R:
            continue
        L = min(max(np.int64(num_tokens[r]), 0), L_max)
        if scratch:
            keys[r] = 0
            used[r] = 1
        u = used[r : r + 1]
        for p in range(0 if scratch else max(length[r], 0), L):
            if u[0] < 1 or u[0] > M - 2:  # only a corrupt state: two nodes a position fit
                break
            append_position(keys[r], vals[r], nodes[r], u, token_ids[r], p, min(p + 1, D), path)
        length[r] = max(L, 0 if scratch else length[r])
    return True


def _run_index(token_ids, num_tokens, req_indices, index, max_n, scratch, check):
    keys, vals, nodes, used, length = (np_(t) for t in index)
    seen = zeroed_i32(num_tokens.shape[0]) if check else NONE_I32
    return _index_rows(
        np_(token_ids), np_(num_tokens), opt(req_indices, NONE_I32), req_indices is not None,
        keys, vals, nodes, used, length, max_n, scratch, check, seen,
    )  # fmt: skip


def frequency_index_build(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    _run_index(token_ids, num_tokens, req_indices, index, max_n, True, False)


def frequency_index_extend(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    _run_index(token_ids, num_tokens, req_indices, index, max_n, False, False)


def frequency_index_build_checked(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    """:func:`frequency_index_build` after the wrapper's value checks, in the kernel; None
    if one fails (``ops/_library.py``'s ``call``), else True."""
    return _run_index(token_ids, num_tokens, req_indices, index, max_n, True, True) or None


def frequency_index_extend_checked(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    """:func:`frequency_index_extend` after the wrapper's value checks (as the build's)."""
    return _run_index(token_ids, num_tokens, req_indices, index, max_n, False, True) or None


# ----------------------------------------------------------------------------- proposals


@jit
def draft_cap(m, cap, D, factor, offset):
    """``min(cap, D - m, floor(factor * m + offset))`` (float64, no fused multiply-add)."""
    lim = min(cap, D - m)
    c = m * factor + offset
    return lim if c >= lim else np.int64(np.floor(c))


@jit
def _chain(nodes, used, store, node, max_len, min_prob, out, probs):
    """Follow ``best`` from ``node`` for at most ``max_len`` drafts while the running
    probability stays ``>= min_prob``: ``(drafts, score)``; writes them (read from the
    trie's token ``store``) when ``out`` has room (a final pass), else only counts."""
    n, prob, score, t = node, 1.0, 0.0, 0
    while t < max_len:
        x = np.int64(nodes[BEST, n])
        if x <= 0 or x >= used:
            break
        nxt = prob * (np.float64(nodes[CNT, x]) / np.float64(nodes[CNT, n]))
        if nxt < min_prob:
            break
        if out.shape[0]:
            out[t] = _at(store, nodes[POS, x])
            probs[t] = np.float32(nxt)
        prob = nxt
        score += nxt
        t += 1
        n = x
    return t, score


@jit
def best_chain(keys, vals, nodes, used, store, row, L, min_n, D, cap, factor, offset, min_prob):
    """The best-scoring chain of the contexts ``row[L-m:L]`` in one trie (edges read from its
    token ``store``): ``(node, max_len, m, score)``, node -1 if none drafts."""
    empty_i, empty_f = np.zeros(0, np.int32), np.zeros(0, np.float32)
    best_node, best_len, best_m, best_score = np.int64(-1), np.int64(0), 0, 0.0
    node = np.int64(0)
    for m in range(1, min(D - 1, L) + 1):
        t_q = row[L - m]
        if m > nodes[HI, node]:
            node = _find(keys, vals, used, node, t_q)
            if node < 0:
                break
        elif _at(store, nodes[POS, node] - m + 1) != t_q:
            break
        if nodes[BEST, node] < 0:  # no continuation, so none for longer contexts either
            break
        if m < min_n:
            continue
        max_len = draft_cap(m, cap, D, factor, offset)
        t, score = _chain(nodes, used, store, node, max_len, min_prob, empty_i, empty_f)
        if t > 0 and score >= best_score:
            best_node, best_len, best_m, best_score = node, max_len, m, score
    return best_node, best_len, best_m, best_score


@jit
def _propose(token_ids, num_tokens, rows, has_rows, caps, has_caps, keys, vals, nodes, used,
             length, c_tokens, c_keys, c_vals, c_nodes, c_used, c_state, has_corpus, min_n, D,
             k, max_model_len, min_prob, factor, offset, check, drafts, counts, match_len,
             source, probs):  # fmt: skip
    R, L_max = token_ids.shape
    B = drafts.shape[0]
    if check and not _ngram._values_ok(num_tokens, L_max, rows, has_rows, caps, has_caps,
                                       length, True, B):  # fmt: skip
        return False
    a = min(max(c_state[ACTIVE], 0), 1) if has_corpus else 0
    token_ids, keys, vals, nodes, c_tokens, c_keys, c_vals, c_nodes, drafts, probs = borrowed(
        (token_ids, keys, vals, nodes, c_tokens, c_keys, c_vals, c_nodes, drafts, probs)
    )
    for b in range(B):
        r = rows[b] if has_rows else b
        drafts[b, :] = -1
        probs[b, :] = 0.0
        counts[b], match_len[b], source[b] = 0, 0, DRAFT_SOURCE_NONE
        if r < 0 or r >= R:
            continue
        L = min(max(np.int64(num_tokens[r]), 0), L_max)
        row = token_ids[r]
        cap = min(k, caps[b]) if has_caps else k
        if max_model_len >= 0:
            cap = min(cap, max_model_len - L)
        u = min(np.int64(used[r]), nodes.shape[2])  # a corrupt count cannot reach past M
        node, max_len, m, score = best_chain(keys[r], vals[r], nodes[r], u, row, row, L, min_n,
                                             D, cap, factor, offset, min_prob)  # fmt: skip
        nd, store, src = nodes[r], row, DRAFT_SOURCE_OWN
        if has_corpus:  # the corpus wins on a higher score (ties: the own history)
            c_u = min(np.int64(c_used[a]), c_nodes.shape[2])
            c = best_chain(c_keys[a], c_vals[a], c_nodes[a], c_u, c_tokens[a], row,
                           L, min_n, D, cap, factor, offset, min_prob)  # fmt: skip
            if c[0] >= 0 and c[3] > score:
                node, max_len, m, score = c
                nd, u, store = c_nodes[a], c_u, c_tokens[a]
                src = DRAFT_SOURCE_CORPUS
        if node >= 0:
            t, _ = _chain(nd, u, store, node, max_len, min_prob, drafts[b], probs[b])
            counts[b], match_len[b], source[b] = t, m, src
    return True


@jit
def _extend_propose(token_ids, num_tokens, rows, has_rows, caps, has_caps, keys, vals, nodes,
                    used, length, c_tokens, c_keys, c_vals, c_nodes, c_used, c_state,
                    has_corpus, min_n, D, k, max_model_len, min_prob, factor, offset, check,
                    seen, drafts, counts, match_len, source, probs):  # fmt: skip
    """The extend (``_index_rows``) then :func:`_propose`, in one call; with ``check``, both
    wrappers' value checks first (nothing is written if one fails)."""
    if check and not _index.extend_values_ok(num_tokens, token_ids.shape[1], rows, has_rows,
                                             length, caps, has_caps, seen):  # fmt: skip
        return False
    _index_rows(token_ids, num_tokens, rows, has_rows, keys, vals, nodes, used, length, D,
                False, False, seen)  # fmt: skip
    return _propose(
        token_ids, num_tokens, rows, has_rows, caps, has_caps, keys, vals, nodes, used, length,
        c_tokens, c_keys, c_vals, c_nodes, c_used, c_state, has_corpus, min_n, D, k,
        max_model_len, min_prob, factor, offset, False, drafts, counts, match_len, source,
        probs,
    )  # fmt: skip


def _run_propose(token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, min_n,
                 max_n, k, max_model_len, min_token_prob, max_spec_factor, max_spec_offset,
                 check, extend=False):  # fmt: skip
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    tensors, arrays = outputs(((B, k), np.int32), (B, np.int32), (B, np.int32), (B, np.int8),
                              ((B, k), np.float32))  # fmt: skip
    c = _NO_CORPUS if corpus is None else tuple(map(np_, corpus[:5])) + (np_(corpus[6]),)
    args = (
        np_(token_ids), np_(num_tokens), opt(req_indices, NONE_I32), req_indices is not None,
        opt(max_draft_tokens, NONE_I32), max_draft_tokens is not None, *map(np_, index), *c,
        corpus is not None, min_n, max_n, k, -1 if max_model_len is None else max_model_len,
        min_token_prob, max_spec_factor, max_spec_offset, check,
    )  # fmt: skip
    if extend:
        seen = zeroed_i32(num_tokens.shape[0]) if check else NONE_I32
        ok = _extend_propose(*args, seen, *arrays)
    else:
        ok = _propose(*args, *arrays)
    return tuple(tensors) if ok else None


def extend_and_propose(
    token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, *, min_n, max_n,
    num_speculative_tokens, max_model_len, min_token_prob, max_spec_factor, max_spec_offset,
    check,
):  # fmt: skip
    """``frequency_index_extend`` + ``frequency_propose`` as one numba call (the index
    ``[keys, vals, nodes, num_nodes, length]`` written in place): what
    ``ops.ngram_propose(..., scoring="frequency", extend_index=True)`` runs on plain CPU
    tensors. With ``check``, None if the values are refused (nothing written)."""
    return _run_propose(
        token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, min_n, max_n,
        num_speculative_tokens, max_model_len, min_token_prob, max_spec_factor,
        max_spec_offset, check, extend=True,
    )  # fmt: skip


def frequency_propose(
    token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, *, min_n, max_n,
    num_speculative_tokens, max_model_len, min_token_prob, max_spec_factor, max_spec_offset,
):  # fmt: skip
    """The op's CPU function (the schema's arguments)."""
    return _run_propose(
        token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, min_n, max_n,
        num_speculative_tokens, max_model_len, min_token_prob, max_spec_factor,
        max_spec_offset, False,
    )  # fmt: skip


def frequency_propose_checked(
    token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, *, min_n, max_n,
    num_speculative_tokens, max_model_len, min_token_prob, max_spec_factor, max_spec_offset,
):  # fmt: skip
    """:func:`frequency_propose` after the wrapper's value checks (in the kernel); None: refused."""
    return _run_propose(
        token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, min_n, max_n,
        num_speculative_tokens, max_model_len, min_token_prob, max_spec_factor,
        max_spec_offset, True,
    )  # fmt: skip
