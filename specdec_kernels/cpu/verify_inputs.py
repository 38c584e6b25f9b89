"""The CPU verify-step inputs: ``compute_slot_mapping`` and ``prepare_verify_inputs`` as numba
kernels (``cpu/_jit.py``), one loop over the batch's requests and their query tokens.
"""

from __future__ import annotations

import numpy as np

from specdec_kernels.constants import PAD_SLOT
from specdec_kernels.cpu._jit import NONE_I32, NONE_I32_2D, jit, np_, opt, outputs


@jit
def slot_of(block_table, has_table, r, pos, block_size, max_model_len):
    """The KV slot of position ``pos`` of state row ``r`` (paged, or ``r * max_model_len +
    pos`` without a table), ``PAD_SLOT`` where nothing may be written."""
    if r < 0 or pos < 0 or (max_model_len >= 0 and pos >= max_model_len):
        return PAD_SLOT
    if not has_table:
        return r * max_model_len + pos
    idx = pos // block_size
    if r >= block_table.shape[0] or idx >= block_table.shape[1]:
        return PAD_SLOT
    block = np.int64(block_table[r, idx])
    if block < 0:
        return PAD_SLOT
    return block * block_size + pos % block_size


@jit
def _slot_mapping(block_table, has_table, positions, qsl, rows, has_rows, block_size,
                  max_model_len, out):  # fmt: skip
    T = positions.shape[0]
    out[:] = PAD_SLOT
    for b in range(qsl.shape[0] - 1):
        r = rows[b] if has_rows else b
        for t in range(max(qsl[b], 0), min(qsl[b + 1], T)):
            out[t] = slot_of(block_table, has_table, r, np.int64(positions[t]), block_size,
                             max_model_len)  # fmt: skip


@jit
def _prepare(token_ids, num_tokens, draft_token_ids, num_draft_tokens, block_table, has_table,
             rows, has_rows, block_size, max_model_len, input_ids, positions, qsl, seq_lens,
             slot_mapping, cu, flat_drafts):  # fmt: skip
    B, k = draft_token_ids.shape
    R, L_max = token_ids.shape
    t = 0  # next query slot
    d = 0  # next flat draft slot
    qsl[0] = 0
    cu[0] = 0
    for b in range(B):
        r = rows[b] if has_rows else b
        if r < 0 or r >= R or L_max == 0:  # padding row: one dummy token, no drafts
            input_ids[t] = 0
            positions[t] = 0
            slot_mapping[t] = PAD_SLOT
            seq_lens[b] = 1
            t += 1
        else:
            L = min(max(np.int64(num_tokens[r]), 0), L_max)
            k_b = min(max(np.int64(num_draft_tokens[b]), 0), k)  # clamped, as the kernel does
            for j in range(k_b + 1):
                pos = L - 1 + j
                input_ids[t] = token_ids[r, max(L - 1, 0)] if j == 0 else draft_token_ids[b, j - 1]
                positions[t] = pos
                slot_mapping[t] = slot_of(block_table, has_table, r, pos, block_size, max_model_len)
                t += 1
            for j in range(k_b):
                flat_drafts[d] = draft_token_ids[b, j]
                d += 1
            seq_lens[b] = L + k_b
        qsl[b + 1] = t
        cu[b + 1] = d
    for i in range(t, input_ids.shape[0]):  # the tail belongs to no request
        input_ids[i] = 0
        positions[i] = 0
        slot_mapping[i] = PAD_SLOT
    for i in range(d, flat_drafts.shape[0]):
        flat_drafts[i] = -1


def _mml(max_model_len):
    return -1 if max_model_len is None else max_model_len


def compute_slot_mapping(
    block_table, positions, query_start_loc, req_indices, *, block_size, max_model_len,
):  # fmt: skip
    (out,), (out_a,) = outputs((positions.shape[0], np.int64))
    _slot_mapping(
        opt(block_table, NONE_I32_2D), block_table is not None, np_(positions),
        np_(query_start_loc), opt(req_indices, NONE_I32), req_indices is not None, block_size,
        _mml(max_model_len), out_a,
    )  # fmt: skip
    return out


def prepare_verify_inputs(
    token_ids, num_tokens, draft_token_ids, num_draft_tokens, block_table, req_indices, *,
    block_size, max_model_len,
):  # fmt: skip
    B, k = draft_token_ids.shape
    T = B * (k + 1)
    i32, i64 = np.int32, np.int64
    outs, arrays = outputs(
        (T, i32), (T, i64), (B + 1, i32), (B, i32), (T, i64), (B + 1, i32), (B * k, i32)
    )
    _prepare(
        np_(token_ids), np_(num_tokens), np_(draft_token_ids), np_(num_draft_tokens),
        opt(block_table, NONE_I32_2D), block_table is not None, opt(req_indices, NONE_I32),
        req_indices is not None, block_size, _mml(max_model_len), *arrays,
    )  # fmt: skip
    return tuple(outs)
