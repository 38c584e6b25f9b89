"""Plain torch rejection sampling, as an engine without fused kernels runs it.

Softmax over every target row, then per mode:

- greedy: argmax of every row, keep the drafts while they equal it;
- one-hot drafts (n-gram), the library's rule (coupled verification): one inverse-CDF
  sample per row (``cumsum`` + ``searchsorted`` against ``u * total``), keep the drafts
  while they equal their row's sample, emit the sample of the first row that does not;
- draft probabilities: classic speculative sampling: gather ``p`` and ``q`` at the drafts,
  compare with uniforms, build the residual ``max(p - q, 0)`` for every draft row, draw the
  recovered and bonus tokens with ``torch.multinomial``.

Semantics follow ``docs/design.md`` (``rejection_sample``) without top-k and min-p; top-p
(``top_p=``, one-hot drafts only) the way vLLM 0.33.0's torch sampler filters on a CPU:
sort each row, cumulative mass of the sorted probabilities, drop the tokens whose
cumulative mass from the smallest up is ``<= 1 - p`` (the largest always stays),
renormalise (restated, not vLLM's code; ties at the boundary can differ from the
library's rule, which keeps them together). For the correctness check the same function runs with
the library's Philox uniforms (``uniforms=``), and inverse-CDF sampling instead of
``multinomial``, so its tokens can be compared with ``rejection_sample``'s one for one;
the timed run draws its own uniforms (``torch.rand`` / ``multinomial``).
"""

from __future__ import annotations

import torch


def _layout(cu: torch.Tensor, k: int, n_flat: int, n_rows: int):
    """Padded [B, k] draft indices and [B, k+1] row indices of the packed layout."""
    B = cu.shape[0] - 1
    device = cu.device
    cu = cu.long()
    counts = cu[1:] - cu[:-1]
    j = torch.arange(k + 1, device=device)
    b = torch.arange(B, device=device)
    draft_idx = (cu[:-1, None] + j[None, :k]).clamp(max=max(n_flat - 1, 0))
    valid = j[None, :k] < counts[:, None]
    row_idx = (cu[:-1, None] + b[:, None] + j[None, :]).clamp(max=n_rows - 1)
    return counts, valid, draft_idx, row_idx


