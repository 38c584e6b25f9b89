"""The CUDA top-N logprobs of a verify step: ``top_logprobs`` in device-side torch ops.

A top-N over the vocabulary is a selection, which ``torch.topk`` does on every device. It is
not fast: on an H200 a call takes 0.9-4 ms, 0.21-0.35x vLLM's fp32 ``log_softmax`` +
``topk`` rule (~25 small ops of host cost at small B, an int64 ``topk`` over every logit at
large B; bench/results/2026-12-04-nvidia-h200-processing-logprobs-frequency.md): a Triton
kernel is the open fix. No host synchronisation, static shapes: every
slot's row is gathered (a slot past ``num_emitted`` reads row 0 and is overwritten), and
ties go to the lower id through one int64 key per logit, the logit's order-preserving
32-bit pattern above the complement of its id, so one ``topk`` gives the contract's order.
Values are taken only at the ``N + 1`` ids a slot reports, against a float64 normaliser
(an fp32 ``log_softmax`` drifts by ~2e-5 at V = 152k). Temporaries: the fp32 rows and one
int64 key per logit.

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
from specdec_kernels.kernels._utils import next_pow2
from specdec_kernels.kernels.sampling import EXP2_MIN, LOG2E, _filter_threshold, _row_max, _row_sums

_LOW32 = (1 << 32) - 1


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
    V,
    K1,
    NP1,
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
    ``NP1`` ids in the row as sampled, ``l / T`` or ``(l - m) / T - log S`` where the
    weight's bits are ``>= t``, -inf elsewhere. A logprobs slot whose row has no finite
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
            for c in range(0, NP1, ID_BLOCK):
                offs = c + tl.arange(0, ID_BLOCK)
                mask = offs < NP1
                ids = tl.load(ids_ptr + s * NP1 + offs, mask=mask, other=0)
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
                kept = e.to(tl.int32, bitcast=True) >= t
                tl.store(values_ptr + s * NP1 + offs, tl.where(kept, v, float("-inf")), mask=mask)


def _order_keys(x: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered as ``(x desc, id asc)`` for fp32 rows ``x`` without NaN and without
    -0.0 (one int64 per logit: the float's order-preserving 32-bit key, then the id's
    complement)."""
    bits = x.view(torch.int32)
    key = (bits >> 31).bitwise_and_(0x7FFFFFFF).bitwise_xor_(bits)  # negative floats: flipped
    ids = torch.arange(x.shape[1], device=x.device, dtype=torch.int64)
    return key.to(torch.int64).mul_(1 << 32).add_(_LOW32 - ids)


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
    j = torch.arange(K1, device=device)
    live = j[None, :] < num_emitted.clamp(0, K1)[:, None].to(device)
    rows = cu_num_draft_tokens[:-1].long()[:, None] + torch.arange(B, device=device)[:, None] + j
    rows = torch.where(live, rows, 0).clamp(0, target_logits.shape[0] - 1)
    x = target_logits.index_select(0, rows.flatten()).float()  # a copy: changed in place
    x.masked_fill_(torch.isnan(x), float("-inf")).add_(0.0)  # NaN as -inf; -0.0 as +0.0
    tok = output_token_ids.flatten().long().clamp(0, V - 1)[:, None]
    x_tok = x.gather(1, tok)
    rank = (x >= x_tok).sum(1, keepdim=True)
    m = x.max(1, keepdim=True).values
    n_max = (x == m).sum(1, keepdim=True)
    ids = _LOW32 - (_order_keys(x).topk(N, dim=1).values & _LOW32) if N else tok[:, :0]
    picked = torch.cat([x.gather(1, ids), x_tok], 1)  # the N values and the token's
    if logprobs_mode.endswith("_logits"):
        values = picked
    else:  # (x - m) - log S, S summed in float64; no finite maximum: -log n at the n maxima
        finite = torch.isfinite(m)
        safe_m = torch.where(finite, m, 0.0)
        log_s = x.sub_(safe_m).exp_().sum(1, keepdim=True, dtype=torch.float64).log_()
        values = torch.where(
            finite,
            ((picked - safe_m) - log_s).float(),
            torch.where(picked == m, -torch.log(n_max.float()), float("-inf")),
        )
    if logprobs_mode.startswith("processed") and temperature is not None:
        values = values.contiguous()
        _processed_values_kernel[(B * K1,)](
            logits_ptr=target_logits, stride_lr=target_logits.stride(0),
            stride_lv=target_logits.stride(1), rows_ptr=rows.flatten().contiguous(),
            emitted_ptr=num_emitted, temp_ptr=temperature, top_k_ptr=top_k, top_p_ptr=top_p,
            min_p_ptr=min_p, ids_ptr=torch.cat([ids, tok], 1).contiguous(), values_ptr=values,
            V=V, K1=K1, NP1=N + 1, HAS_TOP_K=top_k is not None, HAS_TOP_P=top_p is not None,
            HAS_MIN_P=min_p is not None, LOGITS=logprobs_mode.endswith("_logits"),
            BLOCK=min(1024, max(16, next_pow2(V))), SEARCH_BLOCK=min(128, max(16, next_pow2(V))),
            NPIV=_rejection.SEARCH_PIVOTS or (16 if target_logits.is_cuda else 1024),
            ID_BLOCK=min(128, next_pow2(N + 1)),
        )  # fmt: skip
    live = live.flatten()[:, None]
    top_ids.copy_(torch.where(live, ids, -1).view(B, K1, N))
    top_vals.copy_(torch.where(live, values[:, :N], 0.0).view(B, K1, N))
    tok_lp.copy_(torch.where(live, values[:, N:], 0.0).view(B, K1))
    tok_rank.copy_(torch.where(live, rank, 0).view(B, K1))
    return tok_lp, tok_rank, top_ids, top_vals
