"""Vectorised torch draft-length planning: the CPU path of ``plan_draft_lengths`` and
``update_acceptance_stats``.

- ``plan_draft_lengths``: the gains of all ``B x k`` draft slots in one ``[B, k]`` tile
  (a running product over the ``k`` positions, one fp32 multiplication each, as the
  kernel and the reference do), quantised to integers, one stable descending sort (ties:
  the lower position, then the lower batch row, so equal gains are shared out across
  requests), an int64 prefix sum, and the best prefix length by one ``argmax`` over
  ``(B + prefix) / cost[B + D]`` in float64. Each request gets the number of its slots
  inside the best prefix.
- ``update_acceptance_stats``: the ``[B, k]`` tile of "proposed draft j equals emitted
  token j", a running AND along ``j`` (positions after the first mismatch are not
  observed), and one masked exponential-decay update of the state rows' estimates.
"""

from __future__ import annotations

import torch

from specdec_kernels.constants import DRAFT_GAIN_SCALE


def _state(req_indices: torch.Tensor | None, B: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r clamped at 0, active)`` per batch row."""
    if req_indices is None:
        return torch.arange(B), torch.ones(B, dtype=torch.bool)
    r = req_indices.long()
    return r.clamp(min=0), r >= 0


def _estimates(acceptance, rows, match_len):
    """``[B, k]`` estimates of the class each row's match length falls in."""
    M = acceptance.shape[1]
    cls = match_len.long().clamp(1, M) - 1
    return acceptance[rows, cls].float()


def plan_draft_lengths(
    num_draft_tokens, match_len, verify_cost, req_indices, acceptance, *, max_num_tokens,
):  # fmt: skip
    B = num_draft_tokens.shape[0]
    K = acceptance.shape[2]
    planned = torch.zeros(B, dtype=torch.int32)
    expected = torch.zeros(B, dtype=torch.float32)
    if B == 0:
        return planned, expected
    rows, active = _state(req_indices, B)
    if acceptance.shape[0] == 0:  # no state rows: every batch row is padding
        return planned, expected
    a = _estimates(acceptance, rows, match_len)
    gain = torch.empty((B, K), dtype=torch.float32)
    g = torch.ones(B, dtype=torch.float32)
    for j in range(K):
        g = g * a[:, j]
        gain[:, j] = g
    q = torch.floor(gain * DRAFT_GAIN_SCALE).long()
    j = torch.arange(K)
    valid = active[:, None] & (j[None, :] < num_draft_tokens.long()[:, None])
    flat = torch.where(valid, q, -1).t().reshape(-1)  # position-major: slot j * B + b

    order = torch.sort(flat, descending=True, stable=True).indices  # ties: lower (j, b)
    top = flat[order]
    limit = int(valid.sum())
    if max_num_tokens is not None:
        limit = max(0, min(limit, max_num_tokens - B))
    limit = min(limit, verify_cost.shape[0] - 1 - B)
    total = B * DRAFT_GAIN_SCALE + torch.cat([top.new_zeros(1), torch.cumsum(top[:limit], 0)])
    value = total.double() / verify_cost[B : B + limit + 1].double()
    best = int(torch.argmax(value))  # the first maximum: the smallest D on a tie

    chosen = torch.zeros(B * K, dtype=torch.bool)
    chosen[order[:best]] = True
    chosen = chosen.reshape(K, B).t()
    planned = chosen.sum(1).to(torch.int32)
    sums = torch.where(chosen, q, 0).sum(1)
    expected = torch.where(active, 1.0 + sums.double() / DRAFT_GAIN_SCALE, 0.0).float()
    return planned, expected


def update_acceptance_stats(
    draft_token_ids, num_draft_tokens, match_len, output_token_ids, num_emitted, req_indices,
    acceptance, *, decay,
):  # fmt: skip
    B = draft_token_ids.shape[0]
    M, K = acceptance.shape[1], acceptance.shape[2]
    if B == 0 or acceptance.shape[0] == 0:
        return
    rows, active = _state(req_indices, B)
    cls = match_len.long().clamp(1, M) - 1
    j = torch.arange(K)
    limit = torch.minimum(num_draft_tokens.long(), num_emitted.long()).clamp(max=K)
    seen = active[:, None] & (j[None, :] < limit[:, None])
    hit = draft_token_ids[:, :K] == output_token_ids[:, :K]
    # observed: j < limit and every earlier observed draft matched
    before_ok = torch.cumprod(torch.where(seen, hit, True).to(torch.int32), dim=1)
    prefix = torch.cat([torch.ones(B, 1, dtype=torch.int32), before_ok[:, :-1]], dim=1)
    observed = seen & (prefix > 0)
    keep = torch.tensor(decay, dtype=torch.float32)
    learn = torch.tensor(1.0, dtype=torch.float32) - keep
    a = acceptance[rows, cls]
    new = a * keep + learn * hit.float()
    live = rows[active]
    acceptance[live, cls[active]] = torch.where(observed, new, a)[active]
