"""Vectorised torch rejection sampler: the CPU path of ``rejection_sample``.

Works on the live rows only (``cu[B] + B`` target rows, one per query token of every
request), all at once: greedy argmax, the fp32 weights of sampled rows, the filters
(one sort per row when top-k or top-p is on), the acceptance test and the inverse-CDF
samples; then the first non-accepted row of each request decides what is emitted. The
arithmetic is the Triton kernel's, step for step (``specdec_kernels/kernels/rejection.py``
explains the weights ``e`` and the kept set ``{e >= t}``); only sums are taken in a
different order, so tokens differ from the kernel's only when a uniform lands within
float rounding of a boundary.
"""

from __future__ import annotations

import torch

from specdec_kernels.cpu.philox import philox_uniform

_NEG_INF = float("-inf")


def _nan_to_neg_inf(x: torch.Tensor) -> torch.Tensor:
    return x.masked_fill(torch.isnan(x), _NEG_INF)


def target_weights(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
) -> torch.Tensor:
    """Kept fp32 weights ``w`` ``[R, V]`` of sampled rows (``p = w / w.sum(-1)``).

    ``logits`` fp32 ``[R, V]`` with NaN already read as -inf; the per-row parameters are
    ``[R]`` (``temperature > 0``). ``e = 1 where l == max l else exp((l - max l) / T)``
    (subtracting first: a tiny ``T`` must not overflow ``l / T``); the kept set is
    ``{e >= t}``, ``t`` the largest of the top-k, top-p and min-p thresholds.
    """
    R, V = logits.shape
    m = logits.max(dim=-1, keepdim=True).values
    # (l/2 - m/2) / T * 2 equals (l - m) / T bit for bit, but cannot overflow when l and m
    # are finite of opposite signs near float32's limit.
    half = logits * 0.5 - m * 0.5
    e = torch.where(logits == m, 1.0, torch.exp(half / temperature[:, None] * 2.0))
    t = torch.zeros(R, dtype=torch.float32)
    k_on = None if top_k is None else (top_k > 0) & (top_k < V)
    p_on = None if top_p is None else top_p < 1.0
    if (k_on is not None and bool(k_on.any())) or (p_on is not None and bool(p_on.any())):
        srt = torch.sort(e, dim=-1, descending=True).values
        if k_on is not None:
            kth = srt.gather(1, (top_k.long().clamp(1, V) - 1)[:, None])[:, 0]
            t = torch.where(k_on, kth, t)
        if p_on is not None:
            kept_k = torch.where(e >= t[:, None], e, 0.0)
            S_k = kept_k.sum(-1)
            srt_k = torch.where(srt >= t[:, None], srt, 0.0)
            # Mass strictly above each sorted position: the first of a tie group sees
            # exactly the tokens with larger weight, and the kept positions are a prefix.
            above = torch.cat([torch.zeros(R, 1), torch.cumsum(srt_k, dim=-1)[:, :-1]], dim=1)
            n_keep = (above < (top_p * S_k)[:, None]).sum(-1)
            tp = srt_k.gather(1, (n_keep - 1).clamp(min=0)[:, None])[:, 0]
            t = torch.where(p_on, torch.maximum(t, tp), t)
    if min_p is not None:
        t = torch.maximum(t, min_p.float())
    return torch.where(e >= t[:, None], e, 0.0)


