"""Vectorised torch n-gram proposer: the CPU path of ``ngram_propose``.

Instead of comparing every window with the suffix (``max_n`` passes over each history),
it first keeps only the positions ``j`` whose token equals the request's last token (one
pass, usually a few percent of positions), then extends the match backwards on those
candidates only. ``c[j]``, the length of the common run ending at ``j`` and at ``L-1``
(capped at ``max_n``), gives both the n-gram length (``n = c[j]``) and the window
``[j-n+1, j]``; its following token ``j+1`` must exist, so ``j <= L-2``.
"""

from __future__ import annotations

import torch


def ngram_propose(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    req_indices: torch.Tensor | None,
    max_draft_tokens: torch.Tensor | None,
    *,
    min_n: int,
    max_n: int,
    num_speculative_tokens: int,
    max_model_len: int | None,
    tie_break: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    k = num_speculative_tokens
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    drafts = torch.full((B, k), -1, dtype=torch.int32)
    counts = torch.zeros(B, dtype=torch.int32)
    if B == 0 or k == 0:
        return drafts, counts

    if req_indices is None:
        rows = torch.arange(B)
        active = torch.ones(B, dtype=torch.bool)
    else:
        rows = req_indices.long()
        active = rows >= 0
        rows = rows.clamp(min=0)
    lengths = torch.where(active, num_tokens[rows].long(), 0)
    width = int(lengths.max())
    if width < 2:
        return drafts, counts
    hist = token_ids[rows, :width]  # [B, width], only the rows in the batch are read

    # Tokens of the suffix, right-aligned: suffix[b, t] = seq[L-1-t] (or -1 if t >= L).
    t_idx = torch.arange(max_n)
    suffix_pos = lengths[:, None] - 1 - t_idx[None, :]
    suffix = torch.where(
        suffix_pos >= 0, hist.gather(1, suffix_pos.clamp(min=0)), torch.full_like(suffix_pos, -1)
    ).to(hist.dtype)

    # Cheap filter: window ends j <= L-2 whose token equals the last token.
    pos = torch.arange(width)
    cand = (hist == suffix[:, :1]) & (pos[None, :] <= lengths[:, None] - 2)
    bi, ji = cand.nonzero(as_tuple=True)
    if bi.numel() == 0:
        return drafts, counts

    # Extend each candidate's match backwards, t = 1 .. max_n-1, on candidates only.
    run = torch.ones_like(ji)
    alive = torch.ones_like(ji, dtype=torch.bool)
    for t in range(1, max_n):
        back = ji - t
        ok = back >= 0
        eq = hist[bi, back.clamp(min=0)] == suffix[bi, t]
        alive &= ok & eq & (suffix_pos[bi, t] >= 0)
        if not bool(alive.any()):
            break
        run += alive

    # Longest n per request, then the first/last window with that n.
    best_n = torch.zeros(B, dtype=torch.long).scatter_reduce(0, bi, run, "amax")
    hit = (run == best_n[bi]) & (best_n[bi] >= min_n)
    if tie_break == "first":
        sentinel = width
        end = torch.full((B,), sentinel, dtype=torch.long)
        end = end.scatter_reduce(0, bi[hit], ji[hit], "amin")
        found = end < sentinel
    else:
        end = torch.full((B,), -1, dtype=torch.long)
        end = end.scatter_reduce(0, bi[hit], ji[hit], "amax")
        found = end >= 0

    start = end + 1  # first draft token = the token after the matched window
    cap = torch.full((B,), k, dtype=torch.long)
    if max_draft_tokens is not None:
        cap = torch.minimum(cap, max_draft_tokens.long())
    if max_model_len is not None:
        cap = torch.minimum(cap, max_model_len - lengths)
    m = torch.minimum(cap, lengths - start).clamp(min=0)
    m = torch.where(found & active, m, 0)

    j = torch.arange(k)
    take = j[None, :] < m[:, None]
    src = (start[:, None] + j[None, :]).clamp(0, width - 1)
    drafts = torch.where(take, hist.gather(1, src), -1).to(torch.int32)
    return drafts, m.to(torch.int32)
