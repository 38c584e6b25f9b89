"""``process_logits``: penalties, logit bias and masks for the verify rows, exact with drafts.

Row ``j`` of a request is processed as plain decoding processes the position after its
first ``j`` drafts (they count as output tokens), so coupled verification of the processed
logits emits what a ``k = 0`` loop with the same processing emits. The result goes to
``rejection_sample``; ``target_logits`` is not modified. Contract: ``docs/design.md``, op
``process_logits``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec_kernels.cpu import processing as _cpu
from specdec_kernels.ops._library import define
from specdec_kernels.ops._processing_args import prepare, processed_logits


def _fake(
    target_logits, draft_token_ids, cu_num_draft_tokens, token_ids, num_tokens,
    num_prompt_tokens, req_indices, repetition_penalty, frequency_penalty, presence_penalty,
    logit_bias_ids, logit_bias_values, allowed_token_mask, grammar_mask, bad_word_ids,
    min_tokens, stop_token_ids,
):  # fmt: skip
    _cpu.require_together(
        repetition_penalty, frequency_penalty, presence_penalty, logit_bias_ids,
        logit_bias_values, min_tokens, stop_token_ids,
    )  # fmt: skip
    return target_logits.new_empty(target_logits.shape, dtype=torch.float32)


define(
    "process_logits(Tensor target_logits, Tensor draft_token_ids, Tensor cu_num_draft_tokens, "
    "Tensor token_ids, Tensor num_tokens, Tensor num_prompt_tokens, Tensor? req_indices, "
    "Tensor? repetition_penalty, Tensor? frequency_penalty, Tensor? presence_penalty, "
    "Tensor? logit_bias_ids, Tensor? logit_bias_values, Tensor? allowed_token_mask, "
    "Tensor? grammar_mask, Tensor? bad_word_ids, Tensor? min_tokens, "
    "Tensor? stop_token_ids) -> Tensor",
    cpu=_cpu.process_logits,
    cuda="specdec_kernels.kernels.processing:process_logits",
    fake=_fake,
)


class LogitsProcessing(NamedTuple):
    """What :func:`process_logits` applies beyond the logits and drafts, as one value for
    ``rejection_sample(..., processing=LogitsProcessing(...))``, which verifies
    ``process_logits(target_logits, draft_token_ids, cu_num_draft_tokens, **processing)``
    (on plain CPU tensors in one pass that processes only the rows verification reads).
    Fields, meanings and checks: :func:`process_logits`' arguments of the same names."""

    token_ids: torch.Tensor
    num_tokens: torch.Tensor
    num_prompt_tokens: torch.Tensor
    req_indices: torch.Tensor | None = None
    repetition_penalty: torch.Tensor | None = None
    frequency_penalty: torch.Tensor | None = None
    presence_penalty: torch.Tensor | None = None
    logit_bias_ids: torch.Tensor | None = None
    logit_bias_values: torch.Tensor | None = None
    allowed_token_mask: torch.Tensor | None = None
    grammar_mask: torch.Tensor | None = None
    bad_word_ids: torch.Tensor | None = None
    min_tokens: torch.Tensor | None = None
    stop_token_ids: torch.Tensor | None = None


def token_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """Pack a bool mask ``[..., V]`` (True: allowed) into the int32 bitmask
    ``[..., ceil(V / 32)]`` that :func:`process_logits` takes (token ``t`` at bit ``t % 32``
    of word ``t // 32``, xgrammar's layout), on the mask's device, no host sync. Temporaries:
    one byte per token. Contract: ``docs/design.md``, "Helpers".

    Parameters
    ----------
    allowed : torch.Tensor
        bool ``[..., V]``, ``V >= 1``; True marks an allowed token.

    Returns
    -------
    torch.Tensor
        int32 ``[..., ceil(V / 32)]``; the bits past ``V`` are clear.

    Raises
    ------
    ValueError
        ``allowed`` not a bool tensor of at least one dimension.

    Examples
    --------
    >>> token_bitmask(torch.tensor([[True, False, True] + [False] * 30 + [True]])).tolist()
    [[5, 2]]
    """
    if not isinstance(allowed, torch.Tensor) or allowed.dtype != torch.bool or allowed.ndim < 1:
        raise ValueError("allowed must be a bool tensor [..., V]")
    *lead, V = allowed.shape
    W = (V + 31) // 32
    padded = torch.zeros((*lead, W * 32), dtype=torch.uint8, device=allowed.device)
    padded[..., :V] = allowed
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=allowed.device)
    packed = (padded.view(*lead, W * 4, 8) * weights).sum(-1, dtype=torch.uint8)
    return packed.view(torch.int32)  # four bytes per word, little-endian


