"""Plain-Python speculative rejection sampler: the oracle for ``rejection_sample``.

Coupled verification for one-hot (n-gram) drafts: every verify row gets the token the
plain sampler (k = 0) would draw there, and a draft is kept iff it equals that token;
with draft probabilities, speculative sampling as Leviathan, Kalman and Matias (2023,
"Fast inference from transformers via speculative decoding") and Chen et al. (2023,
"Accelerating large language model decoding with speculative sampling") define it. The
exact rules are ``docs/design.md``'s (op 2), written request by request and row by row
with the filters' literal definitions (``O(V^2)`` comparisons, fine for test
vocabularies). It has its own Philox4x32-10 on Python integers, independent of the torch
and Triton ones.
"""

from __future__ import annotations

import math

import torch

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = 0xFFFFFFFF
LOG2E = 1.4426950408889634
EXP2_MIN = -126.0


def philox4x32_10(counter: list[int], key: list[int]) -> list[int]:
    """Philox4x32-10 on four 32-bit counter words and two key words (Python ints)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
        p0, p1 = _M0 * c0, _M1 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & _MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & _MASK32
    return [c0, c1, c2, c3]


def uniform(seed: int, counter: int, stream: int) -> float:
    """The library's uniform: key = seed's 64 bits, counter = (counter's 64 bits, stream, 0)."""
    s, c = seed & 0xFFFFFFFFFFFFFFFF, counter & 0xFFFFFFFFFFFFFFFF
    r0 = philox4x32_10([c & _MASK32, c >> 32, stream, 0], [s & _MASK32, s >> 32])[0]
    return (r0 >> 8) * 2.0**-24  # exact in float32 too


def _first_argmax(row: torch.Tensor) -> int:
    return int((row == row.max()).nonzero()[0, 0])


def _kept_weights(row: torch.Tensor, T: float, k: int, top_p: float, min_p: float):
    """The sampled row's kept fp32 weights ``w`` (``p = w / sum w``): :func:`kept_set`'s
    weights, 0 outside the kept set."""
    e, keep = kept_set(row, T, k, top_p, min_p)
    return torch.where(keep, e, 0.0)


def kept_set(row: torch.Tensor, T: float, k: int, top_p: float, min_p: float):
    """The sampled row's fp32 weights ``e`` and the filters' kept set (bool), literal filters.

    ``e = 1`` where ``l == max l``, else ``exp2(z)`` for ``z = (l/2 - m/2) * (2 * log2(e) / T)
    > -126`` and 0 below (``z`` is ``(l - m) / T`` in base 2, halved so that ``l - m`` cannot
    overflow near 3.4e38; weights that would be subnormal count as 0).
    """
    V = row.shape[0]
    l = row.masked_fill(torch.isnan(row), float("-inf"))
    m = l.max()
    scale = torch.tensor(LOG2E, dtype=torch.float32) / torch.tensor(T, dtype=torch.float32)
    z = (l * 0.5 - m * 0.5) * (scale * 2)
    # exp2 in float64, rounded once: torch's fp32 exp2 can give equal inputs results an ulp
    # apart by their place in the tensor (its vector and tail loops), splitting ties
    e = torch.where(z > EXP2_MIN, torch.exp2(z.double()).float(), 0.0)
    e = torch.where(l == m, torch.ones_like(l), e)
    keep = torch.ones(V, dtype=torch.bool)
    larger = e[None, :] > e[:, None]  # larger[x, y]: e(y) > e(x)
    if 0 < k < V:  # top-k: fewer than k tokens have a larger weight
        keep = larger.sum(1) < k
    if top_p < 1.0:  # top-p: the kept mass above x is < top_p of the kept mass
        ek = torch.where(keep, e, 0.0)
        above = torch.where(larger & keep[None, :], e[None, :], 0.0).sum(1)
        keep = keep & (above < torch.tensor(top_p, dtype=torch.float32) * ek.sum())
    if min_p > 0.0:  # min-p: p(x) >= min_p * max p; the max weight is 1
        keep = keep & (e >= torch.tensor(min_p, dtype=torch.float32))
    return e, keep


def _log_prob(raw: torch.Tensor, t: int) -> float:
    """``log_softmax(raw)[t]``, NaN read as -inf; where the maximum is not finite (all -inf,
    or +inf entries) the ``n`` ids holding it share the mass: ``-log n`` there, -inf elsewhere
    (``log_softmax`` would give NaN)."""
    raw = raw.masked_fill(torch.isnan(raw), float("-inf"))
    top = raw.max()
    if torch.isfinite(top):
        return float(torch.log_softmax(raw, dim=0)[t])
    n = int((raw == top).sum())
    return -math.log(n) if raw[t] == top else float("-inf")


def _sample(mass: torch.Tensor, total: torch.Tensor, u: float) -> int | None:
    """First id whose running mass exceeds ``u * total`` (with mass > 0)."""
    thr = torch.tensor(u, dtype=torch.float32) * total
    run = torch.cumsum(mass, 0)
    for i in range(mass.shape[0]):
        if run[i] > thr and mass[i] > 0:
            return i
    positive = (mass > 0).nonzero()
    return int(positive[-1, 0]) if positive.numel() else None


def rejection_sample(
    target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, temperature, top_k, top_p,
    min_p, seeds, offsets, *, num_speculative_tokens, return_logprobs,
):  # fmt: skip
    """Loop over requests, then over their rows until the first row that is not accepted.

    One-hot drafts (``draft_probs is None``): coupled verification. Row ``j`` has its own
    token ``y_j`` (greedy: the argmax; sampled: the inverse-CDF sample of the filtered
    ``p`` with the stream-1 uniform of counter ``offsets[b] + j``, exactly what the plain
    sampler draws there); ``d_j`` is accepted iff ``d_j == y_j``; the first row that is
    not accepted emits its ``y_j``. With ``draft_probs``: classic speculative sampling
    (stream-0 acceptance uniform, stream-1 sample of the residual or of the bonus ``p``).
    """
    K1 = num_speculative_tokens + 1
    cu = cu_num_draft_tokens.tolist()
    B = len(cu) - 1
    V = target_logits.shape[1]
    out = torch.full((B, K1), -1, dtype=torch.int32)
    num_emitted = torch.zeros((B,), dtype=torch.int32)
    logprobs = torch.zeros((B, K1) if return_logprobs else (0,), dtype=torch.float32)
    for b in range(B):
        kb = cu[b + 1] - cu[b]
        T = 0.0 if temperature is None else float(temperature[b])
        emitted: list[int] = []
        for j in range(kb + 1):
            raw = target_logits[cu[b] + b + j].float()
            row = raw.masked_fill(torch.isnan(raw), float("-inf"))
            x = int(draft_token_ids[cu[b] + j]) if j < kb else None
            valid = x is not None and 0 <= x < V
            if T == 0.0:  # greedy: y_j is the argmax
                y = _first_argmax(row)
                emitted.append(y)
                if valid and y == x:
                    continue
                break
            w = _kept_weights(
                row,
                T,
                0 if top_k is None else int(top_k[b]),
                1.0 if top_p is None else float(top_p[b]),
                0.0 if min_p is None else float(min_p[b]),
            )
            S = w.sum()
            seed, counter = int(seeds[b]), int(offsets[b]) + j
            q = None if draft_probs is None or j == kb else draft_probs[cu[b] + j].float()
            if q is None:  # one-hot draft or bonus row: y_j, the plain sampler's token
                y = _sample(w, S, uniform(seed, counter, 1))
                y = _first_argmax(row) if y is None else y
                emitted.append(y)
                if valid and y == x:
                    continue
                break
            if valid:  # classic speculative sampling: u < p(x) / q(x)
                u = uniform(seed, counter, 0)
                if q[x] > 0 and torch.tensor(u, dtype=torch.float32) < (w[x] / S) / q[x]:
                    emitted.append(x)
                    continue
            mass, total = w, S
            if valid:  # normalize(max(p - q, 0)), unless it has no mass
                r = torch.clamp(w / S - q, min=0.0)
                if r.sum() > 0:
                    mass, total = r, r.sum()
            tok = _sample(mass, total, uniform(seed, counter, 1))
            emitted.append(_first_argmax(row) if tok is None else tok)
            break
        out[b, : len(emitted)] = torch.tensor(emitted, dtype=torch.int32)
        num_emitted[b] = len(emitted)
        if return_logprobs:
            for j, t in enumerate(emitted):
                logprobs[b, j] = _log_prob(target_logits[cu[b] + b + j].float(), t)
    return out, num_emitted, logprobs
