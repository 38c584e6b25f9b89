"""The CUDA top-N logprobs of a verify step: ``top_logprobs`` in device-side torch ops.

A top-N over the vocabulary is a selection, which ``torch.topk`` does well on every device;
a Triton kernel would add nothing but code. No host synchronisation, static shapes: every
slot's row is gathered (a slot past ``num_emitted`` reads row 0 and is overwritten), and
ties go to the lower id through one int64 key per logit, the logit's order-preserving
32-bit pattern above the complement of its id, so one ``topk`` gives the contract's order.
"""

from __future__ import annotations

import torch

from specdec_kernels.kernels import _utils

_LOW32 = (1 << 32) - 1


def _order_keys(x: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered as ``(x desc, id asc)`` for fp32 rows ``x`` without NaN."""
    bits = (x + 0.0).view(torch.int32).to(torch.int64)  # + 0.0: -0.0 becomes +0.0
    key = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # negative floats: flip the order
    ids = torch.arange(x.shape[1], device=x.device, dtype=torch.int64)
    return key * (1 << 32) + (_LOW32 - ids)


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
    if B == 0 or target_logits.shape[0] == 0:  # no rows to read (unvalidated): no slot is live
        tok_lp.zero_(), tok_rank.zero_(), top_ids.fill_(-1), top_vals.zero_()
        return tok_lp, tok_rank, top_ids, top_vals
    j = torch.arange(K1, device=device)
    live = j[None, :] < num_emitted.clamp(0, K1)[:, None].to(device)
    rows = cu_num_draft_tokens[:-1].long()[:, None] + torch.arange(B, device=device)[:, None] + j
    rows = torch.where(live, rows, 0).clamp(0, max(target_logits.shape[0] - 1, 0))
    x = target_logits.index_select(0, rows.flatten()).float()
    x = x.masked_fill(torch.isnan(x), float("-inf"))
    tok = output_token_ids.flatten().long().clamp(0, V - 1)[:, None]
    x_tok = x.gather(1, tok)
    m = x.max(1, keepdim=True).values
    if logprobs_mode == "raw_logits":
        values = x
    else:  # log_softmax; a row whose maximum is not finite: -log n at its n maxima
        n_max = (x == m).sum(1, keepdim=True).float()
        shared = torch.where(x == m, -torch.log(n_max), float("-inf"))
        values = torch.where(torch.isfinite(m), torch.log_softmax(x, 1), shared)
    chosen = _order_keys(x).topk(N, dim=1).values
    ids = _LOW32 - (chosen & _LOW32)
    live = live.flatten()[:, None]
    top_ids.copy_(torch.where(live, ids, -1).view(B, K1, N))
    top_vals.copy_(torch.where(live, values.gather(1, ids), 0.0).view(B, K1, N))
    tok_lp.copy_(torch.where(live, values.gather(1, tok), 0.0).view(B, K1))
    tok_rank.copy_(torch.where(live, (x >= x_tok).sum(1, keepdim=True), 0).view(B, K1))
    return tok_lp, tok_rank, top_ids, top_vals
