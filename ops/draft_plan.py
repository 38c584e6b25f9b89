"""``plan_draft_lengths`` and ``update_acceptance_stats``: draft lengths chosen on the device.

Speculation pays when the tokens it adds to the verify pass return more than they cost:
at batch 1 almost always, at a large batch on a busy machine often not. These two ops let
an engine choose, every step and with no host synchronisation, how many of the proposed
drafts each request verifies, from a cost model of its own verify pass and per-request
acceptance estimates it keeps on the device (``docs/design.md``, "Draft-length planning").
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec_kernels.cpu import draft_plan as _cpu
from specdec_kernels.ops._library import call, define
from specdec_kernels.ops._validation import (
    check_int,
    check_req_indices,
    check_req_indices_values,
    check_shape,
    check_tensor,
    check_value_range,
    should_check_values,
)

MAX_PLAN_SLOTS = 1 << 14
"""The largest ``B * k`` :func:`plan_draft_lengths` accepts (one Triton program plans it)."""

DEFAULT_PRIOR = 0.5
"""The acceptance estimate a new request starts from (:func:`new_acceptance_stats`)."""

DEFAULT_DECAY = 0.8
"""Weight of the old estimate in each update (about the last five observations count)."""


class DraftPlan(NamedTuple):
    """The draft lengths chosen by :func:`plan_draft_lengths`."""

    num_draft_tokens: torch.Tensor
    """int32 ``[B]``: drafts request ``b`` verifies this step, ``<=`` the proposed count."""
    expected_num_emitted: torch.Tensor
    """float32 ``[B]``: ``1 + sum`` of the planned drafts' gains (0 for padding rows)."""


def _plan_fake(
    num_draft_tokens, match_len, verify_cost, req_indices, acceptance, *, max_num_tokens,
):  # fmt: skip
    B = num_draft_tokens.shape[0]
    return (
        num_draft_tokens.new_empty((B,), dtype=torch.int32),
        num_draft_tokens.new_empty((B,), dtype=torch.float32),
    )


define(
    "plan_draft_lengths(Tensor num_draft_tokens, Tensor match_len, Tensor verify_cost, "
    "Tensor? req_indices, Tensor acceptance, *, int? max_num_tokens) -> (Tensor, Tensor)",
    cpu=_cpu.plan_draft_lengths,
    cuda="specdec_kernels.kernels.draft_plan:plan_draft_lengths",
    fake=_plan_fake,
)


def _update_fake(
    draft_token_ids, num_draft_tokens, match_len, output_token_ids, num_emitted, req_indices,
    acceptance, *, decay,
):  # fmt: skip
    return None


define(
    "update_acceptance_stats(Tensor draft_token_ids, Tensor num_draft_tokens, "
    "Tensor match_len, Tensor output_token_ids, Tensor num_emitted, Tensor? req_indices, "
    "Tensor(a!) acceptance, *, float decay) -> ()",
    cpu=_cpu.update_acceptance_stats,
    cuda="specdec_kernels.kernels.draft_plan:update_acceptance_stats",
    fake=_update_fake,
)


