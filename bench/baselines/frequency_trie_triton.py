"""The path-compressed trie of ``frequency_trie.py`` as Triton kernels: a design prototype.

NOT the op: the question it answers is whether the trie runs on the device as it must for
``scoring="frequency"`` (fixed shapes, no host synchronisation, no atomics, results that do
not depend on scheduling) and gives the numba prototype's integers bit for bit. One store
per state row of ``token_ids`` (the request's own history: the row is its one document,
so no token copy and no separators); one program per row, which appends its new
positions in order (each append reads what the previous one wrote: sequential by nature)
or proposes from its history. Scalar loops only; ``while`` loops carry flags instead of
``break`` (which the GPU compiler refuses). The proposal launches with
``enable_fp_fusion=False`` (``m * factor + 1e-6`` must round twice, as in numba) and takes
``factor`` and ``min_token_prob`` as float64 (a Python float argument would be float32).
Both launch with one warp: the code is scalar, and with more warps every thread would run
the loops and read back what thread 0 alone stores, unsynchronised.

Shapes: ``keys`` int64 ``[R, S]`` and ``vals`` int32 ``[R, S]`` (S a power of two),
``nodes`` int32 ``[R, 5, N]`` (cnt, hi, par, pos, best; node 0 the root), ``meta`` int64
``[R, 3]`` (unused, keys, nodes), ``path`` int64 ``[R, D + 2]`` scratch. A row never runs
out of room when ``N >= 2 L_max + 3`` and ``S >= 4/3 N``: the caller sizes it so (there
is no error path in a kernel).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from bench.baselines import frequency_trie as ft


@triton.jit
def _home(parent, tok, mask):
    h = ((parent + 1) * 0x9E3779B1 + (tok + 1)) & 0xFFFFFFFF
    h = ((h ^ (h >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
    h = ((h ^ (h >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
    return (h ^ (h >> 16)) & mask


@triton.jit
def _probe(keys, parent, tok, mask):
    """``(slot, found)``: the slot of ``(parent, tok)``'s key, else the empty one."""
    key = ((parent + 1) << 32) | (tok + 1)
    i = _home(parent, tok, mask)
    k = tl.load(keys + i)
    while (k != key) & (k != 0):
        i = (i + 1) & mask
        k = tl.load(keys + i)
    return i, k == key


@triton.jit
def _put(keys, vals, meta, parent, tok, node, mask):
    i, found = _probe(keys, parent, tok, mask)
    if found:
        pass
    else:
        tl.store(keys + i, ((parent + 1) << 32) | (tok + 1))
        tl.store(meta + 1, tl.load(meta + 1) + 1)
    tl.store(vals + i, node.to(tl.int32))


@triton.jit
def _new_node(nodes, meta, N, cnt, hi, par, pos, best):
    n = tl.load(meta + 2)
    tl.store(meta + 2, n + 1)
    tl.store(nodes + n, cnt.to(tl.int32))
    tl.store(nodes + N + n, hi.to(tl.int32))
    tl.store(nodes + 2 * N + n, par.to(tl.int32))
    tl.store(nodes + 3 * N + n, pos.to(tl.int32))
    tl.store(nodes + 4 * N + n, best.to(tl.int32))
    return n


@triton.jit
def _fill(path, a, b, node):
    for j in range(a, b):
        tl.store(path + j, node)


@triton.jit
def _insert(row, keys, vals, nodes, meta, path, p, Dp, N, mask):
    """``frequency_trie._insert`` for position ``p`` of the row."""
    one = tl.full((), 1, tl.int64)
    none = tl.full((), -1, tl.int64)
    node = tl.zeros((), tl.int64)
    depth = tl.zeros((), tl.int64)
    going = depth < Dp
    while going:
        t = tl.load(row + p - depth).to(tl.int64)
        i, found = _probe(keys, node, t, mask)
        lo = depth + 1
        if found:
            child = tl.load(vals + i).to(tl.int64)
            c_hi = tl.load(nodes + N + child).to(tl.int64)
            c_pos = tl.load(nodes + 3 * N + child).to(tl.int64)
            d = lo + 1
            lim = tl.minimum(c_hi, Dp)
            same = d <= lim
            while same:
                same = tl.load(row + c_pos - d + 1) == tl.load(row + p - d + 1)
                d += same.to(tl.int64)
                same = same & (d <= lim)
            if d > c_hi:  # the whole run matches
                tl.store(nodes + child, tl.load(nodes + child) + 1)
                tl.store(nodes + 3 * N + child, tl.maximum(c_pos, p).to(tl.int32))
                _fill(path, lo, c_hi + 1, child)
                node = child
                depth = c_hi
                going = depth < Dp
            else:  # split: the upper part lo..d-1 takes the old key
                c_cnt = tl.load(nodes + child).to(tl.int64)
                c_best = tl.load(nodes + 4 * N + child).to(tl.int64)
                up = _new_node(nodes, meta, N, c_cnt + 1, d - 1, node, tl.maximum(c_pos, p),
                               c_best)  # fmt: skip
                _put(keys, vals, meta, node, t, up, mask)
                tl.store(nodes + 2 * N + child, up.to(tl.int32))
                c_tok = tl.load(row + c_pos - d + 1).to(tl.int64)
                _put(keys, vals, meta, up, c_tok, child, mask)
                _fill(path, lo, d, up)
                if d <= Dp:
                    leaf = _new_node(nodes, meta, N, one, Dp, up, p, none)
                    p_tok = tl.load(row + p - d + 1).to(tl.int64)
                    _put(keys, vals, meta, up, p_tok, leaf, mask)
                    _fill(path, d, Dp + 1, leaf)
                going = lo < 0
        else:  # a new leaf for the depths lo..Dp
            leaf = _new_node(nodes, meta, N, one, Dp, node, p, none)
            _put(keys, vals, meta, node, t, leaf, mask)
            _fill(path, lo, Dp + 1, leaf)
            going = lo < 0


