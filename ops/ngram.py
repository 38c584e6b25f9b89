"""``ngram_propose``: batched n-gram (prompt lookup) drafting on the device."""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec_kernels.cpu import ngram as _cpu
from specdec_kernels.ops._library import define
from specdec_kernels.ops._validation import (
    check_int,
    check_req_indices_values,
    check_shape,
    check_tensor,
    check_token_state,
    check_value_range,
    should_check_values,
)

TIE_BREAKS = ("first", "last")


class NgramProposal(NamedTuple):
    """Draft tokens proposed by :func:`ngram_propose`."""

    draft_token_ids: torch.Tensor
    """int32 ``[B, k]``: the drafts of batch row ``b`` in ``[b, :num_draft_tokens[b]]``, then -1."""
    num_draft_tokens: torch.Tensor
    """int32 ``[B]``: how many drafts row ``b`` got, in ``[0, k]``."""
    match_len: torch.Tensor
    """int32 ``[B]``: the ``n`` of the n-gram whose continuation became the drafts, in
    ``[min_n, max_n]``; 0 for a row that got no draft."""


def _fake(
    token_ids,
    num_tokens,
    req_indices,
    max_draft_tokens,
    *,
    min_n,
    max_n,
    num_speculative_tokens,
    max_model_len,
    tie_break,
):
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    return (
        token_ids.new_empty((B, num_speculative_tokens), dtype=torch.int32),
        token_ids.new_empty((B,), dtype=torch.int32),
        token_ids.new_empty((B,), dtype=torch.int32),
    )


define(
    "ngram_propose(Tensor token_ids, Tensor num_tokens, Tensor? req_indices, "
    "Tensor? max_draft_tokens, *, int min_n, int max_n, int num_speculative_tokens, "
    "int? max_model_len, str tie_break) -> (Tensor, Tensor, Tensor)",
    cpu=_cpu.ngram_propose,
    cuda="specdec_kernels.kernels.ngram:ngram_propose",
    fake=_fake,
)


