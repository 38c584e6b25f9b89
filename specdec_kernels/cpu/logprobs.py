"""The CPU top-N logprobs of a verify step: ``top_logprobs`` as one numba kernel
(``cpu/_jit.py``).

Per emitted slot, its target row in ``BLOCK`` pieces (``cpu/sampling.py``): the maximum,
then per piece the emitted token's rank count (a vectorised compare) and the merge into a
small sorted list of the ``N`` largest logits, skipped where the piece's maximum is not
above the list's last (the common case once the list holds the row's top; an integer max
over order keys, vectorised); an insertion happens only where a logit beats the list's
last, so ties stay with the lower id, which came first; then, for ``raw_logprobs``, the
log-normaliser's pass. Above ``N = 64`` one stable sort of the row gives the top N. In
the processed modes a sampled request's slot also takes the row's weights and the filters'
threshold exactly as ``rejection_sample`` does (``cpu/filters.py``'s ``kept_weights``), and
its values are those of the row as sampled.
"""

from __future__ import annotations

import numpy as np
import torch

from specdec_kernels.cpu._jit import float_rows, jit, np_, outputs, scratch
from specdec_kernels.cpu.filters import kept_weights
from specdec_kernels.cpu.sampling import (
    BLOCK,
    block,
    param_arrays,
    params_ok,
    range_max,
    raw_log_normaliser,
    row_max,
)


@jit
def value_of(x, m, log_s, n_max, logits_mode):
    """The mode's value of a logit ``x`` (NaN read as -inf) in a row of maximum ``m``: the
    logit, or its log-softmax ``(x - m) - log S`` (``log_s`` float64); a row whose maximum is
    not finite: ``-log n`` at its ``n`` maximal ids, -inf elsewhere (``docs/design.md``,
    ``rejection_sample``; its ``logprobs`` use this too)."""
    if logits_mode:
        return x
    if np.isfinite(m):
        return np.float32((x - m) - log_s)
    return np.float32(-np.log(np.float32(n_max))) if x == m else np.float32(-np.inf)


@jit
def processed_value(x, m, T, log_s, n_max, kept, logits_mode):
    """A sampled row's value of a logit ``x`` in the processed modes: ``x / T`` or
    ``(x - m) / T - log S`` (``log_s`` of the kept weights' float64 sum) on the kept set,
    -inf elsewhere; a row whose maximum is not finite: :func:`value_of`'s rule."""
    if not kept:
        return np.float32(-np.inf)
    if logits_mode:
        return np.float32(x / T)
    if np.isfinite(m):  # in float64: l - m can pass the float32 range where (l - m) / T does not
        return np.float32((np.float64(x) - np.float64(m)) / np.float64(T) - log_s)
    return value_of(x, m, log_s, n_max, False)


@jit
def _count_ge(src, x):
    """How many entries of ``src`` are ``>= x`` (NaN: none; one vectorised pass)."""
    c = 0
    for i in range(src.shape[0]):
        c += src[i] >= x
    return c


@jit
def _insert_top(src, j0, ids, vals, filled):
    """Merge the block ``src`` (ids from ``j0``) into the sorted ``N`` largest."""
    N = ids.shape[0]
    for i in range(src.shape[0]):
        x = src[i] if src[i] == src[i] else -np.inf
        if filled == N and x <= vals[N - 1]:
            continue
        p = filled if filled < N else N - 1  # after every larger or equal entry
        while p > 0 and vals[p - 1] < x:
            vals[p], ids[p] = vals[p - 1], ids[p - 1]
            p -= 1
        vals[p], ids[p] = x, j0 + i
        filled = min(filled + 1, N)
    return filled


SORT_ABOVE_N = 64
"""Above this many entries the top N come from one stable sort of the row instead of the
sorted list (whose insertions would cost ~N per entry)."""


