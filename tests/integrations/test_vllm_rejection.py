"""The plugin's verification against vLLM's own ``RejectionSampler`` on the same batches.

Batches are laid out as ``GPUModelRunner._calc_spec_decode_metadata`` lays them out (per
request its draft rows, then its bonus row) and sampled as vLLM's input batch stores the
parameters (temperature 0 for greedy requests, ``top_k = vocab_size`` when off, the
logits processors vLLM loads under speculative decoding: ``min_tokens`` only).

- greedy requests: identical tokens;
- sampled requests: each implementation's emitted tokens and acceptance counts against the
  exact distribution (chi-square), and the two acceptance rates against each other;
- seeded requests: tokens depend on the seed, not on the batch row or the neighbours;
- features the op lacks: vLLM's own result, bit for bit, and one log line per reason.

vLLM's reference runs its Triton kernels under ``TRITON_INTERPRET=1`` and its PyTorch
top-k/top-p (``HAS_TRITON = False`` in ``topk_topp_sampler``: its Triton top-k/top-p
kernel needs a GPU's SM count and does not run in the interpreter).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import vllm.v1.sample.ops.topk_topp_sampler as vllm_topk_topp
from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessors
from vllm.v1.sample.logits_processor.builtin import (
    MinPLogitsProcessor,
    MinTokensLogitsProcessor,
)
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.rejection_sampler import RejectionSampler
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from specdec_kernels.integrations.vllm import rejection as plugin

VLLM_FORWARD = RejectionSampler.forward  # vLLM's own (nothing installed at import)

# Statistics: every chi-square and z check below would fail with probability ALPHA for a
# random seed if the sampler were exact; the seeds are fixed, so each outcome is
# deterministic (a failure is a real difference or a changed seed, not noise).
ALPHA = 1e-4


@pytest.fixture(autouse=True)
def _vllm_state(monkeypatch):
    monkeypatch.setattr(vllm_topk_topp, "HAS_TRITON", False)
    monkeypatch.delenv(plugin.ENV_VAR, raising=False)
    plugin.uninstall()
    plugin._logged.clear()
    yield
    plugin.uninstall()


def spec_metadata(drafts: list[list[int]], bonus_first: bool = False) -> SpecDecodeMetadata:
    """``SpecDecodeMetadata`` with the runner's logits layout (per request k_b draft rows,
    then the bonus row); ``bonus_first`` moves every bonus row before the draft rows, to
    check that the plugin follows the indices rather than assuming the layout."""
    num_draft = [len(d) for d in drafts]
    num_sampled = np.array(num_draft) + 1
    cu_sampled = np.cumsum(num_sampled)
    target = np.concatenate(
        [np.arange(c - s, c - 1) for c, s in zip(cu_sampled, num_sampled, strict=True)]
    )
    bonus = cu_sampled - 1
    if bonus_first:  # logits rows: all bonus rows, then all draft rows in order
        B, N = len(drafts), len(target)
        bonus, target = np.arange(B), B + np.arange(N)
    to = lambda a: torch.from_numpy(np.asarray(a, dtype=np.int32))  # noqa: E731
    return SpecDecodeMetadata(
        draft_token_ids=torch.tensor(sum(drafts, []), dtype=torch.int32),
        num_draft_tokens=num_draft,
        cu_num_draft_tokens=to(np.cumsum(num_draft)),
        cu_num_sampled_tokens=to(cu_sampled),
        target_logits_indices=to(target),
        bonus_logits_indices=to(bonus),
        logits_indices=to(np.arange(cu_sampled[-1])),
    )


def min_tokens_processor(active_rows=()):
    proc = MinTokensLogitsProcessor(None, torch.device("cpu"), False)
    added = [
        (row, SamplingParams(min_tokens=5, stop_token_ids=[2]), None, []) for row in active_rows
    ]
    proc.update_state(BatchUpdate(batch_size=8, removed=[], added=added, moved=[]))
    return proc


def sampling_metadata(
    B, V, temperature=None, top_k=None, top_p=None, generators=None, **fields
) -> SamplingMetadata:
    """``SamplingMetadata`` as vLLM's input batch builds it."""
    t = None if temperature is None else torch.tensor(temperature, dtype=torch.float32)
    all_greedy = t is None or bool((t == 0).all())
    base = dict(
        temperature=None if all_greedy else t,
        all_greedy=all_greedy,
        all_random=t is not None and bool((t > 0).all()),
        top_p=None if top_p is None else torch.tensor(top_p, dtype=torch.float32),
        top_k=None if top_k is None else torch.tensor(top_k, dtype=torch.int32),
        generators=generators or {},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(B),
        presence_penalties=torch.zeros(B),
        repetition_penalties=torch.ones(B),
        output_token_ids=[],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors([min_tokens_processor()]),
    )
    base.update(fields)
    return SamplingMetadata(**base)


