"""Plain-Python shared corpus: the oracle for ``corpus_append`` and the corpus lookup.

The **shared corpus** (``docs/design.md``, "Shared corpus"): a ring of ``C`` token slots
holding whole documents at absolute positions (slot ``p % C``), the live window
``[lo, end)``, and per n a table of ``H`` slots where slot ``s`` keeps the largest (most
recent) start ``p`` of all n-gram occurrences (with a following token in the same
document) whose hash maps to ``s`` (two hashes per n-gram). A lookup is exact when it
succeeds and may miss (see :func:`corpus_lookup`).
"""

from __future__ import annotations

from specdec_kernels.reference.ngram_index import mix1, mix2, ngram_hash


def _rows(req_indices, R):
    return list(range(R)) if req_indices is None else req_indices.tolist()


def corpus_append(doc_tokens, doc_lens, req_indices, corpus, *, min_n, max_n):
    """Append one document per batch row (``doc_tokens[r, :doc_lens[r]]``), oldest first."""
    corpus_tokens, corpus_meta, corpus_index, corpus_state = corpus
    C = corpus_tokens.shape[0]
    N, H = corpus_index.shape
    end, lo = int(corpus_state[0]), int(corpus_state[1])
    docs = []
    for r in _rows(req_indices, doc_lens.shape[0]):
        if r < 0 or int(doc_lens[r]) == 0:
            continue
        D = int(doc_lens[r])
        docs.append(doc_tokens[r, max(D - C, 0) : D].tolist())  # at most the last C tokens
    starts = []
    pos = end
    for d in docs:
        starts.append(pos)
        pos += len(d)
    new_end = pos
    q = new_end - C  # every live token lies in [q, new_end); the oldest whole documents go
    if q <= lo:
        new_lo = lo
    elif q < end:
        ds, de = corpus_meta[q % C].tolist()
        new_lo = q if ds == q else de
    else:
        new_lo = min(s for s in starts if s >= q)
    for s, d in zip(starts, docs, strict=True):
        if s < new_lo:
            continue  # evicted by the later documents of this call
        for t, x in enumerate(d):
            corpus_tokens[(s + t) % C] = x
            corpus_meta[(s + t) % C, 0] = s
            corpus_meta[(s + t) % C, 1] = s + len(d)
        for j in range(N):
            n = min_n + j
            for t in range(len(d) - n):  # t + n < len(d): a following token in the document
                h = ngram_hash(d[t : t + n])
                for slot in (mix1(h) % H, mix2(h) % H):
                    if s + t > int(corpus_index[j, slot]):
                        corpus_index[j, slot] = s + t
    corpus_state[0] = new_end
    corpus_state[1] = new_lo


def corpus_lookup(corpus, *, min_n: int):
    """What a corpus lookup returns, derived from the live documents (not from the table).

    Returns ``{(n, n-gram): (p, doc_end)}`` for the n-grams a lookup finds: the most recent
    live occurrence ``p`` (with a following token in its document), kept iff one of the
    n-gram's two slots has ``p`` as the largest start among all live occurrences hashed
    there. That is the table's contract: a slot holds the maximum over everything ever
    inserted into it, evicted occurrences are older than every live one, so a slot whose
    maximum belongs to another n-gram hides this one (a miss), and a hit is always the most
    recent occurrence.
    """
    corpus_tokens, corpus_meta, corpus_index, corpus_state = corpus
    C = corpus_tokens.shape[0]
    N, H = corpus_index.shape
    end, lo = int(corpus_state[0]), int(corpus_state[1])
    ring = corpus_tokens.tolist()
    meta = corpus_meta.tolist()
    latest: dict[tuple[int, tuple[int, ...]], tuple[int, int]] = {}
    slot_max: dict[tuple[int, int], int] = {}
    for p in range(lo, end):
        _, de = meta[p % C]
        for j in range(N):
            n = min_n + j
            if p + n >= de:
                continue
            key = tuple(ring[(p + t) % C] for t in range(n))
            latest[(n, key)] = (p, de)
            h = ngram_hash(list(key))
            for s in (mix1(h) % H, mix2(h) % H):
                slot_max[(j, s)] = max(slot_max.get((j, s), -1), p)
    found = {}
    for (n, key), (p, de) in latest.items():
        h = ngram_hash(list(key))
        j = n - min_n
        if any(slot_max[(j, s)] == p for s in (mix1(h) % H, mix2(h) % H)):
            found[(n, key)] = (p, de)
    return found
