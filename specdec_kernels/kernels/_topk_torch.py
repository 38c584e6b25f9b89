"""The raw values of CUDA ``top_logprobs`` for ``num_logprobs`` above the Triton kernel's
``MAX_KERNEL_N`` (``kernels/logprobs.py``), in device-side torch ops."""

from __future__ import annotations

import torch

_LOW32 = (1 << 32) - 1


def _order_keys(x: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered as ``(x desc, id asc)`` for fp32 rows ``x`` without NaN and without
    -0.0 (one int64 per logit: the float's order-preserving 32-bit key, then the id's
    complement)."""
    bits = x.view(torch.int32)
    key = (bits >> 31).bitwise_and_(0x7FFFFFFF).bitwise_xor_(bits)  # negative floats: flipped
    ids = torch.arange(x.shape[1], device=x.device, dtype=torch.int64)
    return key.to(torch.int64).mul_(1 << 32).add_(_LOW32 - ids)


def top_logprobs_torch(target_logits, output_token_ids, num_emitted, cu_num_draft_tokens, N,
                       logits_mode, outputs):  # fmt: skip
    """The raw values for ``N > MAX_KERNEL_N``, in torch ops, written into ``outputs``;
    returns the row each slot read (int64 ``[B (k+1)]``)."""
    tok_lp, tok_rank, top_ids, top_vals = outputs
    B, K1 = output_token_ids.shape
    V, device = target_logits.shape[1], target_logits.device
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
    n = min(N, V)  # (N > V only unvalidated: ids -1, values 0 past V)
    ids = _LOW32 - (_order_keys(x).topk(n, dim=1).values & _LOW32)
    picked = torch.cat([x.gather(1, ids), x_tok], 1)  # the N values and the token's
    if logits_mode:
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
    live = live.flatten()[:, None]
    top_ids.fill_(-1)[..., :n].copy_(torch.where(live, ids, -1).view(B, K1, n))
    top_vals.zero_()[..., :n].copy_(torch.where(live, values[:, :n], 0.0).view(B, K1, n))
    tok_lp.copy_(torch.where(live, values[:, n:], 0.0).view(B, K1))
    tok_rank.copy_(torch.where(live, rank, 0).view(B, K1))
    return rows.flatten()
