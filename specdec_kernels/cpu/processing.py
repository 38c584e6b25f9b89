"""The CPU logits processing: ``process_logits`` as one numba kernel (``cpu/_jit.py``).

Per request, its verify rows in order, each copied (widened to fp32) just before it is
processed, so the masks find it in the cache. With penalties, the request's history is
counted once into a per-thread int32 array ``[V]`` (output occurrences, and bit 30 for
"seen in the prompt") with the list of its distinct tokens; row ``j`` adds draft
``d_{j-1}`` to the counts, so the work per request is O(history + rows x (distinct tokens +
bias entries)) plus O(V) per row for the copy and for each mask; the counts are zeroed
again through the same list. A bitmask is unpacked to one byte per token through a table
(the allowed-token mask once per request, the grammar mask per row) and applied as a
select on every lane, which vectorises. Bad words compare their prefix with the last
output tokens (drafts first); min_tokens bans the stop tokens while the row's output count
is below it. Rows of padding requests and past the batch are copied at the end. Contract:
``docs/design.md``, "``process_logits``"."""

from __future__ import annotations

import numpy as np
import torch

from specdec_kernels.cpu._jit import (
    NONE_F32,
    NONE_F32_2D,
    NONE_I32,
    NONE_I32_2D,
    NONE_I32_3D,
    as_float32,
    float_rows,
    jit,
    np_,
    opt,
    outputs,
    zeroed_i32,
)

PROMPT_BIT = np.int32(1 << 30)
"""Bit of a count that says "seen in the prompt"; the bits below count output occurrences."""
NEG_INF = np.float32(-np.inf)


def require_together(repetition_penalty, frequency_penalty, presence_penalty, logit_bias_ids,
                     logit_bias_values, min_tokens, stop_token_ids) -> None:  # fmt: skip
    """The op's structural check (CPU path, launcher, fake): the three penalties, the bias
    ids and values, and min_tokens and the stop tokens each come together (the Python
    wrapper ``process_logits`` fills missing penalties with their neutral values)."""
    groups = {
        "repetition_penalty, frequency_penalty and presence_penalty": (
            repetition_penalty, frequency_penalty, presence_penalty),
        "logit_bias_ids and logit_bias_values": (logit_bias_ids, logit_bias_values),
        "min_tokens and stop_token_ids": (min_tokens, stop_token_ids),
    }  # fmt: skip
    for names, tensors in groups.items():
        given = [t is not None for t in tensors]
        if any(given) and not all(given):
            raise ValueError(f"specdec::process_logits takes {names} together")


_BYTE_BITS = ((np.arange(256)[:, None] >> np.arange(8)[None, :]) & 1).astype(np.bool_)
"""``_BYTE_BITS[v, i]``: bit ``i`` of the byte ``v`` (a table instead of a variable shift,
which numba guards with a branch that stops a loop vectorising)."""


@jit
def _unpack(words, b, V, keep):
    """``keep[t]`` = bit ``t % 32`` of ``words[b, t // 32]``, for ``t < V``."""
    row = words[b]
    for q in range((V + 7) >> 3):
        bits = _BYTE_BITS[(row[q >> 2] >> ((q & 3) << 3)) & 0xFF]
        for i in range(min(8, V - (q << 3))):
            keep[(q << 3) + i] = bits[i]


@jit
def _select(x, keep, V):
    """``x = -inf`` where ``keep`` is false (a select on every lane: it vectorises)."""
    for i in range(V):
        x[i] = x[i] if keep[i] else NEG_INF


@jit
def _copy_row(l32, l16, bf16, g, out):
    """Row ``g`` of the logits, widened to fp32, into ``out[g]``."""
    if bf16:
        for i in range(out.shape[1]):
            out[g, i] = as_float32(l16[g, i])
    else:
        out[g, :] = l32[g, :]


@jit
def _past(drafts, lo, j, token_ids, r, L, q):
    """The output token ``q`` places before row ``j``'s position (drafts first)."""
    if q < j:
        f = lo + j - 1 - q
        return drafts[f] if 0 <= f < drafts.shape[0] else -1
    return token_ids[r, L - 1 - (q - j)]


