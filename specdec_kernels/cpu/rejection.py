"""The CPU rejection sampler: ``rejection_sample`` as one numba kernel (``cpu/_jit.py``).

Per request, its target rows in order until the first row that is not accepted (later rows
never matter, so they are never read): a greedy row is one maximum pass and one pass to
the first maximal id; a sampled row is one pass that finds the maximum block by block,
takes the weights against it and sums them by blocks (then rescales the blocks taken
against an older maximum; with a filter on, a maximum pass and a weights pass instead, so
ties keep equal weights), the filters (only where on), and an inverse-CDF search that
reads the weights up to the sample (``cpu/sampling.py``, ``cpu/filters.py``). One-hot
drafts are verified by coupling (the draft is kept iff it is the row's own sample); with
draft probabilities a rejected row samples the residual ``max(p - q, 0)``. Uniforms are
the library's Philox, bit-identical to the kernel's; tokens differ from the kernel's only
where a uniform lands within float rounding of a CDF boundary (``docs/design.md``,
"``rejection_sample``").
"""

from __future__ import annotations

import numpy as np
import torch

from specdec_kernels.cpu._jit import (
    NONE_F32_2D,
    NONE_I32,
    NONE_I64,
    as_float32,
    borrowed,
    float_rows,
    jit,
    np_,
    opt,
    outputs,
    scratch,
)
from specdec_kernels.cpu.filters import kept_weights
from specdec_kernels.cpu.logprobs import value_of
from specdec_kernels.cpu.processed_argmax import processed_argmax
from specdec_kernels.cpu.processing import NONE_TENSORS, buffers, sync_counts, tensors
from specdec_kernels.cpu.processing import values_ok as processing_values_ok
from specdec_kernels.cpu.processing_rows import (
    count_draft,
    process_row,
    request_end,
    request_start,
)
from specdec_kernels.cpu.sampling import (
    BLOCK,
    argmax,
    block,
    inverse_cdf,
    lane_sum,
    param_arrays,
    params_ok,
    philox_uniform,
    raw_log_normaliser,
    row_max,
)


def require_seeds_and_offsets(temperature, seeds, offsets) -> None:
    """The op's one structural check (shared by the CPU path, the Triton launcher and the
    fake): sampled rows need ``seeds`` and ``offsets``."""
    if temperature is not None and (seeds is None or offsets is None):
        raise ValueError(
            "specdec::rejection_sample needs seeds and offsets when temperature is given "
            "(the Python wrapper rejection_sample fills them)"
        )


@jit
def _value(f32, u16, bf16, g, i):
    """Entry ``[g, i]`` of fp32 rows or (widened exactly) of bfloat16 rows."""
    if bf16:
        return as_float32(u16[g, i])
    return f32[g, i]


@jit
def _log_prob(f32, u16, bf16, g, V, tok, buf, w):
    """``log_softmax(row g)[tok]`` as ``(l_tok - m) - log S`` (exact for any finite logits);
    a row with ``+inf`` or only ``-inf`` maxima: ``log(1/n)`` at its ``n`` maximal ids."""
    m = row_max(f32, u16, bf16, g, V, buf)
    l_tok = _value(f32, u16, bf16, g, tok)
    if l_tok != l_tok:
        l_tok = -np.inf
    if np.isfinite(m):
        return value_of(l_tok, m, np.log(raw_log_normaliser(f32, u16, bf16, g, V, m, w)), 0, False)
    n_max = 0
    for j0 in range(0, V, BLOCK):
        src = block(f32, u16, bf16, g, j0, min(BLOCK, V - j0), buf)
        for i in range(src.shape[0]):
            v = src[i] if src[i] == src[i] else -np.inf
            if v == m:
                n_max += 1
    return value_of(l_tok, m, np.float64(0.0), n_max, False)


