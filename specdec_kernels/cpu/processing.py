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
processing=...)`` runs the same row functions (``cpu/processing_rows.py``) on the rows it
verifies (``cpu/rejection.py``). Contract: ``docs/design.md``, "``process_logits``"."""

from __future__ import annotations

import numpy as np
import torch

from specdec_kernels.cpu._jit import (
    NONE_F32,
    NONE_F32_2D,
    NONE_I32,
    NONE_I32_2D,
    NONE_I32_3D,
    borrowed,
    float_rows,
    jit,
    np_,
    opt,
    outputs,
    zeroed_i32,
)
from specdec_kernels.cpu.processing_rows import (
    PROMPT_BIT,
    copy_row,
    count_draft,
    penalties_on,
    process_row,
    request_end,
    request_start,
)

FLOAT32_MAX = np.float32(np.finfo(np.float32).max)


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
    0`` (the per-request values only for a batch's own ``[B]`` arrays: a
    ``ProcessingState`` checks its rows when they are set)."""
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
    if pt[19]:  # kept per state row (ProcessingState): checked when set, written only then
        return True
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
def _process(l32, l16, bf16, drafts, cu, pt, out, counts, uniq, words):
    n_rows, V = out.shape
    B = cu.shape[0] - 1
    copied = np.zeros(n_rows, dtype=np.bool_)
    l32, l16, drafts, out, counts, uniq, words = borrowed(
        (l32, l16, drafts, out, counts, uniq, words)
    )  # what the rows' functions are passed, without reference counts
    pt = borrowed(pt)
    for b in range(B):
        r, pr, L, P, pen, nu = request_start(pt, b, V, counts, uniq, True)
        if r < 0:
            continue  # a padding row keeps its logits (copied below)
        lo = cu[b]
        kb = max(cu[b + 1] - lo, 0)
        for j in range(kb + 1):
            g = lo + b + j
            if g < 0 or g >= n_rows:
                break
            nu = count_draft(pt, r, L, pen, nu, drafts, lo, j, counts, uniq, V)
            process_row(l32, l16, bf16, g, pt, pr, r, L, P, pen, nu, drafts, lo, j, out[g],
                        counts, uniq, words)  # fmt: skip
            copied[g] = True
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
        min_tokens is not None, False, NONE_I32_2D, NONE_I32_2D, False,
    )  # fmt: skip


TENSORS = (
    "token_ids", "num_tokens", "num_prompt", "req", "has_req", "rp", "fp", "pp", "has_pen",
    "bias_ids", "bias_values", "allowed", "has_allowed", "grammar", "has_grammar", "bad",
    "min_tok", "stops", "has_min", "by_row", "kept_counts", "kept_upto", "has_kept",
)  # fmt: skip
"""The processing inputs as the kernels take them: one tuple (an argument each would make
every kernel that processes rows list 23), absent tensors as empty placeholders beside
their ``has_`` flags. ``by_row``: the per-request parameters (penalties to stop tokens)
are kept per state row (``ops/processing_state.py``'s ``ProcessingState``: ``R`` rows, read
at ``req_indices[b]``) instead of one per request of the batch. ``kept_counts`` (int32
``[R, V]``, ``processing_rows.count_upto``'s encoding) and ``kept_upto`` (int32 ``[R, 2]``:
the history length and prompt length counted): a ``ProcessingState``'s history counts
(``keep_counts=True``), brought up to date by :func:`sync_counts`."""

NONE_TENSORS = (
    NONE_I32_2D, NONE_I32, NONE_I32, NONE_I32, False, NONE_F32, NONE_F32, NONE_F32, False,
    NONE_I32_2D, NONE_F32_2D, NONE_I32_2D, False, NONE_I32_2D, False, NONE_I32_3D, NONE_I32,
    NONE_I32_2D, False, False, NONE_I32_2D, NONE_I32_2D, False,
)  # fmt: skip
""":data:`TENSORS` with nothing on (a kernel's argument where no processing is asked)."""


@jit
def sync_counts(pt, B, V):
    """A ``ProcessingState``'s kept history counts (``pt``'s ``kept_counts``) brought up
    to date for the batch's state rows with a penalty on: each row counts its tokens from
    where its last count ended to ``num_tokens`` (O(new tokens)); a row whose history got
    shorter or whose prompt length changed since (a new request, or ``set_request``:
    ``kept_upto = -1``) is zeroed and counted from the start (O(V + history)).
    Memory-safe for any values (lengths clamped as :func:`processing_rows.request_start`
    clamps them)."""
    token_ids, num_tokens, num_prompt, req, has_req = pt[0], pt[1], pt[2], pt[3], pt[4]
    counts, upto = pt[20], pt[21]
    R, L_max = token_ids.shape
    for b in range(B):
        r = req[b] if has_req else b
        if r < 0 or r >= R or not penalties_on(pt, r):
            continue  # (no penalty reads them: set_request counts anew once one is set)
        L = min(max(num_tokens[r], 0), L_max)
        P = min(max(num_prompt[r], 0), L)
        start = upto[r, 0]
        if start < 0 or start > L or upto[r, 1] != P:
            counts[r, :] = 0
            start = 0
        for i in range(start, L):
            t = token_ids[r, i]
            if 0 <= t < V:
                if i < P:
                    counts[r, t] |= PROMPT_BIT
                else:
                    counts[r, t] += 1
        upto[r, 0], upto[r, 1] = L, P


def buffers(V, L_max, n_drafts, pen):
    """The kernels' working buffers: counts (zeroed, reused), the distinct-token list (for
    ``L_max`` history tokens and ``n_drafts`` drafts), one row's mask."""
    return (
        zeroed_i32(V) if pen else NONE_I32,
        np.empty(min(V, L_max + n_drafts) + 1, dtype=np.int32),
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
        *buffers(V, token_ids.shape[1], draft_token_ids.shape[0], repetition_penalty is not None),
    )  # fmt: skip
    return out
