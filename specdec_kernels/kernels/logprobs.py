"""The CUDA top-N logprobs of a verify step: ``top_logprobs`` as Triton kernels.

``_top_n_kernel``, one program per slot (grid ``B (k+1)``): the emitted token's raw value
and rank, the row's log-softmax normaliser (fp32 terms summed in float64: an fp32 sum
drifts by ~2e-5 at V = 152k) and its ``N`` largest logits without sorting the row, in two
reads of it. The first keeps each lane's largest order-preserving int32 key; the ``N``-th
largest of those lane maxima is a bound every one of the top ``N`` reaches, so the
second read gathers the ids at or above it (usually little more than ``N``) while it
counts, and the candidates are ordered by ``(key desc, id asc)`` against each other
(ties to the lower id, as the contract says). Where ties at the bound overflow the
``4 N`` candidate slots, a pivot search finds the ``N``-th largest key exactly (16 pivots
a pass, up to ~8 passes, as the sampler's top-k threshold) and exactly ``N`` ids are
gathered. No host synchronisation, static shapes; temporaries: the rows read (int64
``[B (k+1)]``) and the candidate slots (int32 ``[B (k+1), CAP]``, ``CAP`` = 4 N rounded up
to a power of two, at least 64). For ``N > MAX_KERNEL_N``, torch ops (one int64 key per
logit, its 32-bit key above the complement of its id, and one ``topk``): on an H200 that
route took 0.9-4 ms a call, 0.21-0.35x vLLM's ``log_softmax`` + ``topk`` (bench/results/
2026-12-04-nvidia-h200-processing-logprobs-frequency.md), why the kernel exists; the
kernel has not yet run on a GPU.

The processed modes' values of a sampled request come from one Triton program per slot
(``_processed_values_kernel``), which finds the row's maximum, weights and filters'
threshold with the sampler's own functions (``kernels/sampling.py``), so its kept set is
the one ``rejection_sample``'s kernel samples from, and overwrites the slot's ``N + 1``
values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_kernels.kernels import _utils
from specdec_kernels.kernels import rejection as _rejection
from specdec_kernels.kernels._topk_torch import top_logprobs_torch as _top_logprobs_torch
from specdec_kernels.kernels._utils import next_pow2
from specdec_kernels.kernels.sampling import (
    EXP2_MIN,
    LOG2E,
    _filter_threshold,
    _load_logits,
    _row_max,
    _row_sums,
)


@triton.jit
def _keys(l):
    """Order-preserving int32 keys of fp32 logits without NaN (-0.0 read as +0.0)."""
    bits = tl.where(l == 0.0, 0.0, l).to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _order(l, ids):
    """int64 keys ordered as ``(l desc, id asc)``: the logit's key above ``~id``."""
    return _keys(l).to(tl.int64) * 4294967296 + (4294967295 - ids.to(tl.int64))


@triton.jit
def _narrow(piv, ge, N, lo, hi):
    """One step of the pivot searches: ``ge[i]`` keys are at or above ``piv[i]`` (a
    non-increasing count, so ``ge >= N`` holds on a prefix); returns the new ``lo``, ``hi``
    and the first pivot that failed (``hi + 1`` if none did)."""
    ok = ge >= N
    first_fail = tl.min(tl.where(ok, hi + 1, piv), axis=0)
    return (
        tl.maximum(lo, tl.max(tl.where(ok, piv, lo), axis=0)),
        tl.minimum(hi, first_fail - 1),
        first_fail,
    )


@triton.jit
def _nth_in_block(keys, N, NPIV: tl.constexpr):
    """The ``N``-th largest entry of the int64 vector ``keys`` (``1 <= N <= len``), by the
    pivot search of :func:`_nth_key` in registers (no memory read)."""
    lo = tl.min(keys, axis=0)
    hi = tl.max(keys, axis=0)
    piv_i = tl.arange(0, NPIV).to(tl.int64)
    while lo < hi:
        step = (hi - lo + NPIV - 1) // NPIV
        piv = tl.minimum(lo + 1 + piv_i * step, hi)
        ge = tl.sum((keys[:, None] >= piv[None, :]).to(tl.int32), axis=0)
        lo, hi, first_fail = _narrow(piv, ge, N, lo, hi)
    return lo


