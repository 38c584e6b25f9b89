"""Which vLLM verify batches the plugin takes (:func:`unsupported_reason`): every feature
this library implements as vLLM does; the others go to vLLM's own rejection sampler
(``rejection.py`` logs the reason once). Pure host checks, no device synchronisation."""

from __future__ import annotations

from typing import Any

import torch

from specdec_kernels.integrations.vllm import processing
from specdec_kernels.integrations.vllm.logprobs import LOGPROBS_MODES, PROCESSED_LOGPROBS_MODES

_LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _unmapped_logits_processor(proc: Any) -> bool:
    """A loaded processor that may change logits and that :mod:`.processing` does not map:
    min-p when any request uses it, or any custom processor. (vLLM's built-ins hold
    per-request state; empty state = no effect.)"""
    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinPLogitsProcessor,
        MinTokensLogitsProcessor,
    )

    if type(proc) in (MinTokensLogitsProcessor, LogitBiasLogitsProcessor):
        return False
    if type(proc) is MinPLogitsProcessor:
        return bool(proc.min_p_count)
    return True


def unsupported_reason(
    rejection_sampler: Any,
    metadata: Any,
    draft_probs: torch.Tensor | None,
    logits: torch.Tensor,
    sampling_metadata: Any,
) -> str | None:
    """Why vLLM's own rejection sampler must verify this batch, or None if ours can.

    The batch falls back as a whole when any request uses a feature that this library does
    not implement as vLLM does: an active min-p or custom logits processor, ``min_tokens``
    on a request with structured output (vLLM then unmasks the stop tokens of a row that
    would have no token left), a thinking-token budget, ``logprob_token_ids`` together with
    ``max_num_logprobs`` (vLLM 0.33.0's rejection sampler raises there; alone they are
    ignored, by it and here), full-vocabulary logprobs (it raises on them too), a
    ``logprobs_mode`` not among vLLM 0.33.0's four or processed with logit bias or
    ``min_tokens`` (rows that vLLM processes otherwise, see below), vLLM's
    synthetic or FLy acceptance modes, a sampler that is not vLLM's plain ``Sampler``, a
    device other than CPU/CUDA (ROCm included), logits not fp32/bf16/fp16, or
    ``draft_probs`` of another vocabulary. Penalties, bad words,
    ``allowed_token_ids``, ``min_tokens`` and logit bias go through
    :func:`specdec_kernels.ops.process_logits` (:mod:`.processing`; structured-output masks
    are on the logits before the sampler runs). Pure host checks: no device
    synchronisation.

    Parameters
    ----------
    rejection_sampler : vllm.v1.sample.rejection_sampler.RejectionSampler
    metadata : vllm.v1.spec_decode.metadata.SpecDecodeMetadata
    draft_probs : torch.Tensor or None
    logits : torch.Tensor
    sampling_metadata : vllm.v1.sample.metadata.SamplingMetadata
        The arguments of ``RejectionSampler.forward``.

    Returns
    -------
    str or None
        A short description of the first unsupported feature found.
    """
    from vllm.v1.sample.sampler import Sampler

    sm = sampling_metadata
    if getattr(rejection_sampler, "synthetic_mode", False):
        return "synthetic acceptance (rejection_sample_method='synthetic')"
    if getattr(rejection_sampler, "use_fly", False):
        return "FLy verification (rejection_sample_method='fly')"
    if type(getattr(rejection_sampler, "sampler", None)) is not Sampler:
        return "a sampler other than vllm.v1.sample.sampler.Sampler"
    if logits.device.type not in ("cpu", "cuda") or (
        logits.device.type == "cuda" and torch.version.hip is not None
    ):
        return f"logits on an untested device ({logits.device}, hip={torch.version.hip})"
    if logits.dtype not in _LOGIT_DTYPES or logits.ndim != 2:
        return f"logits of dtype {logits.dtype} and shape {tuple(logits.shape)}"
    if draft_probs is not None and (
        draft_probs.dtype not in _LOGIT_DTYPES
        or draft_probs.ndim != 2
        or draft_probs.shape[1] != logits.shape[1]
    ):
        return f"draft_probs {draft_probs.dtype} {tuple(draft_probs.shape)}"
    if sm.logprob_token_ids and sm.max_num_logprobs is not None:
        # vLLM's rejection sampler raises on this batch (its bonus Sampler returns the
        # specific ids' values where it expects full rows); alone, it ignores the ids
        # (tokens as without them, no logprobs), and so does verify
        return "logprob_token_ids with logprobs"
    if sm.max_num_logprobs is not None:
        mode = rejection_sampler.sampler.logprobs_mode
        if mode not in LOGPROBS_MODES:
            return f"logprobs in the {mode!r} mode"
        if mode in PROCESSED_LOGPROBS_MODES and (
            processing.logit_biases(sm) or processing.min_tokens_entries(sm)
        ):  # the rows where vLLM's rejection sampler differs from its Sampler
            return f"logprobs in the {mode!r} mode with logit bias or min_tokens"
        if sm.max_num_logprobs < 0:
            return "full-vocabulary logprobs (max_num_logprobs = -1)"
    procs = sm.logitsprocs
    loaded = (*procs.argmax_invariant, *procs.non_argmax_invariant)
    if any(_unmapped_logits_processor(p) for p in loaded):
        return "an active logits processor (min_p or custom)"
    if any(so and stops for _, _, stops, so in processing.min_tokens_entries(sm).values()):
        return "min_tokens with structured output"
    holder = getattr(sm, "thinking_budget_state_holder", None)
    if holder is not None and holder.has_tracked_requests():
        return "a thinking-token budget"
    if not sm.all_greedy and sm.temperature is None:
        return "sampled requests without a temperature tensor"
    return None
