"""Step bookkeeping: KV slot mapping, verify-step inputs and committing accepted tokens.

What an engine runs around the model forward so that drafting, verification and the
paged KV cache stay in step (DESIGN.md ops 3, 4, 5), on the device with static shapes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec_kernels import cpu, kernels, reference  # noqa: F401  (subpackages)
from specdec_kernels.cpu import bookkeeping as _cpu
from specdec_kernels.kernels import bookkeeping as _triton
from specdec_kernels.ops._library import define
from specdec_kernels.ops._validation import (
    check_int,
    check_req_indices_values,
    check_shape,
    check_tensor,
    check_value_range,
    should_check_values,
)

FINISH_RUNNING = 0
"""``finish_reason`` of a request that goes on."""
FINISH_STOP = 1
"""``finish_reason`` of a request that committed a stop token."""
FINISH_LENGTH = 2
"""``finish_reason`` of a request that reached ``max_tokens`` or ``max_model_len``."""

_INT32_MAX = 2**31 - 1


class VerifyInputs(NamedTuple):
    """The packed verify-step inputs built by :func:`prepare_verify_inputs`.

    ``N = B*(k+1)`` query slots; the real tokens fill ``[0, query_start_loc[B])``, the tail
    holds id 0, position 0, slot -1.
    """

    input_ids: torch.Tensor
    """int32 ``[B*(k+1)]``: ``[token_ids[r, L-1], d_0 .. d_{k_b-1}]`` of each request, packed."""
    positions: torch.Tensor
    """int64 ``[B*(k+1)]``: ``L-1 .. L-1+k_b`` for each request; 0 for dummy and tail tokens."""
    query_start_loc: torch.Tensor
    """int32 ``[B+1]``: request ``b``'s query is ``[qsl[b], qsl[b+1])``; ``qsl[b] = cu[b] + b``."""
    seq_lens: torch.Tensor
    """int32 ``[B]``: ``L + k_b`` (KV length after the step); 1 for a padding row."""
    slot_mapping: torch.Tensor
    """int64 ``[B*(k+1)]``: KV-cache slot of each query token, -1 (``PAD_SLOT``) for none."""
    cu_num_draft_tokens: torch.Tensor
    """int32 ``[B+1]``: exclusive prefix sum of the draft counts, ``cu[0] = 0``."""
    flat_draft_token_ids: torch.Tensor
    """int32 ``[B*k]``: the drafts of row ``b`` at ``[cu[b], cu[b+1])``, then -1."""


class CommitResult(NamedTuple):
    """What :func:`commit_accepted_tokens` did to each batch row."""

    num_committed: torch.Tensor
    """int32 ``[B]``: tokens appended to the row (0 for padding rows)."""
    finished: torch.Tensor
    """bool ``[B]``: the request ended this step (``finish_reason != 0``)."""
    finish_reason: torch.Tensor
    """int8 ``[B]``: 0 running, 1 stop token, 2 length budget."""


# --------------------------------------------------------------------------- registration


def _slot_impl(fn):
    def impl(block_table, positions, query_start_loc, req_indices, block_size, max_model_len):
        return fn(
            block_table,
            positions,
            query_start_loc,
            req_indices,
            block_size=block_size,
            max_model_len=max_model_len,
        )

    return impl


def _slot_fake(block_table, positions, query_start_loc, req_indices, block_size, max_model_len):
    return positions.new_empty(positions.shape, dtype=torch.int64)


define(
    "compute_slot_mapping(Tensor block_table, Tensor positions, Tensor query_start_loc, "
    "Tensor? req_indices, int block_size, int? max_model_len) -> Tensor",
    cpu=_slot_impl(_cpu.compute_slot_mapping),
    cuda=_slot_impl(_triton.compute_slot_mapping),
    fake=_slot_fake,
)


