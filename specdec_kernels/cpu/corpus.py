"""The CPU shared corpus: ``corpus_append`` and the corpus lookup of ``ngram_propose``, as
numba kernels (``cpu/_jit.py``).

An append plans the documents' absolute starts and the new live window (the oldest whole
documents leave), writes the live documents' tokens and bounds into the ring, and maxes
every occurrence's start into the two slots of its n-gram. A lookup reads the suffix
n-gram's two slots and keeps the most recent start that is live and whose ring tokens are
the n-gram. The hashes are ``cpu/ngram_index.py``'s.
"""

from __future__ import annotations

import numpy as np

from specdec_kernels.cpu._jit import NONE_I32, jit, np_, opt
from specdec_kernels.cpu.ngram_index import mix1, mix2, ngram_hash


@jit
def _append(doc_tokens, doc_lens, rows, has_rows, tokens, meta, index, state, min_n):
    C = tokens.shape[0]
    N, H = index.shape
    R, W = doc_tokens.shape
    B = rows.shape[0] if has_rows else doc_lens.shape[0]
    end, lo = state[0], state[1]
    starts = np.full(B, -1, dtype=np.int64)
    kept = np.zeros(B, dtype=np.int64)
    src = np.zeros(B, dtype=np.int64)
    pos = end
    for b in range(B):
        r = rows[b] if has_rows else b
        if r < 0 or r >= R:
            continue
        D = min(max(np.int64(doc_lens[r]), 0), W)
        if D == 0:
            continue
        kept[b] = min(D, C)  # a document longer than the corpus keeps its last C tokens
        src[b] = D - kept[b]
        starts[b] = pos
        pos += kept[b]
    new_end = pos
    q = new_end - C  # every live token lies in [q, new_end): the oldest whole documents go
    if q <= lo:
        new_lo = lo
    elif q < end:
        ds, de = meta[q % C, 0], meta[q % C, 1]
        new_lo = q if ds == q else de
    else:
        new_lo = new_end
        for b in range(B):
            if kept[b] > 0 and starts[b] >= q:
                new_lo = min(new_lo, starts[b])
    for b in range(B):
        s = starts[b]
        if kept[b] == 0 or s < new_lo:
            continue  # nothing, or evicted by the later documents of this call
        r = rows[b] if has_rows else b
        doc = doc_tokens[r]
        n_tok = kept[b]
        for t in range(n_tok):
            p = (s + t) % C
            tokens[p] = doc[src[b] + t]
            meta[p, 0] = s
            meta[p, 1] = s + n_tok
        for j in range(N):
            n = min_n + j
            for t in range(n_tok - n):  # a following token in the same document
                h = ngram_hash(doc, src[b] + t, n)
                for slot in (mix1(h) % H, mix2(h) % H):
                    if s + t > index[j, slot]:
                        index[j, slot] = s + t
    state[0] = new_end
    state[1] = new_lo


@jit
def corpus_lookup(tokens, meta, index, lo, j, row, L, n, h):
    """``(p, doc_end)`` of the most recent live occurrence of ``row[L-n : L]`` (hash ``h``)
    that one of its two slots of table ``j`` keeps; ``(-1, 0)`` if none."""
    C = tokens.shape[0]
    H = index.shape[1]
    best = np.int64(-1)
    for slot in (mix1(h) % H, mix2(h) % H):
        p = index[j, slot]
        if p < lo or p <= best:
            continue
        ok = True
        for t in range(n):
            if tokens[(p + t) % C] != row[L - n + t]:
                ok = False
                break
        if ok:
            best = p
    if best < 0:
        return best, np.int64(0)
    return best, meta[best % C, 1]


def corpus_append(doc_tokens, doc_lens, req_indices, corpus, *, min_n, max_n):
    tokens, meta, index, state = (np_(t) for t in corpus)
    _append(
        np_(doc_tokens), np_(doc_lens), opt(req_indices, NONE_I32), req_indices is not None,
        tokens, meta, index, state, min_n,
    )  # fmt: skip
