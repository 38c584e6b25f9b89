"""The row functions of the CPU logits processing (``cpu/processing.py``'s kernel and
``rejection_sample(..., processing=...)``'s, ``cpu/rejection.py``): a row's mask words, the
copy that applies them, the counts of a request's history and drafts, and the sparse steps
(bias, penalties, bad words, min_tokens) on one row. ``pt`` is the processing inputs'
tuple (``cpu/processing.py``'s ``TENSORS``). The row functions' ``b`` is the row of the
request's parameters: its batch index, or its state row with ``by_row``
(:func:`request_start`'s ``p``). Contract: ``docs/design.md``, "``process_logits``"."""

from __future__ import annotations

import numpy as np

from specdec_kernels.cpu._jit import NONE_I32, as_float32, jit

PROMPT_BIT = np.int32(1 << 30)
"""Bit of a count that says "seen in the prompt"; the bits below count output occurrences."""
NEG_INF = np.float32(-np.inf)

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
def penalties_on(pt, p):
    """Whether parameter row ``p``'s penalties change anything (not 1, 0, 0)."""
    return pt[5][p] != 1.0 or pt[6][p] != 0.0 or pt[7][p] != 0.0


@jit
def request_start(pt, b, V, counts, uniq, count):
    """Request ``b``'s processing state: ``(r, p, L, P, pen, nu)`` (its state row, -1 for
    padding; the row of its parameters, ``r`` where they are kept per state row (``pt``'s
    ``by_row``), else ``b``, which the row functions take as their ``b``; its history and
    prompt lengths; whether its penalties are on; the number of distinct tokens counted
    into ``counts`` / ``uniq``: its history if ``count`` and ``pen``, else none yet).
    ``pt``: the :data:`TENSORS` tuple."""
    token_ids, num_tokens, num_prompt, req, has_req = pt[0], pt[1], pt[2], pt[3], pt[4]
    has_pen = pt[8]
    R, L_max = token_ids.shape
    r = np.int64(req[b]) if has_req else np.int64(b)
    if r < 0 or r >= R:
        return np.int64(-1), np.int64(b), np.int64(0), np.int64(0), False, np.int64(0)
    p = r if pt[19] else np.int64(b)
    L = np.int64(min(max(num_tokens[r], 0), L_max))
    P = np.int64(min(max(num_prompt[r], 0), L))
    pen = has_pen and penalties_on(pt, p)
    nu = np.int64(0)
    if pen and count:
        nu = count_upto(pt, r, L, P, V, counts, uniq, NONE_I32, 0, 0)
    return r, p, L, P, pen, nu


@jit
def history_kept(pt, L):
    """Whether a request with ``L`` history tokens takes its history counts from a
    ``ProcessingState``'s kept counts (``pt``'s ``has_kept``) where a row is processed in
    full: then :func:`count_upto` leaves the history out and :func:`process_row` applies
    the penalties in one O(V) pass. Only for histories of at least ``V / 2`` tokens: a
    shorter one is cheaper to count (O(L) once per request, O(distinct tokens) per row)
    than a pass over ``V`` per row (design.md, "Kept counts", has the measurements). The
    greedy shortcut reads the kept counts either way."""
    return pt[22] and 2 * L >= pt[20].shape[1]


@jit
def count_upto(pt, r, L, P, V, counts, uniq, drafts, lo, j):
    """Count the history of state row ``r`` (``L`` tokens, the first ``P`` the prompt)
    and the drafts ``d_0 .. d_{j-1}`` (output tokens) into ``counts`` / ``uniq`` (empty
    before); returns ``nu``. Where the history's counts are kept (:func:`history_kept`)
    it is not counted here: ``counts`` holds the drafts alone, the row functions add the
    kept counts of row ``r``."""
    token_ids = pt[0]
    nu = np.int64(0)
    for i in range(0 if history_kept(pt, L) else L):
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
        nu = _count_output(drafts[f] if 0 <= f < drafts.shape[0] else -1, counts, uniq, nu, V)
    return nu


@jit
def _count_output(d, counts, uniq, nu, V):
    """Count token ``d`` (ids outside ``[0, V)``: no token) as one more output occurrence;
    returns the new ``nu``."""
    if 0 <= d < V:
        if counts[d] == 0:
            uniq[nu] = d
            nu += 1
        counts[d] += 1
    return nu


@jit
def count_draft(pt, r, L, pen, nu, drafts, lo, j, counts, uniq, V):
    """Before a request's row ``j`` (after its row ``j - 1``; state row ``r``): count the
    draft ``d_{j-1}`` as an output token; returns the new ``nu``."""
    if pen and j > 0:
        nu = _count_output(_past(drafts, lo, j, pt[0], r, L, 0), counts, uniq, nu, V)
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
def process_row(l32, l16, bf16, g, pt, b, r, L, P, pen, nu, drafts, lo, j, x, counts, uniq,
                words):  # fmt: skip
    """Row ``g`` (request ``b``'s row ``j``) processed into ``x`` (fp32 ``[V]``): copied
    with its mask (:func:`row_words`, :func:`copy_row`), then the sparse steps, after
    :func:`request_start` and :func:`count_draft` (or :func:`count_upto`) for rows ``0 ..
    j``. ``words``: scratch for the mask."""
    masked = row_words(pt, b, g, words)
    copy_row(l32, l16, bf16, g, x, masked, words)
    _sparse_steps(pt, b, r, L, P, pen, nu, drafts, lo, j, x, counts, uniq, masked, words)


@jit
def _sparse_steps(pt, b, r, L, P, pen, nu, drafts, lo, j, x, counts, uniq, masked, words):
    """The steps of :func:`process_row` after the copy, on ``x`` in place. The bias and the
    penalties change only ids they name; those that the mask clears are set to ``-inf``
    again after them, so every entry is what the order of the contract (bias, penalties,
    masks, bans) gives, whatever the values. Writes only the counted tokens, the bias ids,
    the bad words' last tokens and the stop tokens."""
    token_ids, rp, fp, pp = pt[0], pt[5], pt[6], pt[7]
    bias_ids, bias_values = pt[9], pt[10]
    bad, min_tok, stops, has_min = pt[15], pt[16], pt[17], pt[18]
    V = x.shape[0]
    for m in range(bias_ids.shape[1]):
        t = bias_ids[b, m]
        if 0 <= t < V:
            x[t] = x[t] + bias_values[b, m]
    if pen and history_kept(pt, L):  # one pass with the kept counts (masked ids stay -inf)
        kept = pt[20][r]
        rb, fb, pb = rp[b], fp[b], pp[b]
        for t in range(V):
            c = kept[t] + counts[t]
            if c != 0:
                v = _penalised(x[t], c, rb, fb, pb)
                x[t] = NEG_INF if masked and not _allowed(words, t) else v
    elif pen:
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
def request_end(counts, uniq, nu):
    """Zero the counts of the request's distinct tokens again (the buffer is reused)."""
    for u in range(nu):
        counts[uniq[u]] = 0
