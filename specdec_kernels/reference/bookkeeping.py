"""Plain-Python step bookkeeping: the oracle for the slot-mapping, verify-input and commit ops.

One loop per request, one statement per rule of DESIGN.md (ops 3, 4, 5), no vectorisation.
Batch row ``b`` maps to state row ``r = req_indices[b]`` (``-1``: a padding row).
"""

from __future__ import annotations

import torch

PAD_SLOT = -1


def _rows(req_indices: torch.Tensor | None, batch: int) -> list[int]:
    return list(range(batch)) if req_indices is None else req_indices.tolist()


def _slot(
    block_table: torch.Tensor, r: int, pos: int, block_size: int, max_model_len: int | None
) -> int:
    """The KV-cache slot of position ``pos`` of state row ``r``, or ``PAD_SLOT``."""
    if r < 0 or pos < 0:
        return PAD_SLOT
    if max_model_len is not None and pos >= max_model_len:
        return PAD_SLOT
    idx = pos // block_size
    if idx >= block_table.shape[1]:
        return PAD_SLOT
    block = int(block_table[r, idx])
    if block < 0:
        return PAD_SLOT
    return block * block_size + pos % block_size


def compute_slot_mapping(
    block_table: torch.Tensor,
    positions: torch.Tensor,
    query_start_loc: torch.Tensor,
    req_indices: torch.Tensor | None,
    *,
    block_size: int,
    max_model_len: int | None,
) -> torch.Tensor:
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
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    block_table: torch.Tensor,
    req_indices: torch.Tensor | None,
    *,
    block_size: int,
    max_model_len: int,
) -> tuple[torch.Tensor, ...]:
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


def commit_accepted_tokens(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    output_token_ids: torch.Tensor,
    num_emitted: torch.Tensor,
    req_indices: torch.Tensor | None,
    stop_token_ids: torch.Tensor | None,
    num_prompt_tokens: torch.Tensor | None,
    min_tokens: torch.Tensor | None,
    max_tokens: torch.Tensor | None,
    max_model_len: int,
    num_computed_tokens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Append token by token, checking the budget before and the stop list after each one."""
    B = output_token_ids.shape[0]
    rows = _rows(req_indices, B)
    committed = torch.zeros(B, dtype=torch.int32)
    finished = torch.zeros(B, dtype=torch.bool)
    reason = torch.zeros(B, dtype=torch.int8)
    limit = min(max_model_len, token_ids.shape[1])
    for b, r in enumerate(rows):
        if r < 0:
            continue
        start = int(num_tokens[r])
        length = start
        prompt = 0 if num_prompt_tokens is None else int(num_prompt_tokens[r])
        stops = set() if stop_token_ids is None else set(stop_token_ids[b].tolist()) - {-1}
        min_out = 0 if min_tokens is None else int(min_tokens[b])

        def at_budget(n: int) -> bool:
            if n >= limit:
                return True
            return max_tokens is not None and n - prompt >= int(max_tokens[b])  # noqa: B023

        if at_budget(length):
            reason[b] = 2
        else:
            for j in range(int(num_emitted[b])):
                tok = int(output_token_ids[b, j])
                if tok < 0:  # PLACEHOLDER: the end of the emitted tokens
                    break
                out_index = length - prompt
                token_ids[r, length] = tok
                length += 1
                if tok in stops and out_index >= min_out:
                    reason[b] = 1
                    break
                if at_budget(length):
                    reason[b] = 2
                    break
        num_tokens[r] = length
        if num_computed_tokens is not None:
            num_computed_tokens[r] += length - start
        committed[b] = length - start
        finished[b] = bool(reason[b] != 0)
    return committed, finished, reason
