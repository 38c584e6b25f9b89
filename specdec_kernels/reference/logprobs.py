"""Plain top-N logprobs of a verify step: the oracle for ``top_logprobs``.

Slot by slot with the contract's literal definitions (``docs/design.md``, ``top_logprobs``):
a stable descending sort of the row's logits for the top-N, ``log_softmax`` for the values,
a count for the rank.
"""

from __future__ import annotations

import math

import torch


def _values(row: torch.Tensor, logits_mode: bool) -> torch.Tensor:
    """The mode's value of every id of a row (NaN already read as -inf)."""
    if logits_mode:
        return row
    top = row.max()
    if torch.isfinite(top):
        return torch.log_softmax(row.double(), dim=0).float()
    n = int((row == top).sum())  # a row without a finite maximum: its n maxima share the mass
    return torch.where(row == top, -math.log(n), float("-inf")).float()


def top_logprobs(
    target_logits, output_token_ids, num_emitted, cu_num_draft_tokens, *, num_logprobs,
    logprobs_mode,
):  # fmt: skip
    """For every emitted slot ``j < num_emitted[b]``: row ``cu[b] + b + j``'s value (by
    ``logprobs_mode``) and rank at the emitted token, and its ``num_logprobs`` largest
    logits' ids (ties: the lower id) and values; -1 / 0 in the other slots."""
    B, K1 = output_token_ids.shape
    N = num_logprobs
    tok_lp = torch.zeros((B, K1), dtype=torch.float32)
    tok_rank = torch.zeros((B, K1), dtype=torch.int32)
    top_ids = torch.full((B, K1, N), -1, dtype=torch.int32)
    top_vals = torch.zeros((B, K1, N), dtype=torch.float32)
    cu = cu_num_draft_tokens.tolist()
    for b in range(B):
        for j in range(min(max(int(num_emitted[b]), 0), K1)):
            raw = target_logits[cu[b] + b + j].float()
            row = raw.masked_fill(torch.isnan(raw), float("-inf"))
            values = _values(row, logprobs_mode == "raw_logits")
            tok = int(output_token_ids[b, j])
            order = torch.sort(row, descending=True, stable=True).indices[:N]
            top_ids[b, j] = order.to(torch.int32)
            top_vals[b, j] = values[order]
            tok_lp[b, j] = values[tok]
            tok_rank[b, j] = int((row >= row[tok]).sum())
    return tok_lp, tok_rank, top_ids, top_vals