def vllm_tokens(md, logits, sm, draft_probs=None):
    out = VLLM_FORWARD(RejectionSampler(Sampler()), md, draft_probs, logits.clone(), sm)
    return out.sampled_token_ids


def our_tokens(md, logits, sm, draft_probs=None):
    out = plugin.verify(md, draft_probs, logits, sm)
    assert (out.logprobs_tensors is None) == (sm.max_num_logprobs is None)
    return out.sampled_token_ids


def greedy_batch(seed, V=37, B=8, k=4, dtype=torch.float32):
    """Random logits (no ties in fp32) and drafts that equal the row's argmax 70% of the
    time, so acceptance lengths vary; some requests have no drafts."""
    g = torch.Generator().manual_seed(seed)
    num_draft = torch.randint(0, k + 1, (B,), generator=g).tolist()
    logits = torch.randn(sum(num_draft) + B, V, generator=g).to(dtype)
    drafts, row = [], 0
    for n in num_draft:
        d = []
        for _ in range(n):
            best = int(logits[row].float().argmax())
            guess = int(torch.randint(0, V, (1,), generator=g))
            d.append(best if torch.rand(1, generator=g).item() < 0.7 else guess)
            row += 1
        drafts.append(d)
        row += 1  # bonus row
    return drafts, logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(6))
def test_greedy_batches_give_vllms_tokens(seed, dtype):
    drafts, logits = greedy_batch(seed, dtype=dtype)
    md = spec_metadata(drafts)
    sm = sampling_metadata(len(drafts), logits.shape[1])
    want = vllm_tokens(md, logits, sm)
    got = our_tokens(md, logits, sm)
    assert got.dtype == torch.int32 and got.shape == (len(drafts), md.max_spec_len + 1)
    assert torch.equal(got, want)


def test_greedy_batches_exercise_accepts_and_rejects():
    # guards the test above against batches where nothing (or everything) is accepted
    accepted = rejected = 0
    for seed in range(6):
        drafts, logits = greedy_batch(seed)
        md = spec_metadata(drafts)
        out = our_tokens(md, logits, sampling_metadata(len(drafts), logits.shape[1]))
        emitted = (out >= 0).sum(1)
        accepted += int((emitted - 1).sum())
        rejected += sum(int(e) - 1 < len(d) for e, d in zip(emitted, drafts, strict=True))
    assert accepted > 10 and rejected > 10


def test_the_indices_are_followed_not_the_layout():
    drafts, logits = greedy_batch(11)
    md = spec_metadata(drafts)
    B = len(drafts)
    bonus_first = spec_metadata(drafts, bonus_first=True)
    # the same rows, moved to where the bonus-first indices say they are
    moved = torch.cat(
        [logits[md.bonus_logits_indices.long()], logits[md.target_logits_indices.long()]]
    )
    sm = sampling_metadata(B, logits.shape[1])
    want = vllm_tokens(md, logits, sm)
    assert torch.equal(vllm_tokens(bonus_first, moved, sm), want)
    assert torch.equal(our_tokens(bonus_first, moved, sm), want)


