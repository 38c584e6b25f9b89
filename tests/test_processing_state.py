"""ProcessingState: the per-state-row processing parameters the library keeps. Verification
with ``state.batch(...)`` equals verification with the same parameters as a
``LogitsProcessing`` (the gathered one, through the one-kernel CPU route and through the
two ops), every feature, padding rows, rows out of batch order; ``set_request``'s checks
and that a refused call writes nothing; the per-call checks. Contract: ``docs/design.md``,
"``ProcessingState``"."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec_kernels.ops import (
    LogitsProcessing,
    ProcessingState,
    process_logits,
    rejection_sample,
)
from tests.test_processing import accepted_drafts, random_args, same_result, verify_kwargs

I32 = torch.int32
K = 3


def state_of(a: dict, seed: int, neutral: bool = True, keep_counts=False) -> ProcessingState:
    """A state over ``a``'s token buffer holding ``a``'s per-request features in the
    batch's state rows (and other parameters in the rows outside the batch, so that a
    request read at its batch index instead of its state row would show)."""
    V = a["target_logits"].shape[1]
    state = ProcessingState(
        a["token_ids"], a["num_tokens"], a["num_prompt_tokens"], vocab_size=V,
        max_logit_bias=3, max_bad_words=4, max_bad_word_tokens=3, max_stop_tokens=2,
        allowed_tokens=True, keep_counts=keep_counts,
    )  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    for r in range(state.num_rows):
        state.set_request(r, repetition_penalty=0.5, frequency_penalty=2.0, logit_bias={1: 5.0},
                          allowed_token_ids=[0, 2], min_tokens=100, stop_token_ids=[3])  # fmt: skip
    for b, r in enumerate(a["req_indices"].tolist()):
        if r < 0:
            continue
        ids, vals = a["logit_bias_ids"][b].tolist(), a["logit_bias_values"][b].tolist()
        bias = {t: v for t, v in zip(ids, vals, strict=True) if t >= 0}
        mask = a["allowed_token_mask"][b].cpu().numpy().view(np.uint8)
        allowed = np.unpackbits(mask, bitorder="little")[:V].nonzero()[0].tolist()
        on = (torch.rand(3, generator=g) < 0.8) | (not neutral)  # some neutral in some rows
        state.set_request(
            r,
            repetition_penalty=float(a["repetition_penalty"][b]) if on[0] else 1.0,
            frequency_penalty=float(a["frequency_penalty"][b]) if on[0] else 0.0,
            presence_penalty=float(a["presence_penalty"][b]) if on[0] else 0.0,
            logit_bias=bias, allowed_token_ids=allowed if on[1] else None,
            bad_words=[[t for t in w if t >= 0] for w in a["bad_word_ids"][b].tolist()
                       if w[0] >= 0],
            min_tokens=int(a["min_tokens"][b]) if on[2] else 0,
            stop_token_ids=[t for t in a["stop_token_ids"][b].tolist() if t >= 0],
        )  # fmt: skip
    return state


@pytest.mark.parametrize("mode", ["greedy", "greedy-logprobs", "sampled", "draft-probs"])
@pytest.mark.parametrize("accept", [False, True], ids=["random-drafts", "accepted-drafts"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("keep", [False, True], ids=["counted-per-call", "kept-counts"])
@pytest.mark.parametrize("seed", range(4))
def test_a_state_batch_verifies_as_its_logits_processing(seed, keep, dtype, accept, mode):
    a = random_args(seed, dtype=dtype)
    if accept:
        a = accepted_drafts(a, K)
    state = state_of(a, seed, keep_counts=keep)
    B = a["cu_num_draft_tokens"].shape[0] - 1
    kw = verify_kwargs(a, mode, seed, K)
    rows = (a["target_logits"], a["draft_token_ids"], a["cu_num_draft_tokens"])
    batch = state.batch(a["req_indices"], a["grammar_mask"])
    got = rejection_sample(*rows, processing=batch, **kw)
    gathered = batch.logits_processing(B)
    assert isinstance(gathered, LogitsProcessing)
    want = rejection_sample(*rows, processing=gathered, **kw)
    assert same_result(got, want)
    processed = process_logits(*rows, **gathered._asdict())
    assert same_result(got, rejection_sample(processed, *rows[1:], **kw))
    with torch.device("cpu"):  # a torch function mode: the gathered route, through the ops
        assert same_result(rejection_sample(*rows, processing=batch, **kw), got)


def test_the_rows_are_read_at_the_state_row_not_the_batch_index():
    V = 8
    tokens = torch.zeros(2, 4, dtype=I32)
    state = ProcessingState(tokens, i32([1, 1]), i32([1, 1]), vocab_size=V, max_logit_bias=1)
    state.set_request(1, logit_bias={5: 100.0})  # request 0 of the batch is in state row 1
    logits = torch.zeros(1, V)
    out = rejection_sample(logits, i32([]), i32([0, 0]), num_speculative_tokens=0,
                           processing=state.batch(i32([1])))  # fmt: skip
    assert out.output_token_ids.tolist() == [[5]]
    out = rejection_sample(logits, i32([]), i32([0, 0]), num_speculative_tokens=0,
                           processing=state.batch(i32([0])))  # fmt: skip
    assert out.output_token_ids.tolist() == [[0]]


def test_clear_and_move_request():
    V = 8
    tokens = torch.zeros(3, 4, dtype=I32)
    state = ProcessingState(tokens, i32([1] * 3), i32([1] * 3), vocab_size=V, max_logit_bias=1,
                            max_stop_tokens=1, allowed_tokens=True)  # fmt: skip
    state.set_request(0, logit_bias={5: 100.0}, allowed_token_ids=[5, 6], min_tokens=1,
                      stop_token_ids=[6])  # fmt: skip
    state.move_request(0, 2)
    state.clear_request(0)
    logits = torch.zeros(2, V)
    out = rejection_sample(logits, i32([]), i32([0, 0, 0]), num_speculative_tokens=0,
                           processing=state.batch(i32([0, 2])))  # fmt: skip
    assert out.output_token_ids.tolist() == [[0], [5]]


def i32(x) -> torch.Tensor:
    return torch.tensor(x, dtype=I32)


def small_state(**kw) -> ProcessingState:
    tokens = torch.zeros(2, 4, dtype=I32)
    args = dict(vocab_size=8, max_logit_bias=2, max_bad_words=1, max_bad_word_tokens=2,
                max_stop_tokens=1, allowed_tokens=True, keep_counts=True)  # fmt: skip
    args.update(kw)
    return ProcessingState(tokens, i32([1, 1]), i32([0, 0]), **args)


SET_ERRORS = [
    (dict(row=2), "row must lie in"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be > 0"),
    (dict(frequency_penalty=float("nan")), "frequency_penalty must be finite"),
    (dict(repetition_penalty=1e-46), "repetition_penalty must be > 0 in float32"),
    (dict(repetition_penalty=10**400), "repetition_penalty must be finite in float32"),
    (dict(frequency_penalty="1"), "frequency_penalty must be a finite number"),
    (dict(min_tokens=2**31), "min_tokens must be"),
    (dict(bad_words=[1, 2]), "bad_words must be a sequence"),
    (dict(logit_bias=[(1, 1.0)]), "logit_bias must be a mapping"),
    (dict(stop_token_ids=None), "stop_token_ids must be a sequence"),
    (dict(presence_penalty=1e39), "presence_penalty must be finite in float32"),
    (dict(logit_bias={8: 1.0}), "logit_bias must hold token ids"),
    (dict(logit_bias={1: 1.0, 2: 1.0, 3: 1.0}), "more than the state's max_logit_bias = 2"),
    (dict(logit_bias={1: float("inf")}), r"logit_bias\[1\] must be finite in float32"),
    (dict(allowed_token_ids=[]), "allowed_token_ids must not be empty"),
    (dict(allowed_token_ids=[-1]), "allowed_token_ids must hold token ids"),
    (dict(bad_words=[[1], [2]]), "more than the state's max_bad_words = 1"),
    (dict(bad_words=[[1, 2, 3]]), "more than the state's max_bad_word_tokens = 2"),
    (dict(bad_words=[[]]), "must not hold an empty word"),
    (dict(min_tokens=-1), "min_tokens must be"),
    (dict(stop_token_ids=[1, 2]), "more than the state's max_stop_tokens = 1"),
]


@pytest.mark.parametrize("kw,match", SET_ERRORS, ids=[m for _, m in SET_ERRORS])
def test_set_request_refuses_bad_parameters_and_writes_nothing(kw, match):
    state = small_state()
    state.set_request(0, repetition_penalty=1.5, logit_bias={4: 1.0}, bad_words=[[1, 2]],
                      min_tokens=2, stop_token_ids=[3], allowed_token_ids=[1, 4])  # fmt: skip
    arrays = {**state._arrays, "counts": state._counts[0], "upto": state._counts[1]}
    before = {n: None if x is None else x.copy() for n, x in arrays.items()}
    kw = dict(kw)
    row = kw.pop("row", 0)
    with pytest.raises(ValueError, match=match):
        state.set_request(row, **{"logit_bias": {5: 2.0}, **kw})  # a change refused
    for n, x in arrays.items():
        assert (x is None and before[n] is None) or np.array_equal(x, before[n]), n


def test_numpy_numbers_are_taken_and_stop_tokens_without_min_tokens_are_ignored():
    state = small_state(max_stop_tokens=0)
    # (no min_tokens: the stop tokens do nothing)
    state.set_request(0, repetition_penalty=np.float32(1.5), logit_bias={np.int64(3): 2.0},
                      stop_token_ids=[1, 2, 3])  # fmt: skip
    assert state._arrays["repetition_penalty"][0] == 1.5
    assert state._arrays["logit_bias_ids"][0].tolist() == [3, -1]


def test_features_the_state_was_built_without_are_refused():
    state = small_state(max_logit_bias=0, max_stop_tokens=0, allowed_tokens=False,
                        max_bad_words=0)  # fmt: skip
    for kw, match in [(dict(logit_bias={1: 1.0}), "max_logit_bias = 0"),
                      (dict(min_tokens=1), "max_stop_tokens >= 1"),
                      (dict(allowed_token_ids=[1]), "allowed_tokens=True"),
                      (dict(bad_words=[[1]]), "max_bad_words = 0")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            state.set_request(0, **kw)


@pytest.mark.parametrize(
    "kw,match",
    [(dict(vocab_size=0), "vocab_size"), (dict(max_logit_bias=-1), "max_logit_bias"),
     (dict(max_bad_words=1, max_bad_word_tokens=5), "max_bad_word_tokens must lie in"),
     (dict(max_bad_words=1, max_bad_word_tokens=0), "max_bad_word_tokens must lie in"),
     (dict(allowed_tokens=1), "allowed_tokens must be a bool")],
)  # fmt: skip
def test_construction_refuses_bad_capacities(kw, match):
    with pytest.raises(ValueError, match=match):
        small_state(**kw)


def test_each_call_checks_what_changes_per_step():
    state = small_state()
    one = (torch.zeros(1, 8), i32([]), i32([0, 0]))
    with pytest.raises(ValueError, match="the state's vocabulary V = 8"):
        rejection_sample(torch.zeros(1, 9), *one[1:], num_speculative_tokens=0,
                         processing=state.batch())  # fmt: skip
    with pytest.raises(ValueError, match="req_indices"):
        rejection_sample(*one, num_speculative_tokens=0, processing=state.batch(i32([0, 1])))
    with pytest.raises(ValueError, match="grammar_mask must be"):
        rejection_sample(*one, num_speculative_tokens=0,
                         processing=state.batch(grammar_mask=i32([[1, 1]])))  # fmt: skip
    with pytest.raises(ValueError, match="req_indices must lie in"):  # the kernel's value check
        rejection_sample(*one, num_speculative_tokens=0, processing=state.batch(i32([2])))
    state._buffer[1][0] = 9  # num_tokens past L_max = 4: the same error as LogitsProcessing
    with pytest.raises(ValueError, match="num_tokens"):
        rejection_sample(*one, num_speculative_tokens=0, processing=state.batch())
    state._buffer[1][0] = 1
    state._buffer[0].set_(torch.zeros(3, 4, dtype=I32))  # (resize_: refused, numpy views)
    with pytest.raises(ValueError, match="token_ids changed shape"):
        rejection_sample(*one, num_speculative_tokens=0, processing=state.batch())


def test_the_state_owns_arrays_nobody_can_resize():
    state = small_state()
    with pytest.raises(RuntimeError):
        state._tensors["repetition_penalty"].resize_(100)


def test_the_class_example_runs():
    import doctest

    globs = {"torch": torch, "ProcessingState": ProcessingState}
    tests = doctest.DocTestFinder(recurse=False).find(ProcessingState, "ProcessingState",
                                                      globs=globs)  # fmt: skip
    assert tests and tests[0].examples
    runner = doctest.DocTestRunner()
    for t in tests:
        runner.run(t)
    assert runner.failures == 0


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(2))
def test_a_cuda_state_verifies_as_the_cpu_state(seed):
    a = random_args(seed)
    cpu = state_of(a, seed)
    on = {n: (t.cuda() if isinstance(t, torch.Tensor) else t) for n, t in a.items()}
    gpu = state_of(on, seed)
    rows = (a["target_logits"], a["draft_token_ids"], a["cu_num_draft_tokens"])
    want = rejection_sample(*rows, num_speculative_tokens=K, return_logprobs=True,
                            processing=cpu.batch(a["req_indices"], a["grammar_mask"]))  # fmt: skip
    got = rejection_sample(*(on[n] for n in ("target_logits", "draft_token_ids",
                                             "cu_num_draft_tokens")),
                           num_speculative_tokens=K, return_logprobs=True,
                           processing=gpu.batch(on["req_indices"], on["grammar_mask"]))  # fmt: skip
    assert torch.equal(got.output_token_ids.cpu(), want.output_token_ids)
    assert torch.equal(got.num_emitted.cpu(), want.num_emitted)
    torch.testing.assert_close(got.logprobs.cpu(), want.logprobs, rtol=1e-5, atol=1e-6)


def test_the_state_holds_the_parameters_it_was_given():
    # against the LogitsProcessing the parameters came from (every feature on, bias ids
    # made distinct: a mapping holds one value per id), not against the state's own gather
    a = accepted_drafts(random_args(3), K)
    ids = a["logit_bias_ids"].clone()
    for b in range(ids.shape[0]):
        seen = set()
        for m in range(ids.shape[1]):
            if int(ids[b, m]) in seen:
                ids[b, m] = -1
            seen.add(int(ids[b, m]))
    a["logit_bias_ids"] = ids
    state = state_of(a, 3, neutral=False)
    rows = (a["target_logits"], a["draft_token_ids"], a["cu_num_draft_tokens"])
    from tests.test_processing import processing_of

    for mode in ("greedy-logprobs", "sampled"):
        kw = verify_kwargs(a, mode, 3, K)
        want = rejection_sample(*rows, processing=processing_of(a), **kw)
        got = rejection_sample(*rows, processing=state.batch(a["req_indices"], a["grammar_mask"]),
                               **kw)  # fmt: skip
        assert same_result(got, want)


def test_every_route_runs_the_per_call_checks():
    state = small_state()
    wide = (torch.zeros(1, 9), i32([]), i32([0, 0]))
    with torch.device("cpu"), pytest.raises(ValueError, match="the state's vocabulary V = 8"):
        rejection_sample(*wide, num_speculative_tokens=0, processing=state.batch())
    one = (torch.zeros(2, 8), i32([]), i32([0, 0, 0]))
    req = i32([1, 9, 0, 9])[::2]  # not contiguous: taken on both routes
    direct = rejection_sample(*one, num_speculative_tokens=0, processing=state.batch(req))
    with torch.device("cpu"):
        assert same_result(
            rejection_sample(*one, num_speculative_tokens=0, processing=state.batch(req)), direct
        )


def test_the_stored_parameters_are_not_checked_again_per_call():
    # checked when set: a call's value checks read only the batch's token buffer rows
    from specdec_kernels.cpu import processing as cpu_processing

    state = small_state()
    state._arrays["repetition_penalty"][1] = -1.0  # (only set_request writes them)
    pt = state._kernel_tuple(i32([0]), None)
    assert cpu_processing.values_ok(pt, 1, 8)


@pytest.mark.parametrize("sampled_rows", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("seed", range(6))
def test_kept_counts_follow_the_token_buffer_step_by_step(seed, sampled_rows):
    # an engine's loop: tokens appended after each step, a row given a new (shorter)
    # request with set_request; the state with kept counts verifies as the one without
    # and as the LogitsProcessing it gathers, at every step
    g = torch.Generator().manual_seed(seed)
    R, L, V, B = 4, 40, 12, 3
    tokens = torch.randint(0, V, (R, L), generator=g, dtype=I32)
    num_tokens = torch.randint(2, 10, (R,), generator=g, dtype=I32)
    prompt = (num_tokens // 2).to(I32)
    states = [ProcessingState(tokens, num_tokens, prompt, vocab_size=V, keep_counts=kc,
                              max_logit_bias=1) for kc in (True, False)]  # fmt: skip
    for s in states:
        for r in range(R):
            s.set_request(r, repetition_penalty=1.5, frequency_penalty=0.7,
                          presence_penalty=0.3, logit_bias={r: 0.5})  # fmt: skip
    for step in range(8):
        req = torch.randperm(R, generator=g)[:B].to(I32)
        cu = torch.tensor([0, 2, 2, 4], dtype=I32)
        logits = torch.randint(-3, 4, (cu[-1] + B, V), generator=g).float()
        drafts = torch.randint(0, V, (4,), generator=g, dtype=I32)
        kw = dict(num_speculative_tokens=2, return_logprobs=sampled_rows)
        if sampled_rows:
            kw.update(
                temperature=torch.full((B,), 0.9), top_p=torch.full((B,), 0.95),
                seeds=torch.arange(B) + step, offsets=torch.zeros(B, dtype=torch.long),
            )  # fmt: skip
        outs = [rejection_sample(logits, drafts, cu, processing=s.batch(req), **kw)
                for s in states]  # fmt: skip
        gathered = states[1].batch(req).logits_processing(B)
        outs.append(rejection_sample(logits, drafts, cu, processing=gathered, **kw))
        assert same_result(outs[0], outs[1]) and same_result(outs[0], outs[2]), step
        for b, r in enumerate(req.tolist()):  # commit the emitted tokens
            n, e = int(num_tokens[r]), int(outs[0].num_emitted[b])
            e = min(e, L - n)
            tokens[r, n : n + e] = outs[0].output_token_ids[b, :e]
            num_tokens[r] = n + e
        if step == 4:  # row 0 takes a new, shorter request
            tokens[0] = torch.randint(0, V, (L,), generator=g, dtype=I32)
            num_tokens[0], prompt[0] = 3, 2
            for s in states:
                s.set_request(0, repetition_penalty=2.0, frequency_penalty=1.0)


def test_kept_counts_move_with_their_request_and_stay_on_the_cpu():
    tokens = torch.tensor([[1, 1, 2, 0], [3, 3, 3, 3]], dtype=I32)
    state = ProcessingState(tokens, i32([4, 4]), i32([1, 1]), vocab_size=4, keep_counts=True)
    for r in (0, 1):
        state.set_request(r, frequency_penalty=10.0)
    one = (torch.tensor([[1.0, 2.0, 0.0, 0.0]]), i32([]), i32([0, 0]))

    def token(r):
        out = rejection_sample(*one, num_speculative_tokens=0, processing=state.batch(i32([r])))
        return out.output_token_ids.item()

    assert (token(0), token(1)) == (3, 1)  # both rows counted: 0, 1, 2 seen; 3 seen
    tokens[1] = tokens[0]  # the engine moves row 0's request to row 1
    state.move_request(0, 1)
    assert state._counts[0][1].tolist() == state._counts[0][0].tolist()
    assert token(1) == 3
    meta = torch.zeros(2, 4, dtype=I32, device="meta")
    with pytest.raises(ValueError, match="keep_counts is for a CPU token buffer"):
        lengths = torch.zeros(2, dtype=I32, device="meta")
        ProcessingState(meta, lengths, lengths, vocab_size=4, keep_counts=True)


def two_ways(tokens, num_tokens, prompt, logits, drafts, cu, k, **params):
    """Greedy tokens with and without kept counts (``params``: ``set_request``'s)."""
    outs = []
    for keep in (False, True):
        state = ProcessingState(tokens, i32(num_tokens), i32(prompt), vocab_size=logits.shape[1],
                                max_logit_bias=1, keep_counts=keep)  # fmt: skip
        state.set_request(0, **params)
        out = rejection_sample(logits, i32(drafts), i32(cu), num_speculative_tokens=k,
                               processing=state.batch())  # fmt: skip
        outs.append(out.output_token_ids.tolist())
    return outs


def test_kept_counts_add_the_drafts_before_the_row():
    # row 1 counts d_0 = 5 (accepted): 3 - 10 < 2, so 6; without the draft, 5 again
    logits = torch.zeros(3, 8)
    logits[0, 5] = 4.0
    logits[1, 5], logits[1, 6] = 3.0, 2.0
    tokens = torch.tensor([[0, 1, 0, 0]], dtype=I32)
    outs = two_ways(tokens, [2], [1], logits, [5, 6], [0, 2], 2, frequency_penalty=10.0)
    assert outs == [[[5, 6, 0]]] * 2


@pytest.mark.parametrize("V", [10, 20], ids=["history-kept", "history-counted"])
def test_kept_counts_are_not_added_twice_after_the_shortcut_falls_back(V):
    # row 0's argmax 5 is a bias id: the row is processed in full, d_0 counted and the
    # history too where it is short (2 L < V: counted per call, not kept); row 1's 3
    # (4 output occurrences): 10 - 4 = 6.0 > 5.5
    tokens = torch.zeros(1, 8, dtype=I32)
    tokens[0, :5] = torch.tensor([7, 3, 3, 3, 3])
    logits = torch.zeros(3, V)
    logits[0, 5] = 10.0
    logits[1, 3], logits[1, 9] = 10.0, 5.5
    outs = two_ways(tokens, [5], [1], logits, [5, 1], [0, 2], 2, frequency_penalty=1.0,
                    logit_bias={5: 0.0})  # fmt: skip
    assert outs == [[[5, 3, -1]]] * 2


def kept_state(tokens, num_tokens, prompt, V=8):
    state = ProcessingState(tokens, num_tokens, prompt, vocab_size=V, keep_counts=True)
    state.set_request(0, frequency_penalty=10.0)
    return state


def greedy_token(state, V=8, logits=None):
    logits = torch.arange(V, dtype=torch.float32)[None] if logits is None else logits
    out = rejection_sample(logits, i32([]), i32([0, 0]), num_speculative_tokens=0,
                           processing=state.batch())  # fmt: skip
    return out.output_token_ids.item()


@pytest.mark.parametrize("change", ["new request", "prompt length", "rolled back"])
def test_kept_counts_are_counted_anew_when_the_row_changes(change):
    tokens = torch.tensor([[0, 7, 7, 7, 0, 0]], dtype=I32)
    num_tokens, prompt = i32([4]), i32([1])
    state = kept_state(tokens, num_tokens, prompt)
    assert greedy_token(state) == 6  # 7 seen 3 times
    if change == "new request":  # same prompt length, a longer history, set_request
        tokens[0] = torch.tensor([0, 6, 6, 1, 2, 3], dtype=I32)
        num_tokens[0] = 6
        state.set_request(0, frequency_penalty=10.0)
    elif change == "prompt length":  # the whole row as the prompt: nothing is output
        prompt[0] = 4
    else:  # rolled back, read by a call while shorter, then other tokens committed
        num_tokens[0] = 1
        assert greedy_token(state) == 7
        tokens[0, 1:4] = torch.tensor([6, 6, 6], dtype=I32)
        num_tokens[0] = 4
    gathered = state.batch().logits_processing(1)
    want = rejection_sample(torch.arange(8, dtype=torch.float32)[None], i32([]), i32([0, 0]),
                            num_speculative_tokens=0, processing=gathered)  # fmt: skip
    assert greedy_token(state) == want.output_token_ids.item()
    assert greedy_token(state) == {"new request": 7, "prompt length": 7, "rolled back": 7}[change]


def test_a_refused_call_leaves_the_kept_counts_as_they_were():
    tokens = torch.tensor([[0, 7, 7, 7]], dtype=I32)
    state = kept_state(tokens, i32([4]), i32([1]))
    greedy_token(state)
    before = [x.copy() for x in state._counts]
    tokens[0, 3] = 5  # (as if appended: the count is not redone)
    with pytest.raises(ValueError):
        rejection_sample(torch.zeros(1, 8), i32([]), i32([1, 1]), num_speculative_tokens=0,
                         processing=state.batch())  # fmt: skip
    assert all(np.array_equal(x, y) for x, y in zip(state._counts, before, strict=True))
