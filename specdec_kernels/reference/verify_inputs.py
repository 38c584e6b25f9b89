"""Plain-Python verify-step inputs: the oracle for ``compute_slot_mapping`` and
``prepare_verify_inputs``.

One loop per request, one statement per rule of ``docs/design.md`` (its contracts of the
two ops), no vectorisation. Batch row ``b`` maps to state row ``r = req_indices[b]``
(``-1``: a padding row).
"""

from __future__ import annotations

import torch

from specdec_kernels.constants import PAD_SLOT


def _rows(req_indices: torch.Tensor | None, batch: int) -> list[int]:
    return list(range(batch)) if req_indices is None else req_indices.tolist()


def _slot(
    block_table: torch.Tensor | None, r: int, pos: int, block_size: int, max_model_len: int | None
) -> int:
    """The KV-cache slot of position ``pos`` of state row ``r``, or ``PAD_SLOT``.

    Without a block table: the contiguous layout, ``r * max_model_len + pos``.
    """
    if r < 0 or pos < 0:
        return PAD_SLOT
    if max_model_len is not None and pos >= max_model_len:
        return PAD_SLOT
    if block_table is None:
        return r * max_model_len + pos
    idx = pos // block_size
    if idx >= block_table.shape[1]:
        return PAD_SLOT
    block = int(block_table[r, idx])
    if block < 0:
        return PAD_SLOT
    return block * block_size + pos % block_size


def compute_slot_mapping(
    block_table, positions, query_start_loc, req_indices, *, block_size, max_model_len,
):  # fmt: skip
    """Token ``t`` of request ``b`` (``qsl[b] <= t < qsl[b+1]``) gets its slot; others -1."""
    qsl = query_start_loc.tolist()
    rows = _rows(req_indices, len(qsl) - 1)
    pos = positions.tolist()
    out = [PAD_SLOT] * len(pos)
    for b, r in enumerate(rows):
        for t in range(qsl[b], qsl[b + 1]):
            out[t] = _slot(block_table, r, pos[t], block_size, max_model_len)
    return torch.tensor(out, dtype=torch.int64)


def prepare_verify_inputs(
    token_ids, num_tokens, draft_token_ids, num_draft_tokens, block_table, req_indices, *,
    block_size, max_model_len,
):  # fmt: skip
    """Append each request's query ``[last token, d_0 .. d_{k_b-1}]`` to flat lists, then pad."""
    B, k = draft_token_ids.shape
    rows = _rows(req_indices, B)
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    flat_drafts: list[int] = []
    qsl = [0]
    cu = [0]
    seq_lens: list[int] = []
    for b, r in enumerate(rows):
        if r < 0:  # padding row: one dummy token, no drafts
            input_ids.append(0)
            positions.append(0)
            slots.append(PAD_SLOT)
            seq_lens.append(1)
        else:
            length = int(num_tokens[r])
            k_b = int(num_draft_tokens[b])
            drafts = draft_token_ids[b, :k_b].tolist()
            query = [int(token_ids[r, length - 1])] + drafts
            for j, tok in enumerate(query):
                pos = length - 1 + j
                input_ids.append(tok)
                positions.append(pos)
                slots.append(_slot(block_table, r, pos, block_size, max_model_len))
            flat_drafts.extend(drafts)
            seq_lens.append(length + k_b)
        cu.append(len(flat_drafts))
        qsl.append(len(input_ids))
    num_query = B * (k + 1)
    tail = num_query - len(input_ids)
    input_ids += [0] * tail
    positions += [0] * tail
    slots += [PAD_SLOT] * tail
    flat_drafts += [-1] * (B * k - len(flat_drafts))
    i32, i64 = torch.int32, torch.int64
    return (
        torch.tensor(input_ids, dtype=i32),
        torch.tensor(positions, dtype=i64),
        torch.tensor(qsl, dtype=i32),
        torch.tensor(seq_lens, dtype=i32),
        torch.tensor(slots, dtype=i64),
        torch.tensor(cu, dtype=i32),
        torch.tensor(flat_drafts, dtype=i32),
    )
