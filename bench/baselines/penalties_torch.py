"""What an engine runs without ``process_logits``: vLLM 0.33.0's torch logits processing
for the verify rows, restated for this benchmark (not vLLM's code).

The rows' output tokens (committed output plus the drafts before each row) and prompts
go to padded int64 tensors, bin counts by ``scatter_add_`` ([rows, V + 1] int64 each),
the repetition penalty as ``logits *= where(seen, where(l > 0, 1 / p, p), 1)`` (vLLM's
torch path), ``l -= f * counts`` and ``l -= q * (counts > 0)``, the allowed-token mask as
a bool ``[rows, V]`` ``masked_fill_``, bad words and min_tokens' stop tokens as Python
loops over the rows, logit bias by ``index_put_``. Returns new fp32 rows.
"""

from __future__ import annotations

import torch


def _padded(lists: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    """Built on the host, then copied to ``device`` (as vLLM copies its padded token lists)."""
    width = max(1, max(map(len, lists), default=0))
    out = torch.full((len(lists), width), pad, dtype=torch.int64)
    for i, ids in enumerate(lists):
        if ids:
            out[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    return out.to(device)


def _bins(tokens: torch.Tensor, V: int) -> torch.Tensor:
    counts = torch.zeros(tokens.shape[0], V + 1, dtype=torch.int64, device=tokens.device)
    counts.scatter_add_(1, tokens, torch.ones_like(tokens))
    return counts[:, :V]


def process_logits_torch(
    logits: torch.Tensor,
    prompts: list[list[int]],
    outputs: list[list[int]],
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    bias: list[dict[int, float]],
    disallowed: torch.Tensor | None,
    bad_words: list[list[list[int]]],
    min_tokens: list[int],
    stop_ids: list[list[int]],
) -> torch.Tensor:
    """Every argument per row (rows = the verify rows, one request's values repeated)."""
    x = logits.float().clone()
    V = x.shape[1]
    if disallowed is not None:
        x.masked_fill_(disallowed, float("-inf"))
    for r, words in enumerate(bad_words):
        past = outputs[r]
        for w in words:
            n = len(w) - 1
            if n <= len(past) and (n == 0 or past[-n:] == w[:n]):
                x[r, w[-1] : w[-1] + 1] = float("-inf")
    for r, (m, stops) in enumerate(zip(min_tokens, stop_ids, strict=True)):
        if len(outputs[r]) < m:
            x[r, stops] = float("-inf")
    for r, entries in enumerate(bias):
        if entries:
            ids = torch.tensor(list(entries), dtype=torch.int64, device=x.device)
            values = torch.tensor(list(entries.values()), device=x.device)
            x[r].index_put_((ids,), values, accumulate=True)
    seen_prompt = _bins(_padded(prompts, V, x.device), V) > 0
    counts = _bins(_padded(outputs, V, x.device), V)
    penalties = torch.where(seen_prompt | (counts > 0), repetition[:, None], 1.0)
    x *= torch.where(x > 0, 1.0 / penalties, penalties)
    x -= frequency[:, None] * counts
    x -= presence[:, None] * (counts > 0)
    return x
