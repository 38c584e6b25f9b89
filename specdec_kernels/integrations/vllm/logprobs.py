"""Logprobs of the plugin's verify step in vLLM's raw ``logprobs_mode`` settings, computed
by vLLM's own ``Sampler`` helpers on the raw target rows (what its rejection sampler does
in those modes), so the values, top-N ids and ranks are vLLM's."""

from __future__ import annotations

import torch

RAW_LOGPROBS_MODES = ("raw_logprobs", "raw_logits")
"""vLLM ``logprobs_mode`` settings whose logprobs the plugin returns; the processed modes
fall back to vLLM's sampler."""


def raw_logprobs(sampler, rows, cu, output_token_ids, num_logprobs):
    """vLLM's ``LogprobsTensors`` of every output slot, computed by vLLM's own ``Sampler``
    helpers on the raw fp32 target rows (``rows``: the op's layout), as its rejection
    sampler does in the raw modes: slot ``j`` of request ``b`` reads row ``cu[b] + b + j``
    (clamped to the last row; slots past the emitted tokens are dropped by vLLM's
    ``parse_output``), placeholders as token 0."""
    B, K1 = output_token_ids.shape
    start = cu[:-1].long() + torch.arange(B, device=rows.device)
    index = (start[:, None] + torch.arange(K1, device=rows.device)).flatten()
    picked = rows.float()[index.clamp(max=rows.shape[0] - 1)]
    if sampler.logprobs_mode == "raw_logprobs":
        picked = sampler.compute_logprobs(picked)
    tokens = output_token_ids.flatten().long().clamp(min=0)
    return sampler.gather_logprobs(picked, num_logprobs, tokens)
