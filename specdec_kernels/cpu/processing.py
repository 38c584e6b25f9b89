"""The CPU logits processing: ``process_logits`` as one numba kernel (``cpu/_jit.py``).

Per request, its verify rows in order. A row's mask (the request's allowed tokens AND the
row's grammar mask, ``ceil(V / 32)`` words) is applied while the row is copied (widened to
fp32): one pass, a select on 32 lanes per word. With penalties, the request's history is
counted once into a per-thread int32 array ``[V]`` (output occurrences, and bit 30 for
"seen in the prompt") with the list of its distinct tokens; row ``j`` adds draft
``d_{j-1}`` to the counts, so the work per request is O(history + rows x (distinct tokens +
bias entries)) plus one O(V) pass per row; the counts are zeroed again through the same
list. Bias and penalties then change only the ids they name (those the mask clears are
set to ``-inf`` again); bad words compare their prefix with the last output tokens (drafts
first); min_tokens bans the stop tokens while the row's output count is below it. Rows of
padding requests and past the batch are copied at the end. ``rejection_sample(...,
processing=...)`` runs the same row functions on the rows it verifies
(``cpu/rejection.py``). Contract: ``docs/design.md``, "``process_logits``"."""

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
from specdec_kernels.cpu.sampling import argmax

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


BIT = (np.int64(1) << np.arange(32)).astype(np.uint32).view(np.int32)
"""``BIT[t]``: the int32 with only bit ``t`` set (a table instead of a variable shift, which
numba guards with a branch that stops a loop vectorising)."""


@jit
def _allowed(words, t):
    """Whether bit ``t % 32`` of ``words[t // 32]`` is set."""
    return (words[t >> 5] & BIT[t & 31]) != 0


@jit
def row_words(pt, b, g, words):
    """Row ``g``'s mask (request ``b``'s allowed tokens AND the row's grammar mask) into
    ``words`` (int32 ``[ceil(V / 32)]``); False (``words`` untouched) if neither is on."""
    allowed, has_allowed, grammar, has_grammar = pt[11], pt[12], pt[13], pt[14]
    has_grammar = has_grammar and g < grammar.shape[0]  # (more rows: unchecked values)
    if not (has_allowed or has_grammar):
        return False
    for w in range(words.shape[0]):
        a = allowed[b, w] if has_allowed else np.int32(-1)
        words[w] = a & grammar[g, w] if has_grammar else a
    return True


@jit
def copy_row(l32, l16, bf16, g, x, masked, words):
    """Row ``g`` of the logits, widened to fp32, into ``x``; with ``masked``, ``-inf`` where
    the bit of ``words`` is clear (in the same pass: a select on every lane, 32 lanes per
    word, which vectorises; unpacking the mask first measured 8x the whole copy)."""
    V = x.shape[0]
    if not masked:  # element loops (numba's slice assignment measured 3.6x slower), one per
        if bf16:  # dtype (a select between the two per element does not vectorise)
            for i in range(V):
                x[i] = as_float32(l16[g, i])
        else:
            for i in range(V):
                x[i] = l32[g, i]
        return
    full = V >> 5
    for w in range(full):
        word, base = words[w], w << 5
        if bf16:
            for t in range(32):
                v = as_float32(l16[g, base + t])
                x[base + t] = v if (word & BIT[t]) != 0 else NEG_INF
        else:
            for t in range(32):
                v = l32[g, base + t]
                x[base + t] = v if (word & BIT[t]) != 0 else NEG_INF
    for i in range(full << 5, V):
        v = as_float32(l16[g, i]) if bf16 else l32[g, i]
        x[i] = v if _allowed(words, i) else NEG_INF


@jit
def _past(drafts, lo, j, token_ids, r, L, q):
    """The output token ``q`` places before row ``j``'s position (drafts first)."""
    if q < j:
        f = lo + j - 1 - q
        return drafts[f] if 0 <= f < drafts.shape[0] else -1
    return token_ids[r, L - 1 - (q - j)]


