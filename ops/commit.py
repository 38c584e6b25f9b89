"""``commit_accepted_tokens``: append the emitted tokens to each request, with stop rules.

What an engine runs after verification: the accepted drafts and the recovered or bonus
token join the persistent history in place, cut at stop tokens and length budgets, on the
device with static shapes (``docs/design.md``, the op's contract).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec_kernels.cpu import commit as _cpu
from specdec_kernels.ops._library import call, define
from specdec_kernels.ops._validation import (
    check_int,
    check_optional_tensor,
    check_req_indices,
    check_req_indices_values,
    check_rows_range,
    check_shape,
    check_tensor,
    check_token_state,
    check_value_range,
    rows_stats,
    should_check_values,
)


class CommitResult(NamedTuple):
    """What :func:`commit_accepted_tokens` did to each batch row."""

    num_committed: torch.Tensor
    """int32 ``[B]``: tokens appended to the row (0 for padding rows)."""
    finished: torch.Tensor
    """bool ``[B]``: the request ended this step (``finish_reason != 0``)."""
    finish_reason: torch.Tensor
    """int8 ``[B]``: 0 running, 1 stop token, 2 length budget."""


def _commit_fake(
    token_ids, num_tokens, output_token_ids, num_emitted, req_indices, stop_token_ids,
    num_prompt_tokens, min_tokens, max_tokens, num_computed_tokens, *, max_model_len,
):  # fmt: skip
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
    "Tensor? max_tokens, Tensor(c!)? num_computed_tokens, *, int max_model_len) "
    "-> (Tensor, Tensor, Tensor)",
    cpu=_cpu.commit_accepted_tokens,
    cuda="specdec_kernels.kernels.commit:commit_accepted_tokens",
    fake=_commit_fake,
)


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

    Request ``b`` appends ``output_token_ids[b, :num_emitted[b]]`` to state row
    ``req_indices[b]`` up to the first -1, the first counted stop token (committed) or its
    length budget, whichever comes first: vLLM's ``check_stop`` and Hugging Face's
    ``max_new_tokens`` / ``min_new_tokens`` on a block of speculative tokens. Nothing is
    written past a row's end; padding rows and rows outside the batch are untouched. No
    host synchronisation (``torch.ops.specdec.commit_accepted_tokens``; ``token_ids``,
    ``num_tokens`` and ``num_computed_tokens`` are ``Tensor(a!)``). Contract:
    ``docs/design.md``, "``commit_accepted_tokens``".

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

    Examples
    --------
    >>> token_ids = torch.zeros((1, 8), dtype=torch.int32)
    >>> num_tokens = torch.tensor([3], dtype=torch.int32)
    >>> res = commit_accepted_tokens(token_ids, num_tokens,
    ...                              torch.tensor([[5, 2, 7]], dtype=torch.int32),
    ...                              torch.tensor([3], dtype=torch.int32),
    ...                              stop_token_ids=torch.tensor([[2]], dtype=torch.int32),
    ...                              max_model_len=8)
    >>> token_ids[0, :num_tokens[0]].tolist(), res.finish_reason.tolist()  # 2 stops it
    ([0, 0, 0, 5, 2], [1])
    """
    token_ids, num_tokens = check_token_state(token_ids, num_tokens)
    device = token_ids.device
    R, L_max = token_ids.shape
    output_token_ids = check_tensor(
        "output_token_ids", output_token_ids, dtype=torch.int32, ndim=2, device=device
    )
    B, k1 = output_token_ids.shape
    if k1 < 1:
        raise ValueError(f"output_token_ids must have shape (B, k+1) with k+1 >= 1, got {(B, k1)}")
    num_emitted = check_tensor("num_emitted", num_emitted, dtype=torch.int32, ndim=1, device=device)
    check_shape("num_emitted", num_emitted, (B,), "one count per row of output_token_ids")
    check_req_indices(req_indices, "len(output_token_ids)", B, R, device)
    i32 = torch.int32
    stop_token_ids = check_optional_tensor(
        "stop_token_ids", stop_token_ids, dtype=i32, ndim=2, device=device
    )
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
        what = "rows in the batch; L_max = token_ids.shape[1]"
        check_rows_range("num_tokens", num_tokens, req_indices, B, 0, L_max, what)
        if num_prompt_tokens is not None:
            n, lo, _, _, over = rows_stats(num_prompt_tokens, req_indices, B, other=num_tokens)
            if n and (lo < 0 or over > 0):
                raise ValueError(
                    "num_prompt_tokens must lie in [0, num_tokens] for the rows in the batch"
                )
        for name, t in {"min_tokens": min_tokens, "max_tokens": max_tokens}.items():
            if t is not None and t.numel() and int(t.min()) < 0:
                raise ValueError(f"{name} must be >= 0, got {int(t.min())}")

    def contiguous(t):
        return None if t is None else t.contiguous()

    outs = call(
        "commit_accepted_tokens",
        token_ids=token_ids,
        num_tokens=num_tokens,
        output_token_ids=output_token_ids,
        num_emitted=contiguous(num_emitted),
        req_indices=contiguous(req_indices),
        stop_token_ids=stop_token_ids,
        num_prompt_tokens=contiguous(num_prompt_tokens),
        min_tokens=contiguous(min_tokens),
        max_tokens=contiguous(max_tokens),
        num_computed_tokens=num_computed_tokens,
        max_model_len=max_model_len,
    )
    return CommitResult(*outs)