def test_greedy_rows_of_a_mixed_batch_give_vllms_tokens():
    drafts, logits = greedy_batch(3, B=8)
    B, V = len(drafts), logits.shape[1]
    temperature = [0.0, 0.8, 0.0, 1.0, 0.0, 0.5, 0.0, 1.3]
    md = spec_metadata(drafts)
    sm = sampling_metadata(B, V, temperature=temperature, top_k=[V, 5, V, V, 3, V, V, 10])
    want, got = vllm_tokens(md, logits, sm), our_tokens(md, logits, sm)
    greedy = torch.tensor(temperature) == 0
    assert torch.equal(got[greedy], want[greedy])
    for b in (~greedy).nonzero()[:, 0].tolist():  # sampled rows: a valid, -1-padded output
        row = got[b]
        n = int((row >= 0).sum())
        assert 1 <= n <= len(drafts[b]) + 1
        assert bool((row[:n] >= 0).all() and (row[:n] < V).all() and (row[n:] == -1).all())
        assert row[: n - 1].tolist() == drafts[b][: n - 1]


# ---------------------------------------------------------------- sampled: statistics


def filtered_probs(logits, temperature, top_k=None, top_p=None):
    """float64 reference of the target distribution: softmax(l / T), top-k, top-p."""
    p = torch.softmax(logits.double() / temperature, -1)
    if top_k is not None:
        kth = p.sort(descending=True).values[top_k - 1]
        p = torch.where(p >= kth, p, 0.0)
        p = p / p.sum()
    if top_p is not None:
        s, idx = p.sort(descending=True)
        larger = torch.cumsum(s, 0) - s  # mass of the tokens before each one
        keep = torch.zeros_like(p, dtype=torch.bool)
        keep[idx] = larger < top_p
        p = torch.where(keep, p, 0.0)
        p = p / p.sum()
    return p


def chi2_pvalue(counts, expected):
    """Pearson chi-square p-value (Wilson-Hilferty free: torch's regularised gamma)."""
    counts, expected = counts.double(), expected.double()
    stat = float(((counts - expected) ** 2 / expected).sum())
    df = counts.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2), torch.tensor(stat / 2)))


def assert_distribution(samples, probs, what):
    """Tokens with p = 0 never appear; the others follow p (chi-square at ALPHA, the
    tokens expected fewer than 5 times pooled into one bin)."""
    support = probs > 0
    counts = torch.bincount(samples.long(), minlength=probs.numel()).double()
    assert counts[~support].sum() == 0, f"{what}: a token with p = 0 was emitted"
    expected = probs * samples.numel()
    big = support & (expected >= 5)
    small = support & ~big
    counts = torch.cat([counts[big], counts[small].sum()[None]])
    expected = torch.cat([expected[big], expected[small].sum()[None]])
    if float(expected[-1]) < 5:  # the pool too small: fold it into the smallest bin
        i = int(expected[:-1].argmin())
        counts[i] += counts[-1]
        expected[i] += expected[-1]
        counts, expected = counts[:-1], expected[:-1]
    assert counts.numel() >= 2, f"{what}: too few samples for a chi-square"
    p = chi2_pvalue(counts, expected)
    assert p > ALPHA, f"{what}: chi-square p = {p:.2e}"


# Three rows (draft 0, draft 1, bonus) of one request, V = 12, distinct probabilities: no
# tie at the top-k boundary, and the top-p threshold 0.8 lies >= 0.02 from every
# cumulative mass of the filtered rows (checked in the test).
ROW_PROBS = torch.tensor(
    [
        [0.30, 0.22, 0.15, 0.10, 0.07, 0.05, 0.04, 0.03, 0.02, 0.012, 0.005, 0.003],
        [0.04, 0.35, 0.03, 0.18, 0.12, 0.09, 0.06, 0.05, 0.035, 0.025, 0.015, 0.005],
        [0.11, 0.09, 0.25, 0.02, 0.16, 0.13, 0.07, 0.05, 0.045, 0.035, 0.025, 0.015],
    ]
)
R = 1500  # replicas of the request in one batch


