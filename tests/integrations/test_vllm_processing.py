"""The plugin with penalties, bad words, allowed tokens, ``min_tokens`` and logit bias:
vLLM's own rejection sampler's tokens on the same greedy batches (``SamplingMetadata``
built directly: vLLM refuses some of these features with speculation, and its runner
builds nothing else), and every feature live (it changes some batch's tokens).

Logit bias is the one documented difference (vLLM's draft rows get none): it is checked
against vLLM with the bias folded into every row's logits, i.e. its plain sampler's rule.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_vllm_rejection import (  # noqa: F401  (_vllm_state: the autouse fixture)
    _vllm_state,
    greedy_batch,
    our_tokens,
    sampling_metadata,
    spec_metadata,
    vllm_tokens,
)
from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessors
from vllm.v1.sample.logits_processor.builtin import (
    LogitBiasLogitsProcessor,
    MinTokensLogitsProcessor,
)

from specdec_kernels.integrations.vllm import rejection as plugin

SEEDS = range(8)


def _update(proc, added):
    proc.update_state(BatchUpdate(batch_size=8, removed=[], added=added, moved=[]))
    return proc


def features(name: str, seed: int, drafts: list[list[int]], V: int) -> dict:
    """``SamplingMetadata`` fields of one feature, random per request; outputs and bad
    words drawn from a small alphabet (with the drafts) so that they repeat and match."""
    g = torch.Generator().manual_seed(seed)
    B = len(drafts)
    rand = lambda *s: torch.rand(*s, generator=g)  # noqa: E731
    outputs = [torch.randint(0, 6, (int(torch.randint(0, 9, (1,), generator=g)),),
                             generator=g).tolist() for _ in range(B)]  # fmt: skip
    base = dict(output_token_ids=outputs, spec_token_ids=[list(d) for d in drafts])
    if name == "penalties":
        prompt = torch.randint(0, 6, (B, 5), generator=g)
        prompt[0, 3:] = V  # vLLM pads prompts with vocab_size
        return dict(
            base, no_penalties=False, prompt_token_ids=prompt,
            repetition_penalties=0.5 + 1.5 * rand(B), frequency_penalties=2 * rand(B) - 1,
            presence_penalties=2 * rand(B) - 1,
        )  # fmt: skip
    if name == "bad_words":
        words = {}
        for b in range(B):
            past = outputs[b] + drafts[b]
            if past and rand(1) < 0.8:
                i = int(torch.randint(0, len(past), (1,), generator=g))
                words[b] = [
                    [int(torch.randint(0, V, (1,), generator=g))],
                    past[max(0, i - 1) : i + 1],
                ]
        return dict(base, bad_words_token_ids=words)
    if name == "allowed_token_ids":
        return dict(base, allowed_token_ids_mask=rand(B, V) < 0.5)  # True: not allowed
    if name == "min_tokens":
        proc = MinTokensLogitsProcessor(None, torch.device("cpu"), False)
        extra = torch.randint(0, 4, (B,), generator=g).tolist()
        stops = [0, 1, 2]
        added = [(b, SamplingParams(min_tokens=len(outputs[b]) + extra[b], stop_token_ids=stops),
                  None, outputs[b]) for b in range(B)]  # fmt: skip
        return dict(base, logitsprocs=LogitsProcessors([_update(proc, added)]))
    raise ValueError(name)


def boosted(logits):
    """Logits where stop tokens 0..2 and small ids lead often, so the features bite."""
    out = logits.clone()
    out[:, :6] += 1.5
    return out


@pytest.mark.parametrize("name", ["penalties", "bad_words", "allowed_token_ids", "min_tokens"])
def test_greedy_batches_with_a_feature_give_vllms_tokens(name):
    changed = 0
    for seed in SEEDS:
        drafts, logits = greedy_batch(seed)
        logits = boosted(logits)
        B, V = len(drafts), logits.shape[1]
        md = spec_metadata(drafts)
        if name == "min_tokens":  # vLLM's bonus-row rule differs (see the test after next)
            logits[md.bonus_logits_indices.long(), :3] -= 30.0
        sm = replace(sampling_metadata(B, V), **features(name, seed, drafts, V))
        assert plugin.unsupported_reason(plugin_sampler(), md, None, logits, sm) is None
        want = vllm_tokens(md, logits, sm)
        got = our_tokens(md, logits, sm)
        assert torch.equal(got, want), (name, seed)
        changed += not torch.equal(got, our_tokens(md, logits, sampling_metadata(B, V)))
    assert changed, f"{name} never changed a token: the test does not exercise it"


def test_greedy_batches_with_every_feature_give_vllms_tokens():
    for seed in SEEDS:
        drafts, logits = greedy_batch(seed)
        logits = boosted(logits)
        B, V = len(drafts), logits.shape[1]
        fields = {}
        for name in ("penalties", "bad_words", "allowed_token_ids", "min_tokens"):
            fields.update(features(name, seed, drafts, V))
        fields["allowed_token_ids_mask"][:, :3] = False  # leave the stop tokens allowed
        sm = replace(sampling_metadata(B, V), **fields)
        md = spec_metadata(drafts)
        logits[md.bonus_logits_indices.long(), :3] -= 30.0  # as in the min_tokens test
        assert torch.equal(our_tokens(md, logits, sm), vllm_tokens(md, logits, sm)), seed


def test_min_tokens_on_the_bonus_row_counts_the_drafts_before_it():
    # one request, output [5], min_tokens 2, stop token 0, one accepted draft 3: the bonus
    # row's position has 2 output tokens, so plain decoding may stop there. vLLM's Sampler
    # bans the stop token at the bonus row whenever the committed output is below min_tokens.
    V = 8
    logits = torch.zeros(2, V)
    logits[0, 3] = 5.0  # the draft is the argmax: accepted
    logits[1, 0] = 5.0  # the bonus row's argmax is the stop token
    md = spec_metadata([[3]])
    proc = MinTokensLogitsProcessor(None, torch.device("cpu"), False)
    added = [(0, SamplingParams(min_tokens=2, stop_token_ids=[0]), None, [5])]
    sm = replace(sampling_metadata(1, V), output_token_ids=[[5]], spec_token_ids=[[3]],
                 logitsprocs=LogitsProcessors([_update(proc, added)]))  # fmt: skip
    assert our_tokens(md, logits, sm).tolist() == [[3, 0]]  # what k = 0 decoding emits
    assert vllm_tokens(md, logits, sm).tolist() != [[3, 0]]  # vLLM's rule (documented)


def test_logit_bias_is_applied_to_every_row_as_vllms_plain_sampler_does():
    changed = 0
    for seed in SEEDS:
        drafts, logits = greedy_batch(seed)
        B, V = len(drafts), logits.shape[1]
        g = torch.Generator().manual_seed(seed)
        ids, values = torch.randint(0, V, (B, 3), generator=g), 4 * torch.randn(B, 3, generator=g)
        biases = {b: dict(zip(ids[b].tolist(), values[b].tolist(), strict=True))
                  for b in range(B) if b % 3}  # fmt: skip
        proc = LogitBiasLogitsProcessor(None, torch.device("cpu"), False)
        added = [(b, SamplingParams(logit_bias=lb), None, []) for b, lb in biases.items()]
        sm = replace(sampling_metadata(B, V), logitsprocs=LogitsProcessors([_update(proc, added)]))
        md = spec_metadata(drafts)
        folded = logits.clone()
        rows = request_rows(drafts)
        for b, lb in biases.items():
            for t, v in lb.items():
                folded[rows[b], t] += v
        want = vllm_tokens(md, folded, sampling_metadata(B, V))
        got = our_tokens(md, logits, sm)
        assert torch.equal(got, want), seed
        changed += not torch.equal(got, our_tokens(md, logits, sampling_metadata(B, V)))
    assert changed


def request_rows(drafts):
    """Logits rows of each request in ``spec_metadata``'s layout."""
    rows, start = [], 0
    for d in drafts:
        rows.append(list(range(start, start + len(d) + 1)))
        start += len(d) + 1
    return rows