@triton.jit
def _nth_key(row_ptr, V, stride_v, m, N, lo, BLOCK: tl.constexpr, NPIV: tl.constexpr):
    """The ``N``-th largest key of the row and how many keys exceed it, given ``lo`` with
    at least ``N`` keys at or above it.

    A search over the integer keys: ``lo`` always has ``>= N`` keys at or above it,
    ``hi + 1`` fewer (``n_hi`` of them), so the answer is in ``[lo, hi]``; each pass counts
    the keys at or above ``NPIV`` pivots in ``(lo, hi]`` and narrows the range ``NPIV``-fold
    (up to 8 passes for 16 pivots); blocks with no key in ``(lo, hi]`` skip the
    comparisons."""
    hi = _keys(m).to(tl.int64)
    n_hi = N * 0
    piv_i = tl.arange(0, NPIV).to(tl.int64)
    while lo < hi:
        step = (hi - lo + NPIV - 1) // NPIV
        piv = tl.minimum(lo + 1 + piv_i * step, hi)
        ge = tl.zeros([NPIV], dtype=tl.int32) + n_hi  # keys >= each pivot
        for s in range(0, V, BLOCK):
            offs = s + tl.arange(0, BLOCK)
            key = _keys(_load_logits(row_ptr, offs, V, stride_v)).to(tl.int64)
            inside = (key > lo) & (key <= hi) & (offs < V)
            if tl.max(inside.to(tl.int32), axis=0) > 0:
                hit = (key[:, None] >= piv[None, :]) & inside[:, None]
                ge += tl.sum(hit.to(tl.int32), axis=0)
        new_lo, new_hi, first_fail = _narrow(piv, ge, N, lo, hi)
        n_hi = tl.where(first_fail <= hi, tl.max(tl.where(piv == first_fail, ge, 0), axis=0), n_hi)
        lo, hi = new_lo, new_hi
    return lo, n_hi


@triton.jit
def _value(l, m, finite, log_s, n_max, LOGITS: tl.constexpr):
    """Values of logits ``l`` in the raw modes: ``l``, or ``(l - m) - log S`` (float64
    difference); without a finite maximum ``-log n`` at the ``n`` maxima, -inf elsewhere."""
    d = (l - tl.where(finite, m, 0.0)).to(tl.float64) - log_s  # (no inf - inf: NaN)
    lp = tl.where(
        finite, d.to(tl.float32), tl.where(l == m, -tl.log(n_max.to(tl.float32)), float("-inf"))
    )
    return l if LOGITS else lp