def process_logits(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    num_prompt_tokens: torch.Tensor,
    req_indices: torch.Tensor | None = None,
    *,
    repetition_penalty: torch.Tensor | None = None,
    frequency_penalty: torch.Tensor | None = None,
    presence_penalty: torch.Tensor | None = None,
    logit_bias_ids: torch.Tensor | None = None,
    logit_bias_values: torch.Tensor | None = None,
    allowed_token_mask: torch.Tensor | None = None,
    grammar_mask: torch.Tensor | None = None,
    bad_word_ids: torch.Tensor | None = None,
    min_tokens: torch.Tensor | None = None,
    stop_token_ids: torch.Tensor | None = None,
    validate: bool | None = None,
) -> torch.Tensor:
    """Apply sampling penalties, logit bias and token masks to the target logits of a verify
    step, each row as plain decoding would at its position: row ``j`` of request ``b``
    counts the drafts ``d_0 .. d_{j-1}`` as output tokens. Returns new fp32 logits for
    :func:`rejection_sample` (``target_logits`` is not modified); ``k = 0`` is plain
    sampling with the same processing. Order (vLLM's ``Sampler``): logit bias, then
    repetition / frequency / presence penalties; masked tokens (allowed tokens, grammar, bad
    words, min_tokens) end at ``-inf``. No host synchronisation, static shapes
    (``torch.ops.specdec.process_logits``). Contract: ``docs/design.md``,
    "``process_logits``".

    Parameters
    ----------
    target_logits : torch.Tensor
        float32, bfloat16 or float16 ``[>= N + B, V]``, one row per query token in
        ``rejection_sample``'s layout (``N = cu[B]``); any strides.
    draft_token_ids : torch.Tensor
        int32 ``[>= N]``, the flat drafts (ids outside ``[0, V)`` count as no token).
    cu_num_draft_tokens : torch.Tensor
        int32 ``[B + 1]``, exclusive prefix sum of the draft counts, ``cu[0] = 0``.
    token_ids, num_tokens, num_prompt_tokens : torch.Tensor
        int32 ``[R, L_max]``, ``[R]``, ``[R]``: each state row's prompt and committed output
        (the engine's token buffer, read only); output tokens are
        ``token_ids[r, num_prompt_tokens[r] : num_tokens[r]]``.
    req_indices : torch.Tensor, optional
        int32 ``[B]``, the state row of each request; -1 marks a padding row (its rows are
        copied). Default ``arange(B)``.
    repetition_penalty : torch.Tensor, optional
        float32 ``[B]``, ``> 0`` and finite (1 is off): tokens seen in the prompt or the
        output get ``l / p`` where ``l > 0``, else ``l * p``.
    frequency_penalty, presence_penalty : torch.Tensor, optional
        float32 ``[B]``, finite (0 is off): ``l - f * count`` and ``l - p`` for tokens with
        ``count >= 1`` output occurrences. A missing one of the three penalties is neutral.
    logit_bias_ids, logit_bias_values : torch.Tensor, optional
        int32 ``[B, M]`` (-1 padded) and float32 ``[B, M]`` (finite), together: ``l + v``,
        entry by entry in order (a repeated id adds each value).
    allowed_token_mask : torch.Tensor, optional
        int32 ``[B, ceil(V / 32)]``, per request: token ``t`` is allowed iff bit ``t % 32``
        of word ``t // 32`` is set (xgrammar's bitmask layout); the others become ``-inf``.
    grammar_mask : torch.Tensor, optional
        int32 ``[>= N + B, ceil(V / 32)]``, the same layout per logits row (a structured
        output engine's mask for the position after the row's drafts).
    bad_word_ids : torch.Tensor, optional
        int32 ``[B, S, W_max]``, ``S`` token sequences per request, each -1 padded,
        ``W_max <= L_max``: a word's last token becomes ``-inf`` where its other tokens end
        the row's output (committed output, then drafts).
    min_tokens, stop_token_ids : torch.Tensor, optional
        int32 ``[B]`` (``>= 0``) and int32 ``[B, T]`` (-1 padded), together: the stop
        tokens become ``-inf`` while the row's output count ``num_tokens - num_prompt_tokens
        + j`` is below ``min_tokens``. Put EOS among them unless the request ignores it.
    validate : bool, optional
        Run the value checks (see Raises). Default: only for CPU tensors.

    Returns
    -------
    torch.Tensor
        float32 ``[target_logits.shape[0], V]``: the processed rows; rows of padding
        requests and rows past ``cu[B] + B`` are the input rows in fp32.

    Raises
    ------
    ValueError
        Wrong dtype, device, ndim or shape of any tensor; ``target_logits`` with fewer than
        ``len(draft_token_ids) + B`` rows or ``V < 1``; a mask not ``ceil(V / 32)`` words
        wide; ``bad_word_ids`` wider than ``token_ids``; bias ids without values, or
        ``min_tokens`` without ``stop_token_ids`` (or the reverse). With value checks:
        ``cu`` not an exclusive prefix sum within ``len(draft_token_ids)``,
        ``req_indices`` outside ``[-1, R)``, ``num_tokens`` outside ``[0, L_max]`` or
        ``num_prompt_tokens`` outside ``[0, num_tokens]`` (batch rows),
        ``repetition_penalty <= 0`` or not finite, a frequency or presence penalty or a
        bias value not finite, a bias, bad-word or stop id outside ``[-1, V)``,
        ``min_tokens < 0``.

    Examples
    --------
    >>> logits = torch.tensor([[2.0, 1.0, -1.0], [2.0, 1.0, -1.0]])  # one request, one draft
    >>> tokens = torch.tensor([[0, 2]], dtype=torch.int32)  # prompt [0], output [2]
    >>> out = process_logits(logits, torch.tensor([1], dtype=torch.int32),
    ...                      torch.tensor([0, 1], dtype=torch.int32), tokens,
    ...                      torch.tensor([2], dtype=torch.int32),
    ...                      torch.tensor([1], dtype=torch.int32),
    ...                      repetition_penalty=torch.tensor([2.0]))
    >>> out.tolist()  # row 1 also counts the draft 1
    [[1.0, 1.0, -2.0], [1.0, 0.5, -2.0]]
    """
    value_checks, kwargs = prepare(
        target_logits, draft_token_ids, cu_num_draft_tokens, token_ids, num_tokens,
        num_prompt_tokens, req_indices, repetition_penalty=repetition_penalty,
        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
        logit_bias_ids=logit_bias_ids, logit_bias_values=logit_bias_values,
        allowed_token_mask=allowed_token_mask, grammar_mask=grammar_mask,
        bad_word_ids=bad_word_ids, min_tokens=min_tokens, stop_token_ids=stop_token_ids,
        validate=validate,
    )  # fmt: skip
    if value_checks is not None:
        value_checks()
    return processed_logits(kwargs)