@pytest.mark.parametrize(
    "temperature, top_k, top_p, draft_model",
    [(0.7, None, None, False), (1.0, 6, 0.8, False), (0.9, None, None, True)],
    ids=["temperature", "top-k+top-p", "draft-probs"],
)
def test_sampled_batches_match_vllm_in_distribution(temperature, top_k, top_p, draft_model):
    V = ROW_PROBS.shape[1]
    row_logits = ROW_PROBS.log()
    p = [filtered_probs(row_logits[j], temperature, top_k, top_p) for j in range(3)]
    if top_p is not None:  # the threshold is not within rounding of any cumulative mass
        for j in range(3):
            s = p[j].sort(descending=True).values
            assert float((torch.cumsum(s, 0) - s - top_p).abs().min()) > 0.02
    g = torch.Generator().manual_seed(1)
    if draft_model:  # drafts drawn from q, as a draft model would
        q = torch.softmax(torch.randn(2, V, generator=g) * 1.5, -1)
        draft_ids = torch.stack(
            [torch.multinomial(q[j], R, True, generator=g) for j in range(2)], 1
        )
        draft_probs = q.repeat(R, 1)
        accept = [float(torch.minimum(p[j], q[j].double()).sum()) for j in range(2)]
    else:  # n-gram: fixed drafts, the 2nd most likely token of row 0, the likeliest of row 1
        draft_ids = torch.tensor([[int(p[0].argsort(descending=True)[1]), int(p[1].argmax())]] * R)
        draft_probs = None
        accept = [float(p[j][draft_ids[0, j]]) for j in range(2)]
    drafts = draft_ids.tolist()
    md = spec_metadata(drafts)
    logits = row_logits.repeat(R, 1)
    sm = sampling_metadata(
        R,
        V,
        temperature=[temperature] * R,
        top_k=None if top_k is None else [top_k] * R,
        top_p=None if top_p is None else [top_p] * R,
    )
    # exact: P(emitted = 1, 2, 3) and the first token, distributed as p0 whatever the draft
    emitted_probs = torch.tensor(
        [1 - accept[0], accept[0] * (1 - accept[1]), accept[0] * accept[1]], dtype=torch.float64
    )
    rates = {}
    for name, run in (("vllm", vllm_tokens), ("specdec", our_tokens)):
        torch.manual_seed(2)
        out = run(md, logits, sm, draft_probs)
        emitted = (out >= 0).sum(1)
        assert_distribution(emitted - 1, emitted_probs, f"{name}: number of emitted tokens")
        assert_distribution(out[:, 0], p[0], f"{name}: first token")
        rates[name] = float((out[:, 0] == draft_ids[:, 0]).double().mean())
    # the two acceptance rates of draft 0 agree (two-sample z-test at ALPHA, two-sided)
    a = accept[0]
    z = abs(rates["vllm"] - rates["specdec"]) / (2 * a * (1 - a) / R) ** 0.5
    assert z < 3.9, f"acceptance rates {rates} differ (z = {z:.2f})"


# ---------------------------------------------------------------- seeds