@jit
def request_start(pt, b, V, counts, uniq, count):
    """Request ``b``'s processing state: ``(r, L, P, pen, nu)`` (its state row, -1 for
    padding; its history and prompt lengths; whether its penalties are on; the number of
    distinct tokens counted into ``counts`` / ``uniq``: its history if ``count`` and
    ``pen``, else none yet). ``pt``: the :data:`TENSORS` tuple."""
    token_ids, num_tokens, num_prompt, req, has_req = pt[0], pt[1], pt[2], pt[3], pt[4]
    rp, fp, pp, has_pen = pt[5], pt[6], pt[7], pt[8]
    R, L_max = token_ids.shape
    r = np.int64(req[b]) if has_req else np.int64(b)
    if r < 0 or r >= R:
        return np.int64(-1), np.int64(0), np.int64(0), False, np.int64(0)
    L = np.int64(min(max(num_tokens[r], 0), L_max))
    P = np.int64(min(max(num_prompt[r], 0), L))
    pen = has_pen and (rp[b] != 1.0 or fp[b] != 0.0 or pp[b] != 0.0)
    nu = np.int64(0)
    if pen and count:
        nu = count_upto(pt, r, L, P, V, counts, uniq, NONE_I32, 0, 0)
    return r, L, P, pen, nu


@jit
def count_upto(pt, r, L, P, V, counts, uniq, drafts, lo, j):
    """Count the history of state row ``r`` (``L`` tokens, the first ``P`` the prompt)
    and the drafts ``d_0 .. d_{j-1}`` (output tokens) into ``counts`` / ``uniq`` (empty
    before); returns ``nu``."""
    token_ids = pt[0]
    nu = np.int64(0)
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
    for q in range(j):
        f = lo + q
        d = drafts[f] if 0 <= f < drafts.shape[0] else -1
        if 0 <= d < V:
            if counts[d] == 0:
                uniq[nu] = d
                nu += 1
            counts[d] += 1
    return nu


@jit
def _seen(pt, r, L, drafts, lo, j, t):
    """Whether token ``t`` is in state row ``r``'s history or among the drafts ``d_0 ..
    d_{j-1}`` (one comparison pass, which vectorises)."""
    row = pt[0][r]
    hits = 0
    for i in range(L):
        hits += row[i] == t
    for q in range(j):
        f = lo + q
        hits += 0 <= f < drafts.shape[0] and drafts[f] == t
    return hits > 0


@jit
def count_draft(pt, r, L, pen, nu, drafts, lo, j, counts, uniq, V):
    """Before a request's row ``j`` (after its row ``j - 1``; state row ``r``): count the
    draft ``d_{j-1}`` as an output token; returns the new ``nu``."""
    if pen and j > 0:
        d = _past(drafts, lo, j, pt[0], r, L, 0)
        if 0 <= d < V:
            if counts[d] == 0:
                uniq[nu] = d
                nu += 1
            counts[d] += 1
    return nu


@jit
def _penalised(v, cnt, rb, fb, pb):
    """Logit ``v`` of a token with count ``cnt`` (``counts``' encoding) after the
    repetition, frequency and presence penalties (the contract's fp32 operations)."""
    n = cnt & (PROMPT_BIT - 1)
    if rb != 1.0:
        v = v / rb if v > 0 else v * rb
    if n > 0 and fb != 0.0:
        v = v - fb * np.float32(n)
    if n > 0 and pb != 0.0:
        v = v - pb
    return v


@jit
def process_row(pt, b, r, L, P, pen, nu, drafts, lo, j, x, counts, uniq, masked, words):
    """Process ``x`` (request ``b``'s row ``j``, copied by :func:`copy_row` with the row's
    mask ``words`` if ``masked``) in place, after :func:`request_start` and
    :func:`count_draft` for rows ``0 .. j``. The bias and the penalties change only ids
    they name; those that the mask clears are set to ``-inf`` again after them, so every
    entry is what the order of the contract (bias, penalties, masks, bans) gives, whatever
    the values. Writes only the counted tokens and the ids of :func:`_named`."""
    token_ids, rp, fp, pp = pt[0], pt[5], pt[6], pt[7]
    bias_ids, bias_values = pt[9], pt[10]
    bad, min_tok, stops, has_min = pt[15], pt[16], pt[17], pt[18]
    V = x.shape[0]
    for m in range(bias_ids.shape[1]):
        t = bias_ids[b, m]
        if 0 <= t < V:
            x[t] = x[t] + bias_values[b, m]
    if pen:
        rb, fb, pb = rp[b], fp[b], pp[b]
        for u in range(nu):
            t = uniq[u]
            x[t] = _penalised(x[t], counts[t], rb, fb, pb)
    if masked:
        for m in range(bias_ids.shape[1]):
            t = bias_ids[b, m]
            if 0 <= t < V and not _allowed(words, t):
                x[t] = NEG_INF
        for u in range(nu if pen else 0):
            if not _allowed(words, uniq[u]):
                x[uniq[u]] = NEG_INF
    n_out = L - P
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


