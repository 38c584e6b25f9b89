"""Plain-Python draft-length planning: the oracle for ``plan_draft_lengths`` and
``update_acceptance_stats``.

One loop per request and per draft position, the rules of ``docs/design.md`` written out
literally: the gain of a request's ``j``-th draft is the probability that drafts
``0 .. j`` are all accepted, the product of the per-position acceptance estimates; gains
are quantised to multiples of ``2**-24`` so that every sum is exact; the plan takes the
``D`` largest gains (ties: lower position, then lower batch row) for the ``D`` that
maximises ``(B + sum of those gains) / cost[B + D]``, the smallest such ``D`` on a tie.
"""

from __future__ import annotations

import torch

from specdec_kernels.constants import DRAFT_GAIN_SCALE as GAIN_SCALE


def _rows(req_indices: torch.Tensor | None, batch: int) -> list[int]:
    return list(range(batch)) if req_indices is None else req_indices.tolist()


def _class(match_len: int, num_classes: int) -> int:
    return min(max(match_len, 1), num_classes) - 1


def plan_draft_lengths(
    num_draft_tokens, match_len, verify_cost, req_indices, acceptance, *, max_num_tokens,
):  # fmt: skip
    """Enumerate every ``D`` from 0 to the number of proposed drafts; keep the best."""
    B = num_draft_tokens.shape[0]
    M, K = acceptance.shape[1], acceptance.shape[2]
    rows = _rows(req_indices, B)
    items = []  # (-gain, j, b): sorting puts the largest gain first, ties by (j, b)
    gains: dict[tuple[int, int], int] = {}
    for b, r in enumerate(rows):
        if r < 0:
            continue
        c = _class(int(match_len[b]), M)
        g = torch.tensor(1.0, dtype=torch.float32)
        for j in range(min(int(num_draft_tokens[b]), K)):
            g = g * acceptance[r, c, j].float()  # fp32, one multiplication per position
            q = int(torch.floor(g * GAIN_SCALE))
            gains[(b, j)] = q
            items.append((-q, j, b))
    items.sort()
    limit = len(items)
    if max_num_tokens is not None:
        limit = max(0, min(limit, max_num_tokens - B))
    limit = min(limit, verify_cost.shape[0] - 1 - B)
    cost = verify_cost.double().tolist()
    best_d, best_value, total = 0, B * GAIN_SCALE / cost[B], B * GAIN_SCALE
    for d in range(1, limit + 1):
        total += -items[d - 1][0]
        value = total / cost[B + d]
        if value > best_value:
            best_d, best_value = d, value
    planned = torch.zeros(B, dtype=torch.int32)
    expected = torch.zeros(B, dtype=torch.float32)
    for _, _, b in items[:best_d]:
        planned[b] += 1
    for b, r in enumerate(rows):
        if r >= 0:  # 1 (the recovered or bonus token) + the planned drafts' gains
            q = sum(gains[(b, j)] for j in range(int(planned[b])))
            expected[b] = 1.0 + q / GAIN_SCALE
    return planned, expected


def update_acceptance_stats(
    draft_token_ids, num_draft_tokens, match_len, output_token_ids, num_emitted, req_indices,
    acceptance, *, decay,
):  # fmt: skip
    """For each observed position, ``a <- decay * a + (1 - decay) * [d_j == emitted_j]``."""
    B = draft_token_ids.shape[0]
    M, K = acceptance.shape[1], acceptance.shape[2]
    keep = torch.tensor(decay, dtype=torch.float32)
    learn = torch.tensor(1.0, dtype=torch.float32) - keep
    for b, r in enumerate(_rows(req_indices, B)):
        if r < 0:
            continue
        c = _class(int(match_len[b]), M)
        observed = min(int(num_draft_tokens[b]), int(num_emitted[b]), K)
        for j in range(observed):
            hit = int(draft_token_ids[b, j]) == int(output_token_ids[b, j])
            a = acceptance[r, c, j]
            acceptance[r, c, j] = a * keep + learn * float(hit)
            if not hit:  # later positions are conditional on this one: not observed
                break