def new_acceptance_stats(
    num_rows: int,
    num_speculative_tokens: int,
    *,
    num_classes: int = 1,
    prior: float = DEFAULT_PRIOR,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """A fresh acceptance state for :func:`plan_draft_lengths`, every estimate at ``prior``.

    An engine resets the rows of newly admitted requests to the prior with
    ``acceptance[r] = prior`` (a plain tensor write, capturable in a CUDA graph). Contract:
    ``docs/design.md``, "Draft-length planning".

    Parameters
    ----------
    num_rows : int
        ``R``, the number of persistent state rows, ``>= 0``.
    num_speculative_tokens : int
        ``k >= 0``, the draft slots per request.
    num_classes : int
        ``M >= 1``, match-length classes: a proposal whose ``match_len`` is ``n`` uses
        class ``min(max(n, 1), M) - 1``, so ``M = max_n`` keeps one estimate per n-gram
        length and ``M = 1`` one per request.
    prior : float
        The starting estimate in ``[0, 1]``.
    device : torch.device or str, optional
        Where the state lives. Default: the CPU.

    Returns
    -------
    torch.Tensor
        float32 ``[R, M, k]`` filled with ``prior``.

    Raises
    ------
    ValueError
        A negative size, ``num_classes < 1`` or ``prior`` outside ``[0, 1]``.

    Examples
    --------
    >>> new_acceptance_stats(2, 3, num_classes=2, prior=0.8).shape
    torch.Size([2, 2, 3])
    """
    check_int("num_rows", num_rows, min_value=0)
    check_int("num_speculative_tokens", num_speculative_tokens, min_value=0)
    check_int("num_classes", num_classes, min_value=1)
    if not isinstance(prior, (int, float)) or not 0.0 <= float(prior) <= 1.0:
        raise ValueError(f"prior must be a float in [0, 1], got {prior!r}")
    shape = (num_rows, num_classes, num_speculative_tokens)
    return torch.full(shape, float(prior), dtype=torch.float32, device=device)


def plan_draft_lengths(
    num_draft_tokens: torch.Tensor,
    match_len: torch.Tensor,
    verify_cost: torch.Tensor,
    req_indices: torch.Tensor | None = None,
    *,
    acceptance: torch.Tensor,
    max_num_tokens: int | None = None,
    validate: bool | None = None,
) -> DraftPlan:
    """Choose how many of its proposed drafts each request verifies this step.

    The plan ``k'_b <= num_draft_tokens[b]`` maximises the expected emitted tokens per
    unit of verify cost, ``(B + sum of planned gains) / verify_cost[B + D]``, exactly over
    ``D`` (the gain of draft ``j`` is ``a_0 * .. * a_j`` from the acceptance estimates);
    it is all zeros when no draft pays. Bit for bit the same on every path; no host
    synchronisation (``torch.ops.specdec.plan_draft_lengths``). The planned counts go
    straight into ``prepare_verify_inputs``. Contract: ``docs/design.md``, "Draft-length
    planning".

    Parameters
    ----------
    num_draft_tokens : torch.Tensor
        int32 ``[B]``, the drafts proposed for each batch row (``ngram_propose``), in
        ``[0, k]``.
    match_len : torch.Tensor
        int32 ``[B]``, each proposal's match length (``ngram_propose``'s ``match_len``).
    verify_cost : torch.Tensor
        float32 ``[T + 1]``, ``verify_cost[n]`` the cost of one verify pass of ``n`` query
        tokens (any unit), positive and finite for ``n >= B``; ``T >= B``.
    req_indices : torch.Tensor, optional
        int32 ``[B]``, the state row of each batch row, -1 for padding (0 drafts, one
        query token). Default ``arange(B)`` (then ``B <= R``).
    acceptance : torch.Tensor
        float32 ``[R, M, k]``, the acceptance estimates in ``[0, 1]``
        (:func:`new_acceptance_stats`, kept by :func:`update_acceptance_stats`).
    max_num_tokens : int, optional
        A static cap on the verify pass, ``B + sum_b k'_b <= max_num_tokens`` (``>= B``).
        None: no cap beyond ``verify_cost``'s length.
    validate : bool, optional
        Run the value checks (see Raises). Default: only for CPU tensors; never while
        compiling or capturing a CUDA graph.

    Returns
    -------
    DraftPlan
        ``num_draft_tokens`` int32 ``[B]`` and ``expected_num_emitted`` float32 ``[B]``
        (``1 +`` the planned gains; 0 for padding rows), on the inputs' device.

    Raises
    ------
    ValueError
        Wrong dtype, device, ndim or shape; ``len(verify_cost) <= B``;
        ``B * k > MAX_PLAN_SLOTS``; ``max_num_tokens < B``. With value checks:
        ``num_draft_tokens`` outside ``[0, k]``, ``acceptance`` outside ``[0, 1]``,
        ``verify_cost[B:]`` not positive and finite, ``req_indices`` outside ``[-1, R)``.

    Examples
    --------
    >>> acceptance = new_acceptance_stats(2, 4, prior=0.9)
    >>> cost = 1.0 + 0.01 * torch.arange(11, dtype=torch.float32)  # drafts are cheap
    >>> plan = plan_draft_lengths(torch.tensor([4, 2], dtype=torch.int32),
    ...                           torch.tensor([3, 3], dtype=torch.int32), cost,
    ...                           acceptance=acceptance)
    >>> plan.num_draft_tokens.tolist()
    [4, 2]
    """
    num_draft_tokens = check_tensor("num_draft_tokens", num_draft_tokens, dtype=torch.int32, ndim=1)
    device = num_draft_tokens.device
    B = num_draft_tokens.shape[0]
    match_len = check_tensor("match_len", match_len, dtype=torch.int32, ndim=1, device=device)
    check_shape("match_len", match_len, (B,), "one per batch row, like num_draft_tokens")
    acceptance = check_tensor("acceptance", acceptance, dtype=torch.float32, ndim=3, device=device)
    R, _, k = acceptance.shape
    if acceptance.shape[1] < 1:
        raise ValueError(f"acceptance must be [R, M, k] with M >= 1, got {tuple(acceptance.shape)}")
    verify_cost = check_tensor(
        "verify_cost", verify_cost, dtype=torch.float32, ndim=1, device=device
    )
    if verify_cost.shape[0] <= B:
        raise ValueError(
            f"verify_cost must have more than B = {B} entries (verify_cost[n] is the cost of a "
            f"pass of n tokens, and every batch row is one), got {verify_cost.shape[0]}"
        )
    check_req_indices(req_indices, "len(num_draft_tokens)", B, R, device)
    if B * k > MAX_PLAN_SLOTS:
        raise ValueError(f"B * k must be <= {MAX_PLAN_SLOTS} (one planning program), got {B} * {k}")
    if max_num_tokens is not None:
        check_int("max_num_tokens", max_num_tokens, min_value=B)

    if should_check_values([num_draft_tokens, acceptance, verify_cost, req_indices], validate):
        check_req_indices_values(req_indices, R)
        check_value_range("num_draft_tokens", num_draft_tokens, 0, k, "k = acceptance.shape[2]")
        if acceptance.numel() and not bool(((acceptance >= 0) & (acceptance <= 1)).all()):
            raise ValueError("acceptance must lie in [0, 1] (probabilities)")
        used = verify_cost[B:]
        if not bool((torch.isfinite(used) & (used > 0)).all()):
            raise ValueError("verify_cost[B:] must be positive and finite (a cost per pass)")

    planned, expected = call(
        "plan_draft_lengths",
        num_draft_tokens=num_draft_tokens.contiguous(),
        match_len=match_len.contiguous(),
        verify_cost=verify_cost.contiguous(),
        req_indices=None if req_indices is None else req_indices.contiguous(),
        acceptance=acceptance,
        max_num_tokens=max_num_tokens,
    )
    return DraftPlan(planned, expected)


def update_acceptance_stats(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    match_len: torch.Tensor,
    output_token_ids: torch.Tensor,
    num_emitted: torch.Tensor,
    req_indices: torch.Tensor | None = None,
    *,
    acceptance: torch.Tensor,
    decay: float = DEFAULT_DECAY,
    validate: bool | None = None,
) -> None:
    """Update the acceptance estimates, in place, from this step's *proposed* drafts.

    For ``j`` below ``min(num_draft_tokens[b], num_emitted[b], k)`` and until the first
    mismatch, ``a_j <- a_j * decay + (1 - decay) * [d_j == output_token_ids[b, j]]``.
    Pass the drafts as proposed, not as planned: the emitted tokens are the target's own,
    so a request planned down to 0 drafts still observes its first draft. No host
    synchronisation (``torch.ops.specdec.update_acceptance_stats``). Contract:
    ``docs/design.md``, "Draft-length planning".

    Parameters
    ----------
    draft_token_ids : torch.Tensor
        int32 ``[B, k]``, the proposed drafts, -1 padded.
    num_draft_tokens : torch.Tensor
        int32 ``[B]``, the proposed counts, in ``[0, k]``.
    match_len : torch.Tensor
        int32 ``[B]``, the proposals' match lengths (they select the class).
    output_token_ids : torch.Tensor
        int32 ``[B, k+1]``, the emitted tokens (``rejection_sample``).
    num_emitted : torch.Tensor
        int32 ``[B]``, the emitted counts.
    req_indices : torch.Tensor, optional
        int32 ``[B]``, unique state rows, -1 for padding rows (not updated). Default
        ``arange(B)`` (then ``B <= R``).
    acceptance : torch.Tensor
        float32 ``[R, M, k]``, the estimates (:func:`new_acceptance_stats`); mutated.
    decay : float
        In ``[0, 1)``: the weight of the old estimate.
    validate : bool, optional
        Run the value checks (see Raises). Default: only for CPU tensors.

    Raises
    ------
    ValueError
        Wrong dtype, device, ndim or shape (``draft_token_ids`` must be ``[B, k]`` and
        ``output_token_ids`` ``[B, k+1]`` with ``k = acceptance.shape[2]``); ``decay``
        outside ``[0, 1)``. With value checks: ``req_indices`` outside ``[-1, R)`` or
        repeated; ``num_draft_tokens`` outside ``[0, k]``; ``num_emitted`` outside
        ``[0, k+1]``.

    Examples
    --------
    >>> acceptance = new_acceptance_stats(1, 2, prior=0.5)
    >>> update_acceptance_stats(torch.tensor([[4, 5]], dtype=torch.int32),
    ...                         torch.tensor([2], dtype=torch.int32),
    ...                         torch.tensor([1], dtype=torch.int32),
    ...                         torch.tensor([[4, 6, 0]], dtype=torch.int32),  # d_1 rejected
    ...                         torch.tensor([2], dtype=torch.int32),
    ...                         acceptance=acceptance, decay=0.5)
    >>> acceptance[0, 0].tolist()
    [0.75, 0.25]
    """
    acceptance = check_tensor("acceptance", acceptance, dtype=torch.float32, ndim=3)
    device = acceptance.device
    R, M, k = acceptance.shape
    if M < 1:
        raise ValueError(f"acceptance must be [R, M, k] with M >= 1, got {tuple(acceptance.shape)}")
    draft_token_ids = check_tensor(
        "draft_token_ids", draft_token_ids, dtype=torch.int32, ndim=2, device=device
    )
    B = draft_token_ids.shape[0]
    check_shape("draft_token_ids", draft_token_ids, (B, k), "k = acceptance.shape[2]")
    for name, t in (
        ("num_draft_tokens", num_draft_tokens),
        ("match_len", match_len),
        ("num_emitted", num_emitted),
    ):
        check_tensor(name, t, dtype=torch.int32, ndim=1, device=device)
        check_shape(name, t, (B,), "one per batch row, like draft_token_ids")
    output_token_ids = check_tensor(
        "output_token_ids", output_token_ids, dtype=torch.int32, ndim=2, device=device
    )
    check_shape("output_token_ids", output_token_ids, (B, k + 1), "k + 1 = acceptance.shape[2] + 1")
    check_req_indices(req_indices, "len(draft_token_ids)", B, R, device)
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 <= decay < 1:
        raise ValueError(f"decay must be a float in [0, 1), got {decay!r}")

    tensors = [acceptance, draft_token_ids, num_draft_tokens, num_emitted, req_indices]
    if should_check_values(tensors, validate):
        check_req_indices_values(req_indices, R, unique=True)
        check_value_range("num_draft_tokens", num_draft_tokens, 0, k, "k = acceptance.shape[2]")
        check_value_range("num_emitted", num_emitted, 0, k + 1, "k + 1")

    call(
        "update_acceptance_stats",
        draft_token_ids=draft_token_ids.contiguous(),
        num_draft_tokens=num_draft_tokens.contiguous(),
        match_len=match_len.contiguous(),
        output_token_ids=output_token_ids.contiguous(),
        num_emitted=num_emitted.contiguous(),
        req_indices=None if req_indices is None else req_indices.contiguous(),
        acceptance=acceptance,
        decay=float(decay),
    )
