"""One decode step of the example engine: every library op an engine calls, in order.

Read this file to learn the call sequence. The persistent state (``token_ids``,
``num_tokens``, the block table, the sampling parameters, the optional own-history index
and shared corpus) lives on the engine and is indexed by state row; ``rows`` are the state
rows of this step's batch. The step has no Python loop over tokens and reads exactly one
small tensor back to the host. ``k = 0`` (plain decoding) runs the same ops.
"""

from __future__ import annotations

import torch

from specdec_kernels.ops import (
    commit_accepted_tokens,
    corpus_append,
    ngram_index_extend,
    ngram_propose,
    plan_draft_lengths,
    prepare_verify_inputs,
    process_logits,
    rejection_sample,
    sampling_offsets,
    update_acceptance_stats,
)


def decode_step(eng, rows: list[int], max_len: int, *, sampled: bool, use_top_p: bool):
    """Run one step for the requests in state rows ``rows`` (``max_len``: their longest
    history). Returns the host read-back ``[new lengths, committed, finish reasons,
    emitted, proposed, verified, wanted]`` (one list per field, one entry per request)
    and the number of query tokens the verify pass ran."""
    B, k, policy = len(rows), eng.k, eng.policy
    req_indices = torch.tensor(rows, dtype=torch.int32, device=eng.device)
    r = req_indices.long()

    # Up to k drafts per request from its history (index lookups when the engine keeps an
    # index, else a scan) and from the shared corpus of finished requests, if any.
    prop = ngram_propose(
        eng.token_ids, eng.num_tokens, req_indices, min_n=eng.min_n, max_n=eng.max_n,
        num_speculative_tokens=k, max_model_len=eng.max_model_len,
        index=eng.index, corpus=eng.corpus, scoring=eng.scoring,
    )  # fmt: skip

    planned = wanted = prop.num_draft_tokens
    n_query = B * (k + 1)  # static pass: every proposed draft has a row
    if policy.adaptive:
        # How many drafts each request verifies, inside the token budget the host chose for
        # this pass; the plan without that cap is read back: the next budget follows it.
        n_query = policy.token_budget(B)
        planned = wanted = plan_draft_lengths(
            prop.num_draft_tokens, prop.match_len, policy.verify_cost, req_indices,
            acceptance=policy.acceptance, validate=False,  # own state: no value checks
        ).num_draft_tokens  # fmt: skip
        if n_query < min(B * (k + 1), policy.verify_cost.shape[0] - 1):
            planned = plan_draft_lengths(
                prop.num_draft_tokens, prop.match_len, policy.verify_cost, req_indices,
                acceptance=policy.acceptance, max_num_tokens=n_query, validate=False,
            ).num_draft_tokens  # fmt: skip

    # The verify pass: query [last token, drafts] per request, positions, KV slots,
    # query_start_loc and cu_num_draft_tokens; rows past query_start_loc[B] are padding.
    vi = prepare_verify_inputs(
        eng.token_ids, eng.num_tokens, prop.draft_token_ids, planned, eng.block_table,
        req_indices, block_size=eng.block_size, max_model_len=eng.max_model_len,
    )  # fmt: skip

    # The engine's own model over the first n_query rows: the target logits.
    logits = eng.model.forward(
        vi.input_ids[:n_query], vi.positions[:n_query], vi.slot_mapping[:n_query],
        vi.query_start_loc, eng.block_table[r], eng.cache,
        max_query_len=min(k + 1, n_query - B + 1), max_seq_len=max_len + k,
    )  # fmt: skip

    drafts = vi.flat_draft_token_ids[: n_query - B]
    processing = None
    if eng.processing is not None:
        # Penalties, logit bias, allowed tokens, bad words, min_tokens (kept per state row,
        # set at admission): each row as plain decoding processes its position (the drafts
        # before it count as output).
        processing = eng.processing.state.batch(req_indices)

    # Verification of the processed rows: a draft is kept iff it is the token the plain
    # sampler emits at its row (coupled verification), then one bonus or recovered token
    # per request.
    sampling = dict(
        temperature=eng.temperature[r] if sampled else None,
        top_p=eng.top_p[r] if sampled and use_top_p else None,
    )
    rs = rejection_sample(
        logits, drafts, vi.cu_num_draft_tokens,
        num_speculative_tokens=k,
        seeds=eng.seeds[r] if sampled else None,
        offsets=sampling_offsets(eng.num_tokens, req_indices) if sampled else None,
        processing=processing,
        **sampling,
    )  # fmt: skip

    logprob_rows = logits
    if eng.logprobs is not None and eng.logprobs.processed and processing is not None:
        # the processed rows, before the commit moves the histories they count
        logprob_rows = process_logits(logits, drafts, vi.cu_num_draft_tokens,
                                      **processing.logits_processing(B)._asdict())  # fmt: skip

    # Commit the emitted tokens to the persistent state; stop tokens and budgets end
    # requests (the stop token is committed).
    start = eng.num_tokens[r] if eng.logprobs is not None else None  # a copy (indexed)
    cm = commit_accepted_tokens(
        eng.token_ids, eng.num_tokens, rs.output_token_ids, rs.num_emitted, req_indices,
        stop_token_ids=eng.stop_token_ids[r], num_prompt_tokens=eng.num_prompt_tokens,
        max_tokens=eng.max_tokens[r], max_model_len=eng.max_model_len,
        min_tokens=None if eng.processing is None else eng.processing.min_tokens_of(r),
    )  # fmt: skip

    if eng.logprobs is not None:
        # The committed tokens' logprobs and top N (top_logprobs), kept on the device: of
        # the raw rows (vLLM's default, raw_logprobs), or of the rows as sampled (the
        # processed modes: the processing, then the temperature and top-p).
        eng.logprobs.record(logprob_rows, vi.cu_num_draft_tokens, rs, cm.num_committed,
                            req_indices, start, **sampling)  # fmt: skip

    if eng.index is not None:
        # The committed tokens' n-grams (or contexts) join the own-history index ...
        ngram_index_extend(eng.token_ids, eng.num_tokens, req_indices, index=eng.index)
    if eng.corpus is not None:
        # ... and finished requests (prompt + output) join the shared corpus.
        done = torch.where(cm.finished, req_indices, -1).to(torch.int32)
        corpus_append(eng.token_ids, eng.num_tokens, done, corpus=eng.corpus)

    if policy.adaptive:
        # The acceptance estimates learn from the drafts as proposed, verified or not.
        update_acceptance_stats(
            prop.draft_token_ids, prop.num_draft_tokens, prop.match_len,
            rs.output_token_ids, rs.num_emitted, req_indices,
            acceptance=policy.acceptance, validate=False,
        )  # fmt: skip

    # The step's one device-to-host read.
    fields = [eng.num_tokens[r], cm.num_committed, cm.finish_reason.to(torch.int32)]
    fields += [rs.num_emitted, prop.num_draft_tokens, planned, wanted]
    return torch.stack(fields).tolist(), n_query
