"""Plain-Python commit of accepted tokens: the oracle for ``commit_accepted_tokens``.

One loop per request and one per emitted token, one statement per rule of
``docs/design.md`` (the op's contract), no vectorisation. Batch row ``b`` maps to state
row ``r = req_indices[b]`` (``-1``: a padding row).
"""

from __future__ import annotations

import torch

from specdec_kernels.constants import FINISH_LENGTH, FINISH_STOP
from specdec_kernels.reference.verify_inputs import _rows


def commit_accepted_tokens(
    token_ids, num_tokens, output_token_ids, num_emitted, req_indices, stop_token_ids,
    num_prompt_tokens, min_tokens, max_tokens, num_computed_tokens, *, max_model_len,
):  # fmt: skip
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
            reason[b] = FINISH_LENGTH
        else:
            for j in range(int(num_emitted[b])):
                tok = int(output_token_ids[b, j])
                if tok < 0:  # PLACEHOLDER: the end of the emitted tokens
                    break
                out_index = length - prompt
                token_ids[r, length] = tok
                length += 1
                if tok in stops and out_index >= min_out:
                    reason[b] = FINISH_STOP
                    break
                if at_budget(length):
                    reason[b] = FINISH_LENGTH
                    break
        num_tokens[r] = length
        if num_computed_tokens is not None:
            num_computed_tokens[r] += length - start
        committed[b] = length - start
        finished[b] = bool(reason[b] != 0)
    return committed, finished, reason
