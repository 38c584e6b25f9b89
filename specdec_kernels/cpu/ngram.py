"""The CPU n-gram proposer: ``ngram_propose`` as one numba kernel (``cpu/_jit.py``).

Per request, the own-history match comes from a scan of the history or, with an index,
from one table lookup per n (``cpu/ngram_index.py``); with a corpus, the suffix n-grams
longer than the own match are looked up there too (``cpu/corpus.py``) and the longest wins.

The scan visits the window ends ``j <= L-2`` (a token must follow) in the tie-break's
order, skips every ``j`` whose token is not the last one, and extends a match backwards
token by token up to ``P = min(max_n, L-1)``: the first ``j`` that reaches the longest
``n`` wins, and one that reaches ``P`` ends the scan. On real text almost every ``j`` costs
one comparison, so a scan reads each history once, without the prefix table of a KMP scan.
"""

from __future__ import annotations

import numpy as np

from specdec_kernels.constants import DRAFT_SOURCE_CORPUS, DRAFT_SOURCE_NONE, DRAFT_SOURCE_OWN
from specdec_kernels.cpu._jit import (
    NONE_I32,
    NONE_I32_4D,
    NONE_I64,
    NONE_I64_2D,
    borrowed,
    jit,
    np_,
    opt,
    outputs,
    zeroed_i32,
)
from specdec_kernels.cpu.corpus import corpus_lookup
from specdec_kernels.cpu.ngram_index import extend_values_ok, index_rows, ngram_hash, own_lookup


@jit
def _scan(row, L, min_n, max_n, tie_last):
    """``(n, start of the drafts)`` of the own-history match by a scan; ``n = 0``: none."""
    P = min(max_n, L - 1)
    if P < min_n:
        return 0, 0
    last = row[L - 1]
    best, best_j = 0, -1
    for step in range(L - 1):
        j = L - 2 - step if tie_last else step
        if row[j] != last:
            continue
        c = 1
        while c < P and c <= j and row[j - c] == row[L - 1 - c]:
            c += 1
        if c > best and c >= min_n:
            best, best_j = c, j
            if c == P:
                break
    return best, best_j + 1


@jit
def _values_ok(num_tokens, L_max, rows, has_rows, caps, has_caps, length, has_index, B):
    """The wrapper's value checks (``ops/ngram.py``) as one pass: ``req_indices`` in
    ``[-1, R)``, the batch rows' lengths in ``[0, L_max]`` and equal to the index's,
    ``max_draft_tokens >= 0``."""
    R = num_tokens.shape[0]
    for b in range(B):
        r = np.int64(rows[b]) if has_rows else np.int64(b)
        if r < -1 or r >= R or (has_caps and caps[b] < 0):
            return False
        if r >= 0:
            L = num_tokens[r]
            if L < 0 or L > L_max or (has_index and length[r] != L):
                return False
    return True


@jit
def _propose(
    token_ids, num_tokens, rows, has_rows, caps, has_caps, table, length, has_index, c_tokens,
    c_meta, c_index, c_state, has_corpus, min_n, max_n, k, max_model_len, tie_last, check,
    drafts, counts, match_len, source,
):  # fmt: skip
    R, L_max = token_ids.shape
    B = drafts.shape[0]
    if check and not _values_ok(num_tokens, L_max, rows, has_rows, caps, has_caps, length,
                                has_index, B):  # fmt: skip
        return False
    token_ids, table, c_tokens, c_meta, c_index = borrowed(
        (token_ids, table, c_tokens, c_meta, c_index)
    )  # passed per request and per n: without reference counts
    for b in range(B):
        r = rows[b] if has_rows else b
        drafts[b, :] = -1
        counts[b] = 0
        match_len[b] = 0
        source[b] = DRAFT_SOURCE_NONE
        if r < 0 or r >= R:
            continue
        L = min(max(np.int64(num_tokens[r]), 0), L_max)
        row = token_ids[r]
        n_sel, start = 0, 0
        if has_index:
            for n in range(min(max_n, L), min_n - 1, -1):
                first, last = own_lookup(table[r, n - min_n], row, L, n, ngram_hash(row, L - n, n))
                if first >= 0:
                    n_sel, start = n, (last if tie_last else first) + n
                    break
        else:
            n_sel, start = _scan(row, L, min_n, max_n, tie_last)
        avail = L - start
        from_corpus = False
        if has_corpus:  # a longer match in the corpus wins (its most recent occurrence)
            lo = c_state[1]
            for n in range(min(max_n, L), max(n_sel, min_n - 1), -1):
                h = ngram_hash(row, L - n, n)
                p, doc_end = corpus_lookup(c_tokens, c_meta, c_index, lo, n - min_n, row, L, n, h)
                if p >= 0:
                    n_sel, start, avail, from_corpus = n, p + n, doc_end - (p + n), True
                    break
        if n_sel == 0:
            continue
        m = min(k, avail)
        if has_caps:
            m = min(m, caps[b])
        if max_model_len >= 0:
            m = min(m, max_model_len - L)
        if m <= 0:
            continue
        if from_corpus:
            C = c_tokens.shape[0]
            for t in range(m):
                drafts[b, t] = c_tokens[(start + t) % C]
            source[b] = DRAFT_SOURCE_CORPUS
        else:
            for t in range(m):
                drafts[b, t] = row[start + t]
            source[b] = DRAFT_SOURCE_OWN
        counts[b] = m
        match_len[b] = n_sel
    return True


