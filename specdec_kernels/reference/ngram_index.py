"""Plain-Python n-gram index and shared corpus: the oracle for the ``ngram_index`` family.

Two structures (``docs/design-ngram-index.md``):

- the **own-history index** of a request: for every ``n`` in ``[min_n, max_n]`` and every
  n-gram of ``token_ids[r, :L]`` that has a following token, its first and last start
  ``i``. Here it is rebuilt as a Python dict from the tokens on every call, so the
  proposals below are the definition, independent of the hash table the fast paths keep;
  ``ngram_index_build``/``_extend`` still fill that table (plain sequential linear probing)
  so that the table contents can be compared entry for entry;
- the **shared corpus**: a ring of ``C`` token slots holding whole documents at absolute
  positions (slot ``p % C``), the live window ``[lo, end)``, and per n a table of ``H``
  slots where slot ``s`` keeps the largest (most recent) start ``p`` of all n-gram
  occurrences (with a following token in the same document) whose hash maps to ``s``
  (two hashes per n-gram). A lookup is exact when it succeeds and may miss (see
  :func:`corpus_lookup`).

The hash functions below are the specification: the CPU path and the Triton kernels
compute the same values (tests check the tables slot for slot).
"""

from __future__ import annotations

import torch

from specdec_kernels.constants import DRAFT_SOURCE_CORPUS as CORPUS
from specdec_kernels.constants import DRAFT_SOURCE_OWN as OWN
from specdec_kernels.constants import NGRAM_HASH_FNV_OFFSET as FNV_OFFSET
from specdec_kernels.constants import NGRAM_HASH_FNV_PRIME as FNV_PRIME
from specdec_kernels.constants import NGRAM_HASH_MASK as M32
from specdec_kernels.constants import NGRAM_HASH_MIX1 as MIX1
from specdec_kernels.constants import NGRAM_HASH_MIX2 as MIX2


def ngram_hash(tokens: list[int]) -> int:
    """32-bit hash of an n-gram (FNV-1a over 32-bit words with an xorshift per word)."""
    h = FNV_OFFSET ^ len(tokens)
    for x in tokens:
        h = ((h ^ (x & M32)) * FNV_PRIME) & M32
        h ^= h >> 15
    return h


def mix1(h: int) -> int:
    """First finaliser: the own-history table slot is ``mix1(h) % S``, corpus slot 1 ``% H``."""
    h ^= h >> 16
    h = (h * MIX1) & M32
    return h ^ (h >> 16)


def mix2(h: int) -> int:
    """Second finaliser: corpus slot 2 is ``mix2(h) % H``."""
    h ^= h >> 15
    h = (h * MIX2) & M32
    return h ^ (h >> 13)


def _rows(req_indices, R):
    return list(range(R)) if req_indices is None else req_indices.tolist()


# ----------------------------------------------------------------------------- own history


def _insert_row(table: list[list[int]], S: int, seq: list[int], n: int, i: int) -> None:
    """Sequential linear probing: find the n-gram ``seq[i:i+n]`` or an empty slot."""
    key = seq[i : i + n]
    pos = mix1(ngram_hash(key)) % S
    while True:
        first, last = table[pos]
        if first < 0:
            table[pos] = [i, i]
            return
        if seq[first : first + n] == key:
            table[pos] = [min(first, i), max(last, i)]
            return
        pos = (pos + 1) % S


def _index_rows(token_ids, num_tokens, req_indices, index, index_len, *, min_n, from_scratch):
    R, N, S, _ = index.shape
    for r in _rows(req_indices, num_tokens.shape[0]):
        if r < 0:
            continue
        L = int(num_tokens[r])
        old = 0 if from_scratch else int(index_len[r])
        seq = token_ids[r, :L].tolist()
        for j in range(N):
            n = min_n + j
            table = [[-1, -1]] * S if from_scratch else index[r, j].tolist()
            # an n-gram at i joins once token i + n exists: i + n in [old, L)
            for i in range(max(old - n, 0), L - n):
                _insert_row(table, S, seq, n, i)
            index[r, j] = torch.tensor(table, dtype=torch.int32)
        index_len[r] = max(L, old)


def ngram_index_build(
    token_ids, num_tokens, req_indices, index, index_len, *, min_n: int, max_n: int
) -> None:
    """Index rows ``r = req_indices[b]`` from scratch over ``token_ids[r, :num_tokens[r]]``."""
    _index_rows(
        token_ids, num_tokens, req_indices, index, index_len, min_n=min_n, from_scratch=True
    )


