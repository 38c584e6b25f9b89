"""``top_logprobs``: the top-N logprobs (or logits) of the tokens a verify step emitted.

Contract: ``docs/design.md``, "``top_logprobs``".
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from specdec_kernels.cpu import logprobs as _cpu
from specdec_kernels.ops._library import call, define
from specdec_kernels.ops._validation import (
    check_int,
    check_prefix_sum,
    check_rows_range,
    check_shape,
    check_tensor,
    should_check_values,
)
from specdec_kernels.ops.rejection import (
    LOGIT_DTYPES,
    check_sampling_params,
    kernel_top_k,
    sampling_param,
)

LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
"""The ``logprobs_mode`` values (vLLM's names): the log-softmax of the fp32 target logits, or
the logits themselves, as passed (``raw_*``) or as :func:`rejection_sample` samples each
request's rows (``processed_*``: after its temperature and filters)."""


class TopLogprobs(NamedTuple):
    """Result of :func:`top_logprobs`; slot ``[b, j]`` is request ``b``'s ``j``-th emitted
    token, slots at or past ``num_emitted[b]`` hold 0 (ids -1)."""

    token_logprobs: torch.Tensor
    """float32 ``[B, k+1]``: the emitted token's value in the mode."""
    token_ranks: torch.Tensor
    """int32 ``[B, k+1]``: how many ids have a logit at least the emitted token's (1 for a
    unique argmax; vLLM's rank)."""
    top_token_ids: torch.Tensor
    """int32 ``[B, k+1, N]``: the ``N`` ids with the largest logits, largest first (ties:
    the lower id)."""
    top_logprobs: torch.Tensor
    """float32 ``[B, k+1, N]``: their values in the mode."""


def _fake(
    target_logits, output_token_ids, num_emitted, cu_num_draft_tokens, temperature=None,
    top_k=None, top_p=None, min_p=None, *, num_logprobs, logprobs_mode,
):  # fmt: skip
    B, K1 = output_token_ids.shape
    new = target_logits.new_empty
    return (
        new((B, K1), dtype=torch.float32),
        new((B, K1), dtype=torch.int32),
        new((B, K1, num_logprobs), dtype=torch.int32),
        new((B, K1, num_logprobs), dtype=torch.float32),
    )


define(
    "top_logprobs(Tensor target_logits, Tensor output_token_ids, Tensor num_emitted, "
    "Tensor cu_num_draft_tokens, Tensor? temperature=None, Tensor? top_k=None, "
    "Tensor? top_p=None, Tensor? min_p=None, *, int num_logprobs, str logprobs_mode) "
    "-> (Tensor, Tensor, Tensor, Tensor)",
    cpu=_cpu.top_logprobs,
    cuda="specdec_kernels.kernels.logprobs:top_logprobs",
    fake=_fake,
    cpu_checked=_cpu.top_logprobs_checked,
)


def top_logprobs(
    target_logits: torch.Tensor,
    output_token_ids: torch.Tensor,
    num_emitted: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    *,
    num_logprobs: int,
    logprobs_mode: str = "raw_logprobs",
    temperature: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
    validate: bool | None = None,
) -> TopLogprobs:
    """The ``num_logprobs`` most likely tokens of every row that emitted a token in a verify
    step, with the emitted token's own value and rank (what an OpenAI-style ``logprobs = N``
    request returns), from the target logits as passed or as sampled.

    Row ``cu[b] + b + j`` of ``target_logits`` (as :func:`rejection_sample` reads it) gives
    slot ``[b, j]`` for ``j < num_emitted[b]``. In ``raw_logprobs`` mode the values are
    :func:`rejection_sample`'s ``logprobs`` (the log-softmax, a row without a finite maximum
    included); in ``raw_logits`` mode the fp32 logits. NaN logits count as -inf. The
    ``processed_*`` modes take the sampling parameters :func:`rejection_sample` took: a
    request with ``temperature[b] > 0`` gets the values of its rows as sampled (``l / T``,
    or its log-probability, on the filters' kept set; -inf elsewhere), a greedy one the raw
    values; ids and ranks are the raw modes'. With penalties, bias or masks, pass the
    :func:`process_logits` rows of the token state verification saw (before
    :func:`commit_accepted_tokens` appends the step's tokens). No host synchronisation,
    static shapes (``torch.ops.specdec.top_logprobs``). Contract: ``docs/design.md``,
    "``top_logprobs``".

    Parameters
    ----------
    target_logits : torch.Tensor
        float32, bfloat16 or float16 ``[>= N + B, V]``: the rows :func:`rejection_sample`
        verified (``N = cu[B]``). Any strides.
    output_token_ids, num_emitted : torch.Tensor
        int32 ``[B, k+1]`` and int32 ``[B]``: :func:`rejection_sample`'s outputs.
    cu_num_draft_tokens : torch.Tensor
        int32 ``[B + 1]``, the same exclusive prefix sum :func:`rejection_sample` took.
    num_logprobs : int
        ``N`` in ``[0, V]``, the top entries per slot (0: only the emitted token's).
    logprobs_mode : {"raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"}
        vLLM's names.
    temperature, top_k, top_p, min_p : torch.Tensor, optional
        ``[B]``, as :func:`rejection_sample` takes them; read in the processed modes only
        (without a temperature those equal the raw ones).
    validate : bool, optional
        Run the value checks (see Raises). Default: only for CPU tensors; never while
        compiling or capturing a CUDA graph.

    Returns
    -------
    TopLogprobs
        ``token_logprobs`` float32 ``[B, k+1]``, ``token_ranks`` int32 ``[B, k+1]``,
        ``top_token_ids`` int32 ``[B, k+1, N]``, ``top_logprobs`` float32 ``[B, k+1, N]``.

    Raises
    ------
    ValueError
        Wrong dtype, device, ndim or shape of any tensor; ``V < 1``; ``num_logprobs``
        outside ``[0, V]``; another ``logprobs_mode``; a sampling parameter of the wrong
        dtype or shape (:func:`rejection_sample`'s rules). With value checks: ``cu`` not a
        prefix sum of counts in ``[0, k]`` starting at 0, ``target_logits`` with fewer than
        ``cu[B] + B`` rows, ``num_emitted`` outside ``[0, k_b + 1]``, an emitted token
        outside ``[0, V)``, a sampling parameter outside its range.

    Examples
    --------
    >>> logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 3.0]])
    >>> out = top_logprobs(logits, torch.tensor([[1, 2]], dtype=torch.int32),
    ...                    torch.tensor([2], dtype=torch.int32),
    ...                    torch.tensor([0, 1], dtype=torch.int32), num_logprobs=2,
    ...                    logprobs_mode="raw_logits")
    >>> out.top_token_ids.tolist(), out.token_ranks.tolist()  # ties: the lower id first
    ([[[1, 2], [0, 2]]], [[1, 2]])
    """
    target_logits = check_tensor("target_logits", target_logits, dtype=LOGIT_DTYPES, ndim=2)
    device = target_logits.device
    out = check_tensor("output_token_ids", output_token_ids, dtype=torch.int32, ndim=2,
                       device=device)  # fmt: skip
    emitted = check_tensor("num_emitted", num_emitted, dtype=torch.int32, ndim=1, device=device)
    cu = check_tensor(
        "cu_num_draft_tokens", cu_num_draft_tokens, dtype=torch.int32, ndim=1, device=device
    )
    B, K1 = out.shape
    rows, V = target_logits.shape
    check_shape("cu_num_draft_tokens", cu, (B + 1,), "one more than the rows of output_token_ids")
    check_shape("num_emitted", emitted, (B,), "one count per request")
    if K1 < 1:
        raise ValueError("output_token_ids must have k + 1 >= 1 columns, got 0")
    if V < 1:
        raise ValueError(f"target_logits must have a vocabulary of at least 1, got V = {V}")
    N = check_int("num_logprobs", num_logprobs, min_value=0, max_value=V)
    if logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
    params = [
        sampling_param(n, t, dtypes, B, device)
        for n, t, dtypes in (("temperature", temperature, torch.float32),
                             ("top_k", top_k, (torch.int32, torch.int64)),
                             ("top_p", top_p, torch.float32), ("min_p", min_p, torch.float32))
    ]  # fmt: skip
    if not logprobs_mode.startswith("processed"):
        params = [None] * 4  # checked, never read
    value_checks = None
    if should_check_values([target_logits, out, emitted, cu, *params], validate):
        value_checks = functools.partial(_check_values, rows, V, out, emitted, cu, params)
    temperature, top_p, min_p = params[0], params[2], params[3]
    top_k = kernel_top_k(params[1])
    tok_lp, tok_rank, top_ids, top_vals = call(
        "top_logprobs",
        target_logits=target_logits,
        output_token_ids=out.contiguous(),
        num_emitted=emitted.contiguous(),
        cu_num_draft_tokens=cu.contiguous(),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        num_logprobs=N,
        logprobs_mode=logprobs_mode,
        value_checks=value_checks,
    )
    return TopLogprobs(tok_lp, tok_rank, top_ids, top_vals)


def _check_values(rows, V, out, emitted, cu, params) -> None:
    """The value checks of :func:`top_logprobs` (see Raises there)."""
    B, K1 = out.shape
    check_sampling_params(*params)
    hint = "the cu_num_draft_tokens rejection_sample took"
    n_drafts = check_prefix_sum("cu_num_draft_tokens", cu, K1 - 1, "draft counts in [0, k]", hint)
    if rows < n_drafts + B:
        raise ValueError(
            f"target_logits must have at least cu[B] + B = {n_drafts + B} rows, got {rows}"
        )
    if B:
        most = torch.clamp(cu[1:] - cu[:-1] + 1, max=K1)
        if bool(((emitted < 0) | (emitted > most)).any()):
            raise ValueError("num_emitted must lie in [0, k_b + 1] for every request")
        live = torch.arange(K1, device=out.device)[None, :] < emitted[:, None]
        picked = out[live]
        check_rows_range(
            "output_token_ids", picked, None, picked.shape[0], 0, V - 1,
            "the emitted slots: token ids of the vocabulary",
        )  # fmt: skip