def _verify_impl(fn):
    def impl(
        token_ids,
        num_tokens,
        draft_token_ids,
        num_draft_tokens,
        block_table,
        req_indices,
        block_size,
        max_model_len,
    ):
        return fn(
            token_ids,
            num_tokens,
            draft_token_ids,
            num_draft_tokens,
            block_table,
            req_indices,
            block_size=block_size,
            max_model_len=max_model_len,
        )

    return impl


def _verify_fake(
    token_ids,
    num_tokens,
    draft_token_ids,
    num_draft_tokens,
    block_table,
    req_indices,
    block_size,
    max_model_len,
):
    B, k = draft_token_ids.shape
    n = B * (k + 1)
    i32, i64 = torch.int32, torch.int64
    return (
        token_ids.new_empty((n,), dtype=i32),
        token_ids.new_empty((n,), dtype=i64),
        token_ids.new_empty((B + 1,), dtype=i32),
        token_ids.new_empty((B,), dtype=i32),
        token_ids.new_empty((n,), dtype=i64),
        token_ids.new_empty((B + 1,), dtype=i32),
        token_ids.new_empty((B * k,), dtype=i32),
    )


define(
    "prepare_verify_inputs(Tensor token_ids, Tensor num_tokens, Tensor draft_token_ids, "
    "Tensor num_draft_tokens, Tensor block_table, Tensor? req_indices, int block_size, "
    "int max_model_len) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    cpu=_verify_impl(_cpu.prepare_verify_inputs),
    cuda=_verify_impl(_triton.prepare_verify_inputs),
    fake=_verify_fake,
)


def _commit_fake(
    token_ids,
    num_tokens,
    output_token_ids,
    num_emitted,
    req_indices,
    stop_token_ids,
    num_prompt_tokens,
    min_tokens,
    max_tokens,
    max_model_len,
    num_computed_tokens,
):
    # Only the new outputs: the mutated inputs keep their fake metadata.
    B = output_token_ids.shape[0]
    return (
        output_token_ids.new_empty((B,), dtype=torch.int32),
        output_token_ids.new_empty((B,), dtype=torch.bool),
        output_token_ids.new_empty((B,), dtype=torch.int8),
    )


define(
    "commit_accepted_tokens(Tensor(a!) token_ids, Tensor(b!) num_tokens, "
    "Tensor output_token_ids, Tensor num_emitted, Tensor? req_indices, "
    "Tensor? stop_token_ids, Tensor? num_prompt_tokens, Tensor? min_tokens, "
    "Tensor? max_tokens, int max_model_len, Tensor(c!)? num_computed_tokens) "
    "-> (Tensor, Tensor, Tensor)",
    cpu=_cpu.commit_accepted_tokens,
    cuda=_triton.commit_accepted_tokens,
    fake=_commit_fake,
)


# --------------------------------------------------------------------------- validation


def _optional(name, t, *, dtype, ndim, device):
    return None if t is None else check_tensor(name, t, dtype=dtype, ndim=ndim, device=device)


def _batch_rows(req_indices: torch.Tensor | None, B: int) -> torch.Tensor:
    """The state rows of the batch's real rows (int64), for value checks."""
    if req_indices is None:
        return torch.arange(B)
    rows = req_indices.long()
    return rows[rows >= 0]


def _check_req_indices(req_indices, B_name: str, B: int | None, R: int, device):
    """Shape check of ``req_indices``; returns the batch size B."""
    if req_indices is None:
        if B is not None and B > R:
            raise ValueError(
                f"without req_indices batch row b uses state row b, so {B_name} ({B}) must be "
                f"<= the number of state rows ({R})"
            )
        return B
    req_indices = check_tensor("req_indices", req_indices, dtype=torch.int32, ndim=1, device=device)
    if B is not None:
        check_shape("req_indices", req_indices, (B,), f"one state row per batch row, {B_name}")
    return req_indices.shape[0]


# --------------------------------------------------------------------------- public API


