"""``compute_slot_mapping`` and ``prepare_verify_inputs``: the verify step's model inputs.

What an engine runs between drafting and the model forward: the packed query of every
request and the KV-cache slot of each of its tokens, on the device with static shapes
(``docs/design.md``, the contracts of both ops). The KV layout is paged (a block table,
as vLLM's PagedAttention) or, with ``block_table=None``, contiguous per request (slot
``r * max_model_len + pos``, what an engine with one preallocated cache row per request
has).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec_kernels.cpu import verify_inputs as _cpu
from specdec_kernels.ops._library import call, define
from specdec_kernels.ops._validation import (
    check_int,
    check_req_indices,
    check_req_indices_values,
    check_rows_range,
    check_shape,
    check_tensor,
    check_token_state,
    check_value_range,
    should_check_values,
)

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


def _slot_fake(block_table, positions, query_start_loc, req_indices, *, block_size, max_model_len):
    return positions.new_empty(positions.shape, dtype=torch.int64)


define(
    "compute_slot_mapping(Tensor? block_table, Tensor positions, Tensor query_start_loc, "
    "Tensor? req_indices, *, int block_size, int? max_model_len) -> Tensor",
    cpu=_cpu.compute_slot_mapping,
    cuda="specdec_kernels.kernels.verify_inputs:compute_slot_mapping",
    fake=_slot_fake,
)


def _verify_fake(
    token_ids, num_tokens, draft_token_ids, num_draft_tokens, block_table, req_indices, *,
    block_size, max_model_len,
):  # fmt: skip
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
    "Tensor num_draft_tokens, Tensor? block_table, Tensor? req_indices, *, int block_size, "
    "int max_model_len) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    cpu=_cpu.prepare_verify_inputs,
    cuda="specdec_kernels.kernels.verify_inputs:prepare_verify_inputs",
    fake=_verify_fake,
)


def compute_slot_mapping(
    block_table: torch.Tensor | None,
    positions: torch.Tensor,
    query_start_loc: torch.Tensor,
    req_indices: torch.Tensor | None = None,
    *,
    block_size: int | None = None,
    max_model_len: int | None = None,
    validate: bool | None = None,
) -> torch.Tensor:
    """Map every query token to its KV-cache slot, paged (vLLM's PagedAttention layout,
    Kwon et al., 2023) or contiguous per state row (``block_table=None``), ``PAD_SLOT``
    where nothing may be written. The block table is never read out of bounds. No host
    synchronisation (``torch.ops.specdec.compute_slot_mapping``). Contract:
    ``docs/design.md``, "``compute_slot_mapping``".

    Parameters
    ----------
    block_table : torch.Tensor or None
        int32 ``[R, max_blocks]``, the KV-cache block ids of each state row; negative ids
        mark unallocated blocks. Any strides. ``None``: the contiguous layout.
    positions : torch.Tensor
        int64 or int32 ``[T]``, the position of each query token in its sequence.
    query_start_loc : torch.Tensor
        int32 ``[B+1]``, non-decreasing, ``0 <= query_start_loc[0]`` and
        ``query_start_loc[B] <= T`` (entries past it are padding).
    req_indices : torch.Tensor, optional
        int32 ``[B]``, the state row of each batch row; -1 marks a padding row (all its
        tokens get -1). Default ``arange(B)`` (then ``B <= R``).
    block_size : int
        Tokens per KV-cache block, ``>= 1``; required with a block table, ignored without.
    max_model_len : int, optional
        Positions at or past it get -1; required without a block table (it is the
        stride of a state row's slots). ``None``: no such cap.
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
        Wrong dtype, device, ndim or shape; ``block_size`` missing or ``< 1`` with a block
        table; ``max_model_len`` missing without one, or ``< 1``. With value checks:
        ``query_start_loc`` decreasing, negative or past ``T``; ``req_indices`` outside
        ``[-1, R)``.

    Examples
    --------
    >>> block_table = torch.tensor([[7, 3]], dtype=torch.int32)  # one request, two blocks
    >>> compute_slot_mapping(block_table, torch.tensor([3, 4]),
    ...                      torch.tensor([0, 2], dtype=torch.int32), block_size=4).tolist()
    [31, 12]
    """
    positions = check_tensor("positions", positions, dtype=(torch.int64, torch.int32), ndim=1)
    device = positions.device
    block_table = _check_block_table(block_table, None, device)
    query_start_loc = check_tensor(
        "query_start_loc", query_start_loc, dtype=torch.int32, ndim=1, device=device
    )
    if query_start_loc.shape[0] < 1:
        raise ValueError("query_start_loc must have shape (B+1,) with B >= 0, got shape (0,)")
    B = query_start_loc.shape[0] - 1
    R = None if block_table is None else block_table.shape[0]
    check_req_indices(req_indices, "len(query_start_loc) - 1", B, R, device)
    block_size = _check_layout(block_table, block_size, max_model_len, required_len=False)

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

    return call(
        "compute_slot_mapping",
        block_table=block_table,
        positions=positions.contiguous(),
        query_start_loc=query_start_loc.contiguous(),
        req_indices=None if req_indices is None else req_indices.contiguous(),
        block_size=block_size,
        max_model_len=max_model_len,
    )


def _check_block_table(
    block_table: torch.Tensor | None, R: int | None, device: torch.device
) -> torch.Tensor | None:
    """Check an optional block table (int32 ``[R, max_blocks]``, ``R`` rows if known)."""
    if block_table is None:
        return None
    block_table = check_tensor("block_table", block_table, dtype=torch.int32, ndim=2, device=device)
    if R is not None and block_table.shape[0] != R:
        raise ValueError(
            f"block_table must have {R} rows (one per row of token_ids), "
            f"got shape {tuple(block_table.shape)}"
        )
    return block_table


def _check_layout(block_table, block_size, max_model_len, *, required_len: bool) -> int:
    """Check the KV layout's ints; returns the block size the op receives (1 if unused)."""
    if max_model_len is not None or required_len:
        check_int("max_model_len", max_model_len, min_value=1)
    if block_table is None:
        if max_model_len is None:
            raise ValueError(
                "max_model_len is required without a block_table (the contiguous KV layout "
                "puts state row r at slots r * max_model_len ...)"
            )
        if max_model_len > 2**32:  # int32 rows times this stride must fit the int64 slots
            raise ValueError(
                f"max_model_len must be <= 2**32 without a block_table (slots r * "
                f"max_model_len + pos are int64), got {max_model_len}"
            )
        if block_size is not None:
            check_int("block_size", block_size, min_value=1)
        return 1
    if block_size is None:
        raise ValueError("block_size is required with a block_table (tokens per KV block)")
    return check_int("block_size", block_size, min_value=1)


def prepare_verify_inputs(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    block_table: torch.Tensor | None,
    req_indices: torch.Tensor | None = None,
    *,
    block_size: int | None = None,
    max_model_len: int,
    validate: bool | None = None,
) -> VerifyInputs:
    """Pack the verify-step query of every request, ``[last token, d_0 .. d_{k_b-1}]``,
    into static-size model inputs laid out as ``rejection_sample`` expects (vLLM V1's
    speculative decoding step): ids, positions, slots, ``query_start_loc``, ``seq_lens``,
    the exclusive ``cu_num_draft_tokens`` and the flat drafts. ``k = 0`` is plain
    decoding. No host synchronisation (``torch.ops.specdec.prepare_verify_inputs``).
    Contract: ``docs/design.md``, "``prepare_verify_inputs``".

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
    block_table : torch.Tensor or None
        int32 ``[R, max_blocks]``, KV-cache block ids per state row (see
        :func:`compute_slot_mapping`). Any strides. ``None``: a contiguous KV cache per
        state row, slot ``r * max_model_len + pos``.
    req_indices : torch.Tensor, optional
        int32 ``[B]``, state row of each batch row, -1 = padding. Default ``arange(B)``
        (then ``B <= R``).
    block_size : int
        Tokens per KV-cache block, ``>= 1``; required with a block table, ignored without.
    max_model_len : int
        Positions at or past it get slot -1 (a drafter that respects it never makes any);
        the stride of a state row's slots without a block table.
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
        per row of ``token_ids``; ``block_size`` missing or ``< 1`` with a block table;
        ``max_model_len < 1``;
        ``L_max + k >= 2**31`` (int32 ``seq_lens``). With value
        checks: ``req_indices`` outside ``[-1, R)``; ``num_draft_tokens`` outside
        ``[0, k]`` or ``num_tokens`` outside ``[1, L_max]`` for a row in the batch.

    Examples
    --------
    >>> token_ids = torch.tensor([[4, 5, 6, 0]], dtype=torch.int32)
    >>> vi = prepare_verify_inputs(token_ids, torch.tensor([3], dtype=torch.int32),
    ...                            torch.tensor([[8, 9]], dtype=torch.int32),
    ...                            torch.tensor([1], dtype=torch.int32), None, max_model_len=4)
    >>> vi.input_ids.tolist(), vi.positions.tolist(), vi.cu_num_draft_tokens.tolist()
    ([6, 8, 0], [2, 3, 0], [0, 1])
    """
    token_ids, num_tokens = check_token_state(token_ids, num_tokens)
    device = token_ids.device
    R, L_max = token_ids.shape
    draft_token_ids = check_tensor(
        "draft_token_ids", draft_token_ids, dtype=torch.int32, ndim=2, device=device
    )
    B, k = draft_token_ids.shape
    num_draft_tokens = check_tensor(
        "num_draft_tokens", num_draft_tokens, dtype=torch.int32, ndim=1, device=device
    )
    check_shape("num_draft_tokens", num_draft_tokens, (B,), "one count per row of draft_token_ids")
    block_table = _check_block_table(block_table, R, device)
    check_req_indices(req_indices, "len(draft_token_ids)", B, R, device)
    block_size = _check_layout(block_table, block_size, max_model_len, required_len=True)
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
        what = "rows in the batch; L_max = token_ids.shape[1]"
        check_rows_range("num_tokens", num_tokens, req_indices, B, 1, L_max, what)

    outs = call(
        "prepare_verify_inputs",
        token_ids=token_ids,
        num_tokens=num_tokens.contiguous(),
        draft_token_ids=draft_token_ids,
        num_draft_tokens=num_draft_tokens.contiguous(),
        block_table=block_table,
        req_indices=None if req_indices is None else req_indices.contiguous(),
        block_size=block_size,
        max_model_len=max_model_len,
    )
    return VerifyInputs(*outs)


def exclusive_cu_num_draft_tokens(cu_inclusive: torch.Tensor) -> torch.Tensor:
    """Convert vLLM V1's inclusive ``cu_num_draft_tokens`` ``[B]`` to this library's
    exclusive ``[B+1]`` (a leading 0). One ``torch.cat`` on the device, no host
    synchronisation. Contract: ``docs/design.md``, "Helpers".

    Parameters
    ----------
    cu_inclusive : torch.Tensor
        int32 or int64 ``[B]``, the inclusive prefix sum of the draft counts.

    Returns
    -------
    torch.Tensor
        int32 ``[B+1]``, ``[0, cu_inclusive[0], .., cu_inclusive[B-1]]``, on the same device.

    Raises
    ------
    ValueError
        ``cu_inclusive`` is not a 1-D int32/int64 tensor.

    Examples
    --------
    >>> exclusive_cu_num_draft_tokens(torch.tensor([2, 2, 5])).tolist()  # k_b = 2, 0, 3
    [0, 2, 2, 5]
    """
    cu_inclusive = check_tensor(
        "cu_inclusive", cu_inclusive, dtype=(torch.int32, torch.int64), ndim=1
    )
    zero = cu_inclusive.new_zeros((1,), dtype=torch.int32)
    return torch.cat([zero, cu_inclusive.to(torch.int32)])