@triton.jit
def _top_n_kernel(
    logits_ptr, stride_lr, stride_lv, n_rows, out_ptr, emitted_ptr, cu_ptr, rows_ptr,
    tok_lp_ptr, rank_ptr, ids_ptr, vals_ptr, cand_ptr, V, K1, N,
    LOGITS: tl.constexpr, BLOCK: tl.constexpr, SEARCH_BLOCK: tl.constexpr, NPIV: tl.constexpr,
    NB: tl.constexpr, CAP: tl.constexpr, RB: tl.constexpr,
):  # fmt: skip
    """Slot ``s`` (request ``b``, emitted token ``j``): the raw value and rank of the
    emitted token and the ``N`` largest logits' ids (ties: the lower id) and values,
    ``N <= NB``; slots past ``num_emitted`` get 0 and ids -1. Writes the row it read to
    ``rows_ptr`` (0 for those) for the processed modes' kernel.

    Two passes. The first keeps each of the ``BLOCK`` lanes' largest key; the ``N``-th
    largest of those, ``lo``, has ``N`` distinct logits at or above it, so the top ``N``
    all are. The second counts the rank, the maxima and the log-softmax normaliser (fp32
    terms summed in float64) and gathers the ids with a key ``>= lo`` into the slot's
    ``CAP`` candidates (``cand_ptr``). If more than ``CAP`` reach ``lo`` (ties), the
    ``N``-th largest key is searched from ``lo`` (:func:`_nth_key`) and exactly ``N`` ids
    gathered instead. Then each candidate's rank among them by ``(key desc, id asc)``
    (``RB`` at a time against all) is its position, kept if below ``N``."""
    s = tl.program_id(0).to(tl.int64)
    b = s // K1
    nb = tl.arange(0, NB)
    live = (s % K1) < tl.minimum(tl.maximum(tl.load(emitted_ptr + b), 0), K1)
    row = tl.load(cu_ptr + b).to(tl.int64) + b + s % K1
    row = tl.where(live, tl.minimum(tl.maximum(row, 0), n_rows - 1), 0)
    tl.store(rows_ptr + s, row)
    if live:
        row_ptr = logits_ptr + row * stride_lr
        tok = tl.minimum(tl.maximum(tl.load(out_ptr + s), 0), V - 1)
        x_tok = tl.load(row_ptr + tok.to(tl.int64) * stride_lv).to(tl.float32)
        x_tok = tl.where(x_tok != x_tok, float("-inf"), x_tok)
        lane = tl.full([BLOCK], -(2**31) + 0x7FFFFF, tl.int32)  # key(-inf), the smallest
        for c in range(0, V, BLOCK):
            offs = c + tl.arange(0, BLOCK)
            lane = tl.maximum(lane, _keys(_load_logits(row_ptr, offs, V, stride_lv)))
        m_key = tl.max(lane, axis=0)  # the keys are their own inverse: back to the max
        m = (m_key ^ ((m_key >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
        NV = tl.minimum(N, V)  # (N > V only unvalidated: ids -1, values 0 past V)
        tl.store(ids_ptr + s * N + nb, -1, mask=(nb >= NV) & (nb < N))
        tl.store(vals_ptr + s * N + nb, 0.0, mask=(nb >= NV) & (nb < N))
        lo = _nth_in_block(lane.to(tl.int64), tl.maximum(NV, 1), NPIV)
        finite = (m > float("-inf")) & (m < float("inf"))
        rank = 0
        n_max = 0
        n_cand = 0
        S = tl.zeros([], dtype=tl.float64)
        for c in range(0, V, BLOCK):
            offs = c + tl.arange(0, BLOCK)
            l = _load_logits(row_ptr, offs, V, stride_lv)
            rank += tl.sum(((l >= x_tok) & (offs < V)).to(tl.int32), axis=0)
            n_max += tl.sum(((l == m) & (offs < V)).to(tl.int32), axis=0)
            if finite:
                S += tl.sum(tl.where(offs < V, tl.exp(l - m), 0.0).to(tl.float64), axis=0)
            take = (_keys(l).to(tl.int64) >= lo) & (offs < V)
            pos = n_cand + tl.cumsum(take.to(tl.int32), 0) - 1
            tl.store(cand_ptr + s * CAP + pos, offs, mask=take & (pos < CAP))
            n_cand += tl.sum(take.to(tl.int32), axis=0)
        log_s = tl.log(tl.where(finite, S, 1.0))
        tl.store(rank_ptr + s, rank)
        tl.store(tok_lp_ptr + s, _value(x_tok, m, finite, log_s, n_max, LOGITS))
        if (NV > 0) & (n_cand > CAP):  # ties at lo: the N-th largest key, then N ids
            tl.debug_barrier()  # every first candidate written before any is overwritten
            tau, n_gt = _nth_key(row_ptr, V, stride_lv, m, NV, lo, SEARCH_BLOCK, NPIV)
            n_cand = 0
            n_eq = 0
            for c in range(0, V, BLOCK):
                offs = c + tl.arange(0, BLOCK)
                key = _keys(_load_logits(row_ptr, offs, V, stride_lv)).to(tl.int64)
                eq = (key == tau) & (offs < V)
                take = ((key > tau) & (offs < V)) | (
                    eq & (n_eq + tl.cumsum(eq.to(tl.int32), 0) <= NV - n_gt)
                )  # the lowest ids of the tie at tau
                pos = n_cand + tl.cumsum(take.to(tl.int32), 0) - 1
                tl.store(cand_ptr + s * CAP + pos, offs, mask=take & (pos < CAP))
                n_cand += tl.sum(take.to(tl.int32), axis=0)
                n_eq += tl.sum(eq.to(tl.int32), axis=0)
        if NV > 0:
            tl.debug_barrier()  # the candidates written above, read by other threads
            cb = tl.arange(0, CAP)
            all_ids = tl.load(cand_ptr + s * CAP + cb, mask=cb < n_cand, other=0)
            all_l = _load_logits(row_ptr, all_ids, V, stride_lv)
            order = tl.where(cb < n_cand, _order(all_l, all_ids), -9223372036854775807)
            for r0 in range(0, tl.minimum(n_cand, CAP), RB):
                rb = r0 + tl.arange(0, RB)
                ids = tl.load(cand_ptr + s * CAP + rb, mask=rb < n_cand, other=0)
                l = _load_logits(row_ptr, ids, V, stride_lv)
                pos = tl.sum((order[None, :] > _order(l, ids)[:, None]).to(tl.int32), axis=1)
                keep = (rb < n_cand) & (pos < NV)
                tl.store(ids_ptr + s * N + pos, ids, mask=keep)
                tl.store(
                    vals_ptr + s * N + pos, _value(l, m, finite, log_s, n_max, LOGITS), mask=keep
                )
    else:
        tl.store(tok_lp_ptr + s, 0.0)
        tl.store(rank_ptr + s, 0)
        tl.store(ids_ptr + s * N + nb, -1, mask=nb < N)
        tl.store(vals_ptr + s * N + nb, 0.0, mask=nb < N)


@triton.jit
def _processed_values_kernel(
    logits_ptr,
    stride_lr,
    stride_lv,
    rows_ptr,
    emitted_ptr,
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    ids_ptr,
    values_ptr,
    out_ptr,
    tok_lp_ptr,
    V,
    K1,
    N,
    HAS_TOP_K: tl.constexpr,
    HAS_TOP_P: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    LOGITS: tl.constexpr,
    BLOCK: tl.constexpr,
    SEARCH_BLOCK: tl.constexpr,
    NPIV: tl.constexpr,
    ID_BLOCK: tl.constexpr,
):
    """Slot ``s`` of request ``b`` (emitted, ``temperature[b] > 0``): the values of its
    ``N`` top ids and of its emitted token in the row as sampled, ``l / T`` or
    ``(l - m) / T - log S`` where the weight's bits are ``>= t``, -inf elsewhere, written
    over the raw ones. A logprobs slot whose row has no finite
    maximum keeps the raw value (its maxima share the mass, as in the raw mode)."""
    s = tl.program_id(0).to(tl.int64)
    b = s // K1
    T = tl.load(temp_ptr + b).to(tl.float32)
    live = (s % K1) < tl.load(emitted_ptr + b)
    if live & (T > 0.0):
        row_ptr = logits_ptr + tl.load(rows_ptr + s) * stride_lr
        m, arg = _row_max(row_ptr, V, stride_lv, BLOCK)
        go = (m > float("-inf")) & (m < float("inf"))
        if LOGITS:
            go = go | True
        if go:
            scale2 = (LOG2E / T) * 2.0
            t_min = 0
            if HAS_MIN_P:
                t_min = tl.load(min_p_ptr + b).to(tl.float32).to(tl.int32, bitcast=True)
            S_z, S_min, e_x, S_raw = _row_sums(
                row_ptr, V, stride_lv, scale2, m, 0, t_min, HAS_MIN_P=HAS_MIN_P, WANT_X=False,
                LOGPROBS=False, BLOCK=BLOCK,
            )  # fmt: skip
            t, S = _filter_threshold(
                row_ptr, V, stride_lv, scale2, m, S_z, S_min, b, top_k_ptr, top_p_ptr, t_min,
                HAS_TOP_K=HAS_TOP_K, HAS_TOP_P=HAS_TOP_P, HAS_MIN_P=HAS_MIN_P, BLOCK=BLOCK,
                SEARCH_BLOCK=SEARCH_BLOCK, NPIV=NPIV,
            )  # fmt: skip
            log_s = tl.log(S)
            tok = tl.minimum(tl.maximum(tl.load(out_ptr + s), 0), V - 1)
            for c in range(0, N + 1, ID_BLOCK):  # the N top ids, then the token (offs == N)
                offs = c + tl.arange(0, ID_BLOCK)
                mask = offs <= N
                ids = tl.load(ids_ptr + s * N + offs, mask=offs < N, other=0)
                ids = tl.where(offs == N, tok, ids).to(tl.int64)
                l = tl.load(row_ptr + ids * stride_lv, mask=mask, other=float("-inf"))
                l = l.to(tl.float32)
                l = tl.where(l != l, float("-inf"), l)
                z = (l * 0.5 - m * 0.5) * scale2
                e = tl.where(z > EXP2_MIN, tl.exp2(z), 0.0)
                e = tl.where(l == m, 1.0, e)
                # div_rn: an IEEE division (Triton's "/" is ~2 ulp on the GPU), so processed
                # logits equal the CPU path's and torch's l / T; halved for the logprobs, as
                # the weights are: l - m can pass the float32 range
                if LOGITS:
                    v = tl.div_rn(l, T)
                else:
                    v = tl.div_rn(l * 0.5 - m * 0.5, T) * 2.0 - log_s
                v = tl.where(e.to(tl.int32, bitcast=True) >= t, v, float("-inf"))
                tl.store(values_ptr + s * N + offs, v, mask=offs < N)
                tl.store(tok_lp_ptr + s + offs * 0, v, mask=offs == N)


MAX_KERNEL_N = 128
"""Largest ``num_logprobs`` the Triton kernel orders (an ``[N, N]`` comparison); above
it, ``torch.topk`` (OpenAI and vLLM's defaults cap N at 20)."""


def top_logprobs(
    target_logits, output_token_ids, num_emitted, cu_num_draft_tokens, temperature=None,
    top_k=None, top_p=None, min_p=None, *, num_logprobs, logprobs_mode,
):  # fmt: skip
    """The CUDA implementation of ``specdec::top_logprobs`` (registered directly)."""
    B, K1 = output_token_ids.shape
    N, V = num_logprobs, target_logits.shape[1]
    device = target_logits.device
    tok_lp = _utils._empty((B, K1), torch.float32, device)
    tok_rank = _utils._empty((B, K1), torch.int32, device)
    top_ids = _utils._empty((B, K1, N), torch.int32, device)
    top_vals = _utils._empty((B, K1, N), torch.float32, device)
    if B == 0 or V == 0 or target_logits.shape[0] == 0:  # nothing to read (unvalidated)
        tok_lp.zero_(), tok_rank.zero_(), top_ids.fill_(-1), top_vals.zero_()
        return tok_lp, tok_rank, top_ids, top_vals
    logits_mode = logprobs_mode.endswith("_logits")
    npiv = _rejection.SEARCH_PIVOTS or (16 if target_logits.is_cuda else 1024)
    block = min(1024, max(16, next_pow2(V)))
    if N <= MAX_KERNEL_N:  # (the interpreter: wide blocks, few pivots; numpy likes those)
        rows = _utils._empty((B * K1,), torch.int64, device)
        cap = max(64, 4 * next_pow2(N))
        _top_n_kernel[(B * K1,)](
            target_logits, target_logits.stride(0), target_logits.stride(1),
            target_logits.shape[0], output_token_ids, num_emitted, cu_num_draft_tokens, rows,
            tok_lp, tok_rank, top_ids, top_vals, _utils._empty((B * K1, cap), torch.int32, device),
            V, K1, N, LOGITS=logits_mode, BLOCK=block,
            SEARCH_BLOCK=min(128, block) if target_logits.is_cuda else block,
            NPIV=_rejection.SEARCH_PIVOTS or (16 if target_logits.is_cuda or V > 4096 else 256),
            NB=next_pow2(max(N, 1)), CAP=cap, RB=32,
        )  # fmt: skip
    else:
        rows = _top_logprobs_torch(target_logits, output_token_ids, num_emitted,
                                   cu_num_draft_tokens, N, logits_mode,
                                   (tok_lp, tok_rank, top_ids, top_vals))  # fmt: skip
    if logprobs_mode.startswith("processed") and temperature is not None:
        _processed_values_kernel[(B * K1,)](
            logits_ptr=target_logits, stride_lr=target_logits.stride(0),
            stride_lv=target_logits.stride(1), rows_ptr=rows, emitted_ptr=num_emitted,
            temp_ptr=temperature, top_k_ptr=top_k, top_p_ptr=top_p, min_p_ptr=min_p,
            ids_ptr=top_ids, values_ptr=top_vals, out_ptr=output_token_ids, tok_lp_ptr=tok_lp,
            V=V, K1=K1, N=N, HAS_TOP_K=top_k is not None, HAS_TOP_P=top_p is not None,
            HAS_MIN_P=min_p is not None, LOGITS=logits_mode,
            BLOCK=min(1024, max(16, next_pow2(V))), SEARCH_BLOCK=min(128, max(16, next_pow2(V))),
            NPIV=npiv, ID_BLOCK=min(128, next_pow2(N + 1)),
        )  # fmt: skip
    return tok_lp, tok_rank, top_ids, top_vals