@triton.jit
def _extend_kernel(tok_ptr, tok_stride, start_ptr, end_ptr, keys_ptr, vals_ptr, nodes_ptr,
                   meta_ptr, path_ptr, S, N, D):  # fmt: skip
    """Count positions ``start[r] <= p < end[r]`` of row ``r`` (its new tokens)."""
    r = tl.program_id(0).to(tl.int64)
    row = tok_ptr + r * tok_stride
    keys, vals = keys_ptr + r * S, vals_ptr + r * S
    nodes, meta, path = nodes_ptr + r * 5 * N, meta_ptr + r * 3, path_ptr + r * (D + 2)
    mask = (S - 1).to(tl.int64)
    p = tl.load(start_ptr + r).to(tl.int64)
    end = tl.load(end_ptr + r).to(tl.int64)
    while p < end:
        Dp = tl.minimum(p + 1, D)
        _insert(row, keys, vals, nodes, meta, path, p, Dp, N, mask)
        # the contexts ending at p - 1 (depths 1..Dp-1) gained the continuation row[p]
        node = tl.zeros((), tl.int64)
        depth = tl.zeros((), tl.int64)
        while depth < Dp - 1:
            t = tl.load(row + p - 1 - depth).to(tl.int64)
            i, found = _probe(keys, node, t, mask)
            w = tl.load(vals + i).to(tl.int64)
            x = tl.load(path + depth + 2)
            b = tl.load(nodes + 4 * N + w).to(tl.int64)
            bb = tl.maximum(b, 0)
            cx, cb = tl.load(nodes + x), tl.load(nodes + bb)
            px, pb = tl.load(nodes + 3 * N + x), tl.load(nodes + 3 * N + bb)
            if (b != x) & ((b < 0) | (cx > cb) | ((cx == cb) & (px >= pb))):
                tl.store(nodes + 4 * N + w, x.to(tl.int32))
            node = w
            depth = tl.load(nodes + N + w).to(tl.int64)
        p += 1


@triton.jit
def _propose_kernel(tok_ptr, tok_stride, len_ptr, keys_ptr, vals_ptr, nodes_ptr, out_ptr,
                    tmp_ptr, count_ptr, score_ptr, param_ptr, S, N, D, k):  # fmt: skip
    """``frequency_trie.propose`` for row ``r``: drafts into ``out[r, :count[r]]``."""
    r = tl.program_id(0).to(tl.int64)
    row = tok_ptr + r * tok_stride
    keys, vals, nodes = keys_ptr + r * S, vals_ptr + r * S, nodes_ptr + r * 5 * N
    out, tmp = out_ptr + r * k, tmp_ptr + r * k
    mask = (S - 1).to(tl.int64)
    factor, min_prob = tl.load(param_ptr), tl.load(param_ptr + 1)  # float64, as numba's
    L = tl.load(len_ptr + r).to(tl.int64)
    best_t = tl.zeros((), tl.int64)
    best_score = tl.zeros((), tl.float64)
    node = tl.zeros((), tl.int64)
    m = tl.full((), 1, tl.int64)
    alive = m < tl.minimum(L, D)
    while alive:
        t_q = tl.load(row + L - m).to(tl.int64)
        if m > tl.load(nodes + N + node):
            i, found = _probe(keys, node, t_q, mask)
            node = tl.where(found, tl.load(vals + i).to(tl.int64), node)
            alive = found
        else:
            alive = tl.load(row + tl.load(nodes + 3 * N + node) - m + 1) == t_q
        if alive:
            alive = tl.load(nodes + 4 * N + node) >= 0
        if alive:
            cap = (m.to(tl.float64) * factor + 1e-6).to(tl.int64)
            max_len = tl.minimum(tl.minimum(k, cap), D - m)
            n = node
            prob = tl.full((), 1.0, tl.float64)
            score = tl.zeros((), tl.float64)
            t = tl.zeros((), tl.int64)
            go = t < max_len
            while go:
                x = tl.load(nodes + 4 * N + n).to(tl.int64)
                go = x >= 0
                if go:
                    c_x = tl.load(nodes + x).to(tl.float64)
                    nxt = prob * (c_x / tl.load(nodes + n).to(tl.float64))
                    go = nxt >= min_prob
                    if go:
                        pos_x = tl.load(nodes + 3 * N + x)
                        tl.store(tmp + t, tl.load(row + pos_x))
                        prob = nxt
                        score += nxt
                        t += 1
                        n = x
                        go = t < max_len
            if (t > 0) & (score >= best_score):
                best_t = t
                best_score = score
                for j in range(0, t):
                    tl.store(out + j, tl.load(tmp + j))
        m += 1
        alive = alive & (m < tl.minimum(L, D))
    tl.store(count_ptr + r, best_t.to(tl.int32))
    tl.store(score_ptr + r, best_score)