def compute_slot_mapping(
    block_table: torch.Tensor,
    positions: torch.Tensor,
    query_start_loc: torch.Tensor,
    req_indices: torch.Tensor | None = None,
    *,
    block_size: int,
    max_model_len: int | None = None,
    validate: bool | None = None,
) -> torch.Tensor:
    """Map every query token to its paged KV-cache slot.

    Token ``t`` of request ``b`` (``query_start_loc[b] <= t < query_start_loc[b+1]``) at
    position ``pos = positions[t]`` gets ``slot = block_table[r, pos // block_size] *
    block_size + pos % block_size`` with ``r = req_indices[b]``: the paged attention layout of
    vLLM (Kwon et al., 2023, "PagedAttention"), whose ``slot_mapping`` this reproduces.
    ``PAD_SLOT = -1`` (write nothing) for tokens at or past ``query_start_loc[B]`` (and
    before ``query_start_loc[0]``), tokens of padding rows, ``pos < 0``,
    ``pos >= max_model_len``, ``pos // block_size >= max_blocks`` and negative block ids;
    the block table is never read out of bounds.

    The Triton kernel runs one flat grid over tokens and finds each token's request by a
    binary search in ``query_start_loc`` (no host sync, no bound on the longest query,
    balanced for any raggedness); offsets are int64, so ``T`` may be in the millions.
    Calls ``torch.ops.specdec.compute_slot_mapping``.

    Parameters
    ----------
    block_table : torch.Tensor
        int32 ``[R, max_blocks]``, the KV-cache block ids of each state row; negative ids
        mark unallocated blocks. Any strides.
    positions : torch.Tensor
        int64 or int32 ``[T]``, the position of each query token in its sequence.
    query_start_loc : torch.Tensor
        int32 ``[B+1]``, non-decreasing, ``0 <= query_start_loc[0]`` and
        ``query_start_loc[B] <= T`` (entries past it are padding).
    req_indices : torch.Tensor, optional
        int32 ``[B]``, the state row of each batch row; -1 marks a padding row (all its
        tokens get -1). Default ``arange(B)`` (then ``B <= R``).
    block_size : int
        Tokens per KV-cache block, ``>= 1``.
    max_model_len : int, optional
        Positions at or past it get -1. ``None``: no such cap.
    validate : bool, optional
        Run the value checks (see Raises). Default: only for CPU tensors; never while
        compiling or capturing a CUDA graph.

    Returns
    -------
    torch.Tensor
        int64 ``[T]`` slot mapping on the device of ``positions``, -1 padded.

    Raises
    ------
    ValueError
        Wrong dtype, device, ndim or shape; ``block_size < 1``; ``max_model_len < 1``.
        With value checks: ``query_start_loc`` decreasing, negative or past ``T``;
        ``req_indices`` outside ``[-1, R)``.
    """
    block_table = check_tensor("block_table", block_table, dtype=torch.int32, ndim=2)
    device = block_table.device
    positions = check_tensor(
        "positions", positions, dtype=(torch.int64, torch.int32), ndim=1, device=device
    )
    query_start_loc = check_tensor(
        "query_start_loc", query_start_loc, dtype=torch.int32, ndim=1, device=device
    )
    if query_start_loc.shape[0] < 1:
        raise ValueError("query_start_loc must have shape (B+1,) with B >= 0, got shape (0,)")
    B = query_start_loc.shape[0] - 1
    R = block_table.shape[0]
    _check_req_indices(req_indices, "len(query_start_loc) - 1", B, R, device)
    check_int("block_size", block_size, min_value=1)
    if max_model_len is not None:
        check_int("max_model_len", max_model_len, min_value=1)

    if should_check_values([block_table, positions, query_start_loc, req_indices], validate):
        T = positions.shape[0]
        qsl = query_start_loc.long()
        if int(qsl[0]) < 0 or int(qsl[-1]) > T:
            raise ValueError(
                f"query_start_loc must lie in [0, {T}] (T = len(positions)), got "
                f"query_start_loc[0] = {int(qsl[0])}, query_start_loc[B] = {int(qsl[-1])}"
            )
        if B and bool((qsl[1:] < qsl[:-1]).any()):
            raise ValueError("query_start_loc must be non-decreasing")
        check_req_indices_values(req_indices, R)

    return torch.ops.specdec.compute_slot_mapping(
        block_table,
        positions.contiguous(),
        query_start_loc.contiguous(),
        None if req_indices is None else req_indices.contiguous(),
        block_size,
        max_model_len,
    )