def seeded_request_tokens(seed, row, neighbours, V=37, k=3):
    """Our tokens for a request with ``torch.Generator`` seeded ``seed`` at batch ``row``,
    the other rows random requests drawn with ``neighbours``."""
    g = torch.Generator().manual_seed(neighbours)
    B = 5
    request_logits = torch.randn(k + 1, V, generator=torch.Generator().manual_seed(99))
    request_drafts = [3, 17, 5]
    drafts, logits = [], []
    for b in range(B):
        if b == row:
            drafts.append(request_drafts)
            logits.append(request_logits)
        else:
            n = int(torch.randint(0, k + 1, (1,), generator=g))
            drafts.append(torch.randint(0, V, (n,), generator=g).tolist())
            logits.append(torch.randn(n + 1, V, generator=g))
    sm = sampling_metadata(
        B, V, temperature=[1.0] * B, generators={row: torch.Generator().manual_seed(seed)}
    )
    torch.manual_seed(neighbours)  # the unseeded requests' keys come from here
    return our_tokens(spec_metadata(drafts), torch.cat(logits), sm)[row]


def test_a_seeded_request_does_not_depend_on_its_row_or_its_neighbours():
    outputs = set()
    for seed in range(8):
        first = seeded_request_tokens(seed, row=0, neighbours=1)
        for row, neighbours in ((2, 5), (4, 7)):
            assert torch.equal(seeded_request_tokens(seed, row, neighbours), first)
        outputs.add(tuple(first.tolist()))
    assert len(outputs) > 1  # the seed matters


def test_equally_seeded_ranks_emit_the_same_tokens():
    # what TP ranks do: the same batch, generators seeded alike, the same default seed
    drafts, logits = greedy_batch(5)
    B, V = len(drafts), logits.shape[1]
    md = spec_metadata(drafts)

    def rank():
        sm = sampling_metadata(
            B,
            V,
            temperature=[0.0, 1.0] * (B // 2),
            generators={1: torch.Generator().manual_seed(7)},
        )
        torch.manual_seed(1234)
        return our_tokens(md, logits, sm)

    assert torch.equal(rank(), rank())


# ---------------------------------------------------------------- fallbacks and the plugin


def min_p_processor(active_rows=()):
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=8))
    proc = MinPLogitsProcessor(config, torch.device("cpu"), False)
    added = [(row, SamplingParams(min_p=0.2), None, []) for row in active_rows]
    proc.update_state(BatchUpdate(batch_size=8, removed=[], added=added, moved=[]))
    return proc


def fallback_cases(B, V, drafts):
    structured = min_tokens_processor([1])
    structured.min_toks = {b: (*e[:3], True) for b, e in structured.min_toks.items()}
    return {
        "min_p": dict(logitsprocs=LogitsProcessors([min_p_processor([1])])),
        "min_tokens with structured output": dict(logitsprocs=LogitsProcessors([structured])),
    }