@jit
def _sorted_top(l32, l16, bf16, g, V, ids, vals, neg, buf):
    """The ``N`` largest logits of row ``g`` by a stable sort (ties: the lower id first)."""
    for j0 in range(0, V, BLOCK):
        src = block(l32, l16, bf16, g, j0, min(BLOCK, V - j0), buf)
        for i in range(src.shape[0]):
            neg[j0 + i] = -src[i] if src[i] == src[i] else np.inf
    order = np.argsort(neg[:V], kind="mergesort")
    for t in range(ids.shape[0]):
        ids[t] = order[t]
        x = block(l32, l16, bf16, g, order[t], 1, buf)[0]
        vals[t] = x if x == x else -np.inf


@jit
def _top(
    l32, l16, bf16, out_tok, num_emitted, cu, logits_mode, tok_lp, tok_rank, top_ids, top_vals,
    buf, w, neg, processed, temp, has_temp, top_k, has_top_k, top_p, has_top_p, min_p, has_min_p,
    pw, blocks, refs, fwork,
):  # fmt: skip
    B, K1 = out_tok.shape
    N = top_ids.shape[2]
    V = max(l32.shape[1], l16.shape[1])
    rows = max(l32.shape[0], l16.shape[0])
    for b in range(B):
        tok_lp[b, :] = 0.0
        tok_rank[b, :] = 0
        top_ids[b, :, :] = -1
        top_vals[b, :, :] = 0.0
        for j in range(min(max(num_emitted[b], 0), K1)):
            g = cu[b] + b + j
            tok = out_tok[b, j]
            if g < 0 or g >= rows or tok < 0 or tok >= V:
                break
            m = row_max(l32, l16, bf16, g, V, buf)
            x_tok = block(l32, l16, bf16, g, tok, 1, buf)[0]
            x_tok = x_tok if x_tok == x_tok else -np.inf
            ids, vals = top_ids[b, j], top_vals[b, j]  # vals: the logits until the end
            # the rank (an emitted -inf: every id), the maxima of a row whose maximum is
            # not finite (-inf: every id), and the top N, skipping the blocks below it
            rank = V if x_tok == -np.inf else 0
            n_max = 0 if m == np.inf else V
            filled = 0
            for j0 in range(0, V, BLOCK):
                n = min(BLOCK, V - j0)
                skip = N == 0 or N > SORT_ABOVE_N
                skip = skip or (
                    filled == N and range_max(l32, l16, bf16, g, j0, n, buf) <= vals[N - 1]
                )
                if skip and x_tok == -np.inf and m != np.inf:
                    continue
                src = block(l32, l16, bf16, g, j0, n, buf)
                if x_tok > -np.inf:
                    rank += _count_ge(src, x_tok)
                if m == np.inf:
                    n_max += _count_ge(src, m)
                if not skip:
                    filled = _insert_top(src, j0, ids, vals, filled)
            if N > SORT_ABOVE_N:
                _sorted_top(l32, l16, bf16, g, V, ids, vals, neg, buf)
            T = temp[b] if processed and has_temp else np.float32(0.0)
            if T > 0.0:  # the row as sampled: kept iff its weight is >= the threshold
                k_ = top_k[b] if has_top_k else 0
                p_ = top_p[b] if has_top_p else np.float32(1.0)
                mp = min_p[b] if has_min_p else np.float32(0.0)
                t, S = kept_weights(l32, l16, bf16, g, V, T, k_, p_, mp, pw, blocks, refs, buf,
                                    fwork)  # fmt: skip
                log_s = np.log(S)
                for i in range(N):
                    vals[i] = processed_value(vals[i], m, T, log_s, n_max, pw[ids[i]] >= t,
                                              logits_mode)  # fmt: skip
                tok_lp[b, j] = processed_value(x_tok, m, T, log_s, n_max, pw[tok] >= t,
                                               logits_mode)  # fmt: skip
            else:
                log_s = np.float64(0.0)
                if not logits_mode and np.isfinite(m):
                    log_s = np.log(raw_log_normaliser(l32, l16, bf16, g, V, m, w))
                for i in range(N):
                    vals[i] = value_of(vals[i], m, log_s, n_max, logits_mode)
                tok_lp[b, j] = value_of(x_tok, m, log_s, n_max, logits_mode)
            tok_rank[b, j] = rank


