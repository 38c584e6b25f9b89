"""The own-history n-gram index: ``new_ngram_index``, ``ngram_index_build``, ``ngram_index_extend``.

An index replaces ``ngram_propose``'s rescan of every history with one table lookup per
request and n, kept up to date with the tokens each step commits. Contract:
``docs/design.md``, "Own-history n-gram index".
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from specdec_kernels.constants import SCORINGS
from specdec_kernels.cpu import ngram_index as _cpu
from specdec_kernels.ops._library import call, define_index_updates
from specdec_kernels.ops._memory import full
from specdec_kernels.ops._validation import (
    check_batch_lengths,
    check_int,
    check_n_range,
    check_req_indices,
    check_req_indices_values,
    check_shape,
    check_state_tensor,
    check_token_state,
    should_check_values,
)
from specdec_kernels.ops.frequency import (
    FrequencyIndex,
    check_frequency_index,
    new_frequency_index,
)


class NgramIndex(NamedTuple):
    """Per-request own-history n-gram index (made by :func:`new_ngram_index`)."""

    table: torch.Tensor
    """int32 ``[R, N, S, 2]``: per state row and ``n = min_n + j`` a linear-probing table of
    ``(first, last)`` starts, -1 = empty slot. Contiguous."""
    length: torch.Tensor
    """int32 ``[R]``: how many tokens of each row are indexed."""
    min_n: int
    max_n: int


define_index_updates("ngram_index", _cpu, ("ngram_index_build", "ngram_index_extend"))


def new_ngram_index(
    num_rows: int,
    max_model_len: int,
    *,
    min_n: int,
    max_n: int,
    slots: int | None = None,
    scoring: str = "longest",
    device: torch.device | str | None = None,
) -> NgramIndex | FrequencyIndex:
    """An empty own-history index for ``num_rows`` state rows of ``max_model_len`` tokens.

    ``scoring="longest"`` (an :class:`NgramIndex` for ``ngram_propose``'s default rule):
    ``slots`` (``S``) per row and n, ``S >= max_model_len`` (exact at any fill); default
    ``2 * max_model_len``. Memory ``R x (max_n - min_n + 1) x S x 8`` bytes; on a Linux CPU
    a table of 16 MiB or more goes on transparent huge pages. Contract: ``docs/design.md``,
    "Own-history n-gram index".

    ``scoring="frequency"`` (a :class:`FrequencyIndex` for ``ngram_propose(...,
    scoring="frequency")``): contexts of ``min_n .. max_n`` tokens, ``max_n`` (``D <=
    FREQUENCY_MAX_DEPTH``) also bounding a context plus its drafts; per row a trie of
    ``M = 2 * max_model_len + 1`` nodes (16 B each) and ``slots`` hash slots (12 B each; a
    power of two ``>= M``, default the smallest holding ``M`` keys at most 3/4 full):
    ~80 B a token. Exact at any fill. Contract: ``docs/design.md``, "Frequency-scored
    drafting".

    Raises
    ------
    ValueError
        ``num_rows < 0``, ``max_model_len < 1``, a bad n range, ``slots < max_model_len``,
        an unknown ``scoring``; for ``"frequency"``: ``max_n > FREQUENCY_MAX_DEPTH``,
        ``slots`` not a power of two ``>= 2 * max_model_len + 1``.

    Examples
    --------
    >>> index = new_ngram_index(2, 64, min_n=1, max_n=3)
    >>> tuple(index.table.shape), index.length.tolist()
    ((2, 3, 128, 2), [0, 0])
    """
    check_int("num_rows", num_rows, min_value=0)
    check_int("max_model_len", max_model_len, min_value=1)
    check_n_range(min_n, max_n)
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    if slots is not None:
        check_int("slots", slots, min_value=1)
    if scoring == "frequency":
        return new_frequency_index(
            num_rows, max_model_len, min_n=min_n, max_n=max_n, slots=slots, device=device
        )
    S = 2 * max_model_len if slots is None else slots
    if S < max_model_len:
        raise ValueError(f"slots must be >= max_model_len ({max_model_len}), got {S}")
    N = max_n - min_n + 1
    return NgramIndex(
        full((num_rows, N, S, 2), -1, dtype=torch.int32, device=device),
        torch.zeros((num_rows,), dtype=torch.int32, device=device),
        min_n,
        max_n,
    )


def check_index(index: object, token_ids: torch.Tensor) -> NgramIndex | FrequencyIndex:
    """An :class:`NgramIndex` whose tables fit ``token_ids`` (rows, ``S >= L_max``), or a
    :class:`FrequencyIndex` that fits them."""
    if isinstance(index, FrequencyIndex):
        return check_frequency_index(index, token_ids)
    if not isinstance(index, NgramIndex):
        raise ValueError(
            "index must be an NgramIndex or a FrequencyIndex (new_ngram_index), got "
            f"{type(index).__name__}"
        )
    min_n, max_n = index.min_n, index.max_n
    check_n_range(min_n, max_n)
    R, L_max = token_ids.shape
    device = token_ids.device
    table = check_state_tensor("index.table", index.table, dtype=torch.int32, ndim=4, device=device)
    N = max_n - min_n + 1
    rows, n_range, slots, pair = table.shape
    if rows != R or n_range != N or pair != 2:
        raise ValueError(
            f"index.table must have shape ({R}, {N}, S, 2) (rows of token_ids, max_n - min_n + 1), "
            f"got {tuple(table.shape)}"
        )
    if slots < max(L_max, 1):
        raise ValueError(
            f"index.table must have S >= token_ids.shape[1] ({L_max}) slots per row and n so "
            f"that it stays exact when full, got S = {slots}"
        )
    length = check_state_tensor(
        "index.length", index.length, dtype=torch.int32, ndim=1, device=device
    )
    if length.shape[0] != R:
        check_shape("index.length", length, (R,), "one length per row of token_ids")
    return index


def _checked(token_ids, num_tokens, req_indices, index, validate, *, extend):
    token_ids, num_tokens = check_token_state(token_ids, num_tokens)
    index = check_index(index, token_ids)
    R, L_max = token_ids.shape
    B = check_req_indices(req_indices, "the batch", None, R, token_ids.device)
    B = R if B is None else B
    value_checks = None
    if should_check_values([token_ids, num_tokens, req_indices, index.length], validate):
        value_checks = functools.partial(
            _check_values, num_tokens, req_indices, index, B, R, L_max, extend
        )
    rows = None if req_indices is None else req_indices.contiguous()
    if isinstance(index, FrequencyIndex):
        state = [index.keys, index.vals, index.nodes, index.num_nodes, index.length]
        return True, token_ids, num_tokens.contiguous(), rows, state, value_checks
    state = [index.table, index.length]
    return False, token_ids, num_tokens.contiguous(), rows, state, value_checks


def _check_values(num_tokens, req_indices, index, B, R, L_max, extend) -> None:
    """The value checks of :func:`ngram_index_build` / :func:`ngram_index_extend`."""
    check_req_indices_values(req_indices, R, unique=True, what="rows of token_ids")
    other = index.length if extend else None
    if check_batch_lengths(num_tokens, req_indices, B, L_max, other=other)[0] < 0:
        raise ValueError(
            "num_tokens must be >= index.length for the rows in the batch (histories only "
            "grow; rebuild a row with ngram_index_build when its tokens change)"
        )


def ngram_index_build(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    req_indices: torch.Tensor | None = None,
    *,
    index: NgramIndex | FrequencyIndex,
    validate: bool | None = None,
) -> None:
    """Index rows from scratch (admission, after prefill): every n-gram of
    ``token_ids[r, :num_tokens[r]]`` with a following token, ``r = req_indices[b]``.

    In place, no host synchronisation (``torch.ops.specdec.ngram_index_build``). Contract:
    ``docs/design.md``, "Own-history n-gram index".

    Parameters
    ----------
    token_ids : torch.Tensor
        int32 ``[R, L_max]``, the persistent token histories. Any strides.
    num_tokens : torch.Tensor
        int32 ``[R]``, history lengths, ``0 <= L <= L_max``.
    req_indices : torch.Tensor, optional
        int32 ``[B]``, the unique state rows to index; -1 = padding row (skipped). Default:
        every row.
    index : NgramIndex or FrequencyIndex
        The state (``new_ngram_index(R, L_max, ...)``), updated in place.
    validate : bool, optional
        Run the value checks (see Raises). Default: only for CPU tensors.

    Raises
    ------
    ValueError
        Wrong dtype, device, ndim or shape; ``index`` not matching ``token_ids`` (rows,
        n range, ``S < L_max``) or not contiguous. With value checks: ``req_indices``
        outside ``[-1, R)`` or repeated; ``num_tokens`` of a batch row outside ``[0, L_max]``.

    Examples
    --------
    >>> tokens = torch.tensor([[5, 6, 7, 5, 6]], dtype=torch.int32)
    >>> index = new_ngram_index(1, 5, min_n=2, max_n=2)
    >>> ngram_index_build(tokens, torch.tensor([5], dtype=torch.int32), index=index)
    >>> index.length.tolist()
    [5]
    """
    frequency, tok, lens, rows, state, value_checks = _checked(
        token_ids, num_tokens, req_indices, index, validate, extend=False
    )
    lo, hi = index.min_n, index.max_n
    call(
        "frequency_index_build" if frequency else "ngram_index_build",
        token_ids=tok,
        num_tokens=lens,
        req_indices=rows,
        index=state,
        min_n=lo,
        max_n=hi,
        value_checks=value_checks,
    )


def ngram_index_extend(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    req_indices: torch.Tensor | None = None,
    *,
    index: NgramIndex | FrequencyIndex,
    validate: bool | None = None,
) -> None:
    """Add the n-grams completed by the tokens committed since the last call (call it after
    ``commit_accepted_tokens``): O(new tokens x n range) per row, whatever the history length.

    In place, no host synchronisation (``torch.ops.specdec.ngram_index_extend``). Contract:
    ``docs/design.md``, "Own-history n-gram index".

    Parameters
    ----------
    token_ids, num_tokens, req_indices, index, validate
        As :func:`ngram_index_build`; ``num_tokens[r] >= index.length[r]`` (histories only
        grow: a row whose tokens change is rebuilt).

    Raises
    ------
    ValueError
        As :func:`ngram_index_build`; with value checks also ``num_tokens < index.length``
        for a batch row.

    Examples
    --------
    >>> tokens = torch.tensor([[5, 6, 7, 5, 6, 0]], dtype=torch.int32)
    >>> index = new_ngram_index(1, 6, min_n=2, max_n=2)
    >>> ngram_index_build(tokens, torch.tensor([3], dtype=torch.int32), index=index)
    >>> num_tokens = torch.tensor([5], dtype=torch.int32)  # "5 6" was committed
    >>> ngram_index_extend(tokens, num_tokens, index=index)  # the new n-grams: "7 5", "5 6"
    >>> from specdec_kernels.ops import ngram_propose
    >>> ngram_propose(tokens, num_tokens, min_n=2, max_n=2, num_speculative_tokens=2,
    ...               index=index).draft_token_ids.tolist()
    [[7, 5]]
    """
    frequency, tok, lens, rows, state, value_checks = _checked(
        token_ids, num_tokens, req_indices, index, validate, extend=True
    )
    lo, hi = index.min_n, index.max_n
    call(
        "frequency_index_extend" if frequency else "ngram_index_extend",
        token_ids=tok,
        num_tokens=lens,
        req_indices=rows,
        index=state,
        min_n=lo,
        max_n=hi,
        value_checks=value_checks,
    )
