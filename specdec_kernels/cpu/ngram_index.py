"""Vectorised torch n-gram index and shared corpus: the CPU path of the ``ngram_index`` ops.

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

Corpus: appends are a few flat gathers and one ``scatter_reduce(amax)`` per n over the new
occurrences; a proposal looks up every suffix n-gram of the batch at once (own table
window, then the corpus's two slots) and picks per row the longest n (own history first).
"""

from __future__ import annotations

import torch

from specdec_kernels.reference.ngram_index import (
    CORPUS,
    FNV_OFFSET,
    FNV_PRIME,
    M32,
    MIX1,
    MIX2,
    OWN,
)

_WINDOW = 4  # slots read per probe round
_CHUNK = 1 << 19  # n-gram inserts per round batch (bounds the scratch of long prefills)


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


def _batch_rows(req_indices: torch.Tensor | None, R: int) -> torch.Tensor:
    if req_indices is None:
        return torch.arange(R)
    rows = req_indices.long()
    return rows[rows >= 0]


def _gather_tokens(token_ids: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``token_ids[rows, pos]`` as int64 (pos clamped into the row), any strides."""
    pos = pos.clamp(0, max(token_ids.shape[1] - 1, 0))
    return token_ids[rows, pos].long()


# ----------------------------------------------------------------------------- own history


def _insert(token_ids, flat, S, N, rows, js, starts, ns, max_n):
    """Insert the n-grams ``token_ids[rows, starts:starts+ns]`` into tables ``(rows, js)``."""
    M = rows.numel()
    if M == 0:
        return
    t = torch.arange(max_n)
    key = _gather_tokens(token_ids, rows[:, None], starts[:, None] + t)
    h = hash_ngrams(key, ns)
    base = (rows * N + js) * S
    pos = mix1(h) % S
    live = torch.arange(M)
    w = torch.arange(_WINDOW)
    while live.numel():
        r, p0, st, n, kk = rows[live], pos[live], starts[live], ns[live], key[live]
        slot = base[live][:, None] + (p0[:, None] + w) % S  # [m, W]
        first = flat[2 * slot].long()
        occupied = first >= 0
        cand = _gather_tokens(
            token_ids, r[:, None, None], first.clamp(min=0)[:, :, None] + t
        )  # [m, W, max_n]
        same = ((cand == kk[:, None, :]) | (t >= n[:, None, None])).all(-1) & occupied
        hit = same | ~occupied
        any_hit = hit.any(1)
        w_star = hit.to(torch.int8).argmax(1)
        ar = torch.arange(live.numel())
        s_star = slot[ar, w_star]
        matched = any_hit & same[ar, w_star]
        claim = any_hit & ~occupied[ar, w_star]
        # claims: the smallest start wins each empty slot; read back who won
        cs = s_star[claim]
        flat.scatter_reduce_(0, 2 * cs, st[claim].int(), "amin", include_self=False)
        won = torch.zeros_like(claim)
        won[claim] = flat[2 * cs].long() == st[claim]
        ms = s_star[matched]
        flat.scatter_reduce_(0, 2 * ms, st[matched].int(), "amin")
        upd = matched | won
        flat.scatter_reduce_(0, 2 * s_star[upd] + 1, st[upd].int(), "amax")
        # next round: lost claims look at the same slot again, full windows move on
        lost = claim & ~won
        moved = ~any_hit
        pos[live[lost]] = s_star[lost] - base[live[lost]]
        pos[live[moved]] = (p0[moved] + _WINDOW) % S
        live = live[lost | moved]


def _index_rows(token_ids, num_tokens, req_indices, index, index_len, *, min_n, from_scratch):
    R, N, S, _ = index.shape
    rows = _batch_rows(req_indices, R)
    if rows.numel() == 0:
        return
    flat = index.view(-1)
    L = num_tokens[rows].long()
    if from_scratch:
        index[rows] = -1
        old = torch.zeros_like(L)
    else:
        old = index_len[rows].long()
    max_n = min_n + N - 1
    # n-gram (n, i) joins once token i + n exists: i in [max(old - n, 0), L - n)
    lo = [(old - (min_n + j)).clamp(min=0) for j in range(N)]
    hi = [L - (min_n + j) for j in range(N)]
    span = max(int((h - lo_).max()) for lo_, h in zip(lo, hi, strict=True))
    step = max(1, _CHUNK // max(1, rows.numel() * N))
    for off in range(0, max(span, 0), step):
        parts = []
        for j in range(N):
            i = lo[j][:, None] + off + torch.arange(min(step, span - off))
            ok = i < hi[j][:, None]
            rr = rows[:, None].expand_as(i)[ok]
            parts.append((rr, torch.full_like(rr, j), i[ok], torch.full_like(rr, min_n + j)))
        rr, jj, ii, nn = (torch.cat(x) for x in zip(*parts, strict=True))
        _insert(token_ids, flat, S, N, rr, jj, ii, nn, max_n)
    index_len[rows] = torch.maximum(L, old).int()


def ngram_index_build(token_ids, num_tokens, req_indices, index, index_len, *, min_n, max_n):
    _index_rows(
        token_ids, num_tokens, req_indices, index, index_len, min_n=min_n, from_scratch=True
    )


def ngram_index_extend(token_ids, num_tokens, req_indices, index, index_len, *, min_n, max_n):
    _index_rows(
        token_ids, num_tokens, req_indices, index, index_len, min_n=min_n, from_scratch=False
    )


def _own_lookup(token_ids, index, rows, js, key, ns, h):
    """(found, first, last) of each n-gram in its own table (read-only window probes)."""
    R, N, S, _ = index.shape
    flat = index.view(-1)
    M = rows.numel()
    max_n = key.shape[1]
    t = torch.arange(max_n)
    w = torch.arange(_WINDOW)
    base = (rows * N + js) * S
    pos = mix1(h) % S
    found = torch.zeros(M, dtype=torch.bool)
    first = torch.full((M,), -1, dtype=torch.long)
    last = torch.full((M,), -1, dtype=torch.long)
    live = torch.arange(M)
    while live.numel():
        r, kk, n = rows[live], key[live], ns[live]
        slot = base[live][:, None] + (pos[live][:, None] + w) % S
        f = flat[2 * slot].long()
        occupied = f >= 0
        cand = _gather_tokens(token_ids, r[:, None, None], f.clamp(min=0)[:, :, None] + t)
        same = ((cand == kk[:, None, :]) | (t >= n[:, None, None])).all(-1) & occupied
        hit = same | ~occupied
        any_hit = hit.any(1)
        w_star = hit.to(torch.int8).argmax(1)
        ar = torch.arange(live.numel())
        m = any_hit & same[ar, w_star]
        s_star = slot[ar, w_star][m]
        found[live[m]] = True
        first[live[m]] = flat[2 * s_star].long()
        last[live[m]] = flat[2 * s_star + 1].long()
        pos[live[~any_hit]] = (pos[live[~any_hit]] + _WINDOW) % S
        live = live[~any_hit]
    return found, first, last


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
    min_n,
    max_n,
):
    C = corpus_tokens.shape[0]
    N, H = corpus_index.shape
    rows = _batch_rows(req_indices, doc_lens.shape[0])
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
    t = torch.arange(key.shape[1])
    best = torch.full((js.numel(),), -1, dtype=torch.long)
    for s in (mix1(h) % H, mix2(h) % H):
        p = corpus_index[js, s]
        ok = p >= lo
        cand = corpus_tokens[(p.clamp(min=0)[:, None] + t) % C].long()
        ok &= ((cand == key) | (t >= ns[:, None])).all(1)
        best = torch.where(ok, torch.maximum(best, p), best)
    found = best >= 0
    doc_end = torch.where(found, corpus_meta[best.clamp(min=0) % C, 1], 0)
    return found, best, doc_end


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
    min_n,
    max_n,
    num_speculative_tokens,
    max_model_len,
    tie_break,
):
    k = num_speculative_tokens
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    drafts = torch.full((B, k), -1, dtype=torch.int32)
    counts = torch.zeros(B, dtype=torch.int32)
    source = torch.zeros(B, dtype=torch.int8)
    if B == 0 or k == 0 or num_tokens.numel() == 0 or token_ids.shape[1] == 0:
        return drafts, counts, source
    N = max_n - min_n + 1
    if req_indices is None:
        rows = torch.arange(B)
        active = torch.ones(B, dtype=torch.bool)
    else:
        rows = req_indices.long()
        active = rows >= 0
        rows = rows.clamp(min=0)
    L = torch.where(active, num_tokens[rows].long(), 0)

    # one key per (b, n): the suffix n-gram, where L >= n
    ns = torch.arange(min_n, max_n + 1)
    bb = torch.arange(B).repeat_interleave(N)
    jj = torch.arange(N).repeat(B)
    nn = ns.repeat(B)
    ok = active[bb] & (L[bb] >= nn)
    bb, jj, nn = bb[ok], jj[ok], nn[ok]
    rr = rows[bb]
    t = torch.arange(max_n)
    key = _gather_tokens(token_ids, rr[:, None], (L[bb] - nn)[:, None] + t)
    key = torch.where(t < nn[:, None], key, 0)
    h = hash_ngrams(key, nn)
    own, first, last = _own_lookup(token_ids, index, rr, jj, key, nn, h)
    prio = torch.where(own, 2 * jj + 2, 0)
    if corpus_tokens is not None:
        cfound, cp, cend = _corpus_lookup(
            corpus_tokens, corpus_meta, corpus_index, corpus_state, jj, key, nn, h
        )
        prio = torch.where(~own & cfound, 2 * jj + 1, prio)
    else:
        cfound = torch.zeros_like(own)
        cp = cend = torch.zeros_like(first)
    if bb.numel() == 0:
        return drafts, counts, source
    # per row: the highest priority (longest n, own history before the corpus)
    best = torch.full((B,), -1, dtype=torch.long)
    key_b = prio * (bb.numel() + 1) + torch.arange(bb.numel())
    best.scatter_reduce_(0, bb, torch.where(prio > 0, key_b, -1), "amax")
    has = best >= 0
    sel = (best % (bb.numel() + 1)).clamp(max=bb.numel() - 1)
    from_own = has & own[sel]
    from_corpus = has & ~own[sel] & cfound[sel]
    n_sel = nn[sel]
    i = first[sel] if tie_break == "first" else last[sel]
    start_own = i + n_sel
    start_c = cp[sel] + n_sel
    avail = torch.where(from_own, L - start_own, cend[sel] - start_c)
    cap = torch.full((B,), k, dtype=torch.long)
    if max_draft_tokens is not None:
        cap = torch.minimum(cap, max_draft_tokens.long())
    if max_model_len is not None:
        cap = torch.minimum(cap, max_model_len - L)
    m = torch.where(from_own | from_corpus, torch.minimum(cap, avail).clamp(min=0), 0)
    j = torch.arange(k)
    take = j < m[:, None]
    own_tok = _gather_tokens(token_ids, rows[:, None], start_own[:, None] + j)
    if corpus_tokens is not None:
        C = corpus_tokens.shape[0]
        c_tok = corpus_tokens[(start_c.clamp(min=0)[:, None] + j) % C].long()
        tok = torch.where(from_own[:, None], own_tok, c_tok)
    else:
        tok = own_tok
    drafts = torch.where(take, tok, -1).to(torch.int32)
    src = torch.where(from_own, OWN, torch.where(from_corpus, CORPUS, 0))
    source = torch.where(m > 0, src, 0).to(torch.int8)
    return drafts, m.to(torch.int32), source
