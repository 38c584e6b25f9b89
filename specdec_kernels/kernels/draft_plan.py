"""Triton draft-length planning: the CUDA path of ``plan_draft_lengths`` and
``update_acceptance_stats``.

- ``_plan_kernel``, one program: the whole batch's ``[B, k]`` tile of draft gains (a
  running product over the positions, one fp32 multiplication each), quantised to
  integers and packed with their slot index into int64 keys ``gain << 24 | (2**24 - 1 -
  slot)`` with ``slot = j * B + b``, so one ``tl.sort`` orders them by gain and breaks
  ties by the lower position, then the lower batch row, as the stable sort of the CPU
  path does. An int64 ``tl.cumsum`` of the sorted gains is
  exact, the value of every prefix length ``D`` is one float64 division, and the best
  ``D`` is the first maximum. The key at ``D - 1`` is then the threshold: a request
  plans the slots whose key is at least that. One program keeps the step free of any
  host synchronisation and of a second launch; ``B * k`` is bounded by the op layer
  (``ops/draft_plan.py``'s ``MAX_PLAN_SLOTS``) so the tile fits one block.
- ``_update_kernel``, grid ``(B,)``: one program per request compares its proposed drafts
  with the emitted tokens, stops at the first mismatch, and updates the estimates of its
  own state row (``req_indices`` is unique).

Both launch with ``enable_fp_fusion=False``: a fused multiply-add would round the running
product and the decayed update differently from the CPU path, and the plan must match
it bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_kernels import constants
from specdec_kernels.kernels import _utils
from specdec_kernels.kernels._utils import next_pow2

GAIN_SCALE = tl.constexpr(constants.DRAFT_GAIN_SCALE)  # jit code reads only constexpr globals
SLOT_BITS = tl.constexpr(24)
SLOT_MASK = tl.constexpr((1 << 24) - 1)


@triton.jit
def _plan_kernel(
    num_drafts_ptr,
    match_len_ptr,
    acc_ptr,
    acc_stride0,
    acc_stride1,
    acc_stride2,
    cost_ptr,
    num_costs,
    req_indices_ptr,
    planned_ptr,
    expected_ptr,
    batch,
    base_gain,
    num_rows,
    num_classes,
    max_num_tokens,
    K: tl.constexpr,
    HAS_REQ_INDICES: tl.constexpr,
    HAS_MAX_NUM_TOKENS: tl.constexpr,
    BB: tl.constexpr,
    KB: tl.constexpr,
):
    b = tl.arange(0, BB).to(tl.int64)
    j = tl.arange(0, KB)[None, :]
    in_batch = b < batch
    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + b, mask=in_batch, other=-1).to(tl.int64)
    else:
        r = tl.where(in_batch, b, -1)
    active = (r >= 0) & (r < num_rows)  # rows past the state are never read
    rc = tl.where(active, r, 0)
    m = tl.load(num_drafts_ptr + b, mask=active, other=0)
    cls = tl.load(match_len_ptr + b, mask=active, other=1)
    cls = (tl.minimum(tl.maximum(cls, 1), num_classes) - 1).to(tl.int64)
    row = acc_ptr + rc * acc_stride0 + cls * acc_stride1

    # Gains: P(drafts 0..j all accepted), one multiplication per position, in order.
    g = tl.full([BB], 1.0, dtype=tl.float32)
    gain = tl.zeros([BB, KB], dtype=tl.float32)
    for jj in range(K):
        a = tl.load(row + jj * acc_stride2, mask=active, other=0.0).to(tl.float32)
        g = g * a
        gain = tl.where(j == jj, g[:, None], gain)
    q = tl.math.floor(gain * GAIN_SCALE).to(tl.int64)
    valid = active[:, None] & (j < m[:, None]) & (j < K)
    slot = j * batch + b[:, None]  # ties: the lower position, then the lower batch row
    key = tl.where(valid, (q << SLOT_BITS) | (SLOT_MASK - slot), -1)

    srt = tl.sort(tl.reshape(key, [BB * KB]), descending=True)
    ok = srt >= 0
    gains = tl.where(ok, srt >> SLOT_BITS, 0)
    total = base_gain + tl.cumsum(gains, axis=0)  # int64: B * 2**24 passes int32 at B = 128
    d = tl.arange(0, BB * KB) + 1  # prefix length D of each position
    n = batch + d
    allowed = ok & (n < num_costs)
    if HAS_MAX_NUM_TOKENS:
        allowed = allowed & (n <= max_num_tokens)
    cost = tl.load(cost_ptr + n, mask=allowed, other=1.0).to(tl.float64)
    value = tl.where(allowed, total.to(tl.float64) / cost, -1.0)
    base = (base_gain + tl.zeros([], dtype=tl.int64)).to(tl.float64)
    base = base / tl.load(cost_ptr + batch).to(tl.float64)
    best_value = tl.maximum(tl.max(value, axis=0), base)
    best_d = tl.min(tl.where(value == best_value, d, BB * KB + 1), axis=0)
    best_d = tl.where(base == best_value, 0, best_d)
    thr = tl.max(tl.where(d == best_d, srt, -1), axis=0)  # the key of the D-th slot

    chosen = valid & (key >= thr) & (best_d > 0)
    planned = tl.sum(chosen.to(tl.int32), axis=1)
    sums = tl.sum(tl.where(chosen, q, 0), axis=1)
    expected = 1.0 + sums.to(tl.float64) / GAIN_SCALE
    tl.store(planned_ptr + b, planned, mask=in_batch)
    tl.store(expected_ptr + b, tl.where(active, expected, 0.0).to(tl.float32), mask=in_batch)


@triton.jit
def _update_kernel(
    acc_ptr,
    acc_stride0,
    acc_stride1,
    acc_stride2,
    drafts_ptr,
    drafts_stride,
    num_drafts_ptr,
    match_len_ptr,
    out_ptr,
    out_stride,
    num_emitted_ptr,
    req_indices_ptr,
    num_rows,
    num_classes,
    keep,
    learn,
    K: tl.constexpr,
    HAS_REQ_INDICES: tl.constexpr,
    KB: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + b).to(tl.int64)
    else:
        r = b
    if (r >= 0) & (r < num_rows):  # rows past the state are never written
        j = tl.arange(0, KB)
        limit = tl.minimum(tl.load(num_drafts_ptr + b), tl.load(num_emitted_ptr + b))
        seen = j < tl.minimum(limit, K)
        d = tl.load(drafts_ptr + b * drafts_stride + j, mask=seen, other=-1)
        o = tl.load(out_ptr + b * out_stride + j, mask=seen, other=-2)
        hit = d == o
        first_miss = tl.min(tl.where(seen & (d != o), j, KB), axis=0)
        observed = seen & (j <= first_miss)
        cls = tl.load(match_len_ptr + b)
        cls = (tl.minimum(tl.maximum(cls, 1), num_classes) - 1).to(tl.int64)
        ptr = acc_ptr + r * acc_stride0 + cls * acc_stride1 + j * acc_stride2
        a = tl.load(ptr, mask=observed, other=0.0)
        new = a * keep + learn * hit.to(tl.float32)
        tl.store(ptr, new, mask=observed)


def plan_draft_lengths(
    num_draft_tokens, match_len, verify_cost, req_indices, acceptance, *, max_num_tokens,
):  # fmt: skip
    """Launch the planning kernel; inputs are assumed validated (``B * k <= 2**14``)."""
    B = num_draft_tokens.shape[0]
    K = acceptance.shape[2]
    device = num_draft_tokens.device
    planned = _utils._empty((B,), torch.int32, device)
    expected = _utils._empty((B,), torch.float32, device)
    if B == 0:
        return planned, expected
    if acceptance.shape[0] == 0:  # no state rows: every batch row is padding
        return planned.zero_(), expected.zero_()
    _plan_kernel[(1,)](
        num_drafts_ptr=num_draft_tokens,
        match_len_ptr=match_len,
        acc_ptr=acceptance,
        acc_stride0=acceptance.stride(0),
        acc_stride1=acceptance.stride(1),
        acc_stride2=acceptance.stride(2),
        cost_ptr=verify_cost,
        num_costs=verify_cost.shape[0],
        req_indices_ptr=req_indices,
        planned_ptr=planned,
        expected_ptr=expected,
        batch=B,
        base_gain=B * constants.DRAFT_GAIN_SCALE,  # a host int: int64 where it needs to be
        num_rows=acceptance.shape[0],
        num_classes=acceptance.shape[1],
        max_num_tokens=max_num_tokens if max_num_tokens is not None else 0,
        K=K,
        HAS_REQ_INDICES=req_indices is not None,
        HAS_MAX_NUM_TOKENS=max_num_tokens is not None,
        BB=next_pow2(B),
        KB=next_pow2(K),
        enable_fp_fusion=False,
    )
    return planned, expected


def update_acceptance_stats(
    draft_token_ids, num_draft_tokens, match_len, output_token_ids, num_emitted, req_indices,
    acceptance, *, decay,
):  # fmt: skip
    """Launch the update kernel (mutates ``acceptance``); inputs are assumed validated."""
    B = draft_token_ids.shape[0]
    K = acceptance.shape[2]
    if B == 0 or K == 0 or acceptance.shape[0] == 0:
        return
    # fp32 weights, exactly as the CPU path rounds them (both are exact fp32 values)
    keep = torch.tensor(decay, dtype=torch.float32)
    learn = torch.tensor(1.0, dtype=torch.float32) - keep
    _update_kernel[(B,)](
        acc_ptr=acceptance,
        acc_stride0=acceptance.stride(0),
        acc_stride1=acceptance.stride(1),
        acc_stride2=acceptance.stride(2),
        drafts_ptr=draft_token_ids,
        drafts_stride=draft_token_ids.stride(0),
        num_drafts_ptr=num_draft_tokens,
        match_len_ptr=match_len,
        out_ptr=output_token_ids,
        out_stride=output_token_ids.stride(0),
        num_emitted_ptr=num_emitted,
        req_indices_ptr=req_indices,
        num_rows=acceptance.shape[0],
        num_classes=acceptance.shape[1],
        keep=keep.item(),
        learn=learn.item(),
        K=K,
        HAS_REQ_INDICES=req_indices is not None,
        KB=next_pow2(K),
        enable_fp_fusion=False,
    )
