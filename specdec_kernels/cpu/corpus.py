"""Vectorised torch shared corpus: the CPU path of ``corpus_append`` and the corpus lookup
of ``ngram_propose``.

Appends are a few flat gathers and one ``scatter_reduce(amax)`` per n over the new
occurrences; a lookup reads, for every suffix key of the batch, the corpus's two slots and
keeps the most recent live occurrence that holds the key.
"""

from __future__ import annotations

import torch

from specdec_kernels.cpu.ngram_index import (
    SuffixKeys,
    _ar,
    batch_rows,
    hash_ngrams,
    longest_per_row,
    mix1,
    mix2,
)


def corpus_append(doc_tokens, doc_lens, req_indices, corpus, *, min_n, max_n):
    corpus_tokens, corpus_meta, corpus_index, corpus_state = corpus
    C = corpus_tokens.shape[0]
    N, H = corpus_index.shape
    rows = batch_rows(req_indices, doc_lens.shape[0])
    if rows.numel() == 0:
        return
    D = doc_lens[rows].long()
    rows, D = rows[D > 0], D[D > 0]
    if rows.numel() == 0:
        return
    kept = D.clamp(max=C)  # a document longer than C keeps its last C tokens
    end, lo = int(corpus_state[0]), int(corpus_state[1])
    starts = end + torch.cumsum(kept, 0) - kept
    new_end = end + int(kept.sum())
    q = new_end - C
    if q <= lo:
        new_lo = lo
    elif q < end:
        ds, de = corpus_meta[q % C].tolist()
        new_lo = q if ds == q else de
    else:
        new_lo = int(starts[starts >= q].min())
    live = starts >= new_lo
    rows, D, kept, starts = rows[live], D[live], kept[live], starts[live]
    if rows.numel():
        # flat view of the new live tokens: document d, offset t
        doc = torch.repeat_interleave(torch.arange(rows.numel()), kept)
        t = torch.arange(doc.numel()) - (torch.cumsum(kept, 0) - kept)[doc]
        src_pos = D[doc] - kept[doc] + t
        tok = doc_tokens[rows[doc], src_pos]
        p = starts[doc] + t
        slot = p % C
        corpus_tokens[slot] = tok
        corpus_meta[slot, 0] = starts[doc]
        corpus_meta[slot, 1] = (starts + kept)[doc]
        tok64 = tok.long()
        max_n_ = min_n + N - 1
        width = tok64.numel()
        cols = (torch.arange(width)[:, None] + torch.arange(max_n_)).clamp(max=width - 1)
        grams = tok64[cols]
        for j in range(N):
            n = min_n + j
            ok = t + n < kept[doc]  # a following token in the same document
            h = hash_ngrams(grams[ok], n)
            pj = p[ok]
            tab = corpus_index[j]
            tab.scatter_reduce_(0, mix1(h) % H, pj, "amax")
            tab.scatter_reduce_(0, mix2(h) % H, pj, "amax")
    corpus_state[0] = new_end
    corpus_state[1] = new_lo


def _corpus_lookup(corpus_tokens, corpus_meta, corpus_index, corpus_state, js, key, ns, h):
    """(found, p, doc_end) of the most recent live occurrence the corpus table keeps."""
    C = corpus_tokens.shape[0]
    N, H = corpus_index.shape
    lo = corpus_state[1]
    t = _ar(key.shape[1])
    best = torch.full((js.numel(),), -1, dtype=torch.long)
    for s in (mix1(h) % H, mix2(h) % H):
        p = corpus_index[js, s]
        ok = p >= lo
        cand = corpus_tokens[(p.clamp(min=0)[:, None] + t) % C]
        ok &= ((cand == key) | (t >= ns[:, None])).all(1)
        best = torch.where(ok, torch.maximum(best, p), best)
    found = best >= 0
    doc_end = torch.where(found, corpus_meta[best.clamp(min=0) % C, 1], 0)
    return found, best, doc_end


def corpus_match(corpus, keys: SuffixKeys, B: int):
    """Per batch row: the longest n found in the corpus (0: none), the start of its drafts
    and the end of their document."""
    found, p, doc_end = _corpus_lookup(*corpus, keys.jj, keys.key, keys.nn, keys.h)
    n, sel = longest_per_row(B, keys, found)
    if found.numel() == 0:
        return n, n, n
    return n, p.index_select(0, sel) + n, doc_end.index_select(0, sel)