def plugin_sampler():
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    return RejectionSampler(Sampler())


# ---------------------------------------------------------------- sampled


SAMPLED_V = 12
SAMPLED_R = 1500  # replicas of one request (one draft): rows 0 (the draft's) and 1 (bonus)
OUTPUT = [3, 3, 7]  # the request's committed output; prompt [1, 5]


def sampled_case(name: str):
    """``SamplingMetadata`` fields for ``SAMPLED_R`` replicas and the two rows' processed
    logits as vLLM's own functions compute them (row 1 counts the draft as output)."""
    from test_vllm_rejection import ROW_PROBS
    from vllm.v1.sample.ops.bad_words import apply_bad_words
    from vllm.v1.sample.ops.penalties import apply_all_penalties

    R, V, draft = SAMPLED_R, SAMPLED_V, 0
    raw = ROW_PROBS[:2].log()
    outs = [OUTPUT, OUTPUT + [draft]]
    fields = dict(output_token_ids=[list(OUTPUT)] * R, spec_token_ids=[[draft]] * R)
    want = raw.clone()
    if name == "penalties":
        rp, fp, pp = 1.6, 0.4, 0.3
        fields.update(
            no_penalties=False, prompt_token_ids=torch.tensor([[1, 5]] * R),
            repetition_penalties=torch.full((R,), rp), frequency_penalties=torch.full((R,), fp),
            presence_penalties=torch.full((R,), pp),
        )  # fmt: skip
        want = apply_all_penalties(
            want, torch.tensor([[1, 5]] * 2), torch.full((2,), pp), torch.full((2,), fp),
            torch.full((2,), rp), outs,
        )  # fmt: skip
    elif name == "bad_words":  # [7, 1]: row 0 (after 7); [0, 2]: row 1 (after the draft 0)
        words = [[7, 1], [0, 2], [6]]
        fields["bad_words_token_ids"] = {b: words for b in range(R)}
        for j in range(2):
            apply_bad_words(want[j : j + 1], {0: words}, [outs[j]])
    elif name == "allowed_token_ids":
        banned = torch.zeros(V, dtype=torch.bool)
        banned[[1, 4, 9]] = True
        fields["allowed_token_ids_mask"] = banned.repeat(R, 1)
        want[:, banned] = float("-inf")
    elif name == "min_tokens":  # 4 output tokens at least: row 0 (3 so far) bans, row 1 not
        proc = MinTokensLogitsProcessor(None, torch.device("cpu"), False)
        outputs = [list(OUTPUT) for _ in range(R)]
        added = [(b, SamplingParams(min_tokens=4, stop_token_ids=[1, 2]), None, outputs[b])
                 for b in range(R)]  # fmt: skip
        proc.update_state(BatchUpdate(batch_size=R, removed=[], added=added, moved=[]))
        fields.update(output_token_ids=outputs, logitsprocs=LogitsProcessors([proc]))
        want[0, [1, 2]] = float("-inf")
    elif name == "logit_bias":
        proc = LogitBiasLogitsProcessor(None, torch.device("cpu"), False)
        added = [(b, SamplingParams(logit_bias={0: -1.0, 5: 1.5}), None, []) for b in range(R)]
        proc.update_state(BatchUpdate(batch_size=R, removed=[], added=added, moved=[]))
        fields["logitsprocs"] = LogitsProcessors([proc])
        want[:, 0] -= 1.0
        want[:, 5] += 1.5
    return fields, raw, want