def ngram_index_extend(
    token_ids, num_tokens, req_indices, index, index_len, *, min_n: int, max_n: int
) -> None:
    """Add the n-grams completed by tokens ``index_len[r] .. num_tokens[r]-1`` of each row."""
    _index_rows(
        token_ids, num_tokens, req_indices, index, index_len, min_n=min_n, from_scratch=False
    )


def own_occurrences(seq: list[int], n: int) -> dict[tuple[int, ...], list[int]]:
    """n-gram -> [first, last] start over the windows of ``seq`` that have a following token."""
    found: dict[tuple[int, ...], list[int]] = {}
    for i in range(len(seq) - n):
        key = tuple(seq[i : i + n])
        if key in found:
            found[key][1] = i
        else:
            found[key] = [i, i]
    return found


# ----------------------------------------------------------------------------- corpus


def corpus_append(
    doc_tokens,
    doc_lens,
    req_indices,
    corpus_tokens,
    corpus_meta,
    corpus_index,
    corpus_state,
    *,
    min_n: int,
    max_n: int,
) -> None:
    """Append one document per batch row (``doc_tokens[r, :doc_lens[r]]``), oldest first."""
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


def corpus_lookup(corpus_tokens, corpus_meta, corpus_index, corpus_state, *, min_n: int):
    """What a corpus lookup returns, derived from the live documents (not from the table).

    Returns ``{(n, n-gram): (p, doc_end)}`` for the n-grams a lookup finds: the most recent
    live occurrence ``p`` (with a following token in its document), kept iff one of the
    n-gram's two slots has ``p`` as the largest start among all live occurrences hashed
    there. That is the table's contract: a slot holds the maximum over everything ever
    inserted into it, evicted occurrences are older than every live one, so a slot whose
    maximum belongs to another n-gram hides this one (a miss), and a hit is always the most
    recent occurrence.
    """
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


# ----------------------------------------------------------------------------- propose


def ngram_index_propose(
    token_ids,
    num_tokens,
    index,
    index_len,
    req_indices,
    max_draft_tokens,
    corpus_tokens,
    corpus_meta,
    corpus_index,
    corpus_state,
    *,
    min_n: int,
    max_n: int,
    num_speculative_tokens: int,
    max_model_len: int | None,
    tie_break: str,
):
    """n from max_n down: own history (``tie_break`` start) first, then the corpus."""
    k = num_speculative_tokens
    rows = _rows(req_indices, num_tokens.shape[0])
    B = len(rows)
    drafts = torch.full((B, k), -1, dtype=torch.int32)
    counts = torch.zeros(B, dtype=torch.int32)
    match_len = torch.zeros(B, dtype=torch.int32)
    source = torch.zeros(B, dtype=torch.int8)
    corpus = None
    if corpus_tokens is not None:
        corpus = corpus_lookup(corpus_tokens, corpus_meta, corpus_index, corpus_state, min_n=min_n)
        ring = corpus_tokens.tolist()
        C = len(ring)
    for b, r in enumerate(rows):
        if r < 0:
            continue
        L = int(num_tokens[r])
        seq = token_ids[r, :L].tolist()
        cap = k if max_draft_tokens is None else min(k, int(max_draft_tokens[b]))
        if max_model_len is not None:
            cap = min(cap, max_model_len - L)
        for n in range(max_n, min_n - 1, -1):
            if L < n:
                continue
            suffix = tuple(seq[L - n :])
            own = own_occurrences(seq, n).get(suffix)
            if own is not None:
                i = own[0] if tie_break == "first" else own[1]
                m = max(0, min(cap, L - (i + n)))
                out, src = seq[i + n : i + n + m], OWN
            elif corpus is not None and (n, suffix) in corpus:
                p, de = corpus[(n, suffix)]
                m = max(0, min(cap, de - (p + n)))
                out, src = [ring[(p + n + t) % C] for t in range(m)], CORPUS
            else:
                continue
            drafts[b, :m] = torch.tensor(out, dtype=torch.int32)
            counts[b] = m
            match_len[b] = n if m > 0 else 0
            source[b] = src if m > 0 else 0
            break
    return drafts, counts, match_len, source
