"""Vectorised torch verify-step inputs: the CPU path of ``compute_slot_mapping`` and
``prepare_verify_inputs``.

No Python loop over tokens or requests:

- ``compute_slot_mapping`` finds each token's request with ``searchsorted`` on
  ``query_start_loc`` and gathers one block-table entry per token (or, without a block
  table, uses the contiguous layout ``r * max_model_len + pos``).
- ``prepare_verify_inputs`` lays every request out as a ``[B, k+1]`` tile (query token
  ``j`` of row ``b``) and scatters the tile into the packed buffers. The tile has exactly
  ``B*(k+1)`` entries, one per output slot: entry ``j <= k_b`` goes to
  ``qsl[b] + j`` and the ``k - k_b`` unused entries of row ``b`` go to the tail, at
  ``qsl[B] + (b*k - cu[b]) + (j - k_b - 1)`` (``b*k - cu[b]`` is the number of unused
  entries of the rows before ``b``). The flat drafts use the same trick on a ``[B, k]`` tile.
"""

from __future__ import annotations

import torch

from specdec_kernels.constants import PAD_SLOT


def _state_rows(req_indices: torch.Tensor | None, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r clamped at 0, active)`` for every batch row, int64 / bool ``[B]``."""
    if req_indices is None:
        return torch.arange(batch), torch.ones(batch, dtype=torch.bool)
    rows = req_indices.long()
    return rows.clamp(min=0), rows >= 0


def _slots(
    block_table: torch.Tensor | None,
    rows: torch.Tensor,
    pos: torch.Tensor,
    valid: torch.Tensor,
    block_size: int,
    max_model_len: int | None,
) -> torch.Tensor:
    """Slots of int64 ``pos`` in state rows ``rows`` (same shape); -1 where not ``valid``.

    Without a block table: the contiguous layout ``rows * max_model_len + pos``.
    """
    ok = valid & (pos >= 0)
    if max_model_len is not None:
        ok &= pos < max_model_len
    if block_table is None:
        return torch.where(ok, rows * max_model_len + pos, PAD_SLOT)
    R, max_blocks = block_table.shape
    if R == 0 or max_blocks == 0:
        return torch.full_like(pos, PAD_SLOT)
    idx = torch.div(pos, block_size, rounding_mode="floor")
    ok &= idx < max_blocks
    block = block_table[rows.clamp(0, R - 1), idx.clamp(0, max_blocks - 1)].long()
    ok &= block >= 0
    return torch.where(ok, block * block_size + pos.remainder(block_size), PAD_SLOT)


def compute_slot_mapping(
    block_table, positions, query_start_loc, req_indices, *, block_size, max_model_len,
):  # fmt: skip
    T = positions.shape[0]
    B = query_start_loc.shape[0] - 1
    if B == 0 or T == 0:
        return torch.full((T,), PAD_SLOT, dtype=torch.int64)
    qsl = query_start_loc.long()
    t = torch.arange(T)
    b = torch.searchsorted(qsl[1:], t, right=True).clamp(max=B - 1)
    valid = (t >= qsl[0]) & (t < qsl[B])
    rows, active = _state_rows(req_indices, B)
    return _slots(
        block_table, rows[b], positions.long(), valid & active[b], block_size, max_model_len
    )


def prepare_verify_inputs(
    token_ids, num_tokens, draft_token_ids, num_draft_tokens, block_table, req_indices, *,
    block_size, max_model_len,
):  # fmt: skip
    B, k = draft_token_ids.shape
    R, L_max = token_ids.shape
    rows, active = _state_rows(req_indices, B)
    if R == 0 or L_max == 0:
        active = torch.zeros(B, dtype=torch.bool)
        rows = torch.zeros(B, dtype=torch.long)
    k_b = torch.where(active, num_draft_tokens.long().clamp(0, k), 0)  # as the kernel does
    cu = torch.zeros(B + 1, dtype=torch.long)
    torch.cumsum(k_b, 0, out=cu[1:])
    b_idx = torch.arange(B)
    qsl = cu + torch.arange(B + 1)
    length = torch.where(active, num_tokens[rows].long() if R else 0, 0)
    unused_before = b_idx * k - cu[:-1]  # tail entries owned by the rows before b

    # Query tile [B, k+1]: entry j <= k_b is query token j; a padding row has k_b = 0, so
    # its entry 0 is the dummy token.
    j = torch.arange(k + 1)[None, :]
    real = j <= k_b[:, None]
    live = real & active[:, None]
    if R and L_max:
        last = token_ids[rows, (length - 1).clamp(0, L_max - 1)]
    else:
        last = torch.zeros(B, dtype=torch.int32)
    query = torch.cat([last[:, None].to(torch.int32), draft_token_ids], dim=1)
    ids = torch.where(live, query, 0).to(torch.int32)
    pos = torch.where(live, length[:, None] - 1 + j, 0)
    slot = _slots(block_table, rows[:, None].expand(B, k + 1), pos, live, block_size, max_model_len)
    dest = torch.where(
        real, qsl[:-1, None] + j, qsl[B] + unused_before[:, None] + (j - k_b[:, None] - 1)
    ).flatten()
    num_query = B * (k + 1)
    input_ids = torch.empty(num_query, dtype=torch.int32).index_put_((dest,), ids.flatten())
    positions = torch.empty(num_query, dtype=torch.int64).index_put_((dest,), pos.flatten())
    slot_mapping = torch.empty(num_query, dtype=torch.int64).index_put_((dest,), slot.flatten())

    # Draft tile [B, k]: entry j < k_b goes to cu[b] + j, the rest (-1) to the tail.
    jd = torch.arange(k)[None, :]
    real_d = jd < k_b[:, None]
    dest_d = torch.where(
        real_d, cu[:-1, None] + jd, cu[B] + unused_before[:, None] + (jd - k_b[:, None])
    ).flatten()
    vals_d = torch.where(real_d, draft_token_ids, -1).to(torch.int32).flatten()
    flat_drafts = torch.empty(B * k, dtype=torch.int32).index_put_((dest_d,), vals_d)

    seq_lens = torch.where(active, length + k_b, 1).to(torch.int32)
    return (
        input_ids,
        positions,
        qsl.to(torch.int32),
        seq_lens,
        slot_mapping,
        cu.to(torch.int32),
        flat_drafts,
    )