@pytest.mark.parametrize(
    "name", ["penalties", "bad_words", "allowed_token_ids", "min_tokens", "logit_bias"]
)
def test_sampled_rows_follow_the_processed_distributions(name):
    # chi-square at ALPHA = 1e-4 per check (fixed seeds: deterministic outcomes): the first
    # token follows row 0's processed distribution, and where the draft was accepted the
    # second follows row 1's, whose output counts the draft
    from test_vllm_rejection import ALPHA, assert_distribution

    assert ALPHA == 1e-4
    fields, raw, want = sampled_case(name)
    R, V, T = SAMPLED_R, SAMPLED_V, 0.9
    md = spec_metadata([[0]] * R)
    sm = replace(sampling_metadata(R, V, temperature=[T] * R), **fields)
    torch.manual_seed(5)
    out = our_tokens(md, raw.repeat(R, 1), sm)
    p = [torch.softmax(want[j].double() / T, -1) for j in range(2)]
    assert not torch.allclose(p[0], torch.softmax(raw[0].double() / T, -1))  # the feature bites
    assert_distribution(out[:, 0], p[0], f"{name}: row 0")
    accepted = out[:, 0] == 0
    assert int(accepted.sum()) > 100
    assert_distribution(out[accepted, 1], p[1], f"{name}: row 1 after the accepted draft")


# ---------------------------------------------------------------- logprobs


@pytest.mark.parametrize("mode", ["raw_logprobs", "raw_logits"])
@pytest.mark.parametrize("with_penalties", [False, True])
def test_raw_mode_logprobs_are_vllms(mode, with_penalties):
    from test_vllm_rejection import VLLM_FORWARD
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    for seed in range(4):
        drafts, logits = greedy_batch(seed)
        B, V = len(drafts), logits.shape[1]
        fields = features("penalties", seed, drafts, V) if with_penalties else {}
        sm = replace(sampling_metadata(B, V), max_num_logprobs=3, **fields)
        md = spec_metadata(drafts)
        sampler = RejectionSampler(Sampler(logprobs_mode=mode))
        assert plugin.unsupported_reason(sampler, md, None, logits, sm) is None
        want = VLLM_FORWARD(RejectionSampler(Sampler(logprobs_mode=mode)), md, None,
                            logits.clone(), sm)  # fmt: skip
        got = plugin.verify(md, None, logits, sm, sampler)
        assert torch.equal(got.sampled_token_ids, want.sampled_token_ids)
        g, w = got.logprobs_tensors, want.logprobs_tensors
        emitted = (got.sampled_token_ids >= 0).flatten()  # the slots vLLM's parse_output keeps
        for name in ("logprob_token_ids", "logprobs", "selected_token_ranks"):
            a, b = getattr(g, name)[emitted], getattr(w, name)[emitted]
            assert torch.equal(a, b), (mode, seed, name)


