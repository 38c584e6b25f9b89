"""One Inductor smoke test for a whole decoding step (slow on 2 cores: one graph, ~30 s).

The per-op ``torch.compile`` checks use ``backend="aot_eager"``; this one compiles the
step an engine runs, ``ngram_propose -> prepare_verify_inputs -> model -> rejection_sample
-> commit_accepted_tokens``, with the default Inductor backend and ``fullgraph=True``, and
checks it gives what the eager step gives, in-place updates included.
"""

from __future__ import annotations

import pytest
import torch

from specdec_kernels.ops import (
    commit_accepted_tokens,
    ngram_propose,
    prepare_verify_inputs,
    rejection_sample,
    sampling_offsets,
)

V, K, BLOCK_SIZE, MAX_MODEL_LEN = 11, 3, 4, 24


def _step(token_ids, num_tokens, block_table, temperature, seeds):
    proposal = ngram_propose(
        token_ids,
        num_tokens,
        min_n=1,
        max_n=3,
        num_speculative_tokens=K,
        max_model_len=MAX_MODEL_LEN,
    )
    verify = prepare_verify_inputs(
        token_ids,
        num_tokens,
        proposal.draft_token_ids,
        proposal.num_draft_tokens,
        block_table,
        block_size=BLOCK_SIZE,
        max_model_len=MAX_MODEL_LEN,
    )
    # A "model": query token x favours (x + 1) % V, a little noise from the position.
    ids = verify.input_ids.long()
    logits = torch.nn.functional.one_hot((ids + 1) % V, V).float() * 4.0
    logits = logits + torch.sin(verify.positions.float()[:, None] * torch.arange(V))
    sampled = rejection_sample(
        logits,
        verify.flat_draft_token_ids,
        verify.cu_num_draft_tokens,
        num_speculative_tokens=K,
        temperature=temperature,
        top_p=torch.full_like(temperature, 0.9),
        seeds=seeds,
        offsets=sampling_offsets(num_tokens),
    )
    result = commit_accepted_tokens(
        token_ids,
        num_tokens,
        sampled.output_token_ids,
        sampled.num_emitted,
        max_model_len=MAX_MODEL_LEN,
    )
    return verify.slot_mapping, sampled.output_token_ids, result.num_committed, result.finished


@pytest.mark.slow
def test_whole_step_compiles_with_inductor_fullgraph():
    prompts = [[1, 2, 3, 1, 2], [4, 5, 6, 7, 4, 5, 6], [8, 9, 8, 9, 8]]
    token_ids = torch.zeros((3, MAX_MODEL_LEN), dtype=torch.int32)
    for r, p in enumerate(prompts):
        token_ids[r, : len(p)] = torch.tensor(p, dtype=torch.int32)
    num_tokens = torch.tensor([len(p) for p in prompts], dtype=torch.int32)
    block_table = torch.arange(3 * 6, dtype=torch.int32).flip(0).reshape(3, 6)
    temperature = torch.tensor([0.0, 1.0, 0.7])
    seeds = torch.tensor([1, 2, 3], dtype=torch.int64)

    compiled = torch.compile(_step, fullgraph=True)
    state_eager = (token_ids.clone(), num_tokens.clone())
    state_compiled = (token_ids.clone(), num_tokens.clone())
    for _ in range(3):
        want = _step(*state_eager, block_table, temperature, seeds)
        got = compiled(*state_compiled, block_table, temperature, seeds)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)
        assert torch.equal(state_compiled[0], state_eager[0])
        assert torch.equal(state_compiled[1], state_eager[1])
    assert int(state_eager[1].sum()) > sum(len(p) for p in prompts)  # tokens were committed
