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
from specdec_kernels.ops._library import define
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
    num_draft_tokens, match_len, acceptance, verify_cost, req_indices, *, max_num_tokens
):
    B = num_draft_tokens.shape[0]
    return (
        num_draft_tokens.new_empty((B,), dtype=torch.int32),
        num_draft_tokens.new_empty((B,), dtype=torch.float32),
    )


define(
    "plan_draft_lengths(Tensor num_draft_tokens, Tensor match_len, Tensor acceptance, "
    "Tensor verify_cost, Tensor? req_indices, *, int? max_num_tokens) -> (Tensor, Tensor)",
    cpu=_cpu.plan_draft_lengths,
    cuda="specdec_kernels.kernels.draft_plan:plan_draft_lengths",
    fake=_plan_fake,
)


def _update_fake(
    acceptance,
    draft_token_ids,
    num_draft_tokens,
    match_len,
    output_token_ids,
    num_emitted,
    req_indices,
    *,
    decay,
):
    return None


define(
    "update_acceptance_stats(Tensor(a!) acceptance, Tensor draft_token_ids, "
    "Tensor num_draft_tokens, Tensor match_len, Tensor output_token_ids, Tensor num_emitted, "
    "Tensor? req_indices, *, float decay) -> ()",
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
    ``acceptance[r] = prior`` (a plain tensor write, capturable in a CUDA graph).

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
    acceptance: torch.Tensor,
    verify_cost: torch.Tensor,
    req_indices: torch.Tensor | None = None,
    *,
    max_num_tokens: int | None = None,
    validate: bool | None = None,
) -> DraftPlan:
    """Choose how many of its proposed drafts each request verifies this step.

    Request ``b`` (state row ``r = req_indices[b]``) proposed ``m_b = num_draft_tokens[b]``
    drafts; with ``a_j = acceptance[r, c, j]`` the estimated probability that draft ``j``
    is accepted given drafts ``0 .. j-1`` were (``c`` the class of ``match_len[b]``, see
    :func:`new_acceptance_stats`), verifying ``k'_b`` drafts emits
    ``E_b = 1 + sum_{j < k'_b} g_j`` tokens in expectation, where the gain
    ``g_j = a_0 * .. * a_j`` of a further draft never increases with ``j``. The op returns
    ``k'_b <= m_b`` (0 allowed) maximising the expected tokens per unit of verify cost,

        ``(sum_b E_b) / verify_cost[B + sum_b k'_b]``,

    exactly: for any total ``D`` the best plan takes the ``D`` largest gains (each
    request's gains are non-increasing, so that is a prefix of each request), and the op
    tries every ``D`` from 0 to the number of proposed drafts, capped so that
    ``B + D <= max_num_tokens`` and ``B + D < len(verify_cost)``. Gains are quantised to
    multiples of ``2**-24`` (``DRAFT_GAIN_SCALE``) and summed as integers, ties between
    gains go to the lower position, then the lower batch row (equal gains are shared out
    across requests), and a tie between values of
    ``D`` to the smaller ``D``: the CPU path, the Triton kernel and the reference return
    the same plan bit for bit. When no draft can pay for itself the plan is all zeros
    (plain decoding), so speculation is never expected to be slower than none.

    Padding rows (``req_indices[b] = -1``) count one query token each, as
    ``prepare_verify_inputs`` lays them out, and get 0 drafts. No host synchronisation;
    static output shapes. Calls ``torch.ops.specdec.plan_draft_lengths``. The planned
    counts go straight into ``prepare_verify_inputs`` as ``num_draft_tokens``.

    Parameters
    ----------
    num_draft_tokens : torch.Tensor
        int32 ``[B]``, the drafts proposed for each batch row (``ngram_propose``), in
        ``[0, k]``.
    match_len : torch.Tensor
        int32 ``[B]``, the n-gram length each proposal matched (``ngram_propose``'s
        ``match_len``; any value with ``M = 1``).
    acceptance : torch.Tensor
        float32 ``[R, M, k]``, the per-row acceptance estimates in ``[0, 1]``
        (:func:`new_acceptance_stats`, kept by :func:`update_acceptance_stats`).
    verify_cost : torch.Tensor
        float32 ``[T + 1]``, ``verify_cost[n]`` the cost of one verify pass of ``n`` query
        tokens (any unit, e.g. seconds measured by the engine at start-up), positive and
        finite for ``n >= B``; ``T >= B``. Entries past ``T`` are never needed: plans stop
        at ``B + D <= T``.
    req_indices : torch.Tensor, optional
        int32 ``[B]``, the state row of each batch row, -1 for padding. Default
        ``arange(B)`` (then ``B <= R``).
    max_num_tokens : int, optional
        A static cap on the verify pass, ``B + sum_b k'_b <= max_num_tokens``
        (``>= B``). ``None``: no cap beyond ``verify_cost``'s length.
    validate : bool, optional
        Run the value checks (see Raises). Default: only for CPU tensors; never while
        compiling or capturing a CUDA graph.

    Returns
    -------
    DraftPlan
        ``num_draft_tokens`` int32 ``[B]`` and ``expected_num_emitted`` float32 ``[B]``,
        on the device of the inputs.

    Raises
    ------
    ValueError
        Wrong dtype, device, ndim or shape; ``len(verify_cost) <= B``;
        ``B * k > MAX_PLAN_SLOTS``; ``max_num_tokens < B``. With value checks:
        ``num_draft_tokens`` outside ``[0, k]``, ``acceptance`` outside ``[0, 1]``,
        ``verify_cost[B:]`` not positive and finite, ``req_indices`` outside ``[-1, R)``.
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

    planned, expected = torch.ops.specdec.plan_draft_lengths(
        num_draft_tokens.contiguous(),
        match_len.contiguous(),
        acceptance,
        verify_cost.contiguous(),
        None if req_indices is None else req_indices.contiguous(),
        max_num_tokens=max_num_tokens,
    )
    return DraftPlan(planned, expected)


def update_acceptance_stats(
    acceptance: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    match_len: torch.Tensor,
    output_token_ids: torch.Tensor,
    num_emitted: torch.Tensor,
    req_indices: torch.Tensor | None = None,
    *,
    decay: float = DEFAULT_DECAY,
    validate: bool | None = None,
) -> None:
    """Update the acceptance estimates from this step's *proposed* drafts, in place.

    For request ``b`` (state row ``r``, class ``c`` of ``match_len[b]``) and positions
    ``j = 0, 1, ..`` while ``j < min(num_draft_tokens[b], num_emitted[b], k)``: the
    observation is ``x_j = [draft_token_ids[b, j] == output_token_ids[b, j]]`` and the
    estimate moves to ``acceptance[r, c, j] * decay + (1 - decay) * x_j``; after the first
    ``x_j = 0`` later positions are not observed (their estimates are conditional on it).
    An exponentially decayed mean of Bernoulli observations, one per position and class.

    Pass the drafts as *proposed* (``ngram_propose``), not as planned: whether proposed
    draft ``j`` equals emitted token ``j`` is known for every ``j < num_emitted[b]`` even
    when the plan verified fewer drafts (the emitted tokens are the target's own), so a
    request throttled to 0 drafts still observes its first draft and can recover. With
    coupled verification (``rejection_sample`` without draft probabilities) the emitted
    tokens do not depend on the plan, so neither do the observations. No host
    synchronisation; ``acceptance`` is mutated (``Tensor(a!)`` in the schema). Calls
    ``torch.ops.specdec.update_acceptance_stats``.

    Parameters
    ----------
    acceptance : torch.Tensor
        float32 ``[R, M, k]``, the estimates (:func:`new_acceptance_stats`); mutated.
    draft_token_ids : torch.Tensor
        int32 ``[B, k]``, the proposed drafts, -1 padded.
    num_draft_tokens : torch.Tensor
        int32 ``[B]``, the proposed counts, in ``[0, k]``.
    match_len : torch.Tensor
        int32 ``[B]``, the proposals' match lengths.
    output_token_ids : torch.Tensor
        int32 ``[B, k+1]``, the emitted tokens (``rejection_sample``).
    num_emitted : torch.Tensor
        int32 ``[B]``, the emitted counts.
    req_indices : torch.Tensor, optional
        int32 ``[B]``, unique state rows, -1 for padding rows (not updated). Default
        ``arange(B)`` (then ``B <= R``).
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

    torch.ops.specdec.update_acceptance_stats(
        acceptance,
        draft_token_ids.contiguous(),
        num_draft_tokens.contiguous(),
        match_len.contiguous(),
        output_token_ids.contiguous(),
        num_emitted.contiguous(),
        None if req_indices is None else req_indices.contiguous(),
        decay=float(decay),
    )
