"""Plain top-N logprobs of a verify step: the oracle for ``top_logprobs``.

Slot by slot with the contract's literal definitions (``docs/design.md``, ``top_logprobs``):
a stable descending sort of the row's logits for the top-N, ``log_softmax`` for the values,
a count for the rank; in the processed modes, a sampled request's values from the row as
``rejection_sample`` samples it (the literal filters of ``reference/rejection.py``).
"""

from __future__ import annotations

import math

import torch

from specdec_kernels.reference.rejection import kept_set


def _values(row: torch.Tensor, logits_mode: bool) -> torch.Tensor:
    """The mode's value of every id of a row (NaN already read as -inf)."""
    if logits_mode:
        return row
    top = row.max()
    if torch.isfinite(top):
        return torch.log_softmax(row.double(), dim=0).float()
    n = int((row == top).sum())  # a row without a finite maximum: its n maxima share the mass
    return torch.where(row == top, -math.log(n), float("-inf")).float()


def _processed_values(row: torch.Tensor, T: float, k: int, top_p: float, min_p: float,
                      logits_mode: bool) -> torch.Tensor:  # fmt: skip
    """A sampled row's values in the processed modes: ``l / T`` (logits) or
    ``(l - m) / T - log S`` (logprobs, ``S`` the kept weights' sum) on the kept set, -inf
    elsewhere; a row without a finite maximum: its raw log-softmax rule (its maxima are
    kept and share the mass)."""
    e, keep = kept_set(row, T, k, top_p, min_p)
    m = row.max()
    if logits_mode:
        values = row / torch.tensor(T, dtype=torch.float32)
    elif torch.isfinite(m):
        S = e.double()[keep].sum()
        values = ((row.double() - float(m)) / T - torch.log(S)).float()
    else:
        return _values(row, False)
    return torch.where(keep, values, float("-inf"))


def top_logprobs(
    target_logits, output_token_ids, num_emitted, cu_num_draft_tokens, temperature=None,
    top_k=None, top_p=None, min_p=None, *, num_logprobs, logprobs_mode,
):  # fmt: skip
    """For every emitted slot ``j < num_emitted[b]``: row ``cu[b] + b + j``'s value (by
    ``logprobs_mode``) and rank at the emitted token, and its ``num_logprobs`` largest
    logits' ids (ties: the lower id) and values; -1 / 0 in the other slots. Processed modes:
    a request with ``temperature[b] > 0`` takes its values from the row as sampled."""
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
            logits_mode = logprobs_mode.endswith("_logits")
            T = 0.0 if temperature is None else float(temperature[b])
            if logprobs_mode.startswith("processed") and T > 0:
                k = 0 if top_k is None else int(top_k[b])
                p = 1.0 if top_p is None else float(top_p[b])
                mp = 0.0 if min_p is None else float(min_p[b])
                values = _processed_values(row, T, k, p, mp, logits_mode)
            else:
                values = _values(row, logits_mode)
            tok = int(output_token_ids[b, j])
            order = torch.sort(row, descending=True, stable=True).indices[:N]
            top_ids[b, j] = order.to(torch.int32)
            top_vals[b, j] = values[order]
            tok_lp[b, j] = values[tok]
            tok_rank[b, j] = int((row >= row[tok]).sum())
    return tok_lp, tok_rank, top_ids, top_vals
