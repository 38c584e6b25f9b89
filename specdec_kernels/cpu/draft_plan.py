"""The CPU draft-length planner: ``plan_draft_lengths`` and ``update_acceptance_stats`` as
numba kernels (``cpu/_jit.py``).

- ``plan_draft_lengths``: the gain of every draft slot (a running fp32 product of the
  acceptance estimates, quantised to integers), one stable sort of the slots by gain in
  position-major order (ties: the lower position, then the lower batch row), then one pass
  over the prefix sums keeps the ``D`` with the largest ``(B + prefix) / cost[B + D]`` in
  float64, the first on a tie. Integer sums and one float64 division per ``D``: the same
  plan as the reference and the kernel, bit for bit.
- ``update_acceptance_stats``: per request, the proposed drafts against the emitted
  tokens up to the first mismatch, one exponentially decayed fp32 update per observation.
"""

from __future__ import annotations

import numpy as np

from specdec_kernels.constants import DRAFT_GAIN_SCALE
from specdec_kernels.cpu._jit import NONE_I32, jit, np_, opt, outputs


@jit
def _plan(num_draft_tokens, match_len, verify_cost, rows, has_rows, acceptance, max_num_tokens,
          planned, expected):  # fmt: skip
    B = num_draft_tokens.shape[0]
    R, M, K = acceptance.shape
    q = np.full((K, B), -1, dtype=np.int64)  # position-major: slot j * B + b
    valid = 0
    for b in range(B):
        planned[b] = 0
        expected[b] = 0.0
        r = rows[b] if has_rows else b
        if r < 0 or r >= R:
            continue
        c = min(max(match_len[b], 1), M) - 1
        g = np.float32(1.0)
        for j in range(min(max(num_draft_tokens[b], 0), K)):
            g = g * acceptance[r, c, j]  # fp32, one multiplication per position
            q[j, b] = np.int64(np.floor(g * np.float32(DRAFT_GAIN_SCALE)))
            valid += 1
    flat = q.reshape(-1)
    order = np.argsort(-flat, kind="mergesort")  # stable: ties keep (j, b) order
    limit = valid
    if max_num_tokens >= 0:
        limit = max(0, min(limit, max_num_tokens - B))
    limit = min(limit, verify_cost.shape[0] - 1 - B)
    total = np.int64(B) * DRAFT_GAIN_SCALE
    best_d, best_value = 0, np.float64(total) / np.float64(verify_cost[B])
    for d in range(1, limit + 1):
        total += flat[order[d - 1]]
        value = np.float64(total) / np.float64(verify_cost[B + d])
        if value > best_value:
            best_d, best_value = d, value
    sums = np.zeros(B, dtype=np.int64)
    for d in range(best_d):
        slot = order[d]
        b = slot % B
        planned[b] += 1
        sums[b] += flat[slot]
    for b in range(B):
        r = rows[b] if has_rows else b
        if 0 <= r < R:  # 1 (the recovered or bonus token) + the planned drafts' gains
            expected[b] = np.float32(1.0 + sums[b] / DRAFT_GAIN_SCALE)


@jit
def _update(draft_token_ids, num_draft_tokens, match_len, output_token_ids, num_emitted, rows,
            has_rows, acceptance, decay):  # fmt: skip
    B = draft_token_ids.shape[0]
    R, M, K = acceptance.shape
    keep = np.float32(decay)
    learn = np.float32(1.0) - keep
    for b in range(B):
        r = rows[b] if has_rows else b
        if r < 0 or r >= R:
            continue
        c = min(max(match_len[b], 1), M) - 1
        observed = min(num_draft_tokens[b], num_emitted[b], K)
        for j in range(max(observed, 0)):
            hit = draft_token_ids[b, j] == output_token_ids[b, j]
            acceptance[r, c, j] = acceptance[r, c, j] * keep + learn * np.float32(hit)
            if not hit:  # later positions are conditional on this one: not observed
                break


def plan_draft_lengths(
    num_draft_tokens, match_len, verify_cost, req_indices, acceptance, *, max_num_tokens,
):  # fmt: skip
    B = num_draft_tokens.shape[0]
    (planned, expected), arrays = outputs((B, np.int32), (B, np.float32))
    _plan(
        np_(num_draft_tokens), np_(match_len), np_(verify_cost), opt(req_indices, NONE_I32),
        req_indices is not None, np_(acceptance), -1 if max_num_tokens is None else max_num_tokens,
        *arrays,
    )  # fmt: skip
    return planned, expected


def update_acceptance_stats(
    draft_token_ids, num_draft_tokens, match_len, output_token_ids, num_emitted, req_indices,
    acceptance, *, decay,
):  # fmt: skip
    _update(
        np_(draft_token_ids), np_(num_draft_tokens), np_(match_len), np_(output_token_ids),
        np_(num_emitted), opt(req_indices, NONE_I32), req_indices is not None, np_(acceptance),
        decay,
    )  # fmt: skip
