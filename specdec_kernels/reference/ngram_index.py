"""Plain-Python own-history n-gram index: the oracle for ``ngram_index_build`` / ``_extend``.

The **own-history index** of a request (``docs/design.md``, "Own-history n-gram index"):
for every ``n`` in ``[min_n, max_n]`` and every n-gram of ``token_ids[r, :L]`` that has a
following token, its first and last start ``i``. The proposals of
``reference/ngram.py`` are derived from the tokens on every call, independent of the hash
table the fast paths keep; ``ngram_index_build``/``_extend`` still fill that table (plain
sequential linear probing) so that the table contents can be compared entry for entry.

The hash functions below are the specification: the CPU path and the Triton kernels
compute the same values (tests check the tables slot for slot).
"""

from __future__ import annotations

import torch

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


def _index_rows(token_ids, num_tokens, req_indices, index, *, min_n, from_scratch):
    index, index_len = index
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


def ngram_index_build(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    """Index rows ``r = req_indices[b]`` from scratch over ``token_ids[r, :num_tokens[r]]``."""
    _index_rows(token_ids, num_tokens, req_indices, index, min_n=min_n, from_scratch=True)


def ngram_index_extend(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    """Add the n-grams completed by tokens ``index_len[r] .. num_tokens[r]-1`` of each row."""
    _index_rows(token_ids, num_tokens, req_indices, index, min_n=min_n, from_scratch=False)


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
