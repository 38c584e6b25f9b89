"""``rejection_sample``: greedy and sampled verification of draft tokens on the device.

One-hot (n-gram) drafts are verified by coupling, so speculation never changes the output;
draft probabilities get classic speculative sampling. Contract: ``docs/design.md``, op
``rejection_sample``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from specdec_kernels.cpu import rejection as _cpu
from specdec_kernels.ops._library import call, define
from specdec_kernels.ops._validation import (
    FLOAT32_MAX,
    INT64_MAX,
    check_int,
    check_prefix_sum,
    check_req_indices_values,
    check_shape,
    check_tensor,
    check_value_range,
    should_check_values,
)
from specdec_kernels.ops.processing import LogitsProcessing, prepare, processed_logits
from specdec_kernels.ops.processing_state import StateBatch, verify_fused_cpu

LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SEED_HIGH = 2**62
"""Seeds drawn by the wrapper when the caller passes none lie in ``[0, SEED_HIGH)``."""


class RejectionOutput(NamedTuple):
    """Result of :func:`rejection_sample`."""

    output_token_ids: torch.Tensor
    """int32 ``[B, k+1]``: accepted drafts, then the recovered or bonus token, then -1."""
    num_emitted: torch.Tensor
    """int32 ``[B]``: tokens emitted by request ``b`` (accepted drafts + 1), in ``[1, k_b+1]``."""
    logprobs: torch.Tensor | None
    """float32 ``[B, k+1]``: log-softmax of the fp32 target logits (the processed ones with
    ``processing``) at each emitted token (exact for logits of any finite magnitude), 0
    past ``num_emitted[b]``; ``None`` unless ``return_logprobs=True``."""


def sampling_offsets(
    num_tokens: torch.Tensor, req_indices: torch.Tensor | None = None
) -> torch.Tensor:
    """The ``offsets`` an engine passes to :func:`rejection_sample`: the position of each
    request's first query token, ``num_tokens[req_indices[b]] - 1`` (0 for padding rows).
    No host synchronisation. Contract: ``docs/design.md``, "Helpers" and
    "``rejection_sample``" (randomness).

    Parameters
    ----------
    num_tokens : torch.Tensor
        int32 or int64 ``[R]``, tokens (prompt + committed output) of each state row.
    req_indices : torch.Tensor, optional
        int32 ``[B]``, the state row of each batch row; -1 marks a padding row (offset 0).
        Default ``arange(R)``.

    Returns
    -------
    torch.Tensor
        int64 ``[B]``, on the device of ``num_tokens``.

    Raises
    ------
    ValueError
        Wrong dtype, ndim or device of either tensor; with value checks (CPU tensors),
        ``req_indices`` outside ``[-1, R)``.

    Examples
    --------
    >>> sampling_offsets(torch.tensor([7, 3], dtype=torch.int32),
    ...                  torch.tensor([1, -1, 0], dtype=torch.int32)).tolist()
    [2, 0, 6]
    """
    num_tokens = check_tensor("num_tokens", num_tokens, dtype=(torch.int32, torch.int64), ndim=1)
    if req_indices is None:
        return num_tokens.to(torch.int64) - 1
    req_indices = check_tensor(
        "req_indices", req_indices, dtype=torch.int32, ndim=1, device=num_tokens.device
    )
    if should_check_values([num_tokens, req_indices], None):
        check_req_indices_values(req_indices, num_tokens.shape[0], what="rows of num_tokens")
    if num_tokens.shape[0] == 0:  # no state rows: every batch row is padding
        return torch.zeros(req_indices.shape, dtype=torch.int64, device=num_tokens.device)
    rows = req_indices.to(torch.int64)
    pos = num_tokens.to(torch.int64)[rows.clamp(min=0)] - 1
    return torch.where(rows >= 0, pos, torch.zeros_like(pos))


def _fake(
    target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k, top_p,
    min_p, seeds, offsets, *, num_speculative_tokens, return_logprobs,
):  # fmt: skip
    _cpu.require_seeds_and_offsets(temperature, seeds, offsets)
    B = cu_num_draft_tokens.shape[0] - 1
    K1 = num_speculative_tokens + 1
    return (
        target_logits.new_empty((B, K1), dtype=torch.int32),
        target_logits.new_empty((B,), dtype=torch.int32),
        target_logits.new_empty((B, K1) if return_logprobs else (0,), dtype=torch.float32),
    )


define(
    "rejection_sample(Tensor target_logits, Tensor draft_token_ids, Tensor cu_num_draft_tokens, "
    "Tensor? draft_probs, Tensor? temperature, Tensor? top_k, Tensor? top_p, Tensor? min_p, "
    "Tensor? seeds, Tensor? offsets, *, int num_speculative_tokens, bool return_logprobs) "
    "-> (Tensor, Tensor, Tensor)",
    cpu=_cpu.rejection_sample,
    cuda="specdec_kernels.kernels.rejection:rejection_sample",
    cpu_checked=_cpu.rejection_sample_checked,
    fake=_fake,
)


_INCLUSIVE_HINT = (
    "this op takes the exclusive prefix sum cu_num_draft_tokens [B+1] with cu[0] = 0; "
    "vLLM's array of that name is the inclusive [B] one: convert it with "
    "specdec_kernels.ops.exclusive_cu_num_draft_tokens"
)


def kernel_top_k(top_k: torch.Tensor | None) -> torch.Tensor | None:
    """``top_k`` as the kernels take it: int32, values past int32 saturated (all of them
    mean "off"); negatives stay negative, so the CPU kernel's checks refuse them."""
    return None if top_k is None else top_k.clamp(min=-1, max=2**31 - 1).to(torch.int32)