@jit
def _mask_bit(pt, b, g, t):
    """Whether row ``g`` (request ``b``) allows token ``t``: its allowed-token and grammar
    bits (:func:`row_words` for one token)."""
    allowed, has_allowed, grammar, has_grammar = pt[11], pt[12], pt[13], pt[14]
    if has_allowed and (allowed[b, t >> 5] & BIT[t & 31]) == 0:
        return False
    if has_grammar and g < grammar.shape[0] and (grammar[g, t >> 5] & BIT[t & 31]) == 0:
        return False
    return True


@jit
def _biased(l32, l16, bf16, g, pt, b, t):
    """Entry ``t`` of row ``g`` after request ``b``'s logit bias (:func:`process_row`'s
    first step, same operations, same order)."""
    bias_ids, bias_values = pt[9], pt[10]
    v = as_float32(l16[g, t]) if bf16 else l32[g, t]
    for m in range(bias_ids.shape[1]):
        if bias_ids[b, m] == t:
            v = v + bias_values[b, m]
    return v


@jit
def _value_at(l32, l16, bf16, g, pt, b, r, L, P, pen, drafts, lo, j, counts, t):
    """Entry ``t`` of the row :func:`process_row` would leave (same operations, same
    order), computed alone."""
    token_ids, rp, fp, pp = pt[0], pt[5], pt[6], pt[7]
    bad, min_tok, stops, has_min = pt[15], pt[16], pt[17], pt[18]
    v = _biased(l32, l16, bf16, g, pt, b, t)
    if pen and counts[t] != 0:
        v = _penalised(v, counts[t], rp[b], fp[b], pp[b])
    if not _mask_bit(pt, b, g, t):
        return NEG_INF
    n_out = L - P
    for s in range(bad.shape[1]):
        n_w = 0
        while n_w < bad.shape[2] and bad[b, s, n_w] >= 0:
            n_w += 1
        if n_w == 0 or bad[b, s, n_w - 1] != t or n_w - 1 > n_out + j:
            continue
        match = True
        for q in range(n_w - 1):
            if _past(drafts, lo, j, token_ids, r, L, q) != bad[b, s, n_w - 2 - q]:
                match = False
                break
        if match:
            return NEG_INF
    if has_min and n_out + j < min_tok[b]:
        for s in range(stops.shape[1]):
            if stops[b, s] == t:
                return NEG_INF
    return v


@jit
def _named(pt, b, t):
    """Whether :func:`process_row` names ``t`` for request ``b`` other than as a counted
    token: a bias id, a bad word's last token, a stop token."""
    bias_ids, bad, stops, has_min = pt[9], pt[15], pt[17], pt[18]
    for m in range(bias_ids.shape[1]):
        if bias_ids[b, m] == t:
            return True
    for s in range(bad.shape[1]):
        n_w = 0
        while n_w < bad.shape[2] and bad[b, s, n_w] >= 0:
            n_w += 1
        if n_w > 0 and bad[b, s, n_w - 1] == t:
            return True
    for s in range(stops.shape[1] if has_min else 0):
        if stops[b, s] == t:
            return True
    return False


