"""Vectorised torch rejection sampler: the CPU path of ``rejection_sample``.

Works on the live rows only (``cu[B] + B`` target rows, one per query token of every
request). Greedy rows take the argmax. Sampled rows go through a scratch buffer a few rows
at a time (``CHUNK_ELEMENTS`` floats, 4 MiB: it stays in the cache, and no ``[rows, V]``
temporary is allocated, whose page faults alone would cost more than the arithmetic):
copy the rows in, then, in place, the weights ``e = exp((l - max l) / T)`` (computed as
``exp2``), the filters (a sort only for rows with top-k or top-p), and one inverse-CDF
sample per row from block sums (``CDF_BLOCK`` ids a block: the running sum of the block
sums picks the block, a cumsum inside it the id). A sampled row thus costs one read of
its logits from memory and a few passes over a cached buffer; a greedy row one ``max``.

One-hot drafts are verified by coupling: row ``j``'s token is the plain sampler's sample
there, and the draft is kept iff it equals it. With draft probabilities, rows that are not
accepted sample the residual ``max(p - q, 0)``. The first row of each request that is not
accepted decides what is emitted. The arithmetic is the Triton kernel's
(``specdec_kernels/kernels/rejection.py`` explains the weights and the kept set
``{e >= t}``); only sums are taken in another order, so tokens differ from the kernel's only
when a uniform lands within float rounding of a CDF boundary.
"""

from __future__ import annotations

import threading

import torch

from specdec_kernels.cpu.philox import philox_uniform
from specdec_kernels.cpu.sampling import (
    _NEG_INF,
    CHUNK_ELEMENTS,
    EXP2_MIN,
    LOG2E,
    _block_sums,
    _first_argmax,
    _nan_to_neg_inf_,
    _thresholds,
    _weights_,
    inverse_cdf,
)


def require_seeds_and_offsets(temperature, seeds, offsets) -> None:
    """The op's one structural check (shared by the CPU path, the Triton launcher and the
    fake): sampled rows need ``seeds`` and ``offsets``."""
    if temperature is not None and (seeds is None or offsets is None):
        raise ValueError(
            "specdec::rejection_sample needs seeds and offsets when temperature is given "
            "(the Python wrapper rejection_sample fills them)"
        )


_SCRATCH = threading.local()


