"""The greedy shortcut of ``rejection_sample(..., processing=...)``'s CPU kernel
(``cpu/rejection.py``): the argmax of a processed row, usually without processing the row
(``processed_argmax``), and the one-id versions of ``cpu/processing_rows.py``'s steps it
relies on. Contract: ``docs/design.md``, "``rejection_sample``", ``processing``."""

from __future__ import annotations

from specdec_kernels.cpu._jit import as_float32, jit
from specdec_kernels.cpu.processing_rows import (
    BIT,
    NEG_INF,
    _past,
    _penalised,
    _seen,
    copy_row,
    count_upto,
    process_row,
    row_words,
)
from specdec_kernels.cpu.sampling import argmax


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
    monotonic), and let ``t``, the raw row's argmax (the pass plain verification makes;
    if the mask clears it, the argmax of the row copied with the mask into ``prow``), be
    above ``-inf``, not a bias id, bad word's last token or stop token (:func:`_named`)
    and, with a penalty on, not in the history or the drafts before the row (one
    comparison pass). Then ``t``'s entry is unchanged, every other entry is at most its
    (masked) raw value plus its bias, and the entries the processing leaves alone are at
    most ``t``'s and equal only at higher ids; so the processed argmax is ``t`` or a bias
    id whose biased value reaches ``t``'s, each computed alone (:func:`_value_at`).
    Otherwise (a penalty that can raise a logit, ``t`` named or seen, or no allowed entry
    above ``-inf``) the row is processed into ``prow`` and its argmax taken."""
    V = prow.shape[1]
    t = argmax(l32, l16, bf16, g, V, buf)
    m = as_float32(l16[g, t]) if bf16 else l32[g, t]
    raising = pen and (pt[5][b] < 1.0 or pt[6][b] < 0.0 or pt[7][b] < 0.0)
    fast = not raising and m > NEG_INF
    if fast and not _mask_bit(pt, b, g, t):  # the masked row's argmax instead (a copy)
        copy_row(l32, l16, bf16, g, prow[0], row_words(pt, b, g, words), words)
        t = argmax(prow, l16, False, 0, V, buf)
        m = prow[0, t]
        fast = m > NEG_INF
    fast = fast and not _named(pt, b, t)
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
    process_row(l32, l16, bf16, g, pt, b, r, L, P, pen, nu, drafts, lo, j, prow[0], counts,
                uniq, words)  # fmt: skip
    return argmax(prow, l16, False, 0, V, buf), nu, counted