@jit
def _propose_scan(
    token_ids, num_tokens, rows, has_rows, caps, has_caps, min_n, max_n, k, max_model_len,
    tie_last, check, drafts, counts, match_len, source,
):  # fmt: skip
    """:func:`_propose` without an index or corpus: a third fewer arguments to pass (each
    costs the call ~0.1 us, and a B = 1 scan call takes a few)."""
    return _propose(
        token_ids, num_tokens, rows, has_rows, caps, has_caps, NONE_I32_4D, NONE_I32, False,
        NONE_I32, NONE_I64_2D, NONE_I64_2D, NONE_I64, False, min_n, max_n, k, max_model_len,
        tie_last, check, drafts, counts, match_len, source,
    )  # fmt: skip


def ngram_propose(
    token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, *, min_n, max_n,
    num_speculative_tokens, max_model_len, tie_break,
):  # fmt: skip
    """The op's CPU function (the schema's arguments)."""
    return _run(
        token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, min_n, max_n,
        num_speculative_tokens, max_model_len, tie_break, False,
    )  # fmt: skip


def ngram_propose_checked(
    token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, *, min_n, max_n,
    num_speculative_tokens, max_model_len, tie_break,
):  # fmt: skip
    """:func:`ngram_propose` after the wrapper's value checks, run in the kernel (one pass,
    before it writes anything); None if one fails (``ops/_library.py``'s ``call`` then
    raises the wrapper's ``ValueError``). A B = 1 call takes a few microseconds: a separate
    numba call for the checks would add a fifth."""
    return _run(
        token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, min_n, max_n,
        num_speculative_tokens, max_model_len, tie_break, True,
    )  # fmt: skip


def _run(
    token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, min_n, max_n, k,
    max_model_len, tie_break, check_values,
):  # fmt: skip
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    tensors, arrays = outputs(((B, k), np.int32), (B, np.int32), (B, np.int32), (B, np.int8))
    head = (
        np_(token_ids), np_(num_tokens), opt(req_indices, NONE_I32), req_indices is not None,
        opt(max_draft_tokens, NONE_I32), max_draft_tokens is not None,
    )  # fmt: skip
    tail = (min_n, max_n, k, -1 if max_model_len is None else max_model_len, tie_break == "last",
            check_values, *arrays)  # fmt: skip
    if index is None and corpus is None:
        ok = _propose_scan(*head, *tail)
    else:
        c = (NONE_I32, NONE_I64_2D, NONE_I64_2D, NONE_I64) if corpus is None else map(np_, corpus)
        table, length = (NONE_I32_4D, NONE_I32) if index is None else map(np_, index)
        ok = _propose(*head, table, length, index is not None, *c, corpus is not None, *tail)
    return tuple(tensors) if ok else None


@jit
def _extend_propose(
    token_ids, num_tokens, rows, has_rows, caps, has_caps, table, length, c_tokens, c_meta,
    c_index, c_state, has_corpus, min_n, max_n, k, max_model_len, tie_last, check, seen, drafts,
    counts, match_len, source,
):  # fmt: skip
    """``ngram_index_extend`` then :func:`_propose` on the index, in one call; with
    ``check``, both wrappers' value checks first (nothing is written if one fails)."""
    if check and not extend_values_ok(num_tokens, token_ids.shape[1], rows, has_rows, length,
                                      caps, has_caps, seen):  # fmt: skip
        return False
    index_rows(token_ids, num_tokens, rows, has_rows, table, length, min_n, False)
    return _propose(
        token_ids, num_tokens, rows, has_rows, caps, has_caps, table, length, True, c_tokens,
        c_meta, c_index, c_state, has_corpus, min_n, max_n, k, max_model_len, tie_last, False,
        drafts, counts, match_len, source,
    )  # fmt: skip


def extend_and_propose(
    token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, *, min_n, max_n,
    num_speculative_tokens, max_model_len, tie_break, check,
):  # fmt: skip
    """``ngram_index_extend`` + ``ngram_propose`` on the index as one numba call (the
    arguments of ``ngram_propose``'s schema, the index ``[table, length]`` written in
    place): what ``ops.ngram_propose(..., extend_index=True)`` runs on plain CPU tensors.
    With ``check``, None if the values are refused (nothing written)."""
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    k = num_speculative_tokens
    tensors, arrays = outputs(((B, k), np.int32), (B, np.int32), (B, np.int32), (B, np.int8))
    c = (NONE_I32, NONE_I64_2D, NONE_I64_2D, NONE_I64) if corpus is None else map(np_, corpus)
    table, length = map(np_, index)
    ok = _extend_propose(
        np_(token_ids), np_(num_tokens), opt(req_indices, NONE_I32), req_indices is not None,
        opt(max_draft_tokens, NONE_I32), max_draft_tokens is not None, table, length, *c,
        corpus is not None, min_n, max_n, k, -1 if max_model_len is None else max_model_len,
        tie_break == "last", check, zeroed_i32(num_tokens.shape[0]) if check else NONE_I32,
        *arrays,
    )  # fmt: skip
    return tuple(tensors) if ok else None