@pytest.mark.parametrize("mode", ["processed_logprobs", "processed_logits"])
@pytest.mark.parametrize("sampled", [False, True])
def test_processed_mode_logprobs_are_vllms(mode, sampled):
    # vLLM's processed rows: after penalties and bad words, then (not all greedy) its
    # temperature, top-k and top-p; the top-N of every verified slot, and of an all-greedy
    # batch the emitted tokens' logprobs and ranks too (sampled tokens differ from vLLM's)
    from test_vllm_rejection import VLLM_FORWARD
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    for seed in range(4):
        drafts, logits = greedy_batch(seed)
        B, V = len(drafts), logits.shape[1]
        fields = features("penalties", seed, drafts, V)
        fields.update(features("bad_words", seed, drafts, V))  # the same outputs (seed)
        constraints = {}
        if sampled:
            constraints = dict(
                temperature=[0.0, 0.7, 1.3, 0.9] * (B // 4), top_k=[V, 6, V, 4] * (B // 4),
                top_p=[1.0, 1.0, 0.8, 0.9] * (B // 4),
            )  # fmt: skip
        sm = replace(sampling_metadata(B, V, **constraints), max_num_logprobs=3, **fields)
        md = spec_metadata(drafts)
        sampler = RejectionSampler(Sampler(logprobs_mode=mode))
        assert plugin.unsupported_reason(sampler, md, None, logits, sm) is None
        torch.manual_seed(seed)
        want = VLLM_FORWARD(RejectionSampler(Sampler(logprobs_mode=mode)), md, None,
                            logits.clone(), sm)  # fmt: skip
        got = plugin.verify(md, None, logits, sm, sampler)
        g, w = got.logprobs_tensors, want.logprobs_tensors
        K1 = got.sampled_token_ids.shape[1]
        real = torch.arange(K1)[None, :] <= torch.tensor([len(d) for d in drafts])[:, None]
        real = real.flatten()  # slots that read one of the request's own rows
        top = slice(1, None)  # column 0 is the emitted token, then the top-N
        assert torch.equal(g.logprob_token_ids[real, top], w.logprob_token_ids[real, top])
        torch.testing.assert_close(g.logprobs[real, top], w.logprobs[real, top],
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
        if not sampled:
            assert torch.equal(got.sampled_token_ids, want.sampled_token_ids)
            emitted = (got.sampled_token_ids >= 0).flatten()
            assert torch.equal(g.logprob_token_ids[emitted], w.logprob_token_ids[emitted])
            assert torch.equal(g.selected_token_ranks[emitted], w.selected_token_ranks[emitted])
            torch.testing.assert_close(g.logprobs[emitted], w.logprobs[emitted],
                                       rtol=1e-5, atol=1e-6)  # fmt: skip
        raw_mode = RejectionSampler(Sampler(logprobs_mode=mode.replace("processed", "raw")))
        raw = plugin.verify(md, None, logits, sm, raw_mode).logprobs_tensors
        assert not torch.equal(raw.logprobs[real, top], g.logprobs[real, top])  # it bites


def test_processed_modes_fall_back_with_logit_bias_or_min_tokens():
    # the rows vLLM's rejection sampler processes differently (no bias on draft rows, its
    # bonus-row min_tokens rule) would give other processed logprobs: vLLM verifies those
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    drafts, logits = greedy_batch(1)
    B, V = len(drafts), logits.shape[1]
    md = spec_metadata(drafts)
    bias = LogitBiasLogitsProcessor(None, torch.device("cpu"), False)
    _update(bias, [(0, SamplingParams(logit_bias={3: 2.0}), None, [])])
    min_tok = MinTokensLogitsProcessor(None, torch.device("cpu"), False)
    _update(min_tok, [(1, SamplingParams(min_tokens=5, stop_token_ids=[0]), None, [])])
    for proc in (bias, min_tok):
        sm = replace(sampling_metadata(B, V), max_num_logprobs=2,
                     logitsprocs=LogitsProcessors([proc]))  # fmt: skip
        for mode in ("processed_logprobs", "processed_logits"):
            sampler = RejectionSampler(Sampler(logprobs_mode=mode))
            reason = plugin.unsupported_reason(sampler, md, None, logits, sm)
            assert reason == f"logprobs in the {mode!r} mode with logit bias or min_tokens"
        raw = RejectionSampler(Sampler(logprobs_mode="raw_logprobs"))
        assert plugin.unsupported_reason(raw, md, None, logits, sm) is None