def top_p_filter(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``probs`` ``[..., V]`` with each row's top-p nucleus kept (see the module docstring),
    unnormalised; ``top_p`` one value per row."""
    flat = probs.reshape(-1, probs.shape[-1])
    sorted_p, order = flat.sort(dim=-1)  # ascending
    drop = sorted_p.cumsum(dim=-1) <= (1.0 - top_p.reshape(-1, 1))
    drop[:, -1] = False
    kept = sorted_p.masked_fill(drop, 0.0)
    return torch.empty_like(flat).scatter_(1, order, kept).view(probs.shape)


def _inverse_cdf(mass: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """First id whose running mass exceeds ``u * total`` (rows of ``mass``)."""
    run = mass.cumsum(-1)
    thr = (u * run[..., -1]).unsqueeze(-1)
    idx = torch.searchsorted(run, thr, right=True).squeeze(-1)
    return idx.clamp(max=mass.shape[-1] - 1)


def _speculative(
    probs, draft_probs, drafts, in_vocab, safe_drafts, draft_idx, counts, uniforms, generator
):
    """Classic speculative sampling over ``probs`` ``[B, k+1, V]``: (final token, accepted)."""
    B, K1, V = probs.shape
    k = K1 - 1
    device = probs.device
    bidx = torch.arange(B, device=device)
    p_x = probs[:, :k].gather(2, safe_drafts[:, :, None]).squeeze(2)
    q = draft_probs[draft_idx.reshape(-1)].float().view(B, k, V)
    q_x = q.gather(2, safe_drafts[:, :, None]).squeeze(2)
    if uniforms is None:
        accept_u = torch.rand((B, k), device=device, generator=generator)
    else:
        accept_u = uniforms[0][:, :k]
    accept = in_vocab & (q_x > 0) & (accept_u < p_x / q_x)
    accepted = accept.long().cumprod(dim=1).sum(dim=1)

    # The residual at every draft row, then one recovered sample per row.
    p_rows = probs[:, :k]
    residual = (p_rows - q).clamp(min=0.0)
    empty = (residual.sum(dim=-1, keepdim=True) <= 0) | ~in_vocab[:, :, None]
    residual = torch.where(empty, p_rows, residual)
    bonus_p = probs[bidx, counts]  # [B, V]
    if uniforms is None:
        recovered = torch.multinomial(residual.reshape(B * k, V), 1, generator=generator)
        recovered = recovered.view(B, k)
        bonus = torch.multinomial(bonus_p, 1, generator=generator).view(B)
    else:
        recovered = _inverse_cdf(residual, uniforms[1][:, :k])
        bonus = _inverse_cdf(bonus_p, uniforms[1][bidx, counts])
    rec_at = recovered.gather(1, accepted.clamp(max=max(k - 1, 0))[:, None]).squeeze(1)
    return torch.where(accepted >= counts, bonus, rec_at), accepted


def rejection_sample_torch(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    *,
    num_speculative_tokens: int,
    draft_probs: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    uniforms: tuple[torch.Tensor, torch.Tensor] | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(output_token_ids int32 [B, k+1] padded with -1, num_emitted int32 [B])``.

    ``temperature=None``: greedy. Otherwise every request is sampled at its temperature
    (> 0). ``uniforms=(accept_u, sample_u)``, both float32 ``[B, k+1]`` (column ``j``: the
    uniforms of the request's row ``j``), replaces ``torch.rand``/``multinomial``.
    """
    k = num_speculative_tokens
    V = target_logits.shape[1]
    n_flat = draft_token_ids.shape[0]
    counts, valid, draft_idx, row_idx = _layout(
        cu_num_draft_tokens, k, n_flat, target_logits.shape[0]
    )
    B = counts.shape[0]
    device = target_logits.device
    drafts = torch.where(valid, draft_token_ids[draft_idx].long(), -1)
    in_vocab = valid & (drafts >= 0) & (drafts < V)
    safe_drafts = drafts.clamp(0, V - 1)
    bidx = torch.arange(B, device=device)

    if temperature is None:  # greedy: argmax everywhere, keep the matching prefix
        top = target_logits.argmax(dim=-1)[row_idx]  # [B, k+1]
        match = in_vocab & (top[:, :k] == drafts)
        accepted = match.long().cumprod(dim=1).sum(dim=1)
        final = top[bidx, accepted]
    else:
        rows = row_idx.reshape(-1)
        logits = target_logits[rows].float()  # [B*(k+1), V]
        t = temperature.repeat_interleave(k + 1)[:, None]
        probs = torch.softmax(logits / t, dim=-1).view(B, k + 1, V)
        if top_p is not None:
            probs = top_p_filter(probs, top_p.repeat_interleave(k + 1))
        if draft_probs is None:  # coupled verification: every row's own sample
            if uniforms is None:
                sample_u = torch.rand((B, k + 1), device=device, generator=generator)
            else:
                sample_u = uniforms[1]
            y = _inverse_cdf(probs, sample_u)  # [B, k+1]
            match = in_vocab & (y[:, :k] == drafts)
            accepted = match.long().cumprod(dim=1).sum(dim=1)
            final = y[bidx, accepted]
        else:
            final, accepted = _speculative(
                probs,
                draft_probs,
                drafts,
                in_vocab,
                safe_drafts,
                draft_idx,
                counts,
                uniforms,
                generator,
            )

    j = torch.arange(k + 1, device=device)
    padded = torch.cat([drafts, drafts.new_full((B, 1), -1)], dim=1)
    out = torch.where(j[None, :] < accepted[:, None], padded, -1)
    out = torch.where(j[None, :] == accepted[:, None], final[:, None], out)
    return out.to(torch.int32), (accepted + 1).to(torch.int32)


def library_uniforms(
    seeds: torch.Tensor, offsets: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The uniforms ``rejection_sample`` draws: ``[B, k+1]`` for streams 0 and 1."""
    from specdec_kernels.cpu.philox import philox_uniform

    counters = offsets[:, None].long() + torch.arange(k + 1, device=offsets.device)[None, :]
    return (
        philox_uniform(seeds[:, None], counters, 0),
        philox_uniform(seeds[:, None], counters, 1),
    )
