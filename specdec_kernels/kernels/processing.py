"""Triton logits processing: the CUDA path of ``process_logits``.

- ``_count_kernel``, grid ``(B, cdiv(L_max, BLOCK))`` (with penalties only): each program
  reads one block of a request's history and adds its tokens to the request's row of an
  int32 ``[B, V]`` count array with atomics (``+1`` per output occurrence, bit 30 for "seen
  in the prompt"; integer atomics, so the counts do not depend on their order).
- ``_process_kernel``, grid ``(rows, chunks)``: each program takes one logits row and one
  chunk of its vocabulary (whole ``BLOCK``s; as many chunks as keep ~1024 programs busy, so
  a small batch still fills the GPU), finds the row's request
  (``b = #{t >= 1: cu[t] + t <= row}``) and its draft index ``j``, then streams its chunk in
  vocabulary blocks: logit bias (entries in order), penalties (the counts plus the drafts
  before ``j``), the bitmasks, bad words and min_tokens' stop tokens, and writes the fp32
  result. Before the vocabulary loop it finds the bad words whose prefix ends the row's
  output, 16 words at a time and one token column at a time (any number and length of
  words), and writes their last tokens to its own int32 ``[S]`` slice of a ``[rows, chunks,
  S]`` scratch it then reads back in 16-id tiles (stop tokens likewise, from their input).
  Rows of padding requests and rows past the batch are copied.

Launched with ``enable_fp_fusion=False`` (``l - f * c`` must round twice, as on the CPU) and
``div_rn`` for the repetition penalty (the GPU's default division is approximate), so the
result equals the CPU path's bit for bit. Offsets are int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_kernels.kernels import _utils
from specdec_kernels.kernels._utils import next_pow2

PROMPT_BIT = tl.constexpr(1 << 30)  # "seen in the prompt"; the bits below count the output
# programs of _process_kernel to aim for: 3.2-21x less device time than one program a row at
# B <= 8 on an H200, the best of the settings tried (bench/results/*-processing-chunks-*.md)
PROGRAMS = 1024


@triton.jit
def _count_kernel(
    token_ids_ptr, tok_stride0, tok_stride1, L_max, R, num_tokens_ptr, prompt_ptr,
    req_indices_ptr, rp_ptr, fp_ptr, pp_ptr, counts_ptr, V,
    HAS_REQ_INDICES: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    pos = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    r = tl.load(req_indices_ptr + b) if HAS_REQ_INDICES else b
    pen = (tl.load(rp_ptr + b) != 1.0) | (tl.load(fp_ptr + b) != 0.0) | (tl.load(pp_ptr + b) != 0.0)
    active = pen & (r >= 0) & (r < R)
    r = tl.where(active, r, 0).to(tl.int64)
    L = tl.minimum(tl.maximum(tl.load(num_tokens_ptr + r, mask=active, other=0), 0), L_max)
    P = tl.minimum(tl.maximum(tl.load(prompt_ptr + r, mask=active, other=0), 0), L)
    live = tl.where(active, pos < L, False)  # (vector & scalar fails in the interpreter)
    t = tl.load(token_ids_ptr + r * tok_stride0 + pos * tok_stride1, mask=live, other=-1)
    valid = live & (t >= 0) & (t < V)
    where = counts_ptr + b.to(tl.int64) * V + t
    tl.atomic_or(where, PROMPT_BIT, mask=valid & (pos < P))
    tl.atomic_add(where, 1, mask=valid & (pos >= P))


@triton.jit
def _past(drafts_ptr, n_drafts, lo, j, token_ids_ptr, tok_stride0, tok_stride1, r, L, q, mask):
    """The output token ``q`` places before row ``j``'s position (drafts first)."""
    f = lo + j - 1 - q
    from_drafts = q < j
    d = tl.load(drafts_ptr + f, mask=mask & from_drafts & (f >= 0) & (f < n_drafts), other=-1)
    pos = L - 1 - (q - j)
    t = tl.load(
        token_ids_ptr + r * tok_stride0 + pos * tok_stride1,
        mask=mask & (~from_drafts) & (pos >= 0),
        other=-1,
    )
    return tl.where(from_drafts, d, t)