@jit
def _process(
    l32, l16, bf16, drafts, cu, token_ids, num_tokens, num_prompt, req, has_req, rp, fp, pp,
    has_pen, bias_ids, bias_values, allowed, has_allowed, grammar, has_grammar, bad, min_tok,
    stops, has_min, out, counts, uniq, keep, keep_row,
):  # fmt: skip
    n_rows, V = out.shape
    R, L_max = token_ids.shape
    B = cu.shape[0] - 1
    copied = np.zeros(n_rows, dtype=np.bool_)
    for b in range(B):
        r = req[b] if has_req else b
        if r < 0 or r >= R:
            continue  # a padding row keeps its logits (copied below)
        lo = cu[b]
        kb = max(cu[b + 1] - lo, 0)
        L = min(max(num_tokens[r], 0), L_max)
        P = min(max(num_prompt[r], 0), L)
        n_out = L - P
        pen = has_pen and (rp[b] != 1.0 or fp[b] != 0.0 or pp[b] != 0.0)
        nu = 0
        if pen:
            for i in range(L):
                t = token_ids[r, i]
                if 0 <= t < V:
                    if counts[t] == 0:
                        uniq[nu] = t
                        nu += 1
                    if i < P:
                        counts[t] |= PROMPT_BIT
                    else:
                        counts[t] += 1
        for j in range(kb + 1):
            g = lo + b + j
            if g < 0 or g >= n_rows:
                break
            if pen and j > 0:
                d = _past(drafts, lo, j, token_ids, r, L, 0)
                if 0 <= d < V:
                    if counts[d] == 0:
                        uniq[nu] = d
                        nu += 1
                    counts[d] += 1
            _copy_row(l32, l16, bf16, g, out)  # each row just before it is processed:
            copied[g] = True  # it is still in the cache for the masks
            x = out[g]
            for m in range(bias_ids.shape[1]):
                t = bias_ids[b, m]
                if 0 <= t < V:
                    x[t] = x[t] + bias_values[b, m]
            if pen:
                rb, fb, pb = rp[b], fp[b], pp[b]
                for u in range(nu):
                    t = uniq[u]
                    n = counts[t] & (PROMPT_BIT - 1)
                    v = x[t]
                    if rb != 1.0:
                        v = v / rb if v > 0 else v * rb
                    if n > 0 and fb != 0.0:
                        v = v - fb * np.float32(n)
                    if n > 0 and pb != 0.0:
                        v = v - pb
                    x[t] = v
            if has_allowed:
                if j == 0:  # once per request
                    _unpack(allowed, b, V, keep)
                _select(x, keep, V)
            if has_grammar and g < grammar.shape[0]:  # (more rows: unchecked values)
                _unpack(grammar, g, V, keep_row)
                _select(x, keep_row, V)
            for s in range(bad.shape[1]):
                n_w = 0
                while n_w < bad.shape[2] and bad[b, s, n_w] >= 0:
                    n_w += 1
                if n_w == 0 or n_w - 1 > n_out + j:
                    continue
                match = True
                for q in range(n_w - 1):  # the prefix, from its end backwards
                    if _past(drafts, lo, j, token_ids, r, L, q) != bad[b, s, n_w - 2 - q]:
                        match = False
                        break
                if match and bad[b, s, n_w - 1] < V:
                    x[bad[b, s, n_w - 1]] = NEG_INF
            if has_min and n_out + j < min_tok[b]:
                for s in range(stops.shape[1]):
                    if 0 <= stops[b, s] < V:
                        x[stops[b, s]] = NEG_INF
        for u in range(nu):
            counts[uniq[u]] = 0
    for g in range(n_rows):
        if not copied[g]:
            _copy_row(l32, l16, bf16, g, out)


def process_logits(
    target_logits, draft_token_ids, cu_num_draft_tokens, token_ids, num_tokens,
    num_prompt_tokens, req_indices, repetition_penalty, frequency_penalty, presence_penalty,
    logit_bias_ids, logit_bias_values, allowed_token_mask, grammar_mask, bad_word_ids,
    min_tokens, stop_token_ids,
):  # fmt: skip
    require_together(
        repetition_penalty, frequency_penalty, presence_penalty, logit_bias_ids,
        logit_bias_values, min_tokens, stop_token_ids,
    )  # fmt: skip
    n_rows, V = target_logits.shape
    l32, l16 = float_rows(target_logits, n_rows)
    (out,), (arr,) = outputs(((n_rows, V), np.float32))
    has_pen = repetition_penalty is not None
    uniq = np.empty(min(V, token_ids.shape[1] + draft_token_ids.shape[0]) + 1, dtype=np.int32)
    _process(
        l32, l16, target_logits.dtype == torch.bfloat16, np_(draft_token_ids),
        np_(cu_num_draft_tokens), np_(token_ids), np_(num_tokens), np_(num_prompt_tokens),
        opt(req_indices, NONE_I32), req_indices is not None, opt(repetition_penalty, NONE_F32),
        opt(frequency_penalty, NONE_F32), opt(presence_penalty, NONE_F32), has_pen,
        opt(logit_bias_ids, NONE_I32_2D), opt(logit_bias_values, NONE_F32_2D),
        opt(allowed_token_mask, NONE_I32_2D), allowed_token_mask is not None,
        opt(grammar_mask, NONE_I32_2D), grammar_mask is not None, opt(bad_word_ids, NONE_I32_3D),
        opt(min_tokens, NONE_I32), opt(stop_token_ids, NONE_I32_2D), min_tokens is not None, arr,
        zeroed_i32(V) if has_pen else NONE_I32, uniq,
        np.empty(V if allowed_token_mask is not None else 0, dtype=np.bool_),
        np.empty(V if grammar_mask is not None else 0, dtype=np.bool_),
    )  # fmt: skip
    return out