def prepare_verify_inputs(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    block_table: torch.Tensor,
    req_indices: torch.Tensor | None = None,
    *,
    block_size: int,
    max_model_len: int,
    validate: bool | None = None,
) -> VerifyInputs:
    """Pack the verify-step query of every request into static-size model inputs.

    Request ``b`` (state row ``r = req_indices[b]``, ``L = num_tokens[r]``, ``k_b =
    num_draft_tokens[b]`` drafts) verifies its drafts with the query ``[token_ids[r, L-1],
    d_0 .. d_{k_b-1}]`` at positions ``L-1 .. L-1+k_b``, as in vLLM V1's speculative
    decoding step (Leviathan et al., 2023; Chen et al., 2023). The queries are packed
    contiguously: ``cu_num_draft_tokens`` is the exclusive prefix sum of ``k_b``
    (``cu[0] = 0``; vLLM V1's array of the same name is the inclusive ``[B]`` one) and
    ``query_start_loc[b] = cu[b] + b``, so query row ``cu[b] + b + j`` verifies ``d_j``
    and row ``cu[b+1] + b`` is the bonus row, as ``rejection_sample`` expects. Every
    output's size depends only on ``B`` and ``k``; the ``B*(k+1) - query_start_loc[B]``
    tail slots hold id 0, position 0, slot -1, and the flat drafts are padded with -1. A
    padding row (``req_indices[b] = -1``) gets 0 drafts, one dummy token (id 0, position 0,
    slot -1) and ``seq_lens = 1`` (every row keeps ``seq_len >= query_len``). ``k = 0`` is
    plain decoding. No host synchronisation (the prefix sums are computed on the device).
    Calls ``torch.ops.specdec.prepare_verify_inputs``.

    Parameters
    ----------
    token_ids : torch.Tensor
        int32 ``[R, L_max]``, the persistent token history of every state row. Any strides.
    num_tokens : torch.Tensor
        int32 ``[R]``, the history length ``L`` of each state row; ``1 <= L <= L_max`` for
        rows in the batch (the last token is the first query token).
    draft_token_ids : torch.Tensor
        int32 ``[B, k]``, row ``b``'s drafts in ``[b, :k_b]`` (the rest is ignored), e.g.
        from ``ngram_propose``. Any strides; ``k >= 0``.
    num_draft_tokens : torch.Tensor
        int32 ``[B]``, ``0 <= k_b <= k``; ignored for padding rows.
    block_table : torch.Tensor
        int32 ``[R, max_blocks]``, KV-cache block ids per state row (see
        :func:`compute_slot_mapping`). Any strides.
    req_indices : torch.Tensor, optional
        int32 ``[B]``, state row of each batch row, -1 = padding. Default ``arange(B)``
        (then ``B <= R``).
    block_size : int
        Tokens per KV-cache block, ``>= 1``.
    max_model_len : int
        Positions at or past it get slot -1 (a drafter that respects it never makes any).
    validate : bool, optional
        Run the value checks (see Raises). Default: only for CPU tensors; never while
        compiling or capturing a CUDA graph.

    Returns
    -------
    VerifyInputs
        ``input_ids`` int32 ``[B*(k+1)]``, ``positions`` int64 ``[B*(k+1)]``,
        ``query_start_loc`` int32 ``[B+1]``, ``seq_lens`` int32 ``[B]``,
        ``slot_mapping`` int64 ``[B*(k+1)]``, ``cu_num_draft_tokens`` int32 ``[B+1]``,
        ``flat_draft_token_ids`` int32 ``[B*k]``, all on the device of ``token_ids``.

    Raises
    ------
    ValueError
        Wrong dtype, device, ndim or shape; ``block_table`` or ``num_tokens`` not one row
        per row of ``token_ids``; ``block_size < 1``; ``max_model_len < 1``;
        ``L_max + k >= 2**31`` (int32 ``seq_lens``). With value
        checks: ``req_indices`` outside ``[-1, R)``; ``num_draft_tokens`` outside
        ``[0, k]`` or ``num_tokens`` outside ``[1, L_max]`` for a row in the batch.
    """
    token_ids = check_tensor("token_ids", token_ids, dtype=torch.int32, ndim=2)
    device = token_ids.device
    R, L_max = token_ids.shape
    num_tokens = check_tensor("num_tokens", num_tokens, dtype=torch.int32, ndim=1, device=device)
    check_shape("num_tokens", num_tokens, (R,), "one length per row of token_ids")
    draft_token_ids = check_tensor(
        "draft_token_ids", draft_token_ids, dtype=torch.int32, ndim=2, device=device
    )
    B, k = draft_token_ids.shape
    num_draft_tokens = check_tensor(
        "num_draft_tokens", num_draft_tokens, dtype=torch.int32, ndim=1, device=device
    )
    check_shape("num_draft_tokens", num_draft_tokens, (B,), "one count per row of draft_token_ids")
    block_table = check_tensor("block_table", block_table, dtype=torch.int32, ndim=2, device=device)
    if block_table.shape[0] != R:
        raise ValueError(
            f"block_table must have {R} rows (one per row of token_ids), "
            f"got shape {tuple(block_table.shape)}"
        )
    _check_req_indices(req_indices, "len(draft_token_ids)", B, R, device)
    check_int("block_size", block_size, min_value=1)
    check_int("max_model_len", max_model_len, min_value=1)
    if L_max + k > _INT32_MAX:
        raise ValueError(
            f"token_ids.shape[1] + k must be <= {_INT32_MAX} so that seq_lens (int32, up to "
            f"L + k) cannot overflow, got {L_max} + {k}"
        )

    if should_check_values(
        [token_ids, num_tokens, draft_token_ids, num_draft_tokens, block_table, req_indices],
        validate,
    ):
        check_req_indices_values(req_indices, R)
        live = torch.arange(B) if req_indices is None else (req_indices >= 0).nonzero()[:, 0]
        check_value_range(
            "num_draft_tokens", num_draft_tokens[live], 0, k, "k = draft_token_ids.shape[1]"
        )
        rows = _batch_rows(req_indices, B)
        check_value_range(
            "num_tokens",
            num_tokens[rows],
            1,
            L_max,
            "rows in the batch; L_max = token_ids.shape[1]",
        )

    outs = torch.ops.specdec.prepare_verify_inputs(
        token_ids,
        num_tokens.contiguous(),
        draft_token_ids,
        num_draft_tokens.contiguous(),
        block_table,
        None if req_indices is None else req_indices.contiguous(),
        block_size,
        max_model_len,
    )
    return VerifyInputs(*outs)