def inverse_cdf(mass: torch.Tensor, total: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """First id whose running mass exceeds ``u * total`` (and whose own mass is > 0).

    If rounding leaves no such id, the last id with positive mass; if there is none, -1.
    """
    V = mass.shape[-1]
    thr = u * total
    run = torch.cumsum(mass, dim=-1)
    positive = mass > 0
    hit = (run > thr[:, None]) & positive
    first = hit.to(torch.int8).argmax(dim=-1)
    last = V - 1 - positive.flip(-1).to(torch.int8).argmax(dim=-1)
    last = torch.where(positive.any(-1), last, -1)
    return torch.where(hit.any(-1), first, last)


def rejection_sample(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor | None,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    seeds: torch.Tensor | None,
    offsets: torch.Tensor | None,
    *,
    num_speculative_tokens: int,
    return_logprobs: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
    xs = torch.where(valid, x, 0)

    # The live rows cu[b] + b + j are exactly the first N + B rows, request-major: a view.
    logits = target_logits[: rb.numel()].float()  # [R, V]
    m_raw, arg = logits.max(dim=-1)  # the first maximum: ties -> lowest id
    if bool(torch.isnan(m_raw).any()):  # NaN counts as -inf: copy only when there is one
        logits = _nan_to_neg_inf(logits)
        m_raw, arg = logits.max(dim=-1)
    tok = arg.clone()
    acc = is_draft & (x == arg)

    if temperature is not None:
        T = temperature.float()[rb]
        sampled = (T != 0).nonzero(as_tuple=True)[0]
        if sampled.numel():
            sb, sj = rb[sampled], rj[sampled]
            sx, svalid, sxs = x[sampled], valid[sampled], xs[sampled]

            def per_row(p):
                return None if p is None else p[sb]

            w = target_weights(
                logits[sampled], T[sampled], per_row(top_k), per_row(top_p), per_row(min_p)
            )
            S = w.sum(-1)
            w_x = torch.where(svalid, w.gather(1, sxs[:, None])[:, 0], 0.0)
            seed = seeds[sb]
            counter = offsets[sb] + sj
            if draft_probs is not None:
                q_rows = draft_probs[(start[sb] + sj).clamp(max=draft_probs.shape[0] - 1)]
                q_x = torch.where(svalid, q_rows.float().gather(1, sxs[:, None])[:, 0], 0.0)
            else:
                q_x = torch.ones_like(w_x)
            u_acc = philox_uniform(seed, counter, 0)
            s_acc = svalid & (q_x > 0) & (u_acc < (w_x / S) / q_x)

            # Sample where the row is not accepted: residual after a rejection, else p.
            need = (~s_acc).nonzero(as_tuple=True)[0]
            s_tok = sx.clone()
            if need.numel():
                mass = w[need]
                total = S[need]
                nvalid = svalid[need]
                if draft_probs is not None:
                    r = torch.clamp(mass / total[:, None] - q_rows[need].float(), min=0.0)
                    R = r.sum(-1)
                    resid = nvalid & (R > 0)
                    mass = torch.where(resid[:, None], r, mass)
                    total = torch.where(resid, R, total)
                else:
                    rest = total - w_x[need]
                    resid = nvalid & (rest > 0)
                    hole = torch.zeros_like(mass, dtype=torch.bool)
                    hole.scatter_(1, sxs[need][:, None], resid[:, None])
                    mass = mass.masked_fill(hole, 0.0)
                    total = torch.where(resid, rest, total)
                u_s = philox_uniform(seed[need], counter[need], 1)
                drawn = inverse_cdf(mass, total, u_s)
                s_tok[need] = torch.where(drawn >= 0, drawn, arg[sampled][need])
            tok[sampled] = s_tok
            acc[sampled] = s_acc

    acc_grid = torch.zeros((B, K1), dtype=torch.bool)
    acc_grid[rb, rj] = acc
    tok_grid = torch.full((B, K1), -1, dtype=torch.long)
    tok_grid[rb, rj] = tok
    stop = torch.cumprod(acc_grid.to(torch.int32), dim=1).sum(1)  # leading accepted rows
    emit = jj[None, :] <= stop[:, None]
    out = torch.where(emit, tok_grid, -1).to(torch.int32)
    num_emitted = (stop + 1).to(torch.int32)
    if return_logprobs:
        e_raw = torch.where(logits == m_raw[:, None], 1.0, torch.exp(logits - m_raw[:, None]))
        lse = m_raw + torch.log(e_raw.sum(-1))
        lp = logits.gather(1, tok[:, None])[:, 0] - lse
        lp_grid = torch.zeros((B, K1), dtype=torch.float32)
        lp_grid[rb, rj] = lp
        logprobs = torch.where(emit, lp_grid, 0.0)
    return out, num_emitted, logprobs