def new_rows(R: int, L_max: int, D: int, device="cpu") -> tuple[torch.Tensor, ...]:
    """Empty stores for ``R`` rows of up to ``L_max`` tokens: ``(keys, vals, nodes, meta,
    path)``, sized so that a row never runs out of room."""
    N = ft.nodes_for(L_max)
    S = 1 << ft.log2_slots_for(N)
    nodes = torch.zeros((R, 5, N), dtype=torch.int32, device=device)
    nodes[:, 4] = -1
    meta = torch.zeros((R, 3), dtype=torch.int64, device=device)
    meta[:, 2] = 1
    path = torch.zeros((R, D + 2), dtype=torch.int64, device=device)
    z = torch.zeros((R, S), dtype=torch.int64, device=device)
    return z, torch.zeros((R, S), dtype=torch.int32, device=device), nodes, meta, path


def extend(token_ids, start, end, store, D: int) -> None:
    """Count positions ``start[r] <= p < end[r]`` of every row (int32 ``[R]`` each)."""
    keys, vals, nodes, meta, path = store
    R, S = keys.shape
    _extend_kernel[(R,)](token_ids, token_ids.stride(0), start, end, keys, vals, nodes, meta,
                         path, S, nodes.shape[2], D, num_warps=1)  # fmt: skip


_PARAMS: dict[tuple, torch.Tensor] = {}


def _params(factor: float, min_prob: float, device) -> torch.Tensor:
    """float64 ``[factor, min_prob]`` on ``device``, made once (a fresh one would copy from
    the host on every call)."""
    key = (factor, min_prob, str(device))
    if key not in _PARAMS:
        _PARAMS[key] = torch.tensor([factor, min_prob], dtype=torch.float64, device=device)
    return _PARAMS[key]


def propose(token_ids, num_tokens, store, D: int, k: int, factor: float, min_prob: float):
    """``(drafts int32 [R, k] -1 padded, count int32 [R], score float64 [R])``."""
    keys, vals, nodes, _, _ = store
    R, S = keys.shape
    out = torch.full((R, max(k, 1)), -1, dtype=torch.int32, device=keys.device)
    tmp = torch.empty_like(out)
    count = torch.zeros(R, dtype=torch.int32, device=keys.device)
    score = torch.zeros(R, dtype=torch.float64, device=keys.device)
    _propose_kernel[(R,)](token_ids, token_ids.stride(0), num_tokens, keys, vals, nodes, out,
                          tmp, count, score, _params(factor, min_prob, keys.device), S,
                          nodes.shape[2], D, k, num_warps=1, enable_fp_fusion=False)  # fmt: skip
    # a shorter chain that won later leaves an older one's tail in out: pad past the count
    # (torch.where: a boolean-mask assignment would synchronise with the host)
    cols = torch.arange(k, device=keys.device)
    drafts = torch.where(cols[None, :] < count[:, None], out[:, :k], -1)
    return drafts, count, score


def numba_row(tokens: np.ndarray, n: int, L_max: int, D: int):
    """The numba trie of ``tokens[:n]`` sized as :func:`new_rows`' rows (to compare)."""
    store = ft.store_for(L_max, L_max)
    start = ft.reserve(store, L_max)
    if n:
        ft.append(*store, tokens, 0, n, start, D)
    return store
