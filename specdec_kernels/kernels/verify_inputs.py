"""Triton kernels for the verify step's inputs: the CUDA path of ``compute_slot_mapping`` and
``prepare_verify_inputs``.

One launch per op, no host synchronisation, grids that depend only on shapes:

- ``_slot_mapping_kernel``, grid ``(cdiv(T, BLOCK),)``: a flat grid over tokens. Each lane
  finds its request by a branch-free binary search of ``t`` in ``query_start_loc``
  (``ceil(log2(B+2))`` loads per token from an array of ``B+1`` ints that stays in cache).
  Chosen over a grid of ``(request, token block)`` because that grid needs a static bound
  on the longest query (unknown without a host sync; ``T`` as the bound wastes
  ``B*T/BLOCK`` programs) and over one program per request looping over its tokens
  because a long prefill would then run on a single SM: the flat grid is balanced for
  any raggedness.
- ``_prepare_verify_kernel``, grid ``(cdiv(B, ROWS),)``: each program owns ``ROWS`` batch
  rows. It first sums the draft counts of all rows before its own and of the whole batch
  (``O(B)`` cached loads per program, cheaper than a second launch for B up to a few
  thousand), then ``tl.cumsum`` gives each row's exclusive offset ``cu[b]``. Query
  token ``j <= k_b`` of row ``b`` goes to ``qsl[b] + j`` (``qsl[b] = cu[b] + b``); row
  ``b`` also owns ``k - k_b`` tail slots at ``qsl[B] + (b*k - cu[b])`` onwards, so the
  ``B*(k+1)`` outputs are each written exactly once without any program waiting on
  another. The flat drafts use the same layout on ``B*k`` slots.

Both share ``_slot_of``: a paged slot from the block table, or, without a block table
(``HAS_BLOCK_TABLE=False``), the contiguous per-request layout ``r * max_model_len + pos``.
All offsets are int64, so ``T`` in the millions and large ``[R, max_model_len]`` tables
never overflow. The block table is never read out of bounds (masked by
``pos // block_size < max_blocks``), nor ``token_ids`` past a row's end.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_kernels import constants
from specdec_kernels.kernels import _utils
from specdec_kernels.kernels._utils import next_pow2

PAD_SLOT = tl.constexpr(constants.PAD_SLOT)  # jit functions may read only constexpr globals
_SLOT_BLOCK = 1024
_VERIFY_ROWS = 64
_SCAN_BLOCK = 1024


@triton.jit
def _slot_of(
    bt_ptr,
    bt_stride0,
    bt_stride1,
    max_blocks,
    r,
    pos,
    valid,
    block_size,
    max_model_len,
    HAS_BLOCK_TABLE: tl.constexpr,
    HAS_MAX_MODEL_LEN: tl.constexpr,
):
    """Slot of int64 ``pos`` in int64 state row ``r`` (same shapes), ``PAD_SLOT`` if not valid.

    Paged: ``block_table[r, pos // block_size] * block_size + pos % block_size``; without a
    block table, the contiguous layout ``r * max_model_len + pos``.
    """
    ok = valid & (r >= 0) & (pos >= 0)
    if HAS_MAX_MODEL_LEN:
        ok = ok & (pos < max_model_len)
    if HAS_BLOCK_TABLE:
        idx = pos // block_size
        ok = ok & (idx < max_blocks)
        block = tl.load(bt_ptr + r * bt_stride0 + idx * bt_stride1, mask=ok, other=-1)
        block = block.to(tl.int64)
        ok = ok & (block >= 0)
        slot = block * block_size + pos % block_size
    else:
        slot = r * max_model_len + pos
    return tl.where(ok, slot, PAD_SLOT)


@triton.jit(do_not_specialize=["num_query", "batch", "search_steps"])
def _slot_mapping_kernel(
    bt_ptr,
    bt_stride0,
    bt_stride1,
    max_blocks,
    positions_ptr,
    qsl_ptr,
    req_indices_ptr,
    slot_ptr,
    num_query,
    batch,
    search_steps,
    block_size,
    max_model_len,
    HAS_REQ_INDICES: tl.constexpr,
    HAS_BLOCK_TABLE: tl.constexpr,
    HAS_MAX_MODEL_LEN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = t < num_query

    # b = the largest index in [-1, B] with qsl[b] <= t (qsl[-1] counts as -inf). Steps
    # 2^(s-1), ..., 1 reach every index up to 2^s - 2 >= B.
    b = tl.full([BLOCK], -1, dtype=tl.int64)
    for i in range(search_steps):
        cand = b + (1 << (search_steps - 1 - i))
        probe = in_range & (cand <= batch)
        q = tl.load(qsl_ptr + cand, mask=probe, other=0)
        b = tl.where(probe & (q <= t), cand, b)
    valid = in_range & (b >= 0) & (b < batch)  # b == B: at or past qsl[B] (padding)

    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + b, mask=valid, other=-1).to(tl.int64)
    else:
        r = tl.where(valid, b, -1)
    pos = tl.load(positions_ptr + t, mask=valid, other=-1).to(tl.int64)
    slot = _slot_of(
        bt_ptr, bt_stride0, bt_stride1, max_blocks, r, pos, valid, block_size, max_model_len,
        HAS_BLOCK_TABLE, HAS_MAX_MODEL_LEN,
    )  # fmt: skip
    tl.store(slot_ptr + t, slot, mask=in_range)


@triton.jit(do_not_specialize=["batch"])
def _prepare_verify_kernel(
    token_ids_ptr,
    tok_stride0,
    tok_stride1,
    hist_len,
    num_tokens_ptr,
    drafts_ptr,
    drafts_stride0,
    drafts_stride1,
    num_drafts_ptr,
    req_indices_ptr,
    bt_ptr,
    bt_stride0,
    bt_stride1,
    max_blocks,
    input_ids_ptr,
    positions_ptr,
    qsl_ptr,
    seq_lens_ptr,
    slot_ptr,
    cu_ptr,
    flat_drafts_ptr,
    batch,
    k,
    block_size,
    max_model_len,
    HAS_REQ_INDICES: tl.constexpr,
    HAS_BLOCK_TABLE: tl.constexpr,
    ROWS: tl.constexpr,
    KB: tl.constexpr,
    SCAN_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    row0 = pid * ROWS

    # Drafts of the rows before this program's (exclusive offset) and of the whole batch.
    before = tl.zeros([SCAN_BLOCK], dtype=tl.int64)
    total = tl.zeros([SCAN_BLOCK], dtype=tl.int64)
    for start in range(0, batch, SCAN_BLOCK):
        bb = start + tl.arange(0, SCAN_BLOCK)
        m = bb < batch
        kb = tl.load(num_drafts_ptr + bb, mask=m, other=0).to(tl.int64)
        kb = tl.minimum(tl.maximum(kb, 0), k)
        if HAS_REQ_INDICES:
            kb = tl.where(tl.load(req_indices_ptr + bb, mask=m, other=-1) >= 0, kb, 0)
        total += kb
        before += tl.where(bb < row0, kb, 0)
    before_sum = tl.sum(before, axis=0)
    total_sum = tl.sum(total, axis=0)

    b = row0 + tl.arange(0, ROWS).to(tl.int64)
    in_batch = b < batch
    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + b, mask=in_batch, other=-1).to(tl.int64)
    else:
        r = tl.where(in_batch, b, -1)
    active = in_batch & (r >= 0)
    kb = tl.load(num_drafts_ptr + b, mask=active, other=0).to(tl.int64)
    kb = tl.where(active, tl.minimum(tl.maximum(kb, 0), k), 0)
    cu = before_sum + tl.cumsum(kb, axis=0) - kb  # exclusive prefix sum
    qsl = cu + b
    qsl_end = total_sum + batch
    unused_before = b * k - cu  # tail slots owned by the rows before b
    length = tl.load(num_tokens_ptr + tl.maximum(r, 0), mask=active, other=0).to(tl.int64)

    # Query tile [ROWS, KB]: entry j <= k_b is query token j (a padding row's entry 0 is its
    # dummy token); entries k_b < j <= k are the row's tail slots.
    j = tl.arange(0, KB)[None, :]
    real = (j <= kb[:, None]) & in_batch[:, None]
    live = real & active[:, None]
    tail = (j > kb[:, None]) & (j <= k) & in_batch[:, None]
    last_pos = tl.minimum(tl.maximum(length - 1, 0), hist_len - 1)
    last = tl.load(
        token_ids_ptr + r * tok_stride0 + last_pos * tok_stride1,
        mask=active & (length >= 1),
        other=0,
    )
    draft = tl.load(
        drafts_ptr + b[:, None] * drafts_stride0 + (j - 1) * drafts_stride1,
        mask=live & (j >= 1),
        other=0,
    )
    ids = tl.where(live, tl.where(j == 0, last[:, None], draft), 0)
    pos = tl.where(live, length[:, None] - 1 + j, 0)
    slot = _slot_of(
        bt_ptr,
        bt_stride0,
        bt_stride1,
        max_blocks,
        r[:, None],
        pos,
        live,
        block_size,
        max_model_len,
        HAS_BLOCK_TABLE,
        True,
    )
    dest = tl.where(
        real, qsl[:, None] + j, qsl_end + unused_before[:, None] + (j - kb[:, None] - 1)
    )
    write = real | tail
    tl.store(input_ids_ptr + dest, ids.to(tl.int32), mask=write)
    tl.store(positions_ptr + dest, pos, mask=write)
    tl.store(slot_ptr + dest, slot, mask=write)

    # Draft tile: entry j < k_b goes to cu[b] + j, entries k_b <= j < k (value -1) to the tail.
    real_d = (j < kb[:, None]) & in_batch[:, None]
    tail_d = (j >= kb[:, None]) & (j < k) & in_batch[:, None]
    draft_d = tl.load(
        drafts_ptr + b[:, None] * drafts_stride0 + j * drafts_stride1, mask=real_d, other=-1
    )
    dest_d = tl.where(
        real_d, cu[:, None] + j, total_sum + unused_before[:, None] + (j - kb[:, None])
    )
    tl.store(flat_drafts_ptr + dest_d, tl.where(real_d, draft_d, -1), mask=real_d | tail_d)

    tl.store(cu_ptr + b, cu.to(tl.int32), mask=in_batch)
    tl.store(qsl_ptr + b, qsl.to(tl.int32), mask=in_batch)
    tl.store(seq_lens_ptr + b, tl.where(active, length + kb, 1).to(tl.int32), mask=in_batch)
    if pid == 0:
        tl.store(cu_ptr + batch, total_sum.to(tl.int32))
        tl.store(qsl_ptr + batch, qsl_end.to(tl.int32))


def compute_slot_mapping(
    block_table, positions, query_start_loc, req_indices, *, block_size, max_model_len,
):  # fmt: skip
    """Launch the slot-mapping kernel; inputs are assumed validated.

    ``block_table=None`` is the contiguous layout (``max_model_len`` is then given).
    Absent optional tensors go to the kernel as ``None`` (a constexpr there).
    """
    has_bt = block_table is not None
    T = positions.shape[0]
    B = query_start_loc.shape[0] - 1
    slot_mapping = _utils._empty((T,), torch.int64, positions.device)
    if T == 0:
        return slot_mapping
    _slot_mapping_kernel[(triton.cdiv(T, _SLOT_BLOCK),)](
        bt_ptr=block_table,
        bt_stride0=block_table.stride(0) if has_bt else 0,
        bt_stride1=block_table.stride(1) if has_bt else 0,
        max_blocks=block_table.shape[1] if has_bt else 0,
        positions_ptr=positions,
        qsl_ptr=query_start_loc,
        req_indices_ptr=req_indices,
        slot_ptr=slot_mapping,
        num_query=T,
        batch=B,
        search_steps=(B + 1).bit_length(),
        block_size=block_size,
        max_model_len=max_model_len if max_model_len is not None else 0,
        HAS_REQ_INDICES=req_indices is not None,
        HAS_BLOCK_TABLE=has_bt,
        HAS_MAX_MODEL_LEN=max_model_len is not None,
        BLOCK=_SLOT_BLOCK,
    )
    return slot_mapping


def prepare_verify_inputs(
    token_ids, num_tokens, draft_token_ids, num_draft_tokens, block_table, req_indices, *,
    block_size, max_model_len,
):  # fmt: skip
    """Launch the verify-input kernel; inputs are assumed validated.

    ``block_table=None`` is the contiguous layout; absent optional tensors go to the kernel
    as ``None`` (a constexpr there).
    """
    has_bt = block_table is not None
    B, k = draft_token_ids.shape
    device = token_ids.device
    num_query = B * (k + 1)
    input_ids = _utils._empty((num_query,), torch.int32, device)
    positions = _utils._empty((num_query,), torch.int64, device)
    qsl = _utils._empty((B + 1,), torch.int32, device)
    seq_lens = _utils._empty((B,), torch.int32, device)
    slot_mapping = _utils._empty((num_query,), torch.int64, device)
    cu = _utils._empty((B + 1,), torch.int32, device)
    flat_drafts = _utils._empty((B * k,), torch.int32, device)
    outputs = (input_ids, positions, qsl, seq_lens, slot_mapping, cu, flat_drafts)
    if B == 0:
        qsl.zero_()
        cu.zero_()
        return outputs
    _prepare_verify_kernel[(triton.cdiv(B, _VERIFY_ROWS),)](
        token_ids_ptr=token_ids,
        tok_stride0=token_ids.stride(0),
        tok_stride1=token_ids.stride(1),
        hist_len=token_ids.shape[1],
        num_tokens_ptr=num_tokens,
        drafts_ptr=draft_token_ids,
        drafts_stride0=draft_token_ids.stride(0),
        drafts_stride1=draft_token_ids.stride(1),
        num_drafts_ptr=num_draft_tokens,
        req_indices_ptr=req_indices,
        bt_ptr=block_table,
        bt_stride0=block_table.stride(0) if has_bt else 0,
        bt_stride1=block_table.stride(1) if has_bt else 0,
        max_blocks=block_table.shape[1] if has_bt else 0,
        input_ids_ptr=input_ids,
        positions_ptr=positions,
        qsl_ptr=qsl,
        seq_lens_ptr=seq_lens,
        slot_ptr=slot_mapping,
        cu_ptr=cu,
        flat_drafts_ptr=flat_drafts if k else cu,  # never written when k == 0 (no pointer)
        batch=B,
        k=k,
        block_size=block_size,
        max_model_len=max_model_len,
        HAS_REQ_INDICES=req_indices is not None,
        HAS_BLOCK_TABLE=has_bt,
        ROWS=_VERIFY_ROWS,
        KB=next_pow2(k + 1),
        SCAN_BLOCK=_SCAN_BLOCK,
    )
    return outputs