@jit
def _values_ok(rows, V, out_tok, num_emitted, cu, params):
    """The wrapper's value checks (``ops/logprobs.py``) as one pass: ``cu`` a prefix sum of
    counts in ``[0, k]`` from 0, ``cu[B] + B`` rows, ``num_emitted`` in ``[0, k_b + 1]``,
    the emitted tokens in ``[0, V)``, the sampling parameters in their ranges."""
    B, K1 = out_tok.shape
    if cu[0] != 0 or rows < cu[B] + B or not params_ok(*params):
        return False
    for b in range(B):
        kb = cu[b + 1] - cu[b]
        e = num_emitted[b]
        if kb < 0 or kb > K1 - 1 or e < 0 or e > kb + 1:
            return False
        for j in range(e):
            if out_tok[b, j] < 0 or out_tok[b, j] >= V:
                return False
    return True


def top_logprobs(
    target_logits, output_token_ids, num_emitted, cu_num_draft_tokens, temperature=None,
    top_k=None, top_p=None, min_p=None, *, num_logprobs, logprobs_mode,
):  # fmt: skip
    """The CPU implementation of ``specdec::top_logprobs`` (registered directly)."""
    return _run(target_logits, output_token_ids, num_emitted, cu_num_draft_tokens,
                (temperature, top_k, top_p, min_p), num_logprobs, logprobs_mode, False)  # fmt: skip


def top_logprobs_checked(
    target_logits, output_token_ids, num_emitted, cu_num_draft_tokens, temperature=None,
    top_k=None, top_p=None, min_p=None, *, num_logprobs, logprobs_mode,
):  # fmt: skip
    """:func:`top_logprobs` after the wrapper's value checks, in one numba pass before
    anything is computed; None if one fails (``ops/_library.py``'s ``call``)."""
    return _run(target_logits, output_token_ids, num_emitted, cu_num_draft_tokens,
                (temperature, top_k, top_p, min_p), num_logprobs, logprobs_mode, True)  # fmt: skip


def _run(target_logits, output_token_ids, num_emitted, cu_num_draft_tokens, sampling, N, mode,
         check):  # fmt: skip
    out_tok, emitted, cu = np_(output_token_ids), np_(num_emitted), np_(cu_num_draft_tokens)
    params = param_arrays(*sampling)
    if check and not _values_ok(target_logits.shape[0], target_logits.shape[1], out_tok,
                                emitted, cu, params):  # fmt: skip
        return None
    B, K1 = output_token_ids.shape
    (tok_lp, tok_rank, top_ids, top_vals), arrays = outputs(
        ((B, K1), np.float32), ((B, K1), np.int32), ((B, K1, N), np.int32),
        ((B, K1, N), np.float32),
    )  # fmt: skip
    if B == 0:
        return tok_lp, tok_rank, top_ids, top_vals
    l32, l16 = float_rows(target_logits, target_logits.shape[0])
    V = target_logits.shape[1]
    processed = mode.startswith("processed") and sampling[0] is not None
    sampled = 3 * V if processed else 0  # the weights and the filters' work
    sort = 2 * BLOCK + (V if N > SORT_ABOVE_N else 0)
    work = scratch(sort + sampled)
    nb = (V + BLOCK - 1) // BLOCK if processed else 0
    _top(
        l32, l16, target_logits.dtype == torch.bfloat16, out_tok, emitted, cu,
        mode.endswith("_logits"), *arrays, work[:BLOCK], work[BLOCK : 2 * BLOCK],
        work[2 * BLOCK : sort], processed, *params, work[sort : sort + V],
        np.empty(nb, dtype=np.float64), np.empty(nb, dtype=np.float32), work[sort + V :],
    )  # fmt: skip
    return tok_lp, tok_rank, top_ids, top_vals
