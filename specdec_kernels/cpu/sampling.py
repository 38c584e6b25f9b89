"""The CPU path's building blocks of sampled verification: the weights of the filtered
target distribution and the two-level inverse CDF (``kernels/sampling.py`` explains the
arithmetic; these compute the same values, only sums are taken in another order).
"""

from __future__ import annotations

import torch

_NEG_INF = float("-inf")
CHUNK_ELEMENTS = 1 << 20
"""Scratch size (fp32 entries) of the sampled rows' working buffer: rows per chunk =
``max(1, CHUNK_ELEMENTS // V)``."""
CDF_BLOCK = 1024
"""Ids per block of the two-level inverse CDF (the Triton kernel streams blocks of 1024)."""
LOG2E = 1.4426950408889634
EXP2_MIN = -126.0
"""Weights ``exp2(z)`` with ``z <= EXP2_MIN`` (they would be subnormal) count as 0."""
# Rows whose temperature lies outside [_T_FAST_MIN, _T_FAST_MAX], or whose maximum logit is
# not finite, get the weights by the kernel's literal formula (``_exact_weights``); for
# the others ``(l - m) * scale`` is the same value bit for bit (see ``_weights_``).
_T_FAST_MIN = 2.0**-90
_T_FAST_MAX = 1e36


def _nan_to_neg_inf_(x: torch.Tensor) -> torch.Tensor:
    return x.masked_fill_(torch.isnan(x), _NEG_INF)


def _scale(T: torch.Tensor) -> torch.Tensor:
    """``log2(e) / T`` in fp32, per row: the weights are ``exp2((l - m) * scale)``."""
    return torch.full_like(T, LOG2E) / T


