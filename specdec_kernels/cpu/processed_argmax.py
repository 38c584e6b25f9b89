"""The greedy shortcut of ``rejection_sample(..., processing=...)``'s CPU kernel
(``cpu/rejection.py``): the argmax of a processed row, usually without processing the row
(``processed_argmax``), and the one-id versions of ``cpu/processing_rows.py``'s steps it
relies on. Contract: ``docs/design.md``, "``rejection_sample``", ``processing``."""

from __future__ import annotations

import numpy as np

from specdec_kernels.cpu._jit import as_float32, jit
from specdec_kernels.cpu.processing_rows import (
    BIT,
    NEG_INF,
    PROMPT_BIT,
    _past,
    _penalised,
    copy_row,
    count_upto,
    history_kept,
    process_row,
    row_words,
)
from specdec_kernels.cpu.sampling import BLOCK, argmax, block

SCAN_CAP = 8
"""Ids a seen argmax's row processes alone (:func:`_scan`) before it is processed in full."""


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
def _value_at(l32, l16, bf16, g, pt, b, r, L, P, pen, drafts, lo, j, cnt, t):
    """Entry ``t`` of the row :func:`process_row` would leave (same operations, same
    order), computed alone; ``cnt``: ``t``'s count (``counts``' encoding)."""
    token_ids, rp, fp, pp = pt[0], pt[5], pt[6], pt[7]
    bad, min_tok, stops, has_min = pt[15], pt[16], pt[17], pt[18]
    v = _biased(l32, l16, bf16, g, pt, b, t)
    if pen and cnt != 0:
        v = _penalised(v, cnt, rp[b], fp[b], pp[b])
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
def _count_of(pt, r, L, P, pen, counted, counts, drafts, lo, j, t):
    """Token ``t``'s count in ``counts``' encoding (0 without penalties; the rule of
    ``processing_rows.count_upto`` for one token): read from ``counts`` once the history is
    counted, else from a ``ProcessingState``'s kept counts of state row ``r`` (``pt``'s
    ``kept_counts``) or two comparison passes (prompt, output), which vectorise; then the
    drafts ``d_0 .. d_{j-1}``."""
    if not pen:
        return np.int32(0)
    if counted:  # (the history's counts kept: ``counts`` holds the drafts alone)
        return counts[t] + (pt[20][r, t] if history_kept(pt, L) else np.int32(0))
    if pt[22]:
        n = np.int64(pt[20][r, t])  # the history's (its prompt bit included)
    else:
        prompt, output = pt[0][r, :P], pt[0][r, P:L]  # (loops from 0: one from P measured
        in_prompt = 0  # 2.7x slower alone, 4x in the op: not vectorised)
        for i in range(prompt.shape[0]):
            in_prompt += prompt[i] == t
        n = np.int64(0)
        for i in range(output.shape[0]):
            n += output[i] == t
        n |= PROMPT_BIT if in_prompt > 0 else np.int32(0)
    for q in range(j):
        f = lo + q
        if 0 <= f < drafts.shape[0] and drafts[f] == t:
            n += 1
    return np.int32(n)