@jit
def processed_argmax(l32, l16, bf16, g, pt, b, r, L, P, pen, nu, counted, drafts, lo, j, prow,
                     counts, uniq, words, buf):  # fmt: skip
    """``argmax`` (``cpu/sampling.py``'s: NaN as ``-inf``, ties to the lowest id) of
    request ``b``'s row ``j`` (row ``g``) as :func:`process_row` would leave it; ``prow``
    (fp32 ``[1, V]``) is scratch. ``counted``: whether ``counts`` holds the history and the
    drafts before the row; if not, they are counted here when the row needs them. Returns
    ``(token, nu, counted)``.

    Usually without processing the row or counting the history. Let no penalty be able to
    raise a logit (``repetition_penalty >= 1``, frequency and presence penalties ``>= 0``,
    or no penalty; a penalty then never raises one, in fp32 too, rounding being
    monotonic), and let ``t``, the raw row's argmax (the pass plain verification makes), be
    allowed by the mask, not a bias id, bad word's last token or stop token
    (:func:`_named`) and, with a penalty on, not in the history or the drafts before the
    row (one comparison pass). Then ``t``'s entry is unchanged, every other entry is at
    most its raw value plus its bias, and the entries the processing leaves alone are at
    most ``t``'s and equal only at higher ids; so the processed argmax is ``t`` or a bias
    id whose biased value reaches ``t``'s, each computed alone (:func:`_value_at`).
    Otherwise (a penalty that can raise a logit, ``t`` masked, named or seen, or no entry
    above ``-inf``) the row is processed into ``prow`` and its argmax taken."""
    V = prow.shape[1]
    t = argmax(l32, l16, bf16, g, V, buf)
    m = as_float32(l16[g, t]) if bf16 else l32[g, t]
    raising = pen and (pt[5][b] < 1.0 or pt[6][b] < 0.0 or pt[7][b] < 0.0)
    fast = not raising and m > NEG_INF and _mask_bit(pt, b, g, t) and not _named(pt, b, t)
    if fast and pen:
        fast = counts[t] == 0 if counted else not _seen(pt, r, L, drafts, lo, j, t)
    if fast:
        tok = t
        bias_ids = pt[9]
        for k in range(bias_ids.shape[1]):
            c = bias_ids[b, k]
            if not 0 <= c < V or _biased(l32, l16, bf16, g, pt, b, c) < m:
                continue  # at most its biased value: below t's
            if pen and not counted:
                nu, counted = count_upto(pt, r, L, P, V, counts, uniq, drafts, lo, j), True
            v = _value_at(l32, l16, bf16, g, pt, b, r, L, P, pen, drafts, lo, j, counts, c)
            if v > m or (v == m and c < tok):
                m, tok = v, c
        return tok, nu, counted
    if pen and not counted:
        nu, counted = count_upto(pt, r, L, P, V, counts, uniq, drafts, lo, j), True
    masked = row_words(pt, b, g, words)
    copy_row(l32, l16, bf16, g, prow[0], masked, words)
    process_row(pt, b, r, L, P, pen, nu, drafts, lo, j, prow[0], counts, uniq, masked, words)
    return argmax(prow, l16, False, 0, V, buf), nu, counted


FLOAT32_MAX = np.float32(np.finfo(np.float32).max)


@jit
def _ids_ok(ids, V):
    """Every entry of ``ids`` (any shape, C order) in ``[-1, V)``."""
    for t in ids.ravel():
        if not -1 <= t < V:
            return False
    return True


@jit
def values_ok(pt, B, V):
    """``process_logits``' value checks on the processing inputs (``ops/processing.py``'s
    ``prepare``; its ``cu`` checks are ``rejection_sample``'s, stricter, run beside these)
    as one pass: ``req_indices`` in ``[-1, R)``; each batch row's ``num_tokens`` in ``[0,
    L_max]`` and ``num_prompt_tokens`` in ``[0, num_tokens]``; the penalties and bias
    values finite, ``repetition_penalty > 0``; the ids in ``[-1, V)``; ``min_tokens >=
    0``."""
    token_ids, num_tokens, num_prompt, req, has_req = pt[0], pt[1], pt[2], pt[3], pt[4]
    R, L_max = token_ids.shape
    for b in range(req.shape[0] if has_req else 0):
        if not -1 <= req[b] < R:
            return False
    for b in range(B):
        r = req[b] if has_req else b
        if r < 0:
            continue
        if not (0 <= num_tokens[r] <= L_max and 0 <= num_prompt[r] <= num_tokens[r]):
            return False
    rp, fp, pp, has_pen = pt[5], pt[6], pt[7], pt[8]
    for b in range(B if has_pen else 0):
        if not (0 < rp[b] <= FLOAT32_MAX):
            return False
        for v in (fp[b], pp[b]):
            if not -FLOAT32_MAX <= v <= FLOAT32_MAX:
                return False
    for v in pt[10].ravel():
        if not -FLOAT32_MAX <= v <= FLOAT32_MAX:
            return False
    if not (_ids_ok(pt[9], V) and _ids_ok(pt[15], V) and _ids_ok(pt[17], V)):
        return False
    for b in range(pt[16].shape[0]):
        if pt[16][b] < 0:
            return False
    return True


@jit
def request_end(counts, uniq, nu):
    """Zero the counts of the request's distinct tokens again (the buffer is reused)."""
    for u in range(nu):
        counts[uniq[u]] = 0


