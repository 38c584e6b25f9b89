"""Vectorised torch commit of accepted tokens: the CPU path of ``commit_accepted_tokens``.

Works on the ``[B, k+1]`` tile of emitted tokens, with no Python loop: the first ``-1``,
the first counted stop token and the length budget each cap the count, and the committed
tokens are written with one ``index_put_``.
"""

from __future__ import annotations

import torch

from specdec_kernels.constants import FINISH_LENGTH, FINISH_STOP
from specdec_kernels.cpu.verify_inputs import _state_rows


def commit_accepted_tokens(
    token_ids, num_tokens, output_token_ids, num_emitted, req_indices, stop_token_ids,
    num_prompt_tokens, min_tokens, max_tokens, num_computed_tokens, *, max_model_len,
):  # fmt: skip
    B, K1 = output_token_ids.shape
    R, L_max = token_ids.shape
    rows, active = _state_rows(req_indices, B)
    if R == 0:
        active = torch.zeros(B, dtype=torch.bool)
        rows = torch.zeros(B, dtype=torch.long)
    gather = (lambda x: x[rows].long()) if R else (lambda x: torch.zeros(B, dtype=torch.long))
    length = gather(num_tokens)
    out_index = length - (gather(num_prompt_tokens) if num_prompt_tokens is not None else 0)

    # Tokens left in the budget (<= 0: already at it).
    room = min(max_model_len, L_max) - length
    if max_tokens is not None:
        room = torch.minimum(room, max_tokens.long() - out_index)

    j = torch.arange(K1)[None, :]
    tok = output_token_ids.long()
    n = num_emitted.long().clamp(0, K1)
    first_neg = torch.where((j < n[:, None]) & (tok < 0), j, K1).amin(dim=1)
    n = torch.minimum(n, first_neg)

    is_stop = torch.zeros((B, K1), dtype=torch.bool)
    if stop_token_ids is not None and stop_token_ids.shape[1]:
        stops = stop_token_ids.long()[:, None, :]
        is_stop = ((tok[:, :, None] == stops) & (stops >= 0)).any(dim=2)
    if min_tokens is not None:
        is_stop &= out_index[:, None] + j >= min_tokens.long()[:, None]
    is_stop &= j < n[:, None]
    first_stop = torch.where(is_stop, j, K1).amin(dim=1)

    count = torch.minimum(torch.minimum(n, first_stop + 1), room.clamp(min=0))
    reason = torch.where(
        room <= 0,
        FINISH_LENGTH,
        torch.where(first_stop < count, FINISH_STOP, torch.where(count == room, FINISH_LENGTH, 0)),
    )
    count = torch.where(active, count, 0)
    reason = torch.where(active, reason, 0)

    write = j < count[:, None]
    token_ids[rows[:, None].expand(B, K1)[write], (length[:, None] + j)[write]] = output_token_ids[
        write
    ].to(token_ids.dtype)
    if R:
        live = rows[active]
        num_tokens[live] = (length + count)[active].to(num_tokens.dtype)
        if num_computed_tokens is not None:
            num_computed_tokens[live] += count[active].to(num_computed_tokens.dtype)
    return count.to(torch.int32), reason != 0, reason.to(torch.int8)
