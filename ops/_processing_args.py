"""``process_logits``' argument checks and its op call, shared by its wrapper
(``ops/processing.py``) and ``rejection_sample(..., processing=...)``
(``ops/rejection.py``). Contract: ``docs/design.md``, "``process_logits``"."""

from __future__ import annotations

import torch

from specdec_kernels.ops._library import call
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


def _per_request(name, t, dtype, shape, what, device):
    """``t`` checked: ``dtype``, ``shape`` (``None``: any size; at most 3-D), ``device``;
    made contiguous. ``what`` explains the shape; ``{i}`` in it stands for ``shape[i]``.

    The common case is answered in a few attribute reads (ten tensors a call): a generator
    over the sizes measured 0.86 us a tensor, these reads 0.32 us."""
    if t is None:
        return None
    got = t.shape if type(t) is torch.Tensor else ()
    if (
        len(got) == len(shape) <= 3
        and t.dtype is dtype
        and (shape[0] is None or got[0] == shape[0])
        and (len(shape) < 2 or shape[1] is None or got[1] == shape[1])
        and (len(shape) < 3 or shape[2] is None)
        and t.device == device
        and t.is_contiguous()
    ):
        return t
    t = check_tensor(name, t, dtype=dtype, ndim=len(shape), device=device)
    got = tuple(t.shape)
    want = tuple(s if s is not None else got[i] for i, s in enumerate(shape))
    check_shape(name, t, want, what.format(*shape))
    return t.contiguous()


def _together(**tensors) -> None:
    """Raise: the named tensors go together, and some are missing."""
    missing = [n for n, t in tensors.items() if t is None]
    raise ValueError(f"{' and '.join(tensors)} go together: {', '.join(missing)} missing")


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
    num_prompt_tokens, req_indices=None, repetition_penalty=None, frequency_penalty=None,
    presence_penalty=None, logit_bias_ids=None, logit_bias_values=None, allowed_token_mask=None,
    grammar_mask=None, bad_word_ids=None, min_tokens=None, stop_token_ids=None, *, validate=None,
) -> tuple:  # fmt: skip
    """:func:`process_logits`' checks: ``(value_checks, kwargs)``, its value checks as a
    function (None where they do not run; they raise its ``ValueError``; the CPU kernels
    run the same checks themselves, ``cpu/processing.py``'s ``values_ok``) and the keyword
    arguments of its op, normalised (contiguous, the three penalties together). Shared with
    ``rejection_sample(..., processing=...)``, which passes a ``LogitsProcessing``
    positionally (its fields are the arguments after ``cu_num_draft_tokens``, in order)."""
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
    # (spelt out, the messages formatted only when raised: this runs on every call)
    one = "one per request"
    penalties = [
        _per_request("repetition_penalty", repetition_penalty, f32, (B,), one, device),
        _per_request("frequency_penalty", frequency_penalty, f32, (B,), one, device),
        _per_request("presence_penalty", presence_penalty, f32, (B,), one, device),
    ]
    if (logit_bias_ids is None) != (logit_bias_values is None):
        _together(logit_bias_ids=logit_bias_ids, logit_bias_values=logit_bias_values)
    if (min_tokens is None) != (stop_token_ids is None):
        _together(min_tokens=min_tokens, stop_token_ids=stop_token_ids)
    bias_ids = _per_request("logit_bias_ids", logit_bias_ids, i32, (B, None), "[B, M]", device)
    bias_values = _per_request(
        "logit_bias_values", logit_bias_values, f32, (B, None), "[B, M]", device
    )
    if bias_ids is not None and bias_values.shape != bias_ids.shape:
        check_shape("logit_bias_values", bias_values, tuple(bias_ids.shape), "as logit_bias_ids")
    allowed = _per_request(
        "allowed_token_mask", allowed_token_mask, i32, (B, W), "[B, ceil(V / 32) = {1}]", device
    )
    grammar = _per_request(
        "grammar_mask", grammar_mask, i32, (None, W), "[rows, ceil(V / 32) = {1}]", device
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
    min_tokens = _per_request("min_tokens", min_tokens, i32, (B,), one, device)
    stops = _per_request("stop_token_ids", stop_token_ids, i32, (B, None), "[B, T]", device)

    value_checks = None
    if should_check_values([target_logits], validate):  # (all on its device, checked above)

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
            for name, t in (("frequency_penalty", penalties[1]),
                            ("presence_penalty", penalties[2])):  # fmt: skip
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
    given = [t is not None for t in penalties]
    if given != [True] * 3 and given != [False] * 3:
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
