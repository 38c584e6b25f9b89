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
"""

from __future__ import annotations

import torch

from specdec_kernels.kernels import _utils

_LOW32 = (1 << 32) - 1


def _order_keys(x: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered as ``(x desc, id asc)`` for fp32 rows ``x`` without NaN and without
    -0.0 (one int64 per logit: the float's order-preserving 32-bit key, then the id's
    complement)."""
    bits = x.view(torch.int32)
    key = (bits >> 31).bitwise_and_(0x7FFFFFFF).bitwise_xor_(bits)  # negative floats: flipped
    ids = torch.arange(x.shape[1], device=x.device, dtype=torch.int64)
    return key.to(torch.int64).mul_(1 << 32).add_(_LOW32 - ids)


def top_logprobs(
    target_logits, output_token_ids, num_emitted, cu_num_draft_tokens, *, num_logprobs,
    logprobs_mode,
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
    if logprobs_mode == "raw_logits":
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
    top_ids.copy_(torch.where(live, ids, -1).view(B, K1, N))
    top_vals.copy_(torch.where(live, values[:, :N], 0.0).view(B, K1, N))
    tok_lp.copy_(torch.where(live, values[:, N:], 0.0).view(B, K1))
    tok_rank.copy_(torch.where(live, rank, 0).view(B, K1))
    return tok_lp, tok_rank, top_ids, top_vals