def commit_accepted_tokens(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    output_token_ids: torch.Tensor,
    num_emitted: torch.Tensor,
    req_indices: torch.Tensor | None = None,
    *,
    stop_token_ids: torch.Tensor | None = None,
    num_prompt_tokens: torch.Tensor | None = None,
    min_tokens: torch.Tensor | None = None,
    max_tokens: torch.Tensor | None = None,
    max_model_len: int,
    num_computed_tokens: torch.Tensor | None = None,
    validate: bool | None = None,
) -> CommitResult:
    """Append each request's emitted tokens to its history in place, with stop and length rules.

    Request ``b`` (state row ``r = req_indices[b]``) appends ``output_token_ids[b, j]`` for
    ``j = 0, 1, ..`` to ``token_ids[r, num_tokens[r]:]`` and stops after the first of:

    - ``num_emitted[b]`` tokens, or the first negative entry (``PLACEHOLDER = -1``, never
      committed);
    - a stop token: ``output_token_ids[b, j]`` in ``stop_token_ids[b]`` at output index
      ``o >= min_tokens[b]``, where ``o = num_tokens - num_prompt_tokens`` counted before
      appending it; the stop token is committed and the request finishes with reason 1;
    - the length budget: ``max_tokens[b]`` output tokens or ``max_model_len`` tokens in
      total; the request finishes with reason 2. A stop token on the token that fills the
      budget wins (reason 1).

    A row already at its budget commits nothing and finishes with reason 2; otherwise a row
    with ``num_emitted >= 1`` (and a non-negative first token) commits at least one token.
    ``num_tokens[r]`` (and ``num_computed_tokens[r]`` if given) advance by the committed
    count; nothing is ever written past a row's end; padding rows and rows not in the batch
    are untouched. These are the stop rules of vLLM's ``check_stop`` and Hugging Face's
    ``max_new_tokens`` / ``min_new_tokens``, applied to a block of speculative tokens.
    No host synchronisation; calls ``torch.ops.specdec.commit_accepted_tokens``, whose
    schema marks ``token_ids``, ``num_tokens`` and ``num_computed_tokens`` as mutated.

    Parameters
    ----------
    token_ids : torch.Tensor
        int32 ``[R, L_max]``, the persistent token history; mutated in place. Any strides.
    num_tokens : torch.Tensor
        int32 ``[R]``, the history lengths; mutated in place. Any stride.
    output_token_ids : torch.Tensor
        int32 ``[B, k+1]``, the emitted tokens (``rejection_sample``), -1 padded.
    num_emitted : torch.Tensor
        int32 ``[B]``, in ``[0, k+1]``.
    req_indices : torch.Tensor, optional
        int32 ``[B]``, unique state rows, -1 = padding row. Default ``arange(B)`` (``B <= R``).
    stop_token_ids : torch.Tensor, optional
        int32 ``[B, S]``, stop (and EOS) token ids of each batch row, -1 padded (-1 never
        matches).
    num_prompt_tokens : torch.Tensor, optional
        int32 ``[R]``, prompt length of each state row; needed by ``min_tokens`` and
        ``max_tokens``.
    min_tokens : torch.Tensor, optional
        int32 ``[B]``, ``>= 0``: stop tokens at output index ``o < min_tokens`` do not count
        (a safety net; an engine that must never emit them masks their logits).
    max_tokens : torch.Tensor, optional
        int32 ``[B]``, ``>= 0``, the output-token budget of each batch row.
    max_model_len : int
        Total-length budget, ``1 <= max_model_len <= L_max``.
    num_computed_tokens : torch.Tensor, optional
        int32 ``[R]``, advanced by the committed count in place. Any stride.
    validate : bool, optional
        Run the value checks (see Raises). Default: only for CPU tensors; never while
        compiling or capturing a CUDA graph.

    Returns
    -------
    CommitResult
        ``num_committed`` int32 ``[B]``, ``finished`` bool ``[B]``, ``finish_reason`` int8
        ``[B]`` (0 running, 1 stop, 2 length; 0 for padding rows).

    Raises
    ------
    ValueError
        Wrong dtype, device, ndim or shape; ``max_model_len`` outside ``[1, L_max]``;
        ``min_tokens`` or ``max_tokens`` without ``num_prompt_tokens``. With value checks:
        ``req_indices`` outside ``[-1, R)`` or repeated; ``num_emitted`` outside
        ``[0, k+1]``; for rows in the batch ``num_tokens`` outside ``[0, L_max]`` or
        ``num_prompt_tokens`` outside ``[0, num_tokens]``; negative ``min_tokens`` or
        ``max_tokens``.
    """
    token_ids = check_tensor("token_ids", token_ids, dtype=torch.int32, ndim=2)
    device = token_ids.device
    R, L_max = token_ids.shape
    num_tokens = check_tensor("num_tokens", num_tokens, dtype=torch.int32, ndim=1, device=device)
    check_shape("num_tokens", num_tokens, (R,), "one length per row of token_ids")
    output_token_ids = check_tensor(
        "output_token_ids", output_token_ids, dtype=torch.int32, ndim=2, device=device
    )
    B, k1 = output_token_ids.shape
    if k1 < 1:
        raise ValueError(f"output_token_ids must have shape (B, k+1) with k+1 >= 1, got {(B, k1)}")
    num_emitted = check_tensor("num_emitted", num_emitted, dtype=torch.int32, ndim=1, device=device)
    check_shape("num_emitted", num_emitted, (B,), "one count per row of output_token_ids")
    _check_req_indices(req_indices, "len(output_token_ids)", B, R, device)
    i32 = torch.int32
    stop_token_ids = _optional("stop_token_ids", stop_token_ids, dtype=i32, ndim=2, device=device)
    if stop_token_ids is not None and stop_token_ids.shape[0] != B:
        raise ValueError(
            f"stop_token_ids must have shape ({B}, S) (one row per batch row), "
            f"got {tuple(stop_token_ids.shape)}"
        )
    per_state = {"num_prompt_tokens": num_prompt_tokens, "num_computed_tokens": num_computed_tokens}
    for name, t in per_state.items():
        if t is not None:
            check_tensor(name, t, dtype=i32, ndim=1, device=device)
            check_shape(name, t, (R,), "one entry per row of token_ids")
    for name, t in {"min_tokens": min_tokens, "max_tokens": max_tokens}.items():
        if t is not None:
            check_tensor(name, t, dtype=i32, ndim=1, device=device)
            check_shape(name, t, (B,), "one entry per batch row")
            if num_prompt_tokens is None:
                raise ValueError(
                    f"{name} counts output tokens, so it needs num_prompt_tokens (got None)"
                )
    check_int("max_model_len", max_model_len, min_value=1)
    if max_model_len > L_max:
        raise ValueError(
            f"max_model_len must be <= token_ids.shape[1] ({L_max}) so that no row is written "
            f"past its end, got {max_model_len}"
        )

    tensors = [
        token_ids,
        num_tokens,
        output_token_ids,
        num_emitted,
        req_indices,
        stop_token_ids,
        num_prompt_tokens,
        min_tokens,
        max_tokens,
        num_computed_tokens,
    ]
    if should_check_values(tensors, validate):
        check_req_indices_values(req_indices, R, unique=True)
        check_value_range("num_emitted", num_emitted, 0, k1, "k+1 = output_token_ids.shape[1]")
        rows = _batch_rows(req_indices, B)
        check_value_range(
            "num_tokens",
            num_tokens[rows],
            0,
            L_max,
            "rows in the batch; L_max = token_ids.shape[1]",
        )
        if num_prompt_tokens is not None and rows.numel():
            over = num_prompt_tokens[rows] - num_tokens[rows]
            if int(num_prompt_tokens[rows].min()) < 0 or int(over.max()) > 0:
                raise ValueError(
                    "num_prompt_tokens must lie in [0, num_tokens] for the rows in the batch"
                )
        for name, t in {"min_tokens": min_tokens, "max_tokens": max_tokens}.items():
            if t is not None and t.numel() and int(t.min()) < 0:
                raise ValueError(f"{name} must be >= 0, got {int(t.min())}")

    def contiguous(t):
        return None if t is None else t.contiguous()

    outs = torch.ops.specdec.commit_accepted_tokens(
        token_ids,
        num_tokens,
        output_token_ids,
        contiguous(num_emitted),
        contiguous(req_indices),
        stop_token_ids,
        contiguous(num_prompt_tokens),
        contiguous(min_tokens),
        contiguous(max_tokens),
        max_model_len,
        num_computed_tokens,
    )
    return CommitResult(*outs)
