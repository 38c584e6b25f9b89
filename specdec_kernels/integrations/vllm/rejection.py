"""Opt-in vLLM general plugin: vLLM V1's rejection sampling through ``rejection_sample``.

The entry point ``specdec_kernels`` of group ``vllm.general_plugins`` (pyproject) calls
:func:`register` in every vLLM process (API server, engine core, each TP/PP worker) before
the model runner is built. It does nothing unless the environment variable
``SPECDEC_VLLM_REJECTION`` is ``1`` (or ``true``/``yes``/``on``); then it wraps
``vllm.v1.sample.rejection_sampler.RejectionSampler.forward`` so that every batch whose
features this library covers is verified by :func:`specdec_kernels.ops.rejection_sample`
in one call, and every other batch by vLLM's own code, unchanged (:func:`unsupported_reason`
lists what falls back; each reason is logged once per process).

vLLM imports happen inside the functions, so this module imports without vLLM.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import torch

from specdec_kernels.integrations.vllm import processing
from specdec_kernels.integrations.vllm.logprobs import (
    PROCESSED_LOGPROBS_MODES,
    gather_logprobs,
    sampled_rows,
)
from specdec_kernels.integrations.vllm.support import unsupported_reason
from specdec_kernels.ops import (
    LogitsProcessing,
    exclusive_cu_num_draft_tokens,
    process_logits,
    rejection_sample,
)

logger = logging.getLogger(__name__)

ENV_VAR = "SPECDEC_VLLM_REJECTION"
"""Environment variable that turns the routing on (``1``); ``force`` also skips the version
check."""

TESTED_VLLM_VERSIONS = ("0.33.0",)
"""vLLM releases whose ``RejectionSampler``, ``SpecDecodeMetadata`` and ``SamplingMetadata``
this module was checked against (tests/integrations)."""

SEED_HIGH = 2**62
"""Per-step Philox keys are drawn in ``[0, SEED_HIGH)``."""


_ON = ("1", "true", "yes", "on", "force")
_logged: set[str] = set()


def enabled(environ: Any = None) -> bool:
    """Whether ``SPECDEC_VLLM_REJECTION`` asks for the routing (``1``, ``true``, ``yes``,
    ``on`` or ``force``, any case); unset or anything else means off."""
    environ = os.environ if environ is None else environ
    return environ.get(ENV_VAR, "").strip().lower() in _ON


def register() -> None:
    """The ``vllm.general_plugins`` entry point: install the routing iff :func:`enabled`.

    Called by vLLM's ``load_general_plugins()`` in every process, possibly more than once;
    idempotent. With the variable unset it neither imports vLLM nor changes anything.
    """
    if enabled():
        install(force=os.environ.get(ENV_VAR, "").strip().lower() == "force")


def install(*, force: bool = False) -> bool:
    """Wrap ``RejectionSampler.forward`` (vLLM V1 model runner) with the routing.

    Parameters
    ----------
    force : bool
        Install on a vLLM version outside :data:`TESTED_VLLM_VERSIONS` too.

    Returns
    -------
    bool
        True if the routing is installed (now or before); False on an untested vLLM
        version without ``force`` (logged; vLLM's sampler stays as it is).
    """
    import vllm
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    if getattr(RejectionSampler.forward, "__specdec_original__", None) is not None:
        return True
    version = getattr(vllm, "__version__", "unknown")
    if version not in TESTED_VLLM_VERSIONS and not force:
        logger.warning(
            "specdec_kernels: %s=1 is ignored on vLLM %s (tested: %s); set it to 'force' to "
            "route rejection sampling anyway",
            ENV_VAR,
            version,
            ", ".join(TESTED_VLLM_VERSIONS),
        )
        return False
    original = RejectionSampler.forward

    @functools.wraps(original)
    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        reason = unsupported_reason(self, metadata, draft_probs, logits, sampling_metadata)
        if reason is not None:
            if reason not in _logged:
                _logged.add(reason)
                logger.warning(
                    "specdec_kernels: a batch with %s is verified by vLLM's own rejection "
                    "sampler (logged once per reason)",
                    reason,
                )
            return original(self, metadata, draft_probs, logits, sampling_metadata)
        return verify(metadata, draft_probs, logits, sampling_metadata, self)

    forward.__specdec_original__ = original
    RejectionSampler.forward = forward
    logger.info(
        "specdec_kernels: vLLM V1 rejection sampling goes through "
        "specdec_kernels.ops.rejection_sample (%s)",
        ENV_VAR,
    )
    return True


def uninstall() -> None:
    """Restore vLLM's own ``RejectionSampler.forward`` (no-op if not installed)."""
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    original = getattr(RejectionSampler.forward, "__specdec_original__", None)
    if original is not None:
        RejectionSampler.forward = original


def request_seeds(
    sampling_metadata: Any, batch_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Philox keys and counter offsets for one verify step of a vLLM batch.

    A request with its own ``torch.Generator`` (vLLM makes one per request with
    ``SamplingParams.seed``, seeded with it, in ``sampling_metadata.generators``) gets one
    key drawn from that generator, ``randint(0, 2**62, generator=g)``: its tokens then
    depend only on its seed and its own history (which steps it was sampled in), never on
    its batch row or on the other requests. The other requests get keys drawn, in one
    call, from the device's default generator, which vLLM seeds with the same
    ``model_config.seed`` in every worker. Every TP/PP rank runs the same steps on the same
    batches and draws the same keys in the same order, so all ranks emit the same tokens
    (what vLLM's own sampler relies on too). A fresh key every step means no Philox
    counter is used twice, so the offsets are 0. No host synchronisation.

    Parameters
    ----------
    sampling_metadata : vllm.v1.sample.metadata.SamplingMetadata
        ``generators`` maps a batch row to its request's generator (on ``device``).
    batch_size : int
        ``B``, the number of requests.
    device : torch.device
        Where the logits are.

    Returns
    -------
    tuple of torch.Tensor
        ``seeds`` int64 ``[B]`` in ``[0, 2**62)`` and ``offsets`` int64 ``[B]`` (zeros).
    """
    seeds = torch.randint(0, SEED_HIGH, (batch_size,), dtype=torch.int64, device=device)
    for row, generator in sampling_metadata.generators.items():
        if 0 <= row < batch_size:
            seeds[row] = torch.randint(
                0, SEED_HIGH, (1,), dtype=torch.int64, device=device, generator=generator
            )[0]
    return seeds, torch.zeros(batch_size, dtype=torch.int64, device=device)


def verify(
    metadata: Any,
    draft_probs: torch.Tensor | None,
    logits: torch.Tensor,
    sampling_metadata: Any,
    rejection_sampler: Any = None,
) -> Any:
    """Verify a vLLM V1 spec-decode batch with :func:`specdec_kernels.ops.rejection_sample`.

    Takes the arguments of ``RejectionSampler.forward`` and returns what it returns, for a
    batch that :func:`unsupported_reason` accepts. Mapping onto the op:

    - ``metadata.cu_num_draft_tokens`` (inclusive, ``[B]``) becomes the exclusive ``[B+1]``
      with ``cu[0] = 0``; ``k = metadata.max_spec_len``.
    - ``logits`` rows ``target_logits_indices[t]`` (flat draft ``t``) and
      ``bonus_logits_indices[b]`` are gathered into the op's layout, request ``b``'s
      ``k_b`` draft rows then its bonus row (the same order vLLM's runner builds).
    - greedy requests (``sampling_metadata.temperature[b] == 0``, or ``all_greedy``, when
      the temperature tensor is None) keep drafts while they equal the argmax and end with
      the argmax of the first mismatching row or of the bonus row, as vLLM's greedy kernel
      and its ``Sampler`` do (ties: lowest id). The bonus token is sampled by the op, not by
      vLLM's ``Sampler``, with the same temperature, top-k and top-p.
    - sampled requests: temperature, ``top_k`` (``>= V`` off, vLLM stores ``vocab_size``
      for off) and ``top_p`` (1.0 off) as vLLM applies them in
      ``apply_sampling_constraints``; ties at the top-k boundary are kept, as in vLLM.
      n-gram drafts (``draft_probs is None``) and draft-model drafts (``draft_probs``
      ``[N, V]``, rows aligned with the flat drafts) follow the op's contract; every
      emitted token has the target distribution, and a draft's acceptance probability
      equals vLLM's (``p(d)``, resp. ``min(1, p(d)/q(d))``); individual tokens differ
      from vLLM's, which uses other random numbers.
    - penalties, bad words, ``allowed_token_ids``, ``min_tokens`` and logit bias: the
      gathered rows are verified as :func:`specdec_kernels.ops.process_logits` processes
      them (``rejection_sample(..., processing=...)``: one pass on CPU tensors;
      :mod:`.processing` maps the metadata), every row as vLLM's plain ``Sampler`` would
      process its position (drafts before it counted as output); where vLLM's draft and
      bonus rows differ from that (logit bias, ``min_tokens`` at the bonus row), see
      ``docs/design.md``, "``process_logits``". The processed logprob modes read the
      processed rows, so there they are materialised by ``process_logits`` first.
    - randomness: :func:`request_seeds`.
    - logprobs (``max_num_logprobs``, all four ``logprobs_mode`` settings): top-N and the
      emitted token's logprob and rank, by vLLM's own ``Sampler.compute_logprobs`` and
      ``gather_logprobs``, of the raw target rows (raw modes) or of the processed rows
      after vLLM's temperature, top-k and top-p (processed modes, as vLLM's rejection
      sampler; :mod:`.logprobs`).

    Parameters
    ----------
    metadata : vllm.v1.spec_decode.metadata.SpecDecodeMetadata
        ``draft_token_ids`` int32 ``[N]``, ``num_draft_tokens`` ``[B]`` ints,
        ``cu_num_draft_tokens`` int32 ``[B]`` (inclusive), ``target_logits_indices``
        ``[N]``, ``bonus_logits_indices`` ``[B]``, ``max_spec_len``.
    draft_probs : torch.Tensor or None
        float ``[N, V]``, the draft model's probabilities, or None (n-gram).
    logits : torch.Tensor
        fp32/bf16/fp16 ``[N + B, V]``, the target logits; not modified.
    sampling_metadata : vllm.v1.sample.metadata.SamplingMetadata
        ``temperature`` float32 ``[B]`` or None (all greedy), ``top_k`` int32 ``[B]`` or
        None, ``top_p`` float32 ``[B]`` or None, ``generators``.
    rejection_sampler : vllm.v1.sample.rejection_sampler.RejectionSampler, optional
        The sampler whose ``forward`` this replaces (its ``sampler.logprobs_mode`` and
        helpers compute logprobs); default a plain ``Sampler()`` (``raw_logprobs``).

    Returns
    -------
    vllm.v1.outputs.SamplerOutput
        ``sampled_token_ids`` int32 ``[B, max_spec_len + 1]``: accepted drafts, then the
        recovered or bonus token, then -1 (vLLM's ``PLACEHOLDER_TOKEN_ID``);
        ``logprobs_tensors``: vLLM's ``LogprobsTensors`` of the ``B (k+1)`` output slots
        when ``max_num_logprobs`` is set, else None.

    Raises
    ------
    ValueError
        From :func:`specdec_kernels.ops.rejection_sample` on inconsistent metadata.
    """
    from vllm.v1.outputs import SamplerOutput

    device = logits.device
    sm = sampling_metadata
    cu_inclusive = metadata.cu_num_draft_tokens.to(device=device, dtype=torch.int32)
    B = cu_inclusive.shape[0]
    drafts = metadata.draft_token_ids.to(device=device, dtype=torch.int32)
    N = drafts.shape[0]
    # row of flat draft t in the op's layout: t + (its request b), b = #{cu_inclusive <= t}
    t = torch.arange(N, device=device, dtype=torch.int32)
    request_of_draft = torch.searchsorted(cu_inclusive, t, right=True)
    rows = torch.empty(N + B, dtype=torch.int64, device=device)
    rows[t.long() + request_of_draft] = metadata.target_logits_indices.to(device).long()
    bonus_rows = cu_inclusive.long() + torch.arange(B, device=device)
    rows[bonus_rows] = metadata.bonus_logits_indices.to(device).long()
    target_logits = raw_logits = logits.index_select(0, rows)
    cu = exclusive_cu_num_draft_tokens(cu_inclusive)
    sampler = None
    if sm.max_num_logprobs is not None:
        if rejection_sampler is None:
            from vllm.v1.sample.sampler import Sampler

            sampler = Sampler()  # vLLM's default mode, raw_logprobs
        else:
            sampler = rejection_sampler.sampler
    processed_logprobs = sampler is not None and sampler.logprobs_mode in PROCESSED_LOGPROBS_MODES
    logits_processing = None
    if processing.needs_processing(sm):  # penalties, bad words, masks, min_tokens, bias
        logits_processing = LogitsProcessing(**processing.process_inputs(sm, B, device))
        if processed_logprobs:  # the logprobs read the processed rows: materialise them
            target_logits = process_logits(
                target_logits, drafts, cu, **logits_processing._asdict()
            )  # fmt: skip
            logits_processing = None

    temperature = top_k = top_p = seeds = offsets = None
    if not sm.all_greedy:
        temperature = sm.temperature.to(torch.float32)
        top_k = sm.top_k
        top_p = None if sm.top_p is None else sm.top_p.to(torch.float32)
        seeds, offsets = request_seeds(sm, B, device)
    out = rejection_sample(
        target_logits,
        drafts,
        cu,
        num_speculative_tokens=metadata.max_spec_len,
        draft_probs=draft_probs,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seeds=seeds,
        offsets=offsets,
        processing=logits_processing,  # None, or verified in one pass (CPU) / two ops
    )
    logprobs = None
    if sampler is not None:  # top-N >= 0 in one of the four modes (unsupported_reason)
        rows = raw_logits
        if processed_logprobs:
            rows = sampled_rows(target_logits.float(), cu, sm)
        logprobs = gather_logprobs(sampler, rows, cu, out.output_token_ids, sm.max_num_logprobs)
    return SamplerOutput(sampled_token_ids=out.output_token_ids, logprobs_tensors=logprobs)