def _scratch(rows: int, V: int) -> torch.Tensor:
    """A ``[rows, V]`` fp32 working buffer, reused from call to call (per thread): a fresh
    multi-MiB allocation is returned to the OS on free and page-faults in again, which cost
    more than the passes over it. Always a normal tensor: one made under
    ``torch.inference_mode()`` could not be written by a later call outside it."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.numel() < rows * V:
        with torch.inference_mode(False):
            buf = torch.empty(max(rows * V, CHUNK_ELEMENTS), dtype=torch.float32)
        _SCRATCH.buf = buf
    return buf[: rows * V].view(rows, V)


class _Rows:
    """The live rows of ``logits`` picked by ``idx`` (``None``: all), chunk by chunk, copied as
    fp32 into one reused scratch buffer."""

    def __init__(self, logits: torch.Tensor, idx: torch.Tensor | None):
        self.logits = logits
        self.idx = idx
        self.n = logits.shape[0] if idx is None else idx.shape[0]
        V = logits.shape[1]
        self.step = max(1, CHUNK_ELEMENTS // max(V, 1))
        self.buf = _scratch(min(self.step, self.n), V)

    def __iter__(self):
        for s in range(0, self.n, self.step):
            e = min(s + self.step, self.n)
            z = self.buf[: e - s]
            # detached: the op has no gradient, and copying a tensor that requires grad
            # would chain every call's graph onto the reused buffer
            if self.idx is None:
                z.copy_(self.logits[s:e].detach())
            else:
                z.copy_(self.logits.detach().index_select(0, self.idx[s:e]))
            m = z.amax(-1)
            if bool(torch.isnan(m).any()):  # NaN counts as -inf
                m = _nan_to_neg_inf_(z).amax(-1)
            yield s, e, z, m


def _sample_rows(
    logits, idx, T, top_k, top_p, min_p, u_sample, x, valid, q_rows=None, u_accept=None
):
    """Tokens (and acceptance) of the sampled live rows ``idx`` (``None``: all rows).

    One-hot (``q_rows is None``): ``tok`` = the inverse-CDF sample of the filtered ``p``
    with ``u_sample``; accepted iff ``x == tok``. With ``q_rows`` (a callable giving the
    draft rows ``q`` of a chunk's positions, or None for rows without a draft): classic
    speculative sampling, ``u_accept < p(x) / q(x)``, else a sample of the residual.
    """
    n = logits.shape[0] if idx is None else idx.shape[0]
    tok = torch.empty(n, dtype=torch.long)
    acc = torch.zeros(n, dtype=torch.bool)
    for s, e, z, m in _Rows(logits, idx):
        sl = slice(s, e)
        w = _weights_(z, m, T[sl])
        t = _thresholds(w, *(None if p is None else p[sl] for p in (top_k, top_p, min_p)))
        if t is not None:
            w.masked_fill_(w < t[:, None], 0.0)
        run = _block_sums(w)
        y, S = inverse_cdf(w, u_sample[sl], run)
        if q_rows is None:
            tok[sl] = y
            acc[sl] = x[sl] == y  # x = -1 (no draft, or out of range) never matches
            continue
        # Draft probabilities: u < p(x) / q(x) with q(x) > 0; otherwise the residual.
        vx = valid[sl]
        xs = torch.where(vx, x[sl], 0)
        drafted = vx.nonzero(as_tuple=True)[0]
        c_tok = y.clone()
        c_acc = torch.zeros(e - s, dtype=torch.bool)
        if drafted.numel():
            q = q_rows(s + drafted)  # fp32 [n_d, V]
            xd = xs[drafted]
            w_x = w[drafted].gather(1, xd[:, None])[:, 0]
            q_x = q.gather(1, xd[:, None])[:, 0]
            ok = (q_x > 0) & (u_accept[sl][drafted] < (w_x / S[drafted]) / q_x)
            c_acc[drafted] = ok
            c_tok[drafted] = torch.where(ok, xd, c_tok[drafted])
            rej = (~ok).nonzero(as_tuple=True)[0]
            if rej.numel():  # normalize(max(p - q, 0)), unless it has no mass
                r = drafted[rej]
                resid = (w[r] / S[r][:, None]).sub_(q[rej]).clamp_(min=0.0)
                r_tok, R = inverse_cdf(resid, u_sample[sl][r])
                c_tok[r] = torch.where((R > 0) & (r_tok >= 0), r_tok, c_tok[r])
        tok[sl] = c_tok
        acc[sl] = c_acc
    return tok, acc


def _log_probs(logits: torch.Tensor, idx: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """``log_softmax(l)[tok]`` of the live rows ``idx``, computed as ``(l_tok - m) - log S``.

    Subtracting the max first keeps the result exact for logits of any finite magnitude
    (``l_tok - (m + log S)`` would round ``log S`` into a huge ``m``). NaN counts as -inf;
    a row with ``+inf`` (or only ``-inf``) logits gives ``log(1/n)`` at its ``n`` maximal ids.
    """
    lp = torch.empty(idx.shape[0], dtype=torch.float32)
    for s, e, z, m in _Rows(logits, idx):
        l_tok = z.gather(1, tok[s:e, None])[:, 0]
        odd = ~torch.isfinite(m)
        if bool(odd.any()):  # weight 1 at the maximal ids, 0 elsewhere
            rows = odd.nonzero(as_tuple=True)[0]
            z[rows] = torch.where(z[rows] == m[rows, None], 0.0, _NEG_INF)
            l_tok[rows] = torch.where(l_tok[rows] == m[rows], 0.0, _NEG_INF)
            m = torch.where(odd, 0.0, m)
        z.sub_(m[:, None]).mul_(LOG2E)
        torch.nn.functional.threshold_(z, EXP2_MIN, _NEG_INF)
        S = z.exp2_().sum(-1)
        lp[s:e] = (l_tok - m) - torch.log(S)
    return lp


def rejection_sample(
    target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k, top_p,
    min_p, seeds, offsets, *, num_speculative_tokens, return_logprobs,
):  # fmt: skip
    """The CPU implementation of ``specdec::rejection_sample`` (registered directly)."""
    require_seeds_and_offsets(temperature, seeds, offsets)
    K1 = num_speculative_tokens + 1
    B = cu_num_draft_tokens.shape[0] - 1
    V = target_logits.shape[1]
    out = torch.full((B, K1), -1, dtype=torch.int32)
    num_emitted = torch.zeros((B,), dtype=torch.int32)
    logprobs = torch.zeros((B, K1) if return_logprobs else (0,), dtype=torch.float32)
    if B == 0:
        return out, num_emitted, logprobs
    if draft_probs is not None and draft_probs.shape[0] == 0:
        draft_probs = None  # then there are no draft rows (N <= len(drafts) <= 0)

    cu = cu_num_draft_tokens.long()
    start = cu[:-1]
    kb = cu[1:] - start
    jj = torch.arange(K1)
    live = jj[None, :] <= kb[:, None]  # [B, K1]
    rb, rj = live.nonzero(as_tuple=True)  # the live rows, request-major
    is_draft = rj < kb[rb]
    flat = start[rb] + rj  # flat draft index of row j (meaningful when is_draft)
    if draft_token_ids.numel():
        x = draft_token_ids[flat.clamp(max=draft_token_ids.numel() - 1)].long()
        x = torch.where(is_draft, x, -1)
    else:
        x = torch.full_like(rb, -1)
    valid = is_draft & (x >= 0) & (x < V)
    x = torch.where(valid, x, -1)  # an id outside [0, V) is never read and never matches

    # The live rows cu[b] + b + j are exactly the first N + B rows, request-major: a view.
    logits = target_logits[: rb.numel()]
    n_rows = rb.numel()
    tok = torch.empty(n_rows, dtype=torch.long)
    acc = torch.zeros(n_rows, dtype=torch.bool)
    T = None if temperature is None else temperature.float()[rb]
    greedy = None if T is None else (T == 0)
    if greedy is None or bool(greedy.all()):
        tok = _first_argmax(logits)
        acc = x == tok
    else:
        g_rows = greedy.nonzero(as_tuple=True)[0]
        if g_rows.numel():
            g_tok = _first_argmax(logits.index_select(0, g_rows))
            tok[g_rows] = g_tok
            acc[g_rows] = x[g_rows] == g_tok
        s_rows = (~greedy).nonzero(as_tuple=True)[0]
        idx = None if s_rows.numel() == n_rows else s_rows  # None: every row, in order
        sb, sj = rb[s_rows], rj[s_rows]
        counter = offsets[sb] + sj
        u_sample = philox_uniform(seeds[sb], counter, 1)
        q_rows = u_accept = None
        if draft_probs is not None:
            u_accept = philox_uniform(seeds[sb], counter, 0)
            q_flat = flat[s_rows]

            def q_rows(pos):
                return draft_probs.index_select(0, q_flat[pos]).float()

        s_tok, s_acc = _sample_rows(
            logits,
            idx,
            T[s_rows],
            *(None if p is None else p[sb] for p in (top_k, top_p, min_p)),
            u_sample,
            x[s_rows],
            valid[s_rows],
            q_rows,
            u_accept,
        )
        tok[s_rows] = s_tok
        acc[s_rows] = s_acc

    acc_grid = torch.zeros((B, K1), dtype=torch.bool)
    acc_grid[rb, rj] = acc & is_draft
    tok_grid = torch.full((B, K1), -1, dtype=torch.long)
    tok_grid[rb, rj] = tok
    stop = torch.cumprod(acc_grid.to(torch.int32), dim=1).sum(1)  # leading accepted rows
    emit = jj[None, :] <= stop[:, None]
    out = torch.where(emit, tok_grid, -1).to(torch.int32)
    num_emitted = (stop + 1).to(torch.int32)
    if return_logprobs:
        emitted_rows = (emit & live)[rb, rj].nonzero(as_tuple=True)[0]
        lp_grid = torch.zeros((B, K1), dtype=torch.float32)
        if emitted_rows.numel():
            lp = _log_probs(logits, emitted_rows, tok[emitted_rows])
            lp_grid[rb[emitted_rows], rj[emitted_rows]] = lp
        logprobs = lp_grid
    return out, num_emitted, logprobs