@triton.jit
def _in(offs, ids):
    """``offs[i]`` is one of ``ids`` (-1 matches nothing)."""
    return tl.max((offs[:, None] == ids[None, :]).to(tl.int32), axis=1) > 0


@triton.jit(do_not_specialize=["B", "M", "S", "LW", "T", "CHUNK"])
def _process_kernel(
    logits_ptr, l_stride0, l_stride1, out_ptr, V, cu_ptr, B, drafts_ptr, n_drafts,
    token_ids_ptr, tok_stride0, tok_stride1, L_max, R, num_tokens_ptr, prompt_ptr,
    req_indices_ptr, rp_ptr, fp_ptr, pp_ptr, counts_ptr, bias_ids_ptr, bias_values_ptr, M,
    allowed_ptr, grammar_ptr, G, W, bad_ptr, S, LW, bans_ptr, min_tokens_ptr, stops_ptr, T,
    CHUNK, HAS_REQ_INDICES: tl.constexpr, HAS_PENALTIES: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_ALLOWED: tl.constexpr, HAS_GRAMMAR: tl.constexpr, HAS_BAD: tl.constexpr,
    HAS_MIN: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    g = tl.program_id(0)
    n_rows = tl.num_programs(0)
    chunk = tl.program_id(1)
    ban_row = (g.to(tl.int64) * tl.num_programs(1) + chunk) * S  # this program's scratch
    tb = tl.arange(0, BLOCK_B) + 1
    starts = tl.load(cu_ptr + tb, mask=tb <= B, other=n_rows) + tb
    b = tl.sum((starts <= g).to(tl.int32), axis=0)  # the request of row g (B: past the batch)
    in_batch = g < tl.load(cu_ptr + B) + B
    bb = tl.minimum(b, B - 1)  # B >= 1 (the launcher copies the rows of an empty batch)
    lo = tl.load(cu_ptr + bb)
    j = g - lo - bb
    r = bb
    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + bb)
    active = in_batch & (b < B) & (r >= 0) & (r < R)
    r = tl.where(active, r, 0).to(tl.int64)  # (no state row may exist: R = 0)
    L = tl.minimum(tl.maximum(tl.load(num_tokens_ptr + r, mask=active, other=0), 0), L_max)
    P = tl.minimum(tl.maximum(tl.load(prompt_ptr + r, mask=active, other=0), 0), L)
    n_out = L - P
    bb64 = bb.to(tl.int64)

    if HAS_PENALTIES:
        rp = tl.load(rp_ptr + bb)
        fp = tl.load(fp_ptr + bb)
        pp = tl.load(pp_ptr + bb)
        pen = active & ((rp != 1.0) | (fp != 0.0) | (pp != 0.0))
        kb = tl.load(cu_ptr + bb + 1) - lo
        n_prev = tl.where(pen, tl.minimum(j, kb), 0)  # the drafts before row j
    if HAS_BAD:  # the last token of every bad word whose prefix ends the output so far,
        # BLOCK_S words at a time, their tokens one column at a time (any S and length),
        # into this row's scratch (-1: none), read back in the vocabulary loop
        for s0 in range(0, S, BLOCK_S):
            s = s0 + tl.arange(0, BLOCK_S)
            live_s = tl.where(active, s < S, False)
            word_ptr = bad_ptr + (bb64 * S + s) * LW
            n_w = tl.full([BLOCK_S], LW, tl.int32)  # tokens before the first -1
            for q in range(0, LW):
                t = tl.load(word_ptr + q, mask=live_s, other=-1)
                n_w = tl.where((t < 0) & (n_w == LW), q, n_w)
            last = tl.load(word_ptr + n_w - 1, mask=tl.where(active, (s < S) & (n_w > 0), False),
                           other=-1)  # fmt: skip
            mismatch = s < 0
            for q in range(0, LW):  # prefix entry q is n_w - 2 - q places before the row
                in_prefix = tl.where(active, (s < S) & (q < n_w - 1), False)
                w = tl.load(word_ptr + q, mask=in_prefix, other=-1)
                past = _past(
                    drafts_ptr, n_drafts, lo, j, token_ids_ptr, tok_stride0, tok_stride1, r, L,
                    n_w - 2 - q, in_prefix,
                )  # fmt: skip
                mismatch |= in_prefix & (past != w)
            hit = live_s & (n_w > 0) & (n_w - 1 <= n_out + j) & (~mismatch) & (last < V)
            tl.store(bans_ptr + ban_row + s, tl.where(hit, last, -1), mask=s < S)
        tl.debug_barrier()  # the stores above are read by every thread of the program below
    if HAS_MIN:
        on = active & (n_out + j < tl.load(min_tokens_ptr + bb))

    for v0 in range(chunk * CHUNK, tl.minimum(chunk * CHUNK + CHUNK, V), BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        vm = offs < V
        x = tl.load(
            logits_ptr + g.to(tl.int64) * l_stride0 + offs.to(tl.int64) * l_stride1,
            mask=vm,
            other=0.0,
        ).to(tl.float32)
        if HAS_BIAS:
            for m in range(0, M):
                t = tl.load(bias_ids_ptr + bb64 * M + m, mask=active, other=-1)
                val = tl.load(bias_values_ptr + bb64 * M + m, mask=active, other=0.0)
                x = tl.where(offs == t, x + val, x)
        if HAS_PENALTIES:
            c = tl.load(counts_ptr + bb64 * V + offs, mask=tl.where(pen, vm, False), other=0)
            n = c & (PROMPT_BIT - 1)
            for i in range(0, n_prev):
                d = tl.load(drafts_ptr + lo + i, mask=(lo + i >= 0) & (lo + i < n_drafts), other=-1)
                n += (offs == d).to(tl.int32)
            seen = (c != 0) | (n > 0)
            rep = tl.where(x > 0, tl.div_rn(x, rp), x * rp)
            x = tl.where(tl.where(rp != 1.0, seen, False), rep, x)
            x = tl.where(tl.where(fp != 0.0, n > 0, False), x - fp * n.to(tl.float32), x)
            x = tl.where(tl.where(pp != 0.0, n > 0, False), x - pp, x)
        banned = offs < 0
        if HAS_ALLOWED:
            live = tl.where(active, vm, False)
            word_a = tl.load(allowed_ptr + bb64 * W + (offs >> 5), mask=live, other=-1)
            banned |= ((word_a >> (offs & 31)) & 1) == 0
        if HAS_GRAMMAR:
            word_g = tl.load(
                grammar_ptr + g.to(tl.int64) * W + (offs >> 5),
                mask=tl.where(active & (g < G), vm, False),  # G rows (unchecked values)
                other=-1,
            )
            banned |= ((word_g >> (offs & 31)) & 1) == 0
        if HAS_BAD:
            for s0 in range(0, S, BLOCK_S):
                s = s0 + tl.arange(0, BLOCK_S)
                ids = tl.load(bans_ptr + ban_row + s, mask=s < S, other=-1)
                banned |= _in(offs, ids)
        if HAS_MIN:
            for t0 in range(0, T, BLOCK_T):
                t_ = t0 + tl.arange(0, BLOCK_T)
                live_t = tl.where(on, t_ < T, False)
                banned |= _in(offs, tl.load(stops_ptr + bb64 * T + t_, mask=live_t, other=-1))
        x = tl.where(banned, float("-inf"), x)
        tl.store(out_ptr + g.to(tl.int64) * V + offs, x, mask=vm)


def process_logits(
    target_logits, draft_token_ids, cu_num_draft_tokens, token_ids, num_tokens,
    num_prompt_tokens, req_indices, repetition_penalty, frequency_penalty, presence_penalty,
    logit_bias_ids, logit_bias_values, allowed_token_mask, grammar_mask, bad_word_ids,
    min_tokens, stop_token_ids,
):  # fmt: skip
    pairs = (
        (repetition_penalty, frequency_penalty), (repetition_penalty, presence_penalty),
        (logit_bias_ids, logit_bias_values), (min_tokens, stop_token_ids),
    )  # fmt: skip
    if any((x is None) != (y is None) for x, y in pairs):  # the CPU path's require_together
        raise ValueError(
            "specdec::process_logits takes the three penalties, the bias ids and values, and "
            "min_tokens and stop_token_ids each together"
        )
    n_rows, V = target_logits.shape
    device = target_logits.device
    B = cu_num_draft_tokens.shape[0] - 1

    def flat(t):  # the kernels index the small inputs as contiguous (the wrapper's are)
        return None if t is None else t.contiguous()

    draft_token_ids, cu_num_draft_tokens, num_tokens, num_prompt_tokens, req_indices = map(
        flat, (draft_token_ids, cu_num_draft_tokens, num_tokens, num_prompt_tokens, req_indices)
    )
    repetition_penalty, frequency_penalty, presence_penalty = map(
        flat, (repetition_penalty, frequency_penalty, presence_penalty)
    )
    logit_bias_ids, logit_bias_values, allowed_token_mask, grammar_mask = map(
        flat, (logit_bias_ids, logit_bias_values, allowed_token_mask, grammar_mask)
    )
    bad_word_ids, min_tokens, stop_token_ids = map(flat, (bad_word_ids, min_tokens, stop_token_ids))
    R, L_max = token_ids.shape
    out = _utils._empty((n_rows, V), torch.float32, device)
    if n_rows == 0 or V == 0:
        return out
    if B == 0:  # no request: every row is copied
        return out.copy_(target_logits)
    counts = None
    if repetition_penalty is not None:
        counts = torch.zeros((B, V), dtype=torch.int32, device=device)
    if counts is not None and L_max > 0:
        block_l = min(1024, next_pow2(L_max))
        _count_kernel[(B, triton.cdiv(L_max, block_l))](
            token_ids, token_ids.stride(0), token_ids.stride(1), L_max, R, num_tokens,
            num_prompt_tokens, req_indices, repetition_penalty, frequency_penalty,
            presence_penalty, counts, V, HAS_REQ_INDICES=req_indices is not None, BLOCK=block_l,
        )  # fmt: skip
    M = 0 if logit_bias_ids is None else logit_bias_ids.shape[1]
    S, LW = (0, 0) if bad_word_ids is None else bad_word_ids.shape[1:]
    block = min(1024, next_pow2(V))
    n_blocks = triton.cdiv(V, block)
    chunk = triton.cdiv(n_blocks, min(n_blocks, max(1, PROGRAMS // n_rows))) * block
    n_chunks = triton.cdiv(V, chunk)
    bans = None  # scratch: each program's banned last tokens of the bad words
    if S * LW > 0:
        bans = _utils._empty((n_rows, n_chunks, S), torch.int32, device)
    T = 0 if stop_token_ids is None else stop_token_ids.shape[1]
    _process_kernel[(n_rows, n_chunks)](
        target_logits, target_logits.stride(0), target_logits.stride(1), out, V,
        cu_num_draft_tokens, B, draft_token_ids, draft_token_ids.shape[0], token_ids,
        token_ids.stride(0), token_ids.stride(1), L_max, R, num_tokens, num_prompt_tokens,
        req_indices, repetition_penalty, frequency_penalty, presence_penalty, counts,
        logit_bias_ids, logit_bias_values, M, allowed_token_mask, grammar_mask,
        0 if grammar_mask is None else grammar_mask.shape[0], (V + 31) // 32,
        bad_word_ids, S, LW, bans, min_tokens, stop_token_ids, T, chunk,
        HAS_REQ_INDICES=req_indices is not None, HAS_PENALTIES=counts is not None,
        HAS_BIAS=M > 0, HAS_ALLOWED=allowed_token_mask is not None,
        HAS_GRAMMAR=grammar_mask is not None, HAS_BAD=S * LW > 0,
        HAS_MIN=min_tokens is not None and T > 0, BLOCK_B=next_pow2(B),
        BLOCK_S=min(16, next_pow2(S)), BLOCK_T=min(16, next_pow2(T)),
        BLOCK=block, enable_fp_fusion=False,
    )  # fmt: skip
    return out