@jit
def _sample(w, V, blocks, S, u, f32, u16, bf16, g, buf):
    """The row's inverse-CDF sample at ``u`` (its argmax if no weight is left)."""
    y = inverse_cdf(w, V, blocks, S, u)
    return y if y >= 0 else argmax(f32, u16, bf16, g, V, buf)


@jit
def values_ok(cu, k, n_drafts, q_rows, has_probs, temp, has_temp, top_k, has_top_k, top_p,
              has_top_p, min_p, has_min_p):  # fmt: skip
    """The wrapper's value checks (``ops/rejection.py``'s ``_check_values``) as one pass:
    ``cu[0] == 0``, every count in ``[0, k]``, ``cu[B] <= len(draft_token_ids)`` and (with
    draft probabilities) ``<=`` their rows, the parameters in their ranges."""
    if cu[0] != 0:
        return False
    for b in range(cu.shape[0] - 1):
        if not 0 <= cu[b + 1] - cu[b] <= k:
            return False
    N = cu[cu.shape[0] - 1]
    if N > n_drafts or (has_probs and N > q_rows):
        return False
    return params_ok(temp, has_temp, top_k, has_top_k, top_p, has_top_p, min_p, has_min_p)


@jit
def _reject(
    l32, l16, l_bf16, drafts, cu, q32, q16, q_bf16, has_probs, temp, has_temp, top_k,
    has_top_k, top_p, has_top_p, min_p, has_min_p, seeds, offsets, lp_on, check, out,
    num_emitted, logprobs, w, blocks, refs, buf, proc, pt, counts, uniq, words, prow, fwork,
):  # fmt: skip
    B, K1 = out.shape
    V = max(l32.shape[1], l16.shape[1])
    rows = max(l32.shape[0], l16.shape[0])
    n_drafts = drafts.shape[0]
    q_rows = max(q32.shape[0], q16.shape[0])  # a draft without its q row is rejected
    if check and not values_ok(cu, K1 - 1, n_drafts, q_rows, has_probs, temp, has_temp, top_k,
                               has_top_k, top_p, has_top_p, min_p, has_min_p):  # fmt: skip
        return False
    if check and proc and not processing_values_ok(pt, B, V):
        return False
    if proc and pt[22]:  # a ProcessingState's kept counts, once the values are accepted
        sync_counts(pt, B, V)
    # what the rows' functions are passed, without reference counts (``borrowed``)
    l32, l16, q32, q16, drafts, w, blocks, refs, buf, counts, uniq, words, prow, fwork = borrowed(
        (l32, l16, q32, q16, drafts, w, blocks, refs, buf, counts, uniq, words, prow, fwork)
    )
    pt = borrowed(pt)
    for b in range(B):
        out[b, :] = -1
        if lp_on:
            logprobs[b, :] = 0.0
        kb = min(max(cu[b + 1] - cu[b], 0), K1 - 1)
        T = temp[b] if has_temp else np.float32(0.0)
        emitted = 0
        r, pr, L, P, pen, nu = np.int64(-1), b, np.int64(0), np.int64(0), False, np.int64(0)
        lazy = T == 0.0 and not lp_on  # greedy rows count the history only if they must
        if proc:
            r, pr, L, P, pen, nu = request_start(pt, b, V, counts, uniq, not lazy)
        counted = not lazy
        direct = r >= 0 and lazy
        for j in range(kb + 1):
            g = cu[b] + b + j  # the target row verifying d_j (the bonus row at j = kb)
            if g < 0 or g >= rows:
                break
            s32, s_bf16, sg = l32, l_bf16, g  # the row verification reads
            tok = -1
            if r >= 0 and counted:
                nu = count_draft(pt, r, L, pen, nu, drafts, cu[b], j, counts, uniq, V)
            if direct:  # greedy: the processed row's argmax, usually without processing it
                tok, nu, counted = processed_argmax(
                    l32, l16, l_bf16, g, pt, pr, r, L, P, pen, nu, counted, drafts, cu[b], j,
                    prow, counts, uniq, words, buf,
                )  # fmt: skip
            elif r >= 0:  # processed: row g in fp32 in prow[0], then processed there
                process_row(l32, l16, l_bf16, g, pt, pr, r, L, P, pen, nu, drafts, cu[b], j,
                            prow[0], counts, uniq, words)  # fmt: skip
                s32, s_bf16, sg = prow, False, 0
            f = cu[b] + j  # the flat draft index
            x = drafts[f] if j < kb and 0 <= f < n_drafts else -1
            valid = 0 <= x < V and (f < q_rows or not has_probs)
            acc = False
            if T == 0.0:  # greedy: the argmax
                if not direct:
                    tok = argmax(s32, l16, s_bf16, sg, V, buf)
                acc = valid and tok == x
            else:
                k_ = top_k[b] if has_top_k else 0
                p_ = top_p[b] if has_top_p else np.float32(1.0)
                mp = min_p[b] if has_min_p else np.float32(0.0)
                S = kept_weights(s32, l16, s_bf16, sg, V, T, k_, p_, mp, w, blocks, refs, buf,
                                 fwork)[1]  # fmt: skip
                S32 = np.float32(S)  # p = w / S in float32, as the kernel computes it
                u1 = philox_uniform(seeds[b], offsets[b] + j, 1)
                coupled = not has_probs or j == kb
                if coupled or not valid:  # the draft is kept iff it is the row's sample
                    tok = _sample(w, V, blocks, S, u1, s32, l16, s_bf16, sg, buf)
                    acc = coupled and valid and tok == x
                else:  # speculative sampling: u < p(x) / q(x)
                    qx = _value(q32, q16, q_bf16, f, x)
                    u0 = philox_uniform(seeds[b], offsets[b] + j, 0)
                    if qx > 0 and u0 < (w[x] / S32) / qx:
                        tok, acc = x, True
                    else:  # normalize(max(p - q, 0)), unless it has no mass: then p's sample
                        tok = _sample(w, V, blocks, S, u1, s32, l16, s_bf16, sg, buf)
                        R = np.float64(0.0)
                        for j0 in range(0, V, BLOCK):
                            n = min(BLOCK, V - j0)
                            q = block(q32, q16, q_bf16, f, j0, n, buf)
                            p = w[j0 : j0 + n]
                            for i in range(n):
                                p[i] = max(p[i] / S32 - q[i], np.float32(0.0))
                            blocks[j0 // BLOCK] = lane_sum(p)
                            R += blocks[j0 // BLOCK]
                        if R > 0:
                            r_tok = inverse_cdf(w, V, blocks, R, u1)
                            if r_tok >= 0:
                                tok = r_tok
            out[b, j] = tok
            if lp_on:
                logprobs[b, j] = _log_prob(s32, l16, s_bf16, sg, V, tok, buf, w)
            emitted += 1
            if not acc:
                break
        if proc:
            request_end(counts, uniq, nu)
        num_emitted[b] = emitted
    return True


def rejection_sample(
    target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k, top_p,
    min_p, seeds, offsets, *, num_speculative_tokens, return_logprobs,
):  # fmt: skip
    """The CPU implementation of ``specdec::rejection_sample`` (registered directly)."""
    return _run(
        target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k,
        top_p, min_p, seeds, offsets, num_speculative_tokens, return_logprobs, False,
    )  # fmt: skip


def rejection_sample_checked(
    target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k, top_p,
    min_p, seeds, offsets, *, num_speculative_tokens, return_logprobs,
):  # fmt: skip
    """:func:`rejection_sample` after the wrapper's value checks, run in the kernel before
    it writes anything; None if one fails (``ops/_library.py``'s ``call`` then raises the
    wrapper's ``ValueError``). Saves the checks' own numba calls: ~5 us of a warm B = 1
    call (a cold call's ~130 us of fixed cost, caches flushed, stays: it is the wrapper's,
    the tensor views' and the dispatch's code and data, not the checks')."""
    return _run(
        target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k,
        top_p, min_p, seeds, offsets, num_speculative_tokens, return_logprobs, True,
    )  # fmt: skip


def rejection_sample_processed(
    target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k, top_p,
    min_p, seeds, offsets, *, num_speculative_tokens, return_logprobs, check, processing,
):  # fmt: skip
    """``rejection_sample(process_logits(target_logits, ...), ...)`` as one kernel call
    (``ops/rejection.py``'s route for plain CPU tensors): each row verification reaches is
    processed into one fp32 scratch row just before it is verified (``cpu/processing.py``'s
    row functions, the same code ``process_logits`` runs), rows it does not reach are never
    processed. ``processing``: ``process_logits``' keyword arguments after the
    draft tokens, as its wrapper passes them to its op, or the kernels' tuple of them
    (``cpu/processing.py``'s ``TENSORS``, as ``ProcessingState`` makes it). With
    ``check``, the rejection and processing value checks run in the kernel (None if one
    fails), as in :func:`rejection_sample_checked`."""
    pt = processing if isinstance(processing, tuple) else tensors(**processing)
    return _run(
        target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k,
        top_p, min_p, seeds, offsets, num_speculative_tokens, return_logprobs, check, pt,
    )  # fmt: skip


def _run(
    target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k, top_p,
    min_p, seeds, offsets, num_speculative_tokens, return_logprobs, check, pt=None,
):  # fmt: skip
    require_seeds_and_offsets(temperature, seeds, offsets)
    K1 = num_speculative_tokens + 1
    B = cu_num_draft_tokens.shape[0] - 1
    V = target_logits.shape[1]
    lp_shape = (B, K1) if return_logprobs else (0,)
    (out, num_emitted, logprobs), (out_a, emitted_a, lp_a) = outputs(
        ((B, K1), np.int32), (B, np.int32), (lp_shape, np.float32)
    )
    cu = np_(cu_num_draft_tokens)
    if B == 0:  # (cu = [c]: only cu[0] == 0 to check)
        return (out, num_emitted, logprobs) if not check or cu[0] == 0 else None
    N = int(cu[-1])  # the live rows are the first N + B (numpy views: no torch op per slice)
    l32, l16 = float_rows(target_logits, N + B)
    q32, q16 = float_rows(draft_probs, N)
    nb = (V + BLOCK - 1) // BLOCK
    proc = pt is not None
    filtered = temperature is not None and (top_k is not None or top_p is not None)
    end = V + BLOCK + (V if proc else 0)
    work = scratch(end + (2 * V if filtered else 0))  # [w | buf | prow | the filters' work]
    if proc:
        bufs = buffers(V, pt[0].shape[1], draft_token_ids.shape[0], pt[8])
        prow = work[V + BLOCK : 2 * V + BLOCK].reshape(1, V)
    else:
        pt, bufs, prow = NONE_TENSORS, (NONE_I32,) * 3, NONE_F32_2D
    ok = _reject(
        l32, l16, target_logits.dtype == torch.bfloat16,
        np_(draft_token_ids) if draft_token_ids.numel() else NONE_I32, cu,
        q32, q16, draft_probs is not None and draft_probs.dtype == torch.bfloat16,
        draft_probs is not None, *param_arrays(temperature, top_k, top_p, min_p),
        opt(seeds, NONE_I64), opt(offsets, NONE_I64),
        return_logprobs, check, out_a, emitted_a, lp_a if return_logprobs else NONE_F32_2D,
        work[:V], np.empty(nb, dtype=np.float64), np.empty(nb, dtype=np.float32),
        work[V : V + BLOCK], proc, pt, *bufs, prow, work[end : end + (2 * V if filtered else 0)],
    )  # fmt: skip
    return (out, num_emitted, logprobs) if ok else None