@jit
def _scan(masked, prow, l32, l16, bf16, g, pt, b, r, L, P, counted, counts, drafts, lo, j, t,
          best, tok, buf):  # fmt: skip
    """The best ``(value, -id)`` among ``(best, tok)`` and the ids other than ``t`` whose
    entry in the raw row (``masked``: ``prow``, the row with its mask) reaches it, each
    processed alone (:func:`_value_at`), for a row whose processing only lowers entries
    other than the bias ids'. Branch and bound: a block with no entry at the best so far
    (a counting pass) is skipped, and its entries are read only up to the last that
    reaches it. Returns ``(tok, best, ok)``; not ok after :data:`SCAN_CAP` ids (a flat
    row: the caller processes it in full)."""
    V = max(l32.shape[1], l16.shape[1])
    n_eval = 0
    for j0 in range(0, V, BLOCK):
        n = min(BLOCK, V - j0)
        if masked:
            src = block(prow, l16, False, 0, j0, n, buf)
        else:
            src = block(l32, l16, bf16, g, j0, n, buf)
        thr = best
        left = 0  # the block's entries >= thr (a comparison pass, which vectorises)
        for i in range(n):
            left += src[i] >= thr
        if left == 0 or (left == 1 and j0 <= t < j0 + n):
            continue
        for i in range(n):  # find them (an entry NaN or below thr is never one)
            if left == 0:
                break
            if not src[i] >= thr:
                continue
            left -= 1
            c = j0 + i
            if c == t or not (src[i] > best or (src[i] == best and c < tok)):
                continue
            n_eval += 1
            if n_eval > SCAN_CAP:
                return tok, best, False
            cnt = _count_of(pt, r, L, P, True, counted, counts, drafts, lo, j, c)
            v = _value_at(l32, l16, bf16, g, pt, b, r, L, P, True, drafts, lo, j, cnt, c)
            if v > best or (v == best and c < tok):
                best, tok = v, c
    return tok, best, True


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
    drafts before the row; if not, they are counted here when the row is processed in
    full. Returns ``(token, nu, counted)``.

    Usually without processing the row or counting the history. Let no penalty be able to
    raise a logit (``repetition_penalty >= 1``, frequency and presence penalties ``>= 0``,
    or no penalty; a penalty then never raises one, in fp32 too, rounding being
    monotonic), and let ``t``, the raw row's argmax (the pass plain verification makes;
    if the mask clears it, the argmax of the row copied with the mask into ``prow``), be
    above ``-inf`` and not a bias id, bad word's last token or stop token
    (:func:`_named`). Then every entry other than a bias id's is at most its (masked) raw
    value, and the entries the processing leaves alone are at most ``t``'s and equal only
    at higher ids. If ``t`` is unseen (not in the history or the drafts before the row:
    two comparison passes, :func:`_count_of`), its entry is unchanged; if seen, its
    penalised value is computed alone and the ids whose (masked) raw value still reaches
    it are processed alone (:func:`_scan`; usually a few). Either way the bias ids whose
    biased value reaches the best are computed alone last (:func:`_value_at`). Otherwise
    (a penalty that can raise a logit, ``t`` named, no allowed entry above ``-inf``, a
    penalised value of ``-inf`` or NaN, or a flat row with more than :data:`SCAN_CAP`
    such ids) the row is processed into ``prow`` and its argmax taken."""
    V = prow.shape[1]
    t = argmax(l32, l16, bf16, g, V, buf)
    m = as_float32(l16[g, t]) if bf16 else l32[g, t]
    raising = pen and (pt[5][b] < 1.0 or pt[6][b] < 0.0 or pt[7][b] < 0.0)
    fast = not raising and m > NEG_INF
    masked = fast and not _mask_bit(pt, b, g, t)
    if masked:  # the masked row's argmax instead (a copy)
        copy_row(l32, l16, bf16, g, prow[0], row_words(pt, b, g, words), words)
        t = argmax(prow, l16, False, 0, V, buf)
        m = prow[0, t]
        fast = m > NEG_INF
    fast = fast and not _named(pt, b, t)
    if fast:
        best, tok = m, t
        cnt = _count_of(pt, r, L, P, pen, counted, counts, drafts, lo, j, t)
        if cnt != 0:  # a seen argmax: its penalised value, then the ids that reach it
            best = _penalised(m, cnt, pt[5][b], pt[6][b], pt[7][b])
            fast = best > NEG_INF  # (-inf or NaN, as an overflow leaves it: the full row)
        if cnt != 0 and fast:
            tok, best, fast = _scan(masked, prow, l32, l16, bf16, g, pt, b, r, L, P, counted,
                                    counts, drafts, lo, j, t, best, tok, buf)  # fmt: skip
    if fast:
        bias_ids = pt[9]
        for k in range(bias_ids.shape[1]):
            c = bias_ids[b, k]
            if not 0 <= c < V or _biased(l32, l16, bf16, g, pt, b, c) < best:
                continue  # at most its biased value: below the best
            cnt = _count_of(pt, r, L, P, pen, counted, counts, drafts, lo, j, c)
            v = _value_at(l32, l16, bf16, g, pt, b, r, L, P, pen, drafts, lo, j, cnt, c)
            if v > best or (v == best and c < tok):
                best, tok = v, c
        return tok, nu, counted
    if pen and not counted:
        nu, counted = count_upto(pt, r, L, P, V, counts, uniq, drafts, lo, j), True
    process_row(l32, l16, bf16, g, pt, b, r, L, P, pen, nu, drafts, lo, j, prow[0], counts,
                uniq, words)  # fmt: skip
    return argmax(prow, l16, False, 0, V, buf), nu, counted
