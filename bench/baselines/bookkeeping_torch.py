"""Eager torch step bookkeeping: what an engine writes without fused kernels.

Slot mapping, verify-input packing and token commit as a handful of vectorised torch ops
each (``searchsorted`` to map tokens to requests, gathers, ``cumsum``, masked writes),
device-agnostic. Semantics follow the bookkeeping contracts of docs/design.md (checked
against the reference in every benchmark run). The commit writes with boolean-mask
indexing, which synchronises a GPU with the host, as such code usually does.
"""

from __future__ import annotations

import torch


def _rows(req_indices: torch.Tensor | None, B: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    if req_indices is None:
        rows = torch.arange(B, device=device)
        return rows, torch.ones(B, dtype=torch.bool, device=device)
    rows = req_indices.long()
    return rows.clamp(min=0), rows >= 0


def _request_of(qsl: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each flat index ``t < T``: its request ``b`` (``qsl[b] <= t < qsl[b+1]``), and
    whether it belongs to any request."""
    qsl = qsl.long()
    t = torch.arange(T, device=qsl.device)
    b = torch.searchsorted(qsl[1:].contiguous(), t, right=True)
    B = qsl.shape[0] - 1
    return b.clamp(max=max(B - 1, 0)), t < qsl[-1]


def compute_slot_mapping_torch(
    block_table, positions, query_start_loc, req_indices=None, *, block_size, max_model_len=None
) -> torch.Tensor:
    T = positions.shape[0]
    B = query_start_loc.shape[0] - 1
    max_blocks = block_table.shape[1]
    b, valid = _request_of(query_start_loc, T)
    rows, active = _rows(req_indices, B, positions.device)
    pos = positions.long()
    valid = valid & active[b] & (pos >= 0)
    if max_model_len is not None:
        valid &= pos < max_model_len
    blk = torch.div(pos, block_size, rounding_mode="floor")
    valid &= blk < max_blocks
    block = block_table[rows[b], blk.clamp(0, max_blocks - 1)].long()
    valid &= block >= 0
    return torch.where(valid, block * block_size + pos % block_size, -1)


def prepare_verify_inputs_torch(
    token_ids,
    num_tokens,
    draft_token_ids,
    num_draft_tokens,
    block_table,
    req_indices=None,
    *,
    block_size,
    max_model_len,
):
    B, k = draft_token_ids.shape
    device = token_ids.device
    rows, active = _rows(req_indices, B, device)
    length = num_tokens[rows].long()
    kb = torch.where(active, num_draft_tokens.long(), 0)
    zero = torch.zeros(1, dtype=torch.long, device=device)
    qsl = torch.cat([zero, torch.cumsum(kb + 1, 0)])
    cu = torch.cat([zero, torch.cumsum(kb, 0)])
    seq_lens = torch.where(active, length + kb, 1)

    T = B * (k + 1)
    b, in_query = _request_of(qsl, T)
    j = torch.arange(T, device=device) - qsl[b]
    real = in_query & active[b]
    last = token_ids[rows, (length - 1).clamp(min=0)].long()
    draft = draft_token_ids[b, (j - 1).clamp(0, max(k - 1, 0))].long() if k else last[b]
    input_ids = torch.where(real, torch.where(j == 0, last[b], draft), 0)
    positions = torch.where(real, length[b] - 1 + j, 0)
    slots = compute_slot_mapping_torch(
        block_table, positions, qsl, req_indices, block_size=block_size, max_model_len=max_model_len
    )
    f = torch.arange(B * k, device=device)
    fb, in_flat = _request_of(cu, B * k)
    flat = torch.where(in_flat, draft_token_ids[fb, (f - cu[fb]).clamp(0, max(k - 1, 0))], -1)
    return (
        input_ids.to(torch.int32),
        positions,
        qsl.to(torch.int32),
        seq_lens.to(torch.int32),
        slots,
        cu.to(torch.int32),
        flat.to(torch.int32),
    )


def commit_accepted_tokens_torch(
    token_ids,
    num_tokens,
    output_token_ids,
    num_emitted,
    req_indices=None,
    *,
    stop_token_ids=None,
    num_prompt_tokens=None,
    min_tokens=None,
    max_tokens=None,
    max_model_len,
    num_computed_tokens=None,
):
    B, K1 = output_token_ids.shape
    device = token_ids.device
    rows, active = _rows(req_indices, B, device)
    start = num_tokens[rows].long()
    prompt = num_prompt_tokens[rows].long() if num_prompt_tokens is not None else 0
    budget = min(max_model_len, token_ids.shape[1]) - start
    if max_tokens is not None:
        budget = torch.minimum(budget, max_tokens.long() - (start - prompt))
    budget = budget.clamp(min=0)

    j = torch.arange(K1, device=device)
    tok = output_token_ids.long()
    present = ((j[None, :] < num_emitted[:, None]) & (tok >= 0)).long().cumprod(dim=1)
    n_valid = present.sum(dim=1)
    if stop_token_ids is not None:
        stop = (tok[:, :, None] == stop_token_ids[:, None, :].long()).any(dim=2) & (tok >= 0)
        if min_tokens is not None:
            stop &= (start - prompt)[:, None] + j[None, :] >= min_tokens[:, None].long()
        stop &= present.bool()
        n_stop = torch.where(stop.any(dim=1), stop.long().argmax(dim=1) + 1, K1 + 1)
    else:
        n_stop = torch.full((B,), K1 + 1, dtype=torch.long, device=device)
    n = torch.minimum(torch.minimum(n_valid, n_stop), budget)
    n = torch.where(active, n, 0)
    by_stop = active & (n_stop <= torch.minimum(n_valid, budget)) & (budget > 0)
    by_length = active & ~by_stop & (budget <= n_valid)
    reason = torch.where(by_stop, 1, torch.where(by_length, 2, 0)).to(torch.int8)

    write = (j[None, :] < n[:, None]) & active[:, None]
    r2 = rows[:, None].expand(B, K1)
    c2 = start[:, None] + j[None, :]
    token_ids[r2[write], c2[write]] = tok[write].to(token_ids.dtype)
    num_tokens[rows[active]] = (start + n)[active].to(num_tokens.dtype)
    if num_computed_tokens is not None:
        num_computed_tokens[rows[active]] += n[active].to(num_computed_tokens.dtype)
    return n.to(torch.int32), reason != 0, reason