@jit
def _process(l32, l16, bf16, drafts, cu, pt, out, counts, uniq, words):
    n_rows, V = out.shape
    B = cu.shape[0] - 1
    copied = np.zeros(n_rows, dtype=np.bool_)
    for b in range(B):
        r, L, P, pen, nu = request_start(pt, b, V, counts, uniq, True)
        if r < 0:
            continue  # a padding row keeps its logits (copied below)
        lo = cu[b]
        kb = max(cu[b + 1] - lo, 0)
        for j in range(kb + 1):
            g = lo + b + j
            if g < 0 or g >= n_rows:
                break
            nu = count_draft(pt, r, L, pen, nu, drafts, lo, j, counts, uniq, V)
            masked = row_words(pt, b, g, words)
            copy_row(l32, l16, bf16, g, out[g], masked, words)
            copied[g] = True
            process_row(pt, b, r, L, P, pen, nu, drafts, lo, j, out[g], counts, uniq, masked,
                        words)  # fmt: skip
        request_end(counts, uniq, nu)
    for g in range(n_rows):
        if not copied[g]:
            copy_row(l32, l16, bf16, g, out[g], False, words)


def tensors(
    token_ids, num_tokens, num_prompt_tokens, req_indices, repetition_penalty, frequency_penalty,
    presence_penalty, logit_bias_ids, logit_bias_values, allowed_token_mask, grammar_mask,
    bad_word_ids, min_tokens, stop_token_ids,
):  # fmt: skip
    """The processing inputs as the one tuple the kernels take (:data:`TENSORS`)."""
    return (
        np_(token_ids), np_(num_tokens), np_(num_prompt_tokens), opt(req_indices, NONE_I32),
        req_indices is not None, opt(repetition_penalty, NONE_F32),
        opt(frequency_penalty, NONE_F32), opt(presence_penalty, NONE_F32),
        repetition_penalty is not None, opt(logit_bias_ids, NONE_I32_2D),
        opt(logit_bias_values, NONE_F32_2D), opt(allowed_token_mask, NONE_I32_2D),
        allowed_token_mask is not None, opt(grammar_mask, NONE_I32_2D), grammar_mask is not None,
        opt(bad_word_ids, NONE_I32_3D), opt(min_tokens, NONE_I32), opt(stop_token_ids, NONE_I32_2D),
        min_tokens is not None,
    )  # fmt: skip


TENSORS = (
    "token_ids", "num_tokens", "num_prompt", "req", "has_req", "rp", "fp", "pp", "has_pen",
    "bias_ids", "bias_values", "allowed", "has_allowed", "grammar", "has_grammar", "bad",
    "min_tok", "stops", "has_min",
)  # fmt: skip
"""The processing inputs as the kernels take them: one tuple (an argument each would make
every kernel that processes rows list 19), absent tensors as empty placeholders beside
their ``has_`` flags."""

NONE_TENSORS = (
    NONE_I32_2D, NONE_I32, NONE_I32, NONE_I32, False, NONE_F32, NONE_F32, NONE_F32, False,
    NONE_I32_2D, NONE_F32_2D, NONE_I32_2D, False, NONE_I32_2D, False, NONE_I32_3D, NONE_I32,
    NONE_I32_2D, False,
)  # fmt: skip
""":data:`TENSORS` with nothing on (a kernel's argument where no processing is asked)."""


def buffers(V, token_ids, draft_token_ids, pen):
    """The kernels' working buffers: counts (zeroed, reused), the distinct-token list, one
    row's mask."""
    return (
        zeroed_i32(V) if pen else NONE_I32,
        np.empty(min(V, token_ids.shape[1] + draft_token_ids.shape[0]) + 1, dtype=np.int32),
        np.empty((V + 31) // 32, dtype=np.int32),
    )


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
    pt = tensors(
        token_ids, num_tokens, num_prompt_tokens, req_indices, repetition_penalty,
        frequency_penalty, presence_penalty, logit_bias_ids, logit_bias_values,
        allowed_token_mask, grammar_mask, bad_word_ids, min_tokens, stop_token_ids,
    )  # fmt: skip
    _process(
        l32, l16, target_logits.dtype == torch.bfloat16, np_(draft_token_ids),
        np_(cu_num_draft_tokens), pt, arr,
        *buffers(V, token_ids, draft_token_ids, repetition_penalty is not None),
    )  # fmt: skip
    return out
