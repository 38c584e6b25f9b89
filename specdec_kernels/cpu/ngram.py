"""Vectorised torch n-gram proposer: the CPU path of ``ngram_propose``.

Comparing every window with the suffix costs ``max_n`` passes over each history. Instead:

1. one pass keeps the positions ``j`` whose token equals the request's last token (in
   real text a few percent of positions); ``j`` is the *end* of a candidate window and
   ``j <= L-2`` so that a following token exists;
2. level ``t = 1 .. max_n-1`` keeps the survivors whose token ``j-t`` equals the
   suffix token ``L-1-t``: a survivor of level ``t`` ends a window of ``n = t+1``
   matching tokens. The survivor sets shrink fast, so each level is cheap;
3. per request, the highest level reached (``>= min_n``) is the longest n, and the
   first (smallest ``j``) or last survivor of that level is the winning window.
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
        rows = None
        lengths = num_tokens.long()
        active = None
    else:
        rows = req_indices.long()
        active = rows >= 0
        rows = rows.clamp(min=0)
        lengths = torch.where(active, num_tokens[rows].long(), 0)
    width = int(lengths.max())
    if width < 2:
        return drafts, counts
    # [B, width] histories of the batch rows only, and a flat view to index them with.
    if req_indices is None and token_ids.is_contiguous():
        hist = token_ids[:, :width]
        flat, row_stride = token_ids.view(-1), token_ids.stride(0)
    else:
        hist = token_ids[rows if rows is not None else slice(None), :width].contiguous()
        flat, row_stride = hist.view(-1), width
    last_pos = torch.arange(B) * row_stride + lengths - 1  # flat position of each last token

    bi, ji = (hist == flat[last_pos.clamp(min=0)][:, None]).nonzero(as_tuple=True)
    idx = (ji <= lengths[bi] - 2).nonzero()[:, 0]  # the window must be followed by a token
    bi, ji = bi[idx], ji[idx]

    # Survivors of level n end a window of n matching tokens; keep (b, n, j) for n >= min_n.
    hit_b, hit_key = [], []
    for n in range(1, max_n + 1):
        if n > 1:
            t = n - 1
            back = bi * row_stride + ji - t
            ok = (ji >= t) & (flat[back.clamp(min=0)] == flat[last_pos[bi] - t])
            idx = ok.nonzero()[:, 0]
            bi, ji = bi[idx], ji[idx]
        if bi.numel() == 0:
            break
        if n >= min_n:
            # larger key wins: longer n first, then the smallest ("first") or largest j
            hit_b.append(bi)
            hit_key.append(n * (width + 1) + (width - ji if tie_break == "first" else ji))
    best = torch.full((B,), -1, dtype=torch.long)
    if hit_b:
        best.scatter_reduce_(0, torch.cat(hit_b), torch.cat(hit_key), "amax")
    best_n = torch.where(best >= 0, best // (width + 1), 0)
    tie = best % (width + 1)
    best_end = tie if tie_break == "last" else width - tie

    found = best_n > 0
    start = best_end + 1  # first draft token = the token after the matched window
    cap = torch.full((B,), k, dtype=torch.long)
    if max_draft_tokens is not None:
        cap = torch.minimum(cap, max_draft_tokens.long())
    if max_model_len is not None:
        cap = torch.minimum(cap, max_model_len - lengths)
    m = torch.minimum(cap, lengths - start).clamp(min=0)
    m = torch.where(found, m, 0)
    if active is not None:
        m = torch.where(active, m, 0)

    j = torch.arange(k)
    take = j[None, :] < m[:, None]
    src = (start[:, None] + j[None, :]).clamp(0, width - 1)
    drafts = torch.where(take, hist.gather(1, src), -1).to(torch.int32)
    return drafts, m.to(torch.int32)
