"""Plain-Python logits processing: the oracle for ``process_logits``.

One loop per request and one per verify row, one statement per rule of ``docs/design.md``
(the op's contract), dense torch over one row at a time. Row ``j`` of request ``b`` is
processed as plain decoding would process the position after its first ``j`` drafts: the
drafts ``d_0 .. d_{j-1}`` count as output tokens.
"""

from __future__ import annotations

import torch

from specdec_kernels.reference.verify_inputs import _rows


def _allowed(words: torch.Tensor, V: int) -> torch.Tensor:
    """bool ``[V]``: bit ``t % 32`` of word ``t // 32`` (the xgrammar bitmask layout)."""
    t = torch.arange(V)
    return ((words.long()[t // 32] >> (t % 32)) & 1).bool()


def _word(ids: torch.Tensor) -> list[int]:
    """A bad word: its tokens before the first -1."""
    out = []
    for t in ids.tolist():
        if t < 0:
            break
        out.append(t)
    return out


def process_logits(
    target_logits, draft_token_ids, cu_num_draft_tokens, token_ids, num_tokens,
    num_prompt_tokens, req_indices, repetition_penalty, frequency_penalty, presence_penalty,
    logit_bias_ids, logit_bias_values, allowed_token_mask, grammar_mask, bad_word_ids,
    min_tokens, stop_token_ids,
):  # fmt: skip
    """Logit bias, then penalties, then the masks (which end at -inf whatever came before)."""
    out = target_logits.float().clone()
    V = out.shape[1]
    cu = cu_num_draft_tokens.tolist()
    B = len(cu) - 1
    inf = torch.tensor(float("inf"))
    for b, r in enumerate(_rows(req_indices, B)):
        if r < 0:
            continue  # a padding row: copied as it is
        L = int(num_tokens[r])
        P = min(int(num_prompt_tokens[r]), L)
        prompt = token_ids[r, :P].tolist()
        output = token_ids[r, P:L].tolist()
        drafts = draft_token_ids[cu[b] : cu[b + 1]].tolist()
        for j in range(cu[b + 1] - cu[b] + 1):
            row = cu[b] + b + j
            x = out[row].clone()
            past = output + drafts[:j]  # this row's output tokens
            if logit_bias_ids is not None:
                for t, v in zip(logit_bias_ids[b].tolist(), logit_bias_values[b], strict=True):
                    if 0 <= t < V:
                        x[t] = x[t] + v  # fp32, in the order of the entries
            if repetition_penalty is not None:
                rp = repetition_penalty[b].float()
                fp = frequency_penalty[b].float()
                pp = presence_penalty[b].float()
                counts = torch.zeros(V, dtype=torch.int64)
                for t in past:
                    if 0 <= t < V:
                        counts[t] += 1
                seen = counts > 0
                for t in prompt:
                    if 0 <= t < V:
                        seen[t] = True
                if rp != 1:
                    x = torch.where(seen, torch.where(x > 0, x / rp, x * rp), x)
                if fp != 0:
                    x = torch.where(counts > 0, x - fp * counts.float(), x)
                if pp != 0:
                    x = torch.where(counts > 0, x - pp, x)
            banned = torch.zeros(V, dtype=torch.bool)
            if allowed_token_mask is not None:
                banned |= ~_allowed(allowed_token_mask[b], V)
            if grammar_mask is not None:
                banned |= ~_allowed(grammar_mask[row], V)
            if bad_word_ids is not None:
                for ids in bad_word_ids[b]:
                    word = _word(ids)
                    n = len(word) - 1  # the prefix that must end the output so far
                    if word and n <= len(past) and past[len(past) - n :] == word[:n]:
                        if word[-1] < V:
                            banned[word[-1]] = True
            if min_tokens is not None and len(past) < int(min_tokens[b]):
                for t in stop_token_ids[b].tolist():
                    if 0 <= t < V:
                        banned[t] = True
            out[row] = torch.where(banned, -inf, x)
    return out