def sampling_param(name, t, dtypes, B, device):
    """A per-request sampling parameter ``[B]`` checked (None stays None), contiguous."""
    if t is None:
        return None
    t = check_tensor(name, t, dtype=dtypes, ndim=1, device=device)
    if t.shape[0] == B + 1:  # the classic mistake: an inclusive [B] cu read as B - 1 requests
        raise ValueError(
            f"{name} has {B + 1} entries but len(cu_num_draft_tokens) - 1 = {B} requests: "
            + _INCLUSIVE_HINT
        )
    check_shape(name, t, (B,), "one value per request")
    return t.contiguous()


def rejection_sample(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    *,
    num_speculative_tokens: int,
    draft_probs: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
    seeds: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    return_logprobs: bool = False,
    processing: LogitsProcessing | StateBatch | None = None,
    validate: bool | None = None,
) -> RejectionOutput:
    """Verify draft tokens against the target model: keep the longest accepted prefix, then
    emit one more token per request (vLLM V1's rejection sampler layout).

    Request ``b`` has drafts ``draft_token_ids[cu[b] : cu[b+1]]`` and target rows
    ``cu[b] + b .. cu[b+1] + b`` (the last is the bonus row). Greedy and sampled rows
    (temperature, top-k, top-p, min-p); one-hot (n-gram) drafts are verified by coupling,
    so every emitted token is the plain (``k = 0``) sampler's and speculation never changes
    the output; draft probabilities get classic speculative sampling (Leviathan et al.,
    2023; Chen et al., 2023). Philox randomness keyed by ``seeds`` at counters
    ``offsets[b] + j``. No input is modified, no host synchronisation, static shapes
    (``torch.ops.specdec.rejection_sample``). Contract: ``docs/design.md``,
    "``rejection_sample``".

    Parameters
    ----------
    target_logits : torch.Tensor
        float32, bfloat16 or float16 ``[>= N + B, V]``, the target model's logits, one row
        per query token (``N = cu[B]``); rows past ``cu[B] + B`` are ignored. Any strides.
        Math is in fp32.
    draft_token_ids : torch.Tensor
        int32 ``[>= N]``, the flat drafts; entries past ``cu[B]`` are ignored (static
        buffers). Ids outside ``[0, V)`` (e.g. -1) are always rejected and never read.
    cu_num_draft_tokens : torch.Tensor
        int32 ``[B + 1]``, exclusive prefix sum of the draft counts: ``cu[0] = 0``,
        non-decreasing, ``cu[b+1] - cu[b] <= k``.
    num_speculative_tokens : int
        ``k >= 0``, the static maximum number of drafts per request; ``k = 0`` makes the op
        a plain per-request sampler over the bonus rows.
    draft_probs : torch.Tensor, optional
        float32, bfloat16 or float16 ``[>= N, V]`` (``N = cu[B]``), the draft model's
        probabilities ``q`` at each flat draft index (rows aligned with
        ``draft_token_ids``). ``None``: deterministic (one-hot) drafts, e.g. n-gram.
    temperature : torch.Tensor, optional
        float32 ``[B]``, ``>= 0`` and finite; 0 makes the request greedy. ``None``: every
        request is greedy (the other sampling parameters are then ignored).
    top_k : torch.Tensor, optional
        int32 or int64 ``[B]``, ``>= 0``; 0 or ``>= V`` is off.
    top_p : torch.Tensor, optional
        float32 ``[B]`` in ``(0, 1]``; 1 is off.
    min_p : torch.Tensor, optional
        float32 ``[B]`` in ``[0, 1]``; 0 is off.
    seeds : torch.Tensor, optional
        int64 ``[B]``, the Philox key of each request (any value), given together with
        ``offsets``. ``None`` (and no ``offsets``): fresh seeds drawn on the device with
        ``torch.randint`` from the default generator (no host sync), counters from 0; the
        tokens then change from call to call.
    offsets : torch.Tensor, optional
        int64 ``[B]``, the Philox counter base of each request: the position of its first
        query token, ``num_tokens[r] - 1`` before the step (:func:`sampling_offsets`).
        Required with ``seeds``.
    return_logprobs : bool
        Also return the log-probabilities of the emitted tokens.
    processing : LogitsProcessing or StateBatch, optional
        Verify the rows :func:`process_logits` would return, bit for bit, with its checks
        (or a :class:`ProcessingState`'s ``batch()``: its kept parameters, checked when set).
    validate : bool, optional
        Run the value checks (see Raises). Default: only for CPU tensors. Never while
        compiling or capturing a CUDA graph.

    Returns
    -------
    RejectionOutput
        ``output_token_ids`` int32 ``[B, k+1]`` (accepted drafts, then the token of the
        first row that is not accepted, then -1), ``num_emitted`` int32 ``[B]`` (accepted
        + 1), ``logprobs`` float32 ``[B, k+1]`` (log-softmax of the fp32 target logits,
        processed with ``processing``, at each emitted token, computed as ``(l - max l) -
        log(sum exp(l - max l))``, so to float rounding for logits of any finite
        magnitude; 0 in the padding) or ``None``;
        on the device of ``target_logits``.

    Raises
    ------
    ValueError
        Wrong dtype, device or ndim of any tensor; ``cu_num_draft_tokens`` not ``[B+1]``
        with ``B >= 0``; ``target_logits.shape[0] < len(draft_token_ids) + B``; ``V < 1``;
        ``draft_probs`` not ``[., V]``; a parameter not ``[B]``;
        ``num_speculative_tokens < 0``; ``seeds`` without ``offsets`` or ``offsets``
        without ``seeds``. With value checks: ``cu[0] != 0``, ``cu`` not
        non-decreasing, ``k_b > k``, ``cu[B] > len(draft_token_ids)``, ``draft_probs``
        with fewer than ``N`` rows, ``temperature`` negative or not finite, ``top_k < 0``,
        ``top_p`` outside ``(0, 1]``, ``min_p`` outside ``[0, 1]``; what ``process_logits`` refuses.

    Examples
    --------
    >>> logits = torch.full((3, 5), -9.0)
    >>> logits[0, 2] = logits[1, 4] = logits[2, 1] = 9.0  # the target's argmax per row
    >>> out = rejection_sample(logits, torch.tensor([2, 3], dtype=torch.int32),
    ...                        torch.tensor([0, 2], dtype=torch.int32), num_speculative_tokens=2)
    >>> out.output_token_ids.tolist(), out.num_emitted.tolist()  # d_0 kept, d_1 -> 4
    ([[2, 4, -1]], [2])
    """
    proc_checks = proc = None
    if isinstance(processing, LogitsProcessing):  # its checks first, as if it ran first
        proc_checks, proc = prepare(target_logits, draft_token_ids, cu_num_draft_tokens,
                                    *processing, validate=validate)  # fmt: skip
    elif processing is not None and not isinstance(processing, StateBatch):
        raise ValueError(
            "processing must be a LogitsProcessing or a ProcessingState's batch(), got "
            f"{type(processing).__name__}"
        )
    target_logits = check_tensor("target_logits", target_logits, dtype=LOGIT_DTYPES, ndim=2)
    device = target_logits.device
    draft_token_ids = check_tensor(
        "draft_token_ids", draft_token_ids, dtype=torch.int32, ndim=1, device=device
    )
    cu = check_tensor(
        "cu_num_draft_tokens", cu_num_draft_tokens, dtype=torch.int32, ndim=1, device=device
    )
    k = check_int("num_speculative_tokens", num_speculative_tokens, min_value=0)
    if not isinstance(return_logprobs, bool):
        raise ValueError(f"return_logprobs must be a bool, got {type(return_logprobs).__name__}")
    if cu.shape[0] < 1:
        raise ValueError(
            "cu_num_draft_tokens must have shape (B + 1,) with B >= 0 (exclusive prefix sum "
            "starting at 0), got shape (0,)"
        )
    B = cu.shape[0] - 1
    n_flat = draft_token_ids.shape[0]
    rows, V = target_logits.shape
    if rows < n_flat + B:
        raise ValueError(
            f"target_logits must have at least len(draft_token_ids) + B = {n_flat} + {B} = "
            f"{n_flat + B} rows (k_b + 1 per request), got {rows}"
        )
    if V < 1:
        raise ValueError(f"target_logits must have a vocabulary of at least 1, got V = {V}")
    if isinstance(processing, StateBatch):  # its per-call checks, on every route
        processing = processing.checked(B, n_flat, V)
    if draft_probs is not None:
        draft_probs = check_tensor(
            "draft_probs", draft_probs, dtype=LOGIT_DTYPES, ndim=2, device=device
        )
        if draft_probs.shape[1] != V:
            raise ValueError(
                f"draft_probs must have shape (>= N, {V}) (one row per draft, N = "
                f"cu_num_draft_tokens[B]; the vocabulary of target_logits), got "
                f"{tuple(draft_probs.shape)}"
            )
    temperature = sampling_param("temperature", temperature, torch.float32, B, device)
    top_k = sampling_param("top_k", top_k, (torch.int32, torch.int64), B, device)
    top_p = sampling_param("top_p", top_p, torch.float32, B, device)
    min_p = sampling_param("min_p", min_p, torch.float32, B, device)
    seeds = sampling_param("seeds", seeds, torch.int64, B, device)
    offsets = sampling_param("offsets", offsets, torch.int64, B, device)

    if (seeds is None) != (offsets is None):
        given, missing = ("seeds", "offsets") if offsets is None else ("offsets", "seeds")
        raise ValueError(
            f"seeds and offsets go together: {given} was given without {missing} (pass both: "
            "offsets[b] = the position of request b's first query token, sampling_offsets(); "
            "or neither, for fresh seeds drawn on the device)"
        )

    params = [temperature, top_k, top_p, min_p]
    value_checks = None
    if should_check_values([target_logits, draft_token_ids, cu, *params], validate):
        value_checks = functools.partial(_check_values, cu, k, n_flat, draft_probs, *params)

    if temperature is not None and seeds is None:  # fresh randomness for this call
        seeds = torch.randint(0, SEED_HIGH, (B,), dtype=torch.int64, device=device)
        offsets = torch.zeros((B,), dtype=torch.int64, device=device)

    draft_token_ids, cu = draft_token_ids.contiguous(), cu.contiguous()
    top_k = kernel_top_k(top_k)
    if processing is not None:
        kwargs = dict(target_logits=target_logits, draft_token_ids=draft_token_ids,
                      cu_num_draft_tokens=cu, draft_probs=draft_probs, temperature=temperature,
                      top_k=top_k, top_p=top_p, min_p=min_p, seeds=seeds, offsets=offsets,
                      num_speculative_tokens=k, return_logprobs=return_logprobs)  # fmt: skip
        result = verify_fused_cpu(kwargs, processing, proc, proc_checks, value_checks)
        if result is not None:  # one kernel that processes the rows it verifies
            out, num_emitted, logprobs = result
            return RejectionOutput(out, num_emitted, logprobs if return_logprobs else None)
        if proc is None:  # a ProcessingState's batch, off that route: its parameters gathered
            gathered = processing.logits_processing(B)
            proc_checks, proc = prepare(target_logits, draft_token_ids, cu, *gathered,
                                        validate=validate)  # fmt: skip
        if proc_checks is not None:
            proc_checks()
        target_logits = processed_logits(proc)

    out, num_emitted, logprobs = call(
        "rejection_sample",
        target_logits=target_logits,
        draft_token_ids=draft_token_ids,
        cu_num_draft_tokens=cu,
        draft_probs=draft_probs,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        seeds=seeds,
        offsets=offsets,
        num_speculative_tokens=k,
        return_logprobs=return_logprobs,
        value_checks=value_checks,
    )
    return RejectionOutput(out, num_emitted, logprobs if return_logprobs else None)


