"""Triton frequency index and proposer: the CUDA path of ``frequency_index_build`` /
``_extend`` and of ``ngram_propose(scoring="frequency")``.

The trie of ``specdec_kernels/cpu/frequency.py`` (same layout, same integers: a state
built by one path reads the same on the other; its device functions are in
``kernels/frequency_trie.py``). One program per batch row, one warp:
a row's appends are sequential by nature (each reads what the previous one wrote), so
the code is scalar, with no atomics and nothing that depends on scheduling; with more
warps every thread would run the loops and read back what thread 0 alone stored.
``while`` loops carry flags instead of ``break`` (the GPU compiler refuses a ``break``).

- build: ``_clear_kernel`` empties the rows' hash tables (grid ``(B, S / BLOCK)``), then
  the extend kernel counts every position from 0;
- extend: positions ``length[r] .. num_tokens[r] - 1``, O(new tokens x D) per row;
- propose: per source (the row's trie, the corpus's active store) the descent over the
  request's last tokens and one chain per context length, float64 probabilities; the
  corpus wins on a higher score; the proposal launches with ``enable_fp_fusion=False`` so that
  ``m * factor + offset`` rounds twice as in the other paths, and its float parameters
  travel as their int64 bit patterns (a Python float argument would become float32).

Values read from the state are guarded as on the CPU (probes bounded, node ids and
positions inside their arrays).
"""

from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl

from specdec_kernels.constants import DRAFT_SOURCE_CORPUS, DRAFT_SOURCE_NONE, DRAFT_SOURCE_OWN
from specdec_kernels.kernels import _utils
from specdec_kernels.kernels.frequency_trie import _at, _find, append_position

_SOURCE_NONE, _SOURCE_OWN = tl.constexpr(DRAFT_SOURCE_NONE), tl.constexpr(DRAFT_SOURCE_OWN)
_SOURCE_CORPUS = tl.constexpr(DRAFT_SOURCE_CORPUS)
_CLEAR_BLOCK = 1024


@triton.jit(do_not_specialize=["L_max"])
def _extend_kernel(token_ids_ptr, hist_stride, tok_stride, num_tokens_ptr, req_indices_ptr,
                   keys_ptr, vals_ptr, nodes_ptr, used_ptr, length_ptr, path_ptr, R, L_max, S,
                   M, D, FROM_SCRATCH: tl.constexpr,
                   HAS_REQ_INDICES: tl.constexpr):  # fmt: skip
    """Count positions ``length[r] .. num_tokens[r] - 1`` (from 0 with ``FROM_SCRATCH``)
    of batch row ``b``'s state row ``r``, in order."""
    b = tl.program_id(0).to(tl.int64)
    r = b
    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + b).to(tl.int64)
    if (r >= 0) & (r < R):
        row = token_ids_ptr + r * hist_stride
        keys, vals = keys_ptr + r * S, vals_ptr + r * S
        nodes, uptr, path = nodes_ptr + r * 4 * M, used_ptr + r, path_ptr + b * (D + 2)
        L = tl.minimum(tl.maximum(tl.load(num_tokens_ptr + r).to(tl.int64), 0), L_max)
        old = tl.load(length_ptr + r).to(tl.int64)
        p = tl.maximum(old, 0)
        if FROM_SCRATCH:
            tl.store(uptr, 1)
            old = tl.zeros((), tl.int64)
            p = tl.zeros((), tl.int64)
        going = p < L
        while going:
            u = tl.load(uptr).to(tl.int64)
            going = (u >= 1) & (u <= M - 2)  # two nodes a position fit (else: corrupt)
            if going:
                Dp = tl.minimum(p + 1, D)
                append_position(row, tok_stride, L_max, keys, vals, nodes, uptr, path, p, Dp, S,
                                M)  # fmt: skip
                p += 1
                going = p < L
        tl.store(length_ptr + r, tl.maximum(L, old).to(tl.int32))


