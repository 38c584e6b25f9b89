"""Triton commit of accepted tokens: the CUDA path of ``commit_accepted_tokens``.

``_commit_kernel``, grid ``(B,)``: one program per request works on its ``k+1`` emitted
tokens: the first ``-1``, the first counted stop token and the length budget each cap the
count; it writes the committed tokens and advances the counters of its own state row
(``req_indices`` is unique, so no two programs touch the same row). No host
synchronisation; offsets are int64 and ``token_ids`` is never written past a row's end.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_kernels import constants
from specdec_kernels.kernels import _utils
from specdec_kernels.kernels._utils import next_pow2

FINISH_STOP = tl.constexpr(constants.FINISH_STOP)  # jit functions read only constexpr globals
FINISH_LENGTH = tl.constexpr(constants.FINISH_LENGTH)


@triton.jit
def _commit_kernel(
    token_ids_ptr,
    tok_stride0,
    tok_stride1,
    hist_len,
    num_tokens_ptr,
    num_tokens_stride,
    out_ptr,
    out_stride0,
    out_stride1,
    num_emitted_ptr,
    req_indices_ptr,
    stop_ptr,
    stop_stride0,
    stop_stride1,
    num_stops,
    prompt_ptr,
    min_tokens_ptr,
    max_tokens_ptr,
    max_model_len,
    computed_ptr,
    computed_stride,
    committed_ptr,
    finished_ptr,
    reason_ptr,
    k1,
    HAS_REQ_INDICES: tl.constexpr,
    HAS_STOP: tl.constexpr,
    HAS_PROMPT: tl.constexpr,
    HAS_MIN_TOKENS: tl.constexpr,
    HAS_MAX_TOKENS: tl.constexpr,
    HAS_COMPUTED: tl.constexpr,
    KB: tl.constexpr,
    SB: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + b).to(tl.int64)
    else:
        r = b
    active = r >= 0
    rc = tl.maximum(r, 0)
    length = tl.load(num_tokens_ptr + rc * num_tokens_stride, mask=active, other=0).to(tl.int64)
    if HAS_PROMPT:
        out_index = length - tl.load(prompt_ptr + rc, mask=active, other=0).to(tl.int64)
    else:
        out_index = length

    j = tl.arange(0, KB)
    tok = tl.load(out_ptr + b * out_stride0 + j * out_stride1, mask=j < k1, other=-1)
    n = tl.load(num_emitted_ptr + b).to(tl.int64)
    n = tl.minimum(tl.maximum(n, 0), k1)
    n = tl.minimum(n, tl.min(tl.where((j < n) & (tok < 0), j, KB), axis=0))

    is_stop = tl.zeros([KB], dtype=tl.int32)
    if HAS_STOP:
        for s0 in range(0, num_stops, SB):
            s = s0 + tl.arange(0, SB)
            stop = tl.load(
                stop_ptr + b * stop_stride0 + s * stop_stride1, mask=s < num_stops, other=-1
            )
            hit = (tok[:, None] == stop[None, :]) & (stop[None, :] >= 0)
            is_stop = tl.maximum(is_stop, tl.max(hit.to(tl.int32), axis=1))
    counts = (is_stop > 0) & (j < n)
    if HAS_MIN_TOKENS:
        counts = counts & (out_index + j >= tl.load(min_tokens_ptr + b).to(tl.int64))
    first_stop = tl.min(tl.where(counts, j, KB), axis=0)

    room = tl.minimum(max_model_len, hist_len) - length  # tokens left in the budget
    if HAS_MAX_TOKENS:
        room = tl.minimum(room, tl.load(max_tokens_ptr + b).to(tl.int64) - out_index)
    count = tl.minimum(tl.minimum(n, first_stop + 1), tl.maximum(room, 0))
    reason = tl.where(
        room <= 0,
        FINISH_LENGTH,
        tl.where(first_stop < count, FINISH_STOP, tl.where(count == room, FINISH_LENGTH, 0)),
    )
    count = tl.where(active, count, 0)
    reason = tl.where(active, reason, 0)

    dst = token_ids_ptr + rc * tok_stride0 + (length + j) * tok_stride1
    tl.store(dst, tok, mask=j < count)
    tl.store(num_tokens_ptr + rc * num_tokens_stride, (length + count).to(tl.int32), mask=active)
    if HAS_COMPUTED:
        cptr = computed_ptr + rc * computed_stride
        done = tl.load(cptr, mask=active, other=0)
        tl.store(cptr, done + count.to(tl.int32), mask=active)
    tl.store(committed_ptr + b, count.to(tl.int32))
    tl.store(finished_ptr + b, reason != 0)
    tl.store(reason_ptr + b, reason.to(tl.int8))


def commit_accepted_tokens(
    token_ids, num_tokens, output_token_ids, num_emitted, req_indices, stop_token_ids,
    num_prompt_tokens, min_tokens, max_tokens, num_computed_tokens, *, max_model_len,
):  # fmt: skip
    """Launch the commit kernel (mutates ``token_ids``, ``num_tokens``, ``num_computed_tokens``).

    Inputs are assumed validated. Absent optional tensors go to the kernel as ``None``
    (a constexpr there, never dereferenced: each has its ``HAS_*`` flag).
    """
    B, k1 = output_token_ids.shape
    device = token_ids.device
    committed = _utils._empty((B,), torch.int32, device)
    finished = _utils._empty((B,), torch.bool, device)
    reason = _utils._empty((B,), torch.int8, device)
    if B == 0:
        return committed, finished, reason
    has_stop = stop_token_ids is not None and stop_token_ids.shape[1] > 0
    num_stops = stop_token_ids.shape[1] if has_stop else 0
    _commit_kernel[(B,)](
        token_ids_ptr=token_ids,
        tok_stride0=token_ids.stride(0),
        tok_stride1=token_ids.stride(1),
        hist_len=token_ids.shape[1],
        num_tokens_ptr=num_tokens,
        num_tokens_stride=num_tokens.stride(0),
        out_ptr=output_token_ids,
        out_stride0=output_token_ids.stride(0),
        out_stride1=output_token_ids.stride(1),
        num_emitted_ptr=num_emitted,
        req_indices_ptr=req_indices,
        stop_ptr=stop_token_ids if has_stop else None,
        stop_stride0=stop_token_ids.stride(0) if has_stop else 0,
        stop_stride1=stop_token_ids.stride(1) if has_stop else 0,
        num_stops=num_stops,
        prompt_ptr=num_prompt_tokens,
        min_tokens_ptr=min_tokens,
        max_tokens_ptr=max_tokens,
        max_model_len=max_model_len,
        computed_ptr=num_computed_tokens,
        computed_stride=num_computed_tokens.stride(0) if num_computed_tokens is not None else 0,
        committed_ptr=committed,
        finished_ptr=finished,
        reason_ptr=reason,
        k1=k1,
        HAS_REQ_INDICES=req_indices is not None,
        HAS_STOP=has_stop,
        HAS_PROMPT=num_prompt_tokens is not None,
        HAS_MIN_TOKENS=min_tokens is not None,
        HAS_MAX_TOKENS=max_tokens is not None,
        HAS_COMPUTED=num_computed_tokens is not None,
        KB=next_pow2(k1),
        SB=min(16, next_pow2(num_stops)),
    )
    return committed, finished, reason
