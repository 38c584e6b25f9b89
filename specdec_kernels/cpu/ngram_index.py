"""Vectorised torch own-history n-gram index: the CPU path of ``ngram_index_build`` /
``_extend`` and the index lookup of ``ngram_propose``.

Own-history index (``index`` int32 ``[R, N, S, 2]``: per row and n a linear-probing table
of ``(first, last)`` starts, -1 = empty; the key of a slot is the n-gram at its ``first``,
so every probe is verified against the tokens). All inserts of a call go in together,
in rounds: each pending n-gram reads a window of ``_WINDOW`` consecutive slots from its
probe position and stops at the first slot that is empty or holds its own n-gram. A match
updates ``first``/``last`` with ``scatter_reduce`` (amin/amax); an empty slot is claimed
by the smallest start that wants it (``amin`` with ``include_self=False``) and the losers
look at that slot again in the next round (the same n-gram merges, another one probes on).
Slots never empty again, so a key is never behind an empty slot and the table holds
exactly one slot per distinct n-gram, whatever the order of the inserts. Long prefills go
in chunks of positions, so the scratch stays bounded.

A proposal looks up every suffix n-gram of the batch at once (:func:`suffix_keys`, one key
per row and n) with read-only window probes and keeps per row the longest n found.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from specdec_kernels.constants import NGRAM_HASH_FNV_OFFSET as FNV_OFFSET
from specdec_kernels.constants import NGRAM_HASH_FNV_PRIME as FNV_PRIME
from specdec_kernels.constants import NGRAM_HASH_MASK as M32
from specdec_kernels.constants import NGRAM_HASH_MIX1 as MIX1
from specdec_kernels.constants import NGRAM_HASH_MIX2 as MIX2

_WINDOW = 4  # slots read per probe round
_CHUNK = 1 << 19  # n-gram inserts per round batch (bounds the scratch of long prefills)


@functools.lru_cache(maxsize=256)
def _ar(start: int, stop: int | None = None) -> torch.Tensor:
    """A cached ``torch.arange`` (never written to): a step uses ~20 small constant ones."""
    return torch.arange(start) if stop is None else torch.arange(start, stop)


def hash_ngrams(tok: torch.Tensor, n: torch.Tensor | int) -> torch.Tensor:
    """``ngram_hash`` of each row of ``tok`` (int64 ``[M, >= max n]``), first ``n`` columns."""
    M, width = tok.shape
    nn = torch.as_tensor(n, dtype=torch.int64)
    h = (FNV_OFFSET ^ nn).expand(M).clone() if nn.dim() == 0 else FNV_OFFSET ^ nn
    for t in range(width):
        step = ((h ^ (tok[:, t] & M32)) * FNV_PRIME) & M32
        step ^= step >> 15
        h = torch.where(nn > t, step, h)
    return h


def mix1(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = (h * MIX1) & M32
    return h ^ (h >> 16)


def mix2(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 15)
    h = (h * MIX2) & M32
    return h ^ (h >> 13)


def batch_rows(req_indices: torch.Tensor | None, R: int) -> torch.Tensor:
    if req_indices is None:
        return _ar(R)
    rows = req_indices.long()
    return rows[rows >= 0]


class Tokens:
    """``token_ids`` as a flat view of its storage: ``(r, c) -> flat[r * s0 + c * s1]``.

    One 1-D gather per lookup instead of 2-D advanced indexing (any strides, no copy).
    """

    def __init__(self, token_ids: torch.Tensor):
        R, W = token_ids.shape
        self.s0, self.s1 = token_ids.stride()
        self.W = W
        if R and W:
            span = (R - 1) * self.s0 + (W - 1) * self.s1 + 1
            self.flat = token_ids.as_strided((span,), (1,))
        else:
            self.flat = token_ids.new_zeros(1)
            self.W = 1

    def at(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """int32 tokens at ``(rows, cols)`` (broadcast; columns clamped into the row)."""
        idx = rows * self.s0 + cols.clamp(0, self.W - 1) * self.s1
        return self.flat.index_select(0, idx.reshape(-1)).view(idx.shape)


def _take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return x.index_select(0, idx)


def _where_idx(mask: torch.Tensor) -> torch.Tensor:
    return mask.nonzero().squeeze(1)


def _all_columns(eq: torch.Tensor) -> torch.Tensor:
    """``eq.all(1)`` for a narrow ``[P, n]`` bool tensor (column ANDs: much faster)."""
    out = eq[:, 0].clone()
    for t in range(1, eq.shape[1]):
        out &= eq[:, t]
    return out


def _probe(tab, tokens, S, slot_base, pos, rows, key, beyond):
    """Look at ``_WINDOW`` slots from ``pos``: the first that is empty or holds ``key``.

    Returns ``(any_hit, slot, is_same)`` per key: whether the window has such a slot, that
    slot's flat index, and whether it holds the key (else it is empty). The key of an
    occupied slot is the n-gram at its ``first``: compared token by token, only for the
    occupied slots (``beyond[m, t]``: column ``t`` is past the key's n).
    """
    m = pos.numel()
    local = pos[:, None] + _ar(_WINDOW)
    local = local.remainder(S)  # a table narrower than the window wraps more than once
    slot = slot_base[:, None] + local  # [m, W]
    first = tab.index_select(0, (2 * slot).view(-1))  # [m * W]
    occ = first >= 0
    same = torch.zeros_like(occ)
    fi = _where_idx(occ)
    if fi.numel():
        ki = torch.div(fi, _WINDOW, rounding_mode="floor")
        t = _ar(key.shape[1])
        cand = tokens.at(_take(rows, ki)[:, None], _take(first, fi).long()[:, None] + t)
        eq = (cand == _take(key, ki)) | _take(beyond, ki)
        same.index_copy_(0, fi, _all_columns(eq))
    same = same.view(m, _WINDOW)
    hit = (same | ~occ.view(m, _WINDOW)).to(torch.int8)
    w_star = hit.argmax(1, keepdim=True)  # the first hit
    any_hit = hit.gather(1, w_star)[:, 0].bool()
    return any_hit, slot.gather(1, w_star)[:, 0], same.gather(1, w_star)[:, 0] & any_hit


# ----------------------------------------------------------------------------- own history


def _insert(tokens, tab, S, N, rows, js, starts, ns, max_n):
    """Insert the n-grams ``token_ids[rows, starts:starts+ns]`` into tables ``(rows, js)``."""
    M = rows.numel()
    if M == 0:
        return
    t = _ar(max_n)
    key = tokens.at(rows[:, None], starts[:, None] + t)
    beyond = t >= ns[:, None]
    h = hash_ngrams(key.long(), ns)
    base = (rows * N + js) * S
    pos = mix1(h) % S
    st32 = starts.int()
    live = None  # all keys pending
    while True:
        if live is None:
            r, b, p0, st, kk, bey = rows, base, pos, st32, key, beyond
        else:
            r, b, p0, st = _take(rows, live), _take(base, live), _take(pos, live), _take(st32, live)
            kk, bey = _take(key, live), _take(beyond, live)
        any_hit, s_star, same = _probe(tab, tokens, S, b, p0, r, kk, bey)
        claim = any_hit & ~same
        # claims: the smallest start wins each empty slot; read back who won
        ci = _where_idx(claim)
        cs, cst = _take(s_star, ci), _take(st, ci)
        tab.scatter_reduce_(0, 2 * cs, cst, "amin", include_self=False)
        won = torch.zeros_like(claim)
        won.index_copy_(0, ci, _take(tab, 2 * cs) == cst)
        si = _where_idx(same)
        tab.scatter_reduce_(0, 2 * _take(s_star, si), _take(st, si), "amin")
        ui = _where_idx(same | won)
        tab.scatter_reduce_(0, 2 * _take(s_star, ui) + 1, _take(st, ui), "amax")
        # next round: lost claims look at the same slot again, full windows move on
        lost = claim & ~won
        moved = ~any_hit
        ni = _where_idx(lost | moved)
        if ni.numel() == 0:
            return
        nxt_pos = torch.where(lost, s_star - b, p0 + _WINDOW).remainder(S)
        idx = ni if live is None else _take(live, ni)
        pos.index_copy_(0, idx, _take(nxt_pos, ni))
        live = idx


def _index_rows(token_ids, num_tokens, req_indices, index, *, min_n, from_scratch):
    index, index_len = index
    R, N, S, _ = index.shape
    rows = batch_rows(req_indices, R)
    if rows.numel() == 0:
        return
    tab = index.view(-1)
    tokens = Tokens(token_ids)
    L = num_tokens.index_select(0, rows).long()
    if from_scratch:
        index[rows] = -1
        old = torch.zeros_like(L)
    else:
        old = index_len.index_select(0, rows).long()
    max_n = min_n + N - 1
    ns = _ar(min_n, max_n + 1)
    # n-gram (n, i) joins once token i + n exists: i in [max(old - n, 0), L - n)
    lo = (old[:, None] - ns).clamp(min=0)  # [B', N]
    hi = L[:, None] - ns
    span = int((hi - lo).max())
    step = max(1, _CHUNK // (rows.numel() * N))
    for off in range(0, max(span, 0), step):
        D = min(step, span - off)
        i = lo[:, :, None] + (off + _ar(D))  # [B', N, D]
        flat = _where_idx((i < hi[:, :, None]).view(-1))
        bj = torch.div(flat, D, rounding_mode="floor")
        jj = bj % N
        _insert(
            tokens, tab, S, N, _take(rows, torch.div(bj, N, rounding_mode="floor")), jj,
            _take(i.view(-1), flat), _take(ns, jj), max_n,
        )  # fmt: skip
    index_len.index_copy_(0, rows, torch.maximum(L, old).int())


def ngram_index_build(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    _index_rows(token_ids, num_tokens, req_indices, index, min_n=min_n, from_scratch=True)


def ngram_index_extend(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    _index_rows(token_ids, num_tokens, req_indices, index, min_n=min_n, from_scratch=False)


def _own_lookup(tokens, index, rows, js, key, ns, h):
    """(found, first, last) of each n-gram in its own table (read-only window probes)."""
    R, N, S, _ = index.shape
    tab = index.view(-1)
    beyond = _ar(key.shape[1]) >= ns[:, None]
    base = (rows * N + js) * S
    pos = mix1(h) % S
    any_hit, slot, found = _probe(tab, tokens, S, base, pos, rows, key, beyond)
    live = _where_idx(~any_hit)
    while live.numel():  # rare: a full window; look at the next one
        p = (_take(pos, live) + _WINDOW).remainder(S)
        pos.index_copy_(0, live, p)
        a, s_, f = _probe(
            tab, tokens, S, _take(base, live), p, _take(rows, live), _take(key, live),
            _take(beyond, live),
        )  # fmt: skip
        slot.index_copy_(0, live, s_)
        found.index_copy_(0, live, f)
        live = _take(live, _where_idx(~a))
    pair = tab.view(-1, 2).index_select(0, slot).long()
    first = torch.where(found, pair[:, 0], -1)
    last = torch.where(found, pair[:, 1], -1)
    return found, first, last


# ----------------------------------------------------------------------------- lookup


class SuffixKeys(NamedTuple):
    """One key per (batch row, n) with ``L >= n``: the row's suffix n-gram."""

    bb: torch.Tensor  # batch row
    jj: torch.Tensor  # n - min_n
    nn: torch.Tensor  # n
    rows: torch.Tensor  # state row
    key: torch.Tensor  # int32 [M, max_n], the n-gram, 0 past n
    h: torch.Tensor  # its hash


def suffix_keys(tokens, rows, L, active, *, min_n, max_n) -> SuffixKeys:
    B, N = rows.numel(), max_n - min_n + 1
    ns = _ar(min_n, max_n + 1)
    bb = _ar(B).repeat_interleave(N)
    jj = _ar(N).repeat(B)
    nn = ns.repeat(B)
    ok = _where_idx(active[bb] & (L[bb] >= nn))
    bb, jj, nn = _take(bb, ok), _take(jj, ok), _take(nn, ok)
    rr = _take(rows, bb)
    t = _ar(max_n)
    key = tokens.at(rr[:, None], (_take(L, bb) - nn)[:, None] + t)
    key = torch.where(t < nn[:, None], key, 0)
    return SuffixKeys(bb, jj, nn, rr, key, hash_ngrams(key.long(), nn))


def longest_per_row(B: int, keys: SuffixKeys, found: torch.Tensor):
    """Per batch row, the largest n whose key is ``found`` (0: none) and that key's index
    (any valid index where n = 0)."""
    M = keys.bb.numel()
    if M == 0:
        zero = torch.zeros(B, dtype=torch.long)
        return zero, zero
    best = torch.full((B,), -1, dtype=torch.long)
    best.scatter_reduce_(0, keys.bb, torch.where(found, keys.jj * M + _ar(M), -1), "amax")
    sel = (best % M).clamp(min=0)
    return torch.where(best >= 0, _take(keys.nn, sel), 0), sel


def own_match(tokens, index, keys: SuffixKeys, B: int, *, tie_break):
    """Per batch row: the longest n whose suffix occurs earlier in the row (0: none) and
    the start of its drafts (after the ``tie_break`` occurrence)."""
    k = keys
    found, first, last = _own_lookup(tokens, index[0], k.rows, k.jj, k.key, k.nn, k.h)
    n, sel = longest_per_row(B, keys, found)
    i = _take(first if tie_break == "first" else last, sel) if found.numel() else n
    return n, i + n