@triton.jit
def _clear_kernel(req_indices_ptr, keys_ptr, R, S, HAS_REQ_INDICES: tl.constexpr,
                  BLOCK: tl.constexpr):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    r = b
    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + b).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    rr = offs * 0 + r  # the row as a block (the interpreter's mask typing)
    ok = (rr >= 0) & (rr < R) & (offs < S)
    tl.store(keys_ptr + rr * S + offs, tl.zeros((BLOCK,), tl.int64), mask=ok)


def _index_rows(token_ids, num_tokens, req_indices, index, max_n, from_scratch):
    keys, vals, nodes, used, length = index
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    if B == 0:
        return
    R, S = keys.shape
    if from_scratch:
        _clear_kernel[(B, triton.cdiv(S, _CLEAR_BLOCK))](
            req_indices, keys, R, S, HAS_REQ_INDICES=req_indices is not None, BLOCK=_CLEAR_BLOCK
        )
    path = torch.zeros((B, max_n + 2), dtype=torch.int64, device=token_ids.device)  # scratch
    _extend_kernel[(B,)](
        token_ids, token_ids.stride(0), token_ids.stride(1), num_tokens, req_indices, keys, vals,
        nodes, used, length, path, R, token_ids.shape[1], S, nodes.shape[2], max_n,
        FROM_SCRATCH=from_scratch, HAS_REQ_INDICES=req_indices is not None, num_warps=1,
    )  # fmt: skip


