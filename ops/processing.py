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
from specdec_kernels.ops._library import call, define
from specdec_kernels.ops._validation import (
    FLOAT32_MAX,
    check_prefix_sum,
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

LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INT32_MAX = 2**31 - 1


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


def _per_request(name, t, dtype, shape, what, device):
    if t is None:
        return None
    if (  # the common case in a few attribute reads (ten of these per call)
        type(t) is torch.Tensor
        and t.dtype is dtype
        and t.dim() == len(shape)
        and t.device == device
        and all(s is None or s == n for s, n in zip(shape, t.shape, strict=True))
        and t.is_contiguous()
    ):
        return t
    t = check_tensor(name, t, dtype=dtype, ndim=len(shape), device=device)
    got = tuple(t.shape)
    want = tuple(s if s is not None else got[i] for i, s in enumerate(shape))
    check_shape(name, t, want, what)
    return t.contiguous()


def _together(**tensors) -> None:
    given = [n for n, t in tensors.items() if t is not None]
    if given and len(given) < len(tensors):
        missing = [n for n in tensors if n not in given]
        raise ValueError(f"{' and '.join(tensors)} go together: {', '.join(missing)} missing")


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


def processed_logits(a: dict) -> torch.Tensor:
    """The op on :func:`prepare`'s keyword arguments (after its value checks)."""
    return call(
        "process_logits",
        target_logits=a["target_logits"],
        draft_token_ids=a["draft_token_ids"],
        cu_num_draft_tokens=a["cu_num_draft_tokens"],
        token_ids=a["token_ids"],
        num_tokens=a["num_tokens"],
        num_prompt_tokens=a["num_prompt_tokens"],
        req_indices=a["req_indices"],
        repetition_penalty=a["repetition_penalty"],
        frequency_penalty=a["frequency_penalty"],
        presence_penalty=a["presence_penalty"],
        logit_bias_ids=a["logit_bias_ids"],
        logit_bias_values=a["logit_bias_values"],
        allowed_token_mask=a["allowed_token_mask"],
        grammar_mask=a["grammar_mask"],
        bad_word_ids=a["bad_word_ids"],
        min_tokens=a["min_tokens"],
        stop_token_ids=a["stop_token_ids"],
    )


def prepare(
    target_logits, draft_token_ids, cu_num_draft_tokens, token_ids, num_tokens,
    num_prompt_tokens, req_indices=None, *, repetition_penalty=None, frequency_penalty=None,
    presence_penalty=None, logit_bias_ids=None, logit_bias_values=None, allowed_token_mask=None,
    grammar_mask=None, bad_word_ids=None, min_tokens=None, stop_token_ids=None, validate=None,
) -> tuple:  # fmt: skip
    """:func:`process_logits`' checks: ``(value_checks, kwargs)``, its value checks as a
    function (None where they do not run; they raise its ``ValueError``; the CPU kernels
    run the same checks themselves, ``cpu/processing.py``'s ``values_ok``) and the keyword
    arguments of its op, normalised (contiguous, the three penalties together). Shared with
    ``rejection_sample(..., processing=...)``."""
    target_logits = check_tensor("target_logits", target_logits, dtype=LOGIT_DTYPES, ndim=2)
    device = target_logits.device
    i32, f32 = torch.int32, torch.float32
    drafts = check_tensor("draft_token_ids", draft_token_ids, dtype=i32, ndim=1, device=device)
    cu = check_tensor("cu_num_draft_tokens", cu_num_draft_tokens, dtype=i32, ndim=1, device=device)
    token_ids, num_tokens = check_token_state(token_ids, num_tokens)
    if token_ids.device != device:
        raise ValueError(f"token_ids must be on {device} (target_logits), got {token_ids.device}")
    R, L_max = token_ids.shape
    num_prompt_tokens = check_tensor(
        "num_prompt_tokens", num_prompt_tokens, dtype=i32, ndim=1, device=device
    )
    check_shape("num_prompt_tokens", num_prompt_tokens, (R,), "one entry per row of token_ids")
    if cu.shape[0] < 1:
        raise ValueError("cu_num_draft_tokens must have shape (B + 1,) with B >= 0, got (0,)")
    B = cu.shape[0] - 1
    n_rows, V = target_logits.shape
    if n_rows < drafts.shape[0] + B:
        raise ValueError(
            f"target_logits must have at least len(draft_token_ids) + B = {drafts.shape[0]} + "
            f"{B} rows (k_b + 1 per request), got {n_rows}"
        )
    if V < 1:
        raise ValueError(f"target_logits must have a vocabulary of at least 1, got V = {V}")
    check_req_indices(req_indices, "len(cu_num_draft_tokens) - 1", B, R, device)
    W = (V + 31) // 32
    penalties = [repetition_penalty, frequency_penalty, presence_penalty]
    names = ["repetition_penalty", "frequency_penalty", "presence_penalty"]
    penalties = [_per_request(n, t, f32, (B,), "one per request", device) for n, t in
                 zip(names, penalties, strict=True)]  # fmt: skip
    _together(logit_bias_ids=logit_bias_ids, logit_bias_values=logit_bias_values)
    _together(min_tokens=min_tokens, stop_token_ids=stop_token_ids)
    bias_ids = _per_request("logit_bias_ids", logit_bias_ids, i32, (B, None), "[B, M]", device)
    bias_values = _per_request(
        "logit_bias_values", logit_bias_values, f32, (B, None), "[B, M]", device
    )
    if bias_ids is not None:
        check_shape("logit_bias_values", bias_values, tuple(bias_ids.shape), "as logit_bias_ids")
    allowed = _per_request(
        "allowed_token_mask", allowed_token_mask, i32, (B, W), f"[B, ceil(V / 32) = {W}]", device
    )
    grammar = _per_request(
        "grammar_mask", grammar_mask, i32, (None, W), f"[rows, ceil(V / 32) = {W}]", device
    )
    if grammar is not None and grammar.shape[0] < drafts.shape[0] + B:
        raise ValueError(
            f"grammar_mask must have at least len(draft_token_ids) + B = {drafts.shape[0] + B} "
            f"rows (one per logits row), got {grammar.shape[0]}"
        )
    bad = _per_request("bad_word_ids", bad_word_ids, i32, (B, None, None), "[B, S, W]", device)
    if bad is not None and bad.shape[2] > L_max:
        raise ValueError(
            f"bad_word_ids holds words of up to {bad.shape[2]} tokens, longer than "
            f"max_model_len = token_ids.shape[1] = {L_max}"
        )
    min_tokens = _per_request("min_tokens", min_tokens, i32, (B,), "one per request", device)
    stops = _per_request("stop_token_ids", stop_token_ids, i32, (B, None), "[B, T]", device)

    tensors = [target_logits, drafts, cu, token_ids, num_tokens, num_prompt_tokens, req_indices]
    extra = [*penalties, bias_ids, bias_values, allowed, grammar, bad, min_tokens, stops]
    value_checks = None
    if should_check_values(tensors + extra, validate):

        def value_checks() -> None:
            N = check_prefix_sum(
                "cu_num_draft_tokens", cu, _INT32_MAX, "the draft counts: cu non-decreasing"
            )
            if N > drafts.shape[0]:
                raise ValueError(
                    "cu_num_draft_tokens[B] must be <= len(draft_token_ids) = "
                    f"{drafts.shape[0]}, got {N}"
                )
            check_req_indices_values(req_indices, R)
            what = "rows in the batch; L_max = token_ids.shape[1]"
            check_rows_range("num_tokens", num_tokens, req_indices, B, 0, L_max, what)
            n, lo, _, _, over = rows_stats(num_prompt_tokens, req_indices, B, other=num_tokens)
            if n and (lo < 0 or over > 0):
                raise ValueError(
                    "num_prompt_tokens must lie in [0, num_tokens] for the rows in the batch"
                )
            if penalties[0] is not None:
                check_value_range("repetition_penalty", penalties[0], 0, FLOAT32_MAX,
                                  "1 = off", lo_open=True)  # fmt: skip
            for name, t in zip(names[1:], penalties[1:], strict=True):
                if t is not None:
                    check_value_range(name, t, -FLOAT32_MAX, FLOAT32_MAX, "finite; 0 = off")
            if bias_values is not None:
                check_value_range("logit_bias_values", bias_values.view(-1), -FLOAT32_MAX,
                                  FLOAT32_MAX, "finite")  # flat: one numba pass  # fmt: skip
            for name, t in (("logit_bias_ids", bias_ids), ("bad_word_ids", bad),
                            ("stop_token_ids", stops)):  # fmt: skip
                if t is not None:
                    what = f"token ids, -1 = padding; V = {V}"
                    check_value_range(name, t.view(-1), -1, V - 1, what)  # flat: one pass
            if min_tokens is not None:
                check_value_range("min_tokens", min_tokens, 0, _INT32_MAX)

    filled = penalties  # the op takes the three together
    if any(t is not None for t in penalties):
        defaults = (1.0, 0.0, 0.0)
        filled = [
            torch.full((B,), d, dtype=f32, device=device) if t is None else t
            for t, d in zip(penalties, defaults, strict=True)
        ]
    return value_checks, dict(
        target_logits=target_logits,
        draft_token_ids=drafts.contiguous(),
        cu_num_draft_tokens=cu.contiguous(),
        token_ids=token_ids,
        num_tokens=num_tokens.contiguous(),
        num_prompt_tokens=num_prompt_tokens.contiguous(),
        req_indices=None if req_indices is None else req_indices.contiguous(),
        repetition_penalty=filled[0],
        frequency_penalty=filled[1],
        presence_penalty=filled[2],
        logit_bias_ids=bias_ids,
        logit_bias_values=bias_values,
        allowed_token_mask=allowed,
        grammar_mask=grammar,
        bad_word_ids=bad,
        min_tokens=min_tokens,
        stop_token_ids=stops,
    )