@pytest.mark.parametrize("case", ["min_p", "min_tokens with structured output"])
def test_features_the_op_lacks_fall_back_to_vllm(case, caplog, monkeypatch):
    drafts, logits = greedy_batch(7)
    B, V = len(drafts), logits.shape[1]
    md = spec_metadata(drafts)
    temperature = [0.0, 0.9] * (B // 2)
    sm = replace(
        sampling_metadata(B, V, temperature=temperature), **fallback_cases(B, V, drafts)[case]
    )
    calls = []
    monkeypatch.setattr(plugin, "verify", lambda *a: calls.append(a))
    assert plugin.install()
    sampler = RejectionSampler(Sampler())
    assert plugin.unsupported_reason(sampler, md, None, logits, sm) is not None
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        for _ in range(2):
            torch.manual_seed(3)
            got = sampler(md, None, logits.clone(), sm)
            torch.manual_seed(3)
            want = VLLM_FORWARD(RejectionSampler(Sampler()), md, None, logits.clone(), sm)
            assert torch.equal(got.sampled_token_ids, want.sampled_token_ids)
    assert calls == []
    notes = [r for r in caplog.records if "verified by vLLM's own rejection sampler" in r.message]
    assert len(notes) == 1 and case in notes[0].message


def test_logprob_token_ids_are_ignored_as_vllms_sampler_ignores_them(monkeypatch):
    # vLLM 0.33.0's rejection sampler returns no logprobs for logprob_token_ids alone (its
    # tokens as without them), and raises on a batch that also asks for logprobs = N
    drafts, logits = greedy_batch(7)
    B, V = len(drafts), logits.shape[1]
    md = spec_metadata(drafts)
    sm = replace(sampling_metadata(B, V, temperature=[0.0, 0.9] * (B // 2)),
                 logprob_token_ids={0: [1, 2]})  # fmt: skip
    assert plugin.install()
    sampler = RejectionSampler(Sampler())
    torch.manual_seed(3)
    want = VLLM_FORWARD(RejectionSampler(Sampler()), md, None, logits.clone(), sm)
    torch.manual_seed(3)
    calls = []
    verify = plugin.verify
    monkeypatch.setattr(plugin, "verify", lambda *a: calls.append(1) or verify(*a))
    got = sampler(md, None, logits.clone(), sm)
    assert calls == [1] and got.logprobs_tensors is None and want.logprobs_tensors is None
    greedy = torch.tensor([0, 1] * (B // 2)) == 0
    assert torch.equal(got.sampled_token_ids[greedy], want.sampled_token_ids[greedy])
    both = replace(sm, max_num_logprobs=1)
    with pytest.raises(RuntimeError, match="shape mismatch"):  # vLLM's own error
        VLLM_FORWARD(RejectionSampler(Sampler()), md, None, logits.clone(), both)
    with pytest.raises(RuntimeError, match="shape mismatch"):  # handed to vLLM: the same
        sampler(md, None, logits.clone(), both)
    assert calls == [1]


def test_full_vocabulary_logprobs_go_to_vllm_which_refuses_them(monkeypatch):
    # vLLM 0.33.0's rejection sampler takes topk(-1) of each row for max_num_logprobs = -1
    drafts, logits = greedy_batch(7)
    md = spec_metadata(drafts)
    sm = replace(sampling_metadata(len(drafts), logits.shape[1]), max_num_logprobs=-1)
    assert plugin.install()
    monkeypatch.setattr(plugin, "verify", lambda *a: pytest.fail("verified by the plugin"))
    for sampler_forward in (VLLM_FORWARD, RejectionSampler.forward):
        with pytest.raises(RuntimeError, match="k out of range"):
            sampler_forward(RejectionSampler(Sampler()), md, None, logits.clone(), sm)


def test_each_unsupported_feature_is_named():
    drafts, logits = greedy_batch(7)
    B, V = len(drafts), logits.shape[1]
    md, sm = spec_metadata(drafts), sampling_metadata(B, V)
    plain = RejectionSampler(Sampler())

    def reason(sampler=plain, probs=None, lg=logits, **fields):
        return plugin.unsupported_reason(sampler, md, probs, lg, replace(sm, **fields))

    assert reason() is None
    assert reason(probs=torch.rand(md.draft_token_ids.shape[0], V)) is None
    assert reason(max_num_logprobs=0) is None  # raw_logprobs, vLLM's default mode
    assert reason(max_num_logprobs=-1).startswith("full-vocabulary logprobs")
    for mode in ("raw_logits", "processed_logprobs", "processed_logits"):
        sampler = RejectionSampler(Sampler(logprobs_mode=mode))
        assert reason(sampler=sampler, max_num_logprobs=2) is None
    future = RejectionSampler(Sampler())
    future.sampler.logprobs_mode = "future_mode"  # a mode vLLM 0.33.0 does not have
    assert reason(sampler=future, max_num_logprobs=2) == "logprobs in the 'future_mode' mode"
    assert reason(logprob_token_ids={0: [1]}) is None  # ignored, as vLLM's sampler does
    assert reason(logprob_token_ids={0: [1]}, max_num_logprobs=1) == (
        "logprob_token_ids with logprobs"
    )
    # mapped onto process_logits: no reason
    assert reason(no_penalties=False) is None
    assert reason(bad_words_token_ids={0: [[1]]}) is None
    assert reason(allowed_token_ids_mask=torch.zeros(B, V, dtype=torch.bool)) is None
    assert reason(logitsprocs=LogitsProcessors([min_tokens_processor([0])])) is None
    active = LogitsProcessors([min_p_processor([0])])
    assert reason(logitsprocs=active).startswith("an active logits processor")
    assert reason(logitsprocs=LogitsProcessors([min_p_processor()])) is None  # idle
    structured = min_tokens_processor([0])
    structured.min_toks = {b: (*e[:3], True) for b, e in structured.min_toks.items()}
    assert reason(logitsprocs=LogitsProcessors([structured])) == "min_tokens with structured output"
    custom = LogitsProcessors()
    custom.non_argmax_invariant.append(object())  # anything but vLLM's idle built-ins
    assert reason(logitsprocs=custom).startswith("an active logits processor")
    holder = SimpleNamespace(has_tracked_requests=lambda: True)
    assert reason(thinking_budget_state_holder=holder) == "a thinking-token budget"
    for flag, name in (("synthetic_mode", "synthetic"), ("use_fly", "FLy")):
        special = RejectionSampler(Sampler())
        setattr(special, flag, True)
        assert reason(sampler=special).startswith(name)

    class OtherSampler(Sampler):
        pass

    assert reason(sampler=RejectionSampler(OtherSampler())).startswith("a sampler other than")
    assert "dtype torch.float64" in reason(lg=logits.double())
    assert "untested device (meta" in reason(lg=logits.to("meta"))
    assert reason(probs=torch.rand(md.draft_token_ids.shape[0], V + 1)).startswith("draft_probs")


def test_a_plain_batch_goes_through_the_op_when_installed(monkeypatch):
    drafts, logits = greedy_batch(8)
    md = spec_metadata(drafts)
    sm = sampling_metadata(len(drafts), logits.shape[1])
    calls = []
    real_verify = plugin.verify
    monkeypatch.setattr(plugin, "verify", lambda *a: calls.append(a) or real_verify(*a))
    assert plugin.install()
    got = RejectionSampler(Sampler())(md, None, logits.clone(), sm)
    assert len(calls) == 1
    assert torch.equal(got.sampled_token_ids, vllm_tokens(md, logits, sm))


def test_the_entry_point_installs_only_when_asked(monkeypatch):
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "specdec_kernels"]
    assert ep.value == "specdec_kernels.integrations.vllm:register"
    register = ep.load()
    register()  # variable unset: nothing changes
    assert RejectionSampler.forward is VLLM_FORWARD
    monkeypatch.setenv(plugin.ENV_VAR, "0")
    register()
    assert RejectionSampler.forward is VLLM_FORWARD
    monkeypatch.setenv(plugin.ENV_VAR, "1")
    register()
    patched = RejectionSampler.forward
    assert patched.__specdec_original__ is VLLM_FORWARD
    register()  # vLLM may load plugins more than once per process
    assert RejectionSampler.forward is patched
    plugin.uninstall()
    assert RejectionSampler.forward is VLLM_FORWARD


def test_vllms_plugin_loader_runs_the_entry_point(monkeypatch):
    import vllm.plugins

    monkeypatch.setenv(plugin.ENV_VAR, "1")
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    vllm.plugins.load_general_plugins()
    assert RejectionSampler.forward.__specdec_original__ is VLLM_FORWARD


def test_an_untested_vllm_version_keeps_vllms_sampler_unless_forced(monkeypatch, caplog):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.34.0")
    monkeypatch.setenv(plugin.ENV_VAR, "1")
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        plugin.register()
    assert RejectionSampler.forward is VLLM_FORWARD
    assert "is ignored on vLLM 0.34.0" in caplog.text
    monkeypatch.setenv(plugin.ENV_VAR, "force")
    plugin.register()
    assert RejectionSampler.forward.__specdec_original__ is VLLM_FORWARD