def _exact_weights(l: torch.Tensor, m: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """The kernel's formula: ``e = 1 where l == m``, else ``exp2(z)`` if ``z > EXP2_MIN``
    else 0, with ``z = (l/2 - m/2) * (2 * scale)``.

    Halving first keeps ``l - m`` from overflowing when ``l`` and ``m`` are finite of
    opposite signs near float32's limit; ``l == m`` handles ``+inf`` maxima and rows that
    are all ``-inf`` (uniform).
    """
    z = (l * 0.5 - m[:, None] * 0.5) * (_scale(T) * 2.0)[:, None]
    e = torch.where(z > EXP2_MIN, torch.exp2(z), 0.0)
    return torch.where(l == m[:, None], 1.0, e)


def _weights_(z: torch.Tensor, m: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """In place: fp32 logits ``z`` ``[C, V]`` (NaN already ``-inf``, row max ``m``) become the
    weights ``e`` at temperatures ``T`` ``[C]`` (``> 0``), ``0 <= e <= 1``, ``e = 1`` at the max.

    For a finite ``m`` and ``2**-90 <= T <= 1e36``, ``(l - m) * scale`` equals the kernel's
    ``(l/2 - m/2) * (2 * scale)`` bit for bit (halving and doubling are exact; where
    ``l - m`` overflows to ``-inf`` the halved form is below ``-126`` too, so the weight is
    0 either way) and ``l == m`` gives ``z = 0``, ``e = 1``. Four in-place passes:
    subtract, scale, flush (``threshold_``), ``exp2`` (several times faster than ``exp``
    on the CPU, and never slowed down by subnormal results). The other rows (huge or tiny
    ``T``, ``+-inf`` maxima) take the literal formula.
    """
    odd = ~torch.isfinite(m) | (T < _T_FAST_MIN) | (T > _T_FAST_MAX)
    exact = None
    if bool(odd.any()):
        rows = odd.nonzero(as_tuple=True)[0]
        exact = (rows, _exact_weights(z[rows], m[rows], T[rows]))
    z.sub_(m[:, None]).mul_(_scale(T)[:, None])
    torch.nn.functional.threshold_(z, EXP2_MIN, _NEG_INF)  # z <= -126 -> -inf -> weight 0
    z.exp2_()
    if exact is not None:
        z[exact[0]] = exact[1]
    return z


def _thresholds(e: torch.Tensor, top_k, top_p, min_p) -> torch.Tensor | None:
    """Per-row threshold ``t`` ``[C]`` of the kept set ``{e >= t}`` (top-k, then top-p, then
    min-p; ``None`` when no filter is on in these rows).

    Top-k keeps ``x`` iff fewer than ``k`` weights are larger, so ``t`` is the ``k``-th
    largest weight; top-p keeps ``x`` iff the kept mass strictly above it is
    ``< top_p * S_k``: the first of a tie group sees exactly the larger weights, so the kept
    sorted positions are a prefix and ``t`` is the weight at its end; min-p keeps
    ``e >= min_p`` (the max weight is 1). One sort, only when top-k or top-p is on.
    """
    C, V = e.shape
    k_on = None if top_k is None else (top_k > 0) & (top_k < V)
    p_on = None if top_p is None else top_p < 1.0
    k_any = k_on is not None and bool(k_on.any())
    p_any = p_on is not None and bool(p_on.any())
    m_any = min_p is not None and bool((min_p > 0).any())
    if not (k_any or p_any or m_any):
        return None
    t = torch.zeros(C, dtype=torch.float32)
    if k_any or p_any:
        srt = torch.sort(e, dim=-1, descending=True).values
        if k_any:
            kth = srt.gather(1, (top_k.long().clamp(1, V) - 1)[:, None])[:, 0]
            t = torch.where(k_on, kth, t)
        if p_any:
            S_k = torch.where(e >= t[:, None], e, 0.0).sum(-1)
            srt_k = torch.where(srt >= t[:, None], srt, 0.0)
            above = torch.cat([torch.zeros(C, 1), torch.cumsum(srt_k, dim=-1)[:, :-1]], dim=1)
            n_keep = (above < (top_p * S_k)[:, None]).sum(-1)
            tp = srt_k.gather(1, (n_keep - 1).clamp(min=0)[:, None])[:, 0]
            t = torch.where(p_on, torch.maximum(t, tp), t)
    if m_any:
        t = torch.maximum(t, min_p.float())
    return t


def target_weights(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
) -> torch.Tensor:
    """Kept fp32 weights ``w`` ``[R, V]`` of sampled rows (``p = w / w.sum(-1)``).

    ``logits`` fp32 ``[R, V]``; the per-row parameters are ``[R]`` (``temperature > 0``).
    A new tensor (the op itself works on a scratch buffer with :func:`_weights_`).
    """
    z = _nan_to_neg_inf_(logits.float().clone())
    e = _weights_(z, z.amax(-1), temperature.float())
    t = _thresholds(e, top_k, top_p, min_p)
    return e if t is None else e.masked_fill_(e < t[:, None], 0.0)


def _block_sums(mass: torch.Tensor) -> torch.Tensor:
    """Running sum ``[C, nb]`` of the sums of ``CDF_BLOCK``-id blocks of ``mass`` ``[C, V]``."""
    C, V = mass.shape
    blk = min(CDF_BLOCK, V)
    full = V // blk
    sums = mass[:, : full * blk].unflatten(1, (full, blk)).sum(-1)
    if full * blk < V:
        sums = torch.cat([sums, mass[:, full * blk :].sum(-1, keepdim=True)], dim=1)
    return sums.cumsum_(-1)


def inverse_cdf(
    mass: torch.Tensor, u: torch.Tensor, run_blocks: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token, total)``: per row of ``mass`` ``[C, V]`` (``>= 0``), the first id whose running
    mass exceeds ``u * total`` (and whose own mass is ``> 0``), ``total`` the row's mass.

    Two levels: the running block sums (``run_blocks``, from :func:`_block_sums` if not
    given; ``total`` is its last column) pick the block where the running mass first
    exceeds ``u * total``, a cumsum inside that block the id. If rounding leaves no such id
    in the block, its last id with positive mass; a row with no mass gives -1.
    """
    C, V = mass.shape
    if run_blocks is None:
        run_blocks = _block_sums(mass)
    blk = min(CDF_BLOCK, V)
    nb = run_blocks.shape[1]
    total = run_blocks[:, -1]
    thr = u * total
    which = torch.searchsorted(run_blocks, thr[:, None], right=True)[:, 0].clamp_(max=nb - 1)
    carry = run_blocks.gather(1, (which - 1).clamp(min=0)[:, None])[:, 0]
    carry = torch.where(which > 0, carry, 0.0)
    cols = which[:, None] * blk + torch.arange(blk)[None, :]
    seg = mass.gather(1, cols.clamp(max=V - 1))
    seg = torch.where(cols < V, seg, 0.0)
    run = carry[:, None] + seg.cumsum(-1)
    positive = seg > 0
    hit = (run > thr[:, None]) & positive
    first = hit.to(torch.int8).argmax(dim=-1)
    last = blk - 1 - positive.flip(-1).to(torch.int8).argmax(dim=-1)
    off = torch.where(hit.any(-1), first, torch.where(positive.any(-1), last, -1))
    tok = torch.where(off >= 0, which * blk + off, -1)
    return tok, total


def _first_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Row argmax, ties to the lowest id, NaN read as ``-inf`` (copies only if there is one)."""
    m, arg = logits.max(dim=-1)  # the first maximum: ties -> lowest id
    if bool(torch.isnan(m).any()):
        m, arg = _nan_to_neg_inf_(logits.float().clone()).max(dim=-1)
    return arg
