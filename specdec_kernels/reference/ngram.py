"""Plain-Python n-gram (prompt lookup) proposer: the oracle for ``ngram_propose``.

Follows the prompt-lookup decoding of Saxena (2023) as vLLM's n-gram proposer and
Hugging Face's ``prompt_lookup_num_tokens`` run it, with the exact rules of ``docs/design.md``.
"""

from __future__ import annotations

import torch


def ngram_propose(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    req_indices: torch.Tensor | None,
    max_draft_tokens: torch.Tensor | None,
    *,
    min_n: int,
    max_n: int,
    num_speculative_tokens: int,
    max_model_len: int | None,
    tie_break: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Loop over requests, then n from ``max_n`` down to ``min_n``, then every start ``i``."""
    k = num_speculative_tokens
    rows = list(range(num_tokens.shape[0])) if req_indices is None else req_indices.tolist()
    drafts = torch.full((len(rows), k), -1, dtype=torch.int32)
    counts = torch.zeros(len(rows), dtype=torch.int32)
    match_len = torch.zeros(len(rows), dtype=torch.int32)  # n of the match, if it drafted
    for b, r in enumerate(rows):
        if r < 0:
            continue
        length = int(num_tokens[r])
        seq = token_ids[r, :length].tolist()
        cap = k if max_draft_tokens is None else min(k, int(max_draft_tokens[b]))
        if max_model_len is not None:
            cap = min(cap, max_model_len - length)
        for n in range(max_n, min_n - 1, -1):
            if length < n:
                continue
            suffix = seq[length - n :]
            starts = [i for i in range(length - n) if seq[i : i + n] == suffix]
            if not starts:
                continue
            i = starts[0] if tie_break == "first" else starts[-1]
            m = max(0, min(cap, length - (i + n)))
            drafts[b, :m] = torch.tensor(seq[i + n : i + n + m], dtype=torch.int32)
            counts[b] = m
            match_len[b] = n if m > 0 else 0
            break
    return drafts, counts, match_len