def ngram_propose(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    req_indices: torch.Tensor | None = None,
    *,
    min_n: int,
    max_n: int,
    num_speculative_tokens: int,
    max_model_len: int | None = None,
    max_draft_tokens: torch.Tensor | None = None,
    tie_break: str = "first",
    validate: bool | None = None,
) -> NgramProposal:
    """Propose draft tokens by matching each request's newest n-gram against its history.

    Prompt lookup decoding (Saxena, 2023), with the semantics of vLLM's n-gram proposer
    and Hugging Face's ``prompt_lookup_num_tokens``: for request ``b`` with history
    ``seq = token_ids[r, :L]`` (``r = req_indices[b]``, ``L = num_tokens[r]``), try
    ``n = max_n, max_n-1, ..., min_n`` and take the first ``n`` for which the suffix
    ``seq[L-n:L]`` occurs at some start ``i`` with ``0 <= i <= L-n-1`` (the window may
    overlap the suffix but must be followed by at least one token). Among the starts of
    that ``n``, ``tie_break="first"`` picks the smallest ``i`` (vLLM's CPU proposer, HF)
    and ``"last"`` the largest (most recent). The drafts are ``seq[i+n : i+n+m]`` with
    ``m = min(k, max_draft_tokens[b], L-(i+n), max_model_len-L)``, clamped at 0.

    Runs on the device with no host synchronisation; output shapes depend only on input
    shapes and Python ints, so the call can be captured in a CUDA graph and traced by
    ``torch.compile(fullgraph=True)``. Calls ``torch.ops.specdec.ngram_propose``.

    Parameters
    ----------
    token_ids : torch.Tensor
        int32 ``[R, L_max]``, the persistent token history (prompt + committed output) of
        every state row; entries at or past ``num_tokens[r]`` are ignored. Rows that no
        ``req_indices`` entry names are never read. Any strides.
    num_tokens : torch.Tensor
        int32 ``[R]``, the history length ``L`` of each state row, ``0 <= L <= L_max``.
    req_indices : torch.Tensor, optional
        int32 ``[B]``, the state row ``r`` of batch row ``b`` (vLLM's ``idx_mapping``);
        ``-1`` marks a padding row of a static batch, which gets 0 drafts. Default
        ``arange(R)``.
    min_n, max_n : int
        The n-gram lengths tried, ``1 <= min_n <= max_n``; the longest match wins.
    num_speculative_tokens : int
        ``k >= 0``, the number of draft slots per request (static); ``k = 0`` returns
        ``[B, 0]`` drafts, so plain decoding runs through the same ops.
    max_model_len : int, optional
        Drafts never take a request past this many tokens (``m <= max_model_len - L``).
        ``None``: no such cap.
    max_draft_tokens : torch.Tensor, optional
        int32 ``[B]``, a per-request cap on the drafts (dynamic k); 0 disables the row.
    tie_break : {"first", "last"}
        Which matching window wins among those of the longest ``n``.
    validate : bool, optional
        Run the value checks (see Raises). Default: only for CPU tensors. Never while
        compiling or capturing a CUDA graph.

    Returns
    -------
    NgramProposal
        ``draft_token_ids`` int32 ``[B, k]`` padded with -1 (``PLACEHOLDER``),
        ``num_draft_tokens`` int32 ``[B]`` and ``match_len`` int32 ``[B]`` (the ``n`` of
        the winning n-gram, 0 for a row without drafts: a signal of how far the drafts can
        be trusted, e.g. for ``plan_draft_lengths``), on the device of ``token_ids``.

    Raises
    ------
    ValueError
        Wrong dtype, device, ndim or shape of any tensor; ``min_n < 1``,
        ``min_n > max_n``, ``num_speculative_tokens < 0``, ``max_model_len < 1``, an
        unknown ``tie_break``. With value checks: ``req_indices`` outside ``[-1, R)``,
        ``num_tokens`` of a batch row's state row outside ``[0, L_max]``,
        ``max_draft_tokens < 0``.
    """
    token_ids, num_tokens = check_token_state(token_ids, num_tokens)
    device = token_ids.device
    R, L_max = token_ids.shape
    B = R
    if req_indices is not None:
        req_indices = check_tensor(
            "req_indices", req_indices, dtype=torch.int32, ndim=1, device=device
        )
        B = req_indices.shape[0]
    if max_draft_tokens is not None:
        max_draft_tokens = check_tensor(
            "max_draft_tokens", max_draft_tokens, dtype=torch.int32, ndim=1, device=device
        )
        check_shape("max_draft_tokens", max_draft_tokens, (B,), "one cap per batch row")
    check_int("min_n", min_n, min_value=1)
    check_int("max_n", max_n, min_value=1)
    if min_n > max_n:
        raise ValueError(f"min_n must be <= max_n, got min_n={min_n}, max_n={max_n}")
    check_int("num_speculative_tokens", num_speculative_tokens, min_value=0)
    if max_model_len is not None:
        check_int("max_model_len", max_model_len, min_value=1)
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"tie_break must be one of {TIE_BREAKS}, got {tie_break!r}")

    if should_check_values([token_ids, num_tokens, req_indices, max_draft_tokens], validate):
        check_req_indices_values(req_indices, R, what="rows of token_ids")
        # only the rows in the batch are read, so only they must be consistent
        lengths = num_tokens if req_indices is None else num_tokens[req_indices[req_indices >= 0]]
        check_value_range(
            "num_tokens", lengths, 0, L_max, "token_ids.shape[1], for the rows in the batch"
        )
        if max_draft_tokens is not None and max_draft_tokens.numel():
            if int(max_draft_tokens.min()) < 0:
                raise ValueError(
                    f"max_draft_tokens must be >= 0, got {int(max_draft_tokens.min())}"
                )

    drafts, counts, match_len = torch.ops.specdec.ngram_propose(
        token_ids,
        num_tokens.contiguous(),
        None if req_indices is None else req_indices.contiguous(),
        None if max_draft_tokens is None else max_draft_tokens.contiguous(),
        min_n=min_n,
        max_n=max_n,
        num_speculative_tokens=num_speculative_tokens,
        max_model_len=max_model_len,
        tie_break=tie_break,
    )
    return NgramProposal(drafts, counts, match_len)