def _check_values(cu, k, n_flat, draft_probs, temperature, top_k, top_p, min_p) -> None:
    """The value checks of :func:`rejection_sample` (see Raises there); the CPU kernel runs
    the same checks itself (``cpu/rejection.py``'s ``values_ok``)."""
    N = check_prefix_sum(
        "cu_num_draft_tokens",
        cu,
        k,
        f"the draft counts: cu non-decreasing, each <= num_speculative_tokens = {k}",
        _INCLUSIVE_HINT,
    )
    if N > n_flat:
        raise ValueError(
            f"cu_num_draft_tokens[B] must be <= len(draft_token_ids) = {n_flat}, got {N}"
        )
    if draft_probs is not None and N > draft_probs.shape[0]:
        raise ValueError(
            f"draft_probs must have at least N = cu_num_draft_tokens[B] = {N} "
            f"rows (one per draft), got {draft_probs.shape[0]}"
        )
    check_sampling_params(temperature, top_k, top_p, min_p)


def check_sampling_params(temperature, top_k, top_p, min_p) -> None:
    """The sampling parameters' value checks (``rejection_sample``'s and ``top_logprobs``')."""
    if temperature is not None:
        check_value_range("temperature", temperature, 0, FLOAT32_MAX, "finite; 0 = greedy")
    if top_k is not None:
        check_value_range("top_k", top_k, 0, INT64_MAX, "0 or >= V = off")
    if top_p is not None:
        check_value_range("top_p", top_p, 0, 1, "1 = off", lo_open=True)
    if min_p is not None:
        check_value_range("min_p", min_p, 0, 1, "0 = off")
