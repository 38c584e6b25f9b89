"""Eager torch n-gram proposer: compare every window with the suffix, for every n.

What a torch user writes without a kernel: for ``n = max_n .. min_n``, ``unfold`` the
history into all windows of length ``n``, compare them with the suffix n-gram, and take
the first match of the longest ``n``. ``max_n - min_n + 1`` passes of ``[B, L, n]``
compares; no host synchronisation, any device. The device-side baseline of the GPU suite.
Semantics of ``ngram_propose`` in docs/design.md with ``tie_break="first"``, no ``req_indices``.
"""

from __future__ import annotations

import torch


def ngram_propose_torch(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    *,
    min_n: int,
    max_n: int,
    num_speculative_tokens: int,
    max_model_len: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(drafts int32 [B, k] padded with -1, num_drafts int32 [B])``."""
    k = num_speculative_tokens
    B, W = token_ids.shape
    device = token_ids.device
    length = num_tokens.long()
    best_n = torch.zeros(B, dtype=torch.long, device=device)
    best_i = torch.zeros(B, dtype=torch.long, device=device)
    for n in range(max_n, min_n - 1, -1):
        if n >= W:
            continue
        windows = token_ids.unfold(1, n, 1)  # [B, W-n+1, n], a view
        offs = torch.arange(n, device=device)
        suffix = token_ids.gather(1, (length[:, None] - n + offs[None, :]).clamp(min=0))
        starts = torch.arange(W - n + 1, device=device)
        match = (windows == suffix[:, None, :]).all(dim=2)
        match &= starts[None, :] <= (length[:, None] - n - 1)
        found = match.any(dim=1) & (best_n == 0)
        first = match.to(torch.int8).argmax(dim=1)
        best_n = torch.where(found, n, best_n)
        best_i = torch.where(found, first, best_i)
    start = best_i + best_n
    m = torch.clamp(length - start, max=k)
    if max_model_len is not None:
        m = torch.minimum(m, max_model_len - length)
    m = torch.where(best_n > 0, m.clamp(min=0), 0)
    j = torch.arange(k, device=device)
    src = (start[:, None] + j[None, :]).clamp(max=W - 1)
    drafts = torch.where(j[None, :] < m[:, None], token_ids.gather(1, src), -1)
    return drafts.to(torch.int32), m.to(torch.int32)
