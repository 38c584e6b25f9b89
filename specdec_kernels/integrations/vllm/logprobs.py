"""Logprobs of the plugin's verify step in each of vLLM's four ``logprobs_mode`` settings,
computed by vLLM's own functions on the rows its rejection sampler reads in that mode, so the
values, top-N ids and ranks are vLLM's:

- ``raw_logprobs`` / ``raw_logits``: the raw target rows (fp32);
- ``processed_logprobs`` / ``processed_logits``: the rows after the logits processing
  (``process_logits``: penalties, bad words, allowed tokens, ``min_tokens``, logit bias)
  and then, in a batch that is not all greedy, vLLM's ``apply_sampling_constraints``
  (temperature, greedy requests at 1, then top-k / top-p masked to -inf), as vLLM's
  rejection sampler and its ``Sampler`` process draft and bonus rows before sampling.
"""

from __future__ import annotations

import torch

RAW_LOGPROBS_MODES = ("raw_logprobs", "raw_logits")
PROCESSED_LOGPROBS_MODES = ("processed_logprobs", "processed_logits")
LOGPROBS_MODES = RAW_LOGPROBS_MODES + PROCESSED_LOGPROBS_MODES
"""vLLM ``logprobs_mode`` settings whose logprobs the plugin returns (all of vLLM 0.33.0's)."""


def sampled_rows(rows, cu, sampling_metadata):
    """``rows`` (the op's layout, fp32) as vLLM samples from them: a copy after vLLM's own
    ``apply_sampling_constraints`` (temperature, top-k, top-p), expanded to the ``k_b + 1``
    rows of each request; the rows themselves in an all-greedy batch."""
    if sampling_metadata.all_greedy:
        return rows
    from vllm.v1.sample.rejection_sampler import apply_sampling_constraints

    B = cu.shape[0] - 1
    rows_per_request_inclusive = cu[1:] + torch.arange(1, B + 1, device=cu.device, dtype=cu.dtype)
    return apply_sampling_constraints(rows.clone(), rows_per_request_inclusive, sampling_metadata)


def gather_logprobs(sampler, rows, cu, output_token_ids, num_logprobs):
    """vLLM's ``LogprobsTensors`` of every output slot, by vLLM's own ``Sampler`` helpers on
    the fp32 rows of the mode (``rows``: the op's layout, see the module docstring), as its
    rejection sampler computes them: slot ``j`` of request ``b`` reads row ``cu[b] + b + j``
    (clamped to the last row; slots past the emitted tokens are dropped by vLLM's
    ``parse_output``), placeholders as token 0; log-softmax first in the ``*_logprobs``
    modes."""
    B, K1 = output_token_ids.shape
    start = cu[:-1].long() + torch.arange(B, device=rows.device)
    index = (start[:, None] + torch.arange(K1, device=rows.device)).flatten()
    picked = rows.float()[index.clamp(max=rows.shape[0] - 1)]
    if sampler.logprobs_mode.endswith("_logprobs"):
        picked = sampler.compute_logprobs(picked)
    tokens = output_token_ids.flatten().long().clamp(min=0)
    return sampler.gather_logprobs(picked, num_logprobs, tokens)
