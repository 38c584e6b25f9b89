"""Plain-Python n-gram (prompt lookup) proposer: the oracle for ``ngram_propose``.

Follows the prompt-lookup decoding of Saxena (2023) as vLLM's n-gram proposer and
Hugging Face's ``prompt_lookup_num_tokens`` run it, with the exact rules of
``docs/design.md`` ("``ngram_propose``"). The own-history match is found by scanning the
tokens whether or not an index is given (the index is exact, so it must not change the
result); the corpus, when given, is read through :func:`~.corpus.corpus_lookup`.
"""

from __future__ import annotations

import torch

from specdec_kernels.constants import DRAFT_SOURCE_CORPUS, DRAFT_SOURCE_OWN
from specdec_kernels.reference.corpus import corpus_lookup


def ngram_propose(
    token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, *, min_n, max_n,
    num_speculative_tokens, max_model_len, tie_break,
):  # fmt: skip
    """Loop over requests, then n from ``max_n`` down to ``min_n``: the first n whose
    suffix occurs earlier in the request (at the ``tie_break`` start) or, failing that,
    in the corpus (its most recent occurrence) gives the drafts."""
    k = num_speculative_tokens
    rows = list(range(num_tokens.shape[0])) if req_indices is None else req_indices.tolist()
    drafts = torch.full((len(rows), k), -1, dtype=torch.int32)
    counts = torch.zeros(len(rows), dtype=torch.int32)
    match_len = torch.zeros(len(rows), dtype=torch.int32)  # n of the match, if it drafted
    source = torch.zeros(len(rows), dtype=torch.int8)
    found = corpus_lookup(corpus, min_n=min_n) if corpus is not None else {}
    ring = corpus[0].tolist() if corpus is not None else []
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
            if starts:
                i = starts[0] if tie_break == "first" else starts[-1]
                m = max(0, min(cap, length - (i + n)))
                out, src = seq[i + n : i + n + m], DRAFT_SOURCE_OWN
            elif (n, tuple(suffix)) in found:
                p, doc_end = found[(n, tuple(suffix))]
                m = max(0, min(cap, doc_end - (p + n)))
                out, src = [ring[(p + n + t) % len(ring)] for t in range(m)], DRAFT_SOURCE_CORPUS
            else:
                continue
            drafts[b, :m] = torch.tensor(out, dtype=torch.int32)
            counts[b] = m
            match_len[b] = n if m > 0 else 0
            source[b] = src if m > 0 else 0
            break
    return drafts, counts, match_len, source