def frequency_index_build(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    """Launch the clear and extend kernels over whole rows; inputs are validated."""
    _index_rows(token_ids, num_tokens, req_indices, index, max_n, True)


def frequency_index_extend(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    """Launch the extend kernel over the rows' new positions; inputs are validated."""
    _index_rows(token_ids, num_tokens, req_indices, index, max_n, False)


# ----------------------------------------------------------------------------- proposals


@triton.jit
def _chain(nodes, M, used, row, ts, L_max, node, max_len, min_prob, out, probs,
           WRITE: tl.constexpr):  # fmt: skip
    """Follow ``best`` from ``node`` (``cpu/frequency.py``'s ``_chain``): ``(drafts,
    score)``; ``WRITE``: store the drafts and their probabilities too."""
    n = node
    prob = tl.full((), 1.0, tl.float64)
    score = tl.zeros((), tl.float64)
    t = tl.zeros((), tl.int64)
    go = t < max_len
    while go:
        x = tl.load(nodes + 3 * M + n).to(tl.int64)
        go = (x > 0) & (x < used)
        if go:
            c_x = tl.load(nodes + x).to(tl.float64)
            nxt = prob * (c_x / tl.load(nodes + n).to(tl.float64))
            go = nxt >= min_prob
            if go:
                if WRITE:
                    x_pos = tl.load(nodes + 2 * M + x).to(tl.int64)
                    tl.store(out + t, _at(row, x_pos, L_max, ts).to(tl.int32))
                    tl.store(probs + t, nxt.to(tl.float32))
                prob = nxt
                score += nxt
                t += 1
                n = x
                go = t < max_len
    return t, score


@triton.jit
def _draft_cap(m, cap, D, factor, offset):
    lim = tl.minimum(cap, D - m)
    c = m.to(tl.float64) * factor + offset  # >= 0: truncation is the floor
    return tl.where(c >= lim.to(tl.float64), lim, tl.minimum(c, lim.to(tl.float64)).to(tl.int64))


@triton.jit
def _best_chain(keys, vals, nodes, M, used, S, store, ts, T, row, row_ts, L, min_n, D, cap,
                factor, offset, min_prob, out, probs):  # fmt: skip
    """``cpu/frequency.py``'s ``best_chain``: the best-scoring chain of the contexts ending
    the request's ``row[:L]`` in one trie whose edges are read from ``store`` (stride
    ``ts``, ``T`` tokens): ``(node, max_len, m, score)``, node -1 if none drafts."""
    best_node = tl.full((), -1, tl.int64)
    best_len = tl.zeros((), tl.int64)
    best_m = tl.zeros((), tl.int64)
    best_score = tl.zeros((), tl.float64)
    node = tl.zeros((), tl.int64)
    m = tl.full((), 1, tl.int64)
    top = tl.minimum(D - 1, L)
    alive = m <= top
    while alive:
        t_q = tl.load(row + (L - m) * row_ts).to(tl.int64)
        if m > tl.load(nodes + M + node):
            node = _find(keys, vals, used, node, t_q, S)
            alive = node >= 0
        else:
            n_pos = tl.load(nodes + 2 * M + node).to(tl.int64)
            alive = _at(store, n_pos - m + 1, T, ts) == t_q
        if alive:  # no continuation: none for longer contexts either
            alive = tl.load(nodes + 3 * M + node) >= 0
        if alive & (m >= min_n):
            max_len = _draft_cap(m, cap, D, factor, offset)
            t, score = _chain(nodes, M, used, store, ts, T, node, max_len, min_prob, out, probs,
                              False)  # fmt: skip
            if (t > 0) & (score >= best_score):
                best_node = node
                best_len = max_len
                best_m = m
                best_score = score
        m += 1
        alive = alive & (m <= top)
    return best_node, best_len, best_m, best_score


_VARYING = ["max_model_len", "L_max", "min_prob_bits", "factor_bits", "offset_bits"]


@triton.jit(do_not_specialize=_VARYING)
def _propose_kernel(token_ids_ptr, hist_stride, tok_stride, num_tokens_ptr, req_indices_ptr,
                    max_draft_tokens_ptr, keys_ptr, vals_ptr, nodes_ptr, used_ptr,
                    c_tokens_ptr, c_keys_ptr, c_vals_ptr, c_nodes_ptr, c_used_ptr, c_state_ptr,
                    drafts_ptr, counts_ptr, match_len_ptr, source_ptr, probs_ptr, R, L_max, S,
                    M, CS, CM, CT, min_n, D, k, max_model_len, min_prob_bits, factor_bits,
                    offset_bits, HAS_REQ_INDICES: tl.constexpr, HAS_MAX_DRAFT: tl.constexpr,
                    HAS_MAX_MODEL_LEN: tl.constexpr, HAS_CORPUS: tl.constexpr,
                    K_BLOCK: tl.constexpr):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    out, probs = drafts_ptr + b * k, probs_ptr + b * k
    offs = tl.arange(0, K_BLOCK)
    tl.store(out + offs, tl.full((K_BLOCK,), -1, tl.int32), mask=offs < k)
    tl.store(probs + offs, tl.zeros((K_BLOCK,), tl.float32), mask=offs < k)
    tl.debug_barrier()  # the padding, stored by every lane, lands before one lane's drafts
    min_prob = min_prob_bits.to(tl.int64).to(tl.float64, bitcast=True)
    factor = factor_bits.to(tl.int64).to(tl.float64, bitcast=True)
    offset = offset_bits.to(tl.int64).to(tl.float64, bitcast=True)
    r = b
    if HAS_REQ_INDICES:
        r = tl.load(req_indices_ptr + b).to(tl.int64)
    count = tl.zeros((), tl.int64)
    m = tl.zeros((), tl.int64)
    source = tl.full((), _SOURCE_OWN, tl.int64)
    if (r >= 0) & (r < R):
        row = token_ids_ptr + r * hist_stride
        keys, vals, nodes = keys_ptr + r * S, vals_ptr + r * S, nodes_ptr + r * 4 * M
        used = tl.minimum(tl.load(used_ptr + r).to(tl.int64), M)  # a corrupt count: <= M
        L = tl.minimum(tl.maximum(tl.load(num_tokens_ptr + r).to(tl.int64), 0), L_max)
        cap = tl.full((), k, tl.int64)
        if HAS_MAX_DRAFT:
            cap = tl.minimum(cap, tl.load(max_draft_tokens_ptr + b).to(tl.int64))
        if HAS_MAX_MODEL_LEN:
            cap = tl.minimum(cap, max_model_len - L)
        node, max_len, m, score = _best_chain(keys, vals, nodes, M, used, S, row, tok_stride,
                                              L_max, row, tok_stride, L, min_n, D, cap, factor,
                                              offset, min_prob, out, probs)  # fmt: skip
        store = row
        ts = tok_stride * 1
        T = L_max * 1
        MM = M * 1
        if HAS_CORPUS:  # the corpus wins on a higher score (ties: the own history)
            a = tl.minimum(tl.maximum(tl.load(c_state_ptr), 0), 1)
            c_nodes = c_nodes_ptr + a * 4 * CM
            c_used = tl.minimum(tl.load(c_used_ptr + a).to(tl.int64), CM)
            c_store = c_tokens_ptr + a * CT
            c_node, c_len, c_m, c_score = _best_chain(
                c_keys_ptr + a * CS, c_vals_ptr + a * CS, c_nodes, CM, c_used, CS, c_store, 1,
                CT, row, tok_stride, L, min_n, D, cap, factor, offset, min_prob, out, probs,
            )  # fmt: skip
            if (c_node >= 0) & (c_score > score):
                node = c_node
                max_len = c_len
                m = c_m
                nodes = c_nodes
                used = c_used
                store = c_store
                ts = tok_stride * 0 + 1
                T = L_max * 0 + CT
                MM = M * 0 + CM
                source = tl.full((), _SOURCE_CORPUS, tl.int64)
        if node >= 0:
            count, _ = _chain(nodes, MM, used, store, ts, T, node, max_len, min_prob, out, probs,
                              True)  # fmt: skip
    tl.store(counts_ptr + b, count.to(tl.int32))
    tl.store(match_len_ptr + b, tl.where(count > 0, m, 0).to(tl.int32))
    tl.store(source_ptr + b, tl.where(count > 0, source, _SOURCE_NONE).to(tl.int8))


def _bits(x: float) -> int:
    """The int64 bit pattern of a float64."""
    return struct.unpack("<q", struct.pack("<d", x))[0]


def frequency_propose(
    token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, *, min_n, max_n,
    num_speculative_tokens, max_model_len, min_token_prob, max_spec_factor, max_spec_offset,
):  # fmt: skip
    """Launch the propose kernel, one program per batch row; inputs are validated."""
    k = num_speculative_tokens
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    drafts, counts, match_len, source = _utils.proposal_outputs(B, k, token_ids.device)
    probs = _utils._empty((B, k), torch.float32, token_ids.device)
    if B == 0:
        return drafts, counts, match_len, source, probs
    keys, vals, nodes, used, _ = index
    c_tok, c_keys, c_vals, c_nodes, c_used, _, c_state = (None,) * 7 if corpus is None else corpus
    _propose_kernel[(B,)](
        token_ids, token_ids.stride(0), token_ids.stride(1), num_tokens, req_indices,
        max_draft_tokens, keys, vals, nodes, used, c_tok, c_keys, c_vals, c_nodes, c_used,
        c_state, drafts, counts, match_len, source, probs, keys.shape[0], token_ids.shape[1],
        keys.shape[1], nodes.shape[2], 1 if corpus is None else c_keys.shape[1],
        1 if corpus is None else c_nodes.shape[2], 1 if corpus is None else c_tok.shape[1],
        min_n, max_n, k, 0 if max_model_len is None else max_model_len, _bits(min_token_prob),
        _bits(max_spec_factor), _bits(max_spec_offset),
        HAS_REQ_INDICES=req_indices is not None, HAS_MAX_DRAFT=max_draft_tokens is not None,
        HAS_MAX_MODEL_LEN=max_model_len is not None, HAS_CORPUS=corpus is not None,
        K_BLOCK=_utils.next_pow2(k), num_warps=1, enable_fp_fusion=False,
    )  # fmt: skip
    return drafts, counts, match_len, source, probs
