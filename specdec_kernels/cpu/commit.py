"""The CPU commit of accepted tokens: ``commit_accepted_tokens`` as one numba kernel
(``cpu/_jit.py``): per request, its emitted tokens are appended one by one, with the
length budget checked before each one and the stop list after it.
"""

from __future__ import annotations

import numpy as np

from specdec_kernels.constants import FINISH_LENGTH, FINISH_STOP
from specdec_kernels.cpu._jit import NONE_I32, NONE_I32_2D, jit, np_, opt, outputs


@jit
def _commit(
    token_ids, num_tokens, output_token_ids, num_emitted, rows, has_rows, stop_token_ids,
    has_stop, num_prompt_tokens, has_prompt, min_tokens, has_min, max_tokens, has_max,
    num_computed_tokens, has_computed, max_model_len, committed, finished, reason,
):  # fmt: skip
    B, K1 = output_token_ids.shape
    R, L_max = token_ids.shape
    limit = min(max_model_len, L_max)
    for b in range(B):
        r = rows[b] if has_rows else b
        committed[b] = 0
        finished[b] = False
        reason[b] = 0
        if r < 0 or r >= R:
            continue
        start = min(max(np.int64(num_tokens[r]), 0), L_max)
        length = start
        prompt = np.int64(num_prompt_tokens[r]) if has_prompt else 0
        min_out = np.int64(min_tokens[b]) if has_min else 0
        budget = limit
        if has_max:  # max_tokens output tokens
            budget = min(budget, prompt + np.int64(max_tokens[b]))
        why = 0
        if length >= budget:
            why = FINISH_LENGTH
        else:
            for j in range(min(max(num_emitted[b], 0), K1)):
                tok = output_token_ids[b, j]
                if tok < 0:  # PLACEHOLDER: the end of the emitted tokens
                    break
                out_index = length - prompt
                token_ids[r, length] = tok
                length += 1
                stop = False
                if has_stop and out_index >= min_out:
                    for s in range(stop_token_ids.shape[1]):
                        if stop_token_ids[b, s] >= 0 and stop_token_ids[b, s] == tok:
                            stop = True
                            break
                if stop:
                    why = FINISH_STOP
                    break
                if length >= budget:
                    why = FINISH_LENGTH
                    break
        num_tokens[r] = length
        if has_computed:
            num_computed_tokens[r] += length - start
        committed[b] = length - start
        finished[b] = why != 0
        reason[b] = why


def commit_accepted_tokens(
    token_ids, num_tokens, output_token_ids, num_emitted, req_indices, stop_token_ids,
    num_prompt_tokens, min_tokens, max_tokens, num_computed_tokens, *, max_model_len,
):  # fmt: skip
    B = output_token_ids.shape[0]
    (committed, finished, reason), arrays = outputs((B, np.int32), (B, np.bool_), (B, np.int8))
    _commit(
        np_(token_ids), np_(num_tokens), np_(output_token_ids), np_(num_emitted),
        opt(req_indices, NONE_I32), req_indices is not None, opt(stop_token_ids, NONE_I32_2D),
        stop_token_ids is not None, opt(num_prompt_tokens, NONE_I32), num_prompt_tokens is not None,
        opt(min_tokens, NONE_I32), min_tokens is not None, opt(max_tokens, NONE_I32),
        max_tokens is not None, opt(num_computed_tokens, NONE_I32), num_computed_tokens is not None,
        max_model_len, *arrays,
    )  # fmt: skip
    return committed, finished, reason
