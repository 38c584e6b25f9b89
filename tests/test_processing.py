"""process_logits (family ``processing``): named cases per feature, reference == CPU path ==
Triton kernel bit for bit on random batches, output invariance of coupled verification
with every feature on, errors.

Contract in ``docs/design.md``; the registration tiers (opcheck, compile, fakes, poisoned
outputs) are tests/test_conformance.py's. The Triton launcher runs on CPU tensors under the
interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels.cpu import processing as cpu_processing
from specdec_kernels.kernels import processing as triton_processing
from specdec_kernels.ops import process_logits, rejection_sample, token_bitmask
from specdec_kernels.ops.processing import LogitsProcessing
from specdec_kernels.reference import processing as ref_processing
from tests.bookkeeping_helpers import KERNEL_DEVICE

I32 = torch.int32
NEG = float("-inf")
FEATURES = ("repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias_ids",
            "logit_bias_values", "allowed_token_mask", "grammar_mask", "bad_word_ids",
            "min_tokens", "stop_token_ids")  # fmt: skip


def i32(x) -> torch.Tensor:
    return torch.tensor(x, dtype=I32)


def bits(allowed: list[list[int]], V: int) -> torch.Tensor:
    """int32 ``[rows, ceil(V/32)]`` bitmasks allowing exactly the given ids."""
    out = torch.zeros(len(allowed), (V + 31) // 32, dtype=torch.int64)
    for r, ids in enumerate(allowed):
        for t in ids:
            out[r, t // 32] |= 1 << (t % 32)
    return torch.where(out >= 2**31, out - 2**32, out).to(I32)


def full_args(**kw) -> dict:
    """Every schema argument (the features absent unless given)."""
    a = dict.fromkeys(FEATURES)
    a["req_indices"] = None
    a.update(kw)
    return a


def run(impl: str, a: dict) -> torch.Tensor:
    if impl == "public":
        pos = [a[n] for n in ("target_logits", "draft_token_ids", "cu_num_draft_tokens",
                              "token_ids", "num_tokens", "num_prompt_tokens")]  # fmt: skip
        rest = {n: a[n] for n in ("req_indices", *FEATURES)}
        return process_logits(*pos, **rest)
    if impl == "triton":
        on = {n: t.to(KERNEL_DEVICE) if isinstance(t, torch.Tensor) else t for n, t in a.items()}
        return triton_processing.process_logits(**on).cpu()
    module = {"reference": ref_processing, "cpu": cpu_processing}[impl]
    return module.process_logits(**a)


def same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit for bit, NaN where NaN (a NaN's payload is not part of the contract: torch's
    fp16 widening and the interpreter's keep different ones)."""
    nan = got.isnan()
    if got.dtype != want.dtype or not torch.equal(nan, want.isnan()):
        return False
    return torch.equal(got.masked_fill(nan, 0).view(I32), want.masked_fill(nan, 0).view(I32))


# ---------------------------------------------------------------- named cases

# One request (state row 0), prompt [0, 1], output [2, 2], drafts [3, 2], V = 6: rows 0..2.
LOGITS = torch.tensor([[2.0, -1.0, 3.0, 1.0, 0.5, -2.0]] * 3)
BASE = dict(
    target_logits=LOGITS, draft_token_ids=i32([3, 2]), cu_num_draft_tokens=i32([0, 2]),
    token_ids=i32([[0, 1, 2, 2, 9, 9]]), num_tokens=i32([4]), num_prompt_tokens=i32([2]),
)  # fmt: skip
ONES = torch.ones(1)
ZEROS = torch.zeros(1)

CASES = {
    # seen in the prompt (0, 1) or output (2; 3 from row 2 on): l / 2 if l > 0 else l * 2
    "repetition-prompt-output-and-drafts": (
        dict(
            repetition_penalty=torch.tensor([2.0]), frequency_penalty=ZEROS, presence_penalty=ZEROS
        ),  # fmt: skip
        [
            [1.0, -2.0, 1.5, 1.0, 0.5, -2.0],
            [1.0, -2.0, 1.5, 0.5, 0.5, -2.0],
            [1.0, -2.0, 1.5, 0.5, 0.5, -2.0],
        ],
    ),
    # output counts: row 0 {2: 2}, row 1 {2: 2, 3: 1}, row 2 {2: 3, 3: 1}; the prompt never
    "frequency-counts-drafts-not-the-prompt": (
        dict(
            repetition_penalty=ONES, frequency_penalty=torch.tensor([0.5]), presence_penalty=ZEROS
        ),  # fmt: skip
        [
            [2.0, -1.0, 2.0, 1.0, 0.5, -2.0],
            [2.0, -1.0, 2.0, 0.5, 0.5, -2.0],
            [2.0, -1.0, 1.5, 0.5, 0.5, -2.0],
        ],
    ),
    "presence-once-per-token": (
        dict(
            repetition_penalty=ONES, frequency_penalty=ZEROS, presence_penalty=torch.tensor([1.0])
        ),
        [
            [2.0, -1.0, 2.0, 1.0, 0.5, -2.0],
            [2.0, -1.0, 2.0, 0.0, 0.5, -2.0],
            [2.0, -1.0, 2.0, 0.0, 0.5, -2.0],
        ],
    ),
    # bias first (0: 2 - 3 = -1 < 0, so the repetition penalty multiplies), a repeated id adds twice
    "bias-before-repetition-repeated-id": (
        dict(
            logit_bias_ids=i32([[0, 5, 5, -1]]),
            logit_bias_values=torch.tensor([[-3.0, 1.0, 1.0, 9.0]]),
            repetition_penalty=torch.tensor([2.0]),
            frequency_penalty=ZEROS,
            presence_penalty=ZEROS,
        ),  # fmt: skip
        [
            [-2.0, -2.0, 1.5, 1.0, 0.5, 0.0],
            [-2.0, -2.0, 1.5, 0.5, 0.5, 0.0],
            [-2.0, -2.0, 1.5, 0.5, 0.5, 0.0],
        ],
    ),
    "allowed-tokens-per-request": (
        dict(allowed_token_mask=bits([[1, 3]], 6)),
        [[NEG, -1.0, NEG, 1.0, NEG, NEG]] * 3,
    ),
    "grammar-mask-per-row": (
        dict(grammar_mask=bits([[0, 1, 2, 3, 4, 5], [2], [4, 5]], 6)),
        [
            [2.0, -1.0, 3.0, 1.0, 0.5, -2.0],
            [NEG, NEG, 3.0, NEG, NEG, NEG],
            [NEG, NEG, NEG, NEG, 0.5, -2.0],
        ],
    ),
    # [4]: always; [2, 0]: after the output's 2 (rows 0 and 2, not row 1 after draft 3);
    # [3, 2, 1]: after drafts 3, 2 (row 2); [1, 2, 2, 5]: its prefix reaches into the prompt
    "bad-words-prefix-in-output-and-drafts": (
        dict(bad_word_ids=i32([[[4, -1, -1, -1], [2, 0, -1, -1], [3, 2, 1, -1], [1, 2, 2, 5]]])),
        [
            [NEG, -1.0, 3.0, 1.0, NEG, -2.0],
            [2.0, -1.0, 3.0, 1.0, NEG, -2.0],
            [NEG, NEG, 3.0, 1.0, NEG, -2.0],
        ],
    ),
    # output counts 2, 3, 4 at rows 0, 1, 2: stop tokens banned while below 4
    "min-tokens-until-the-rows-count": (
        dict(min_tokens=i32([4]), stop_token_ids=i32([[5, 1, -1]])),
        [
            [2.0, NEG, 3.0, 1.0, 0.5, NEG],
            [2.0, NEG, 3.0, 1.0, 0.5, NEG],
            [2.0, -1.0, 3.0, 1.0, 0.5, -2.0],
        ],
    ),
    "padding-row-copied": (
        dict(req_indices=i32([-1]), allowed_token_mask=bits([[1]], 6)),
        LOGITS.tolist(),
    ),
}


@pytest.mark.parametrize("impl", ["reference", "cpu", "triton", "public"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_named_case(name, impl):
    features, want = CASES[name]
    got = run(impl, full_args(**BASE, **features))
    assert got.tolist() == want


def test_rows_past_the_batch_and_requests_without_drafts_are_processed_as_positions():
    # two requests, k_b = 0 and 1, one extra row past the batch (copied)
    logits = torch.arange(4 * 3, dtype=torch.float32).reshape(4, 3) - 5.0
    a = full_args(
        target_logits=logits, draft_token_ids=i32([2]), cu_num_draft_tokens=i32([0, 0, 1]),
        token_ids=i32([[1, 0], [0, 0]]), num_tokens=i32([2, 1]), num_prompt_tokens=i32([1, 1]),
        repetition_penalty=torch.tensor([1.0, 1.0]), frequency_penalty=torch.tensor([1.0, 1.0]),
        presence_penalty=torch.zeros(2),
    )  # fmt: skip
    want = logits.clone()
    want[0, 0] -= 1  # request 0: output [0]
    want[2, 2] -= 1  # request 1, row 1: draft 2
    for impl in ("reference", "cpu", "triton"):
        assert same(run(impl, a), want), impl


def test_a_batch_of_padding_rows_without_state_rows_is_copied():
    # R = 0: every batch row is padding (found by fuzzing: the kernel read num_tokens[0])
    a = full_args(
        target_logits=torch.randn(2, 8), draft_token_ids=i32([3]), cu_num_draft_tokens=i32([0, 1]),
        token_ids=torch.zeros(0, 4, dtype=I32), num_tokens=torch.zeros(0, dtype=I32),
        num_prompt_tokens=torch.zeros(0, dtype=I32), req_indices=i32([-1]),
        repetition_penalty=torch.tensor([2.0]), frequency_penalty=ONES, presence_penalty=ONES,
    )  # fmt: skip
    for impl in ("reference", "cpu", "triton", "public"):
        assert same(run(impl, a), a["target_logits"]), impl


@pytest.mark.parametrize("V", [1, 31, 32, 33, 70])
def test_token_bitmask_packs_the_bool_mask(V):
    allowed = torch.rand(3, V, generator=torch.Generator().manual_seed(V)) < 0.5
    words = token_bitmask(allowed)
    assert words.dtype == I32 and words.shape == (3, (V + 31) // 32)
    assert torch.equal(words, bits([allowed[r].nonzero().flatten().tolist() for r in range(3)], V))
    with pytest.raises(ValueError, match="bool"):
        token_bitmask(allowed.int())


def test_target_logits_are_not_modified():
    a = full_args(**BASE, repetition_penalty=torch.tensor([2.0]), frequency_penalty=ONES,
                  presence_penalty=ONES, allowed_token_mask=bits([[1]], 6))  # fmt: skip
    before = a["target_logits"].clone()
    for impl in ("reference", "cpu", "triton", "public"):
        run(impl, a)
        assert torch.equal(a["target_logits"], before), impl


# ---------------------------------------------------------------- random batches


def random_args(seed: int, *, dtype=torch.float32, V=45, transposed=False) -> dict:
    g = torch.Generator().manual_seed(seed)
    B, k, R, L = 5, 3, 7, 14
    counts = torch.randint(0, k + 1, (B,), generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]).to(I32)
    N = int(cu[-1])
    rows = N + B + 2
    logits = torch.randn(rows, V, generator=g) * 4
    logits[0, min(1, V - 1)] = float("nan")
    logits[1, : min(3, V)] = float("-inf")
    if transposed:
        logits = logits.t().contiguous().t()
    logits = logits.to(dtype)
    token_ids = torch.randint(0, 7, (R, L), generator=g, dtype=I32)
    token_ids[0, :2] = V  # ids outside [0, V): vLLM pads prompts with V; the op skips them
    num_tokens = torch.randint(0, L + 1, (R,), generator=g, dtype=I32)
    num_prompt = (num_tokens * torch.rand(R, generator=g)).to(I32)
    req = torch.randperm(R, generator=g)[:B].to(I32)
    req[int(torch.randint(0, B, (1,), generator=g))] = -1
    words = torch.randint(0, 7, (B, 4, 3), generator=g, dtype=I32)
    cut = torch.randint(0, 4, (B, 4), generator=g)
    words[torch.arange(3)[None, None, :] >= cut[:, :, None]] = -1
    W = (V + 31) // 32
    rand_bits = lambda n: torch.randint(-(2**31), 2**31, (n, W), generator=g, dtype=torch.int64)  # noqa: E731
    return full_args(
        target_logits=logits,
        draft_token_ids=torch.randint(-1, 7, (N + 2,), generator=g, dtype=I32).index_fill_(
            0, torch.tensor([0]), V
        ),  # one draft id >= V
        cu_num_draft_tokens=cu, token_ids=token_ids, num_tokens=num_tokens,
        num_prompt_tokens=num_prompt, req_indices=req,
        repetition_penalty=torch.tensor([1.0, 1.3, 0.7, 2.0, 1.0]),
        frequency_penalty=torch.tensor([0.5, 0.0, -0.3, 1.0, 0.0]),
        presence_penalty=torch.tensor([0.2, 0.4, 0.0, -1.0, 0.0]),
        logit_bias_ids=torch.randint(-1, V, (B, 3), generator=g, dtype=I32),
        logit_bias_values=torch.randn(B, 3, generator=g),
        allowed_token_mask=(rand_bits(B) | 0xFF).to(I32),
        grammar_mask=(rand_bits(rows) | 0x0F).to(I32), bad_word_ids=words,
        min_tokens=torch.randint(0, 12, (B,), generator=g, dtype=I32),
        stop_token_ids=torch.randint(-1, 7, (B, 2), generator=g, dtype=I32),
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(
    "dtype,transposed",
    [(torch.float32, False), (torch.bfloat16, False), (torch.float16, True)],
)
def test_cpu_and_triton_equal_the_reference_bit_for_bit(seed, dtype, transposed):
    a = random_args(seed, dtype=dtype, transposed=transposed)
    want = run("reference", a)
    for impl in ("cpu", "triton"):
        assert same(run(impl, a), want), impl


def test_more_bad_words_and_stop_tokens_than_one_kernel_tile():
    # the kernel takes words and stop ids 16 at a time and word tokens column by column
    a = random_args(11)
    g = torch.Generator().manual_seed(2)
    B = a["cu_num_draft_tokens"].shape[0] - 1
    words = torch.full((B, 21, 18), -1, dtype=I32)
    lengths = torch.randint(1, 4, (B, 21), generator=g)
    for b in range(B):
        for s_ in range(21):
            n = int(lengths[b, s_])
            words[b, s_, :n] = torch.randint(0, 7, (n,), generator=g, dtype=I32)
    words[:, 20] = 3  # one word of 18 tokens: its prefix is longer than any output
    a.update(bad_word_ids=words, stop_token_ids=torch.randint(-1, 45, (B, 19), generator=g,
                                                              dtype=I32))  # fmt: skip
    want = run("reference", a)
    assert same(run("cpu", a), want) and same(run("triton", a), want)
    assert not same(want, run("reference", {**a, "bad_word_ids": None}))  # the words bite


@pytest.mark.parametrize("programs", [1, 1024])
def test_a_vocabulary_of_several_kernel_chunks(programs, monkeypatch):
    # the kernel splits each row's vocabulary into chunks of whole blocks (one per program;
    # 1024 programs: 3 chunks of one 1024-id block here; 1: one chunk of 3 blocks): every
    # feature's ids spread over the whole vocabulary
    from specdec_kernels.kernels import processing as kernel

    monkeypatch.setattr(kernel, "PROGRAMS", programs)
    V = 2100
    g = torch.Generator().manual_seed(5)
    a = random_args(4, V=V)
    B = a["cu_num_draft_tokens"].shape[0] - 1
    spread = lambda *shape: torch.randint(0, V, shape, generator=g, dtype=I32)  # noqa: E731
    a["token_ids"] = torch.where(a["token_ids"] < 7, a["token_ids"] * 300, a["token_ids"])
    a["draft_token_ids"] = spread(a["draft_token_ids"].shape[0])
    words = spread(B, 4, 3)
    words[:, :, :2] = a["token_ids"][0, :2]  # prefixes that occur
    a.update(bad_word_ids=words, stop_token_ids=spread(B, 3))
    a.update(logit_bias_ids=spread(B, 3))
    want = run("reference", a)
    assert same(run("cpu", a), want) and same(run("triton", a), want)


@pytest.mark.parametrize("drop", ["penalties", "bias", "masks", "bad", "min", "all"])
def test_each_feature_alone_or_absent_matches_the_reference(drop):
    a = random_args(3)
    groups = {
        "penalties": ("repetition_penalty", "frequency_penalty", "presence_penalty"),
        "bias": ("logit_bias_ids", "logit_bias_values"),
        "masks": ("allowed_token_mask", "grammar_mask"),
        "bad": ("bad_word_ids",),
        "min": ("min_tokens", "stop_token_ids"),
    }
    off = FEATURES if drop == "all" else groups[drop]
    a.update(dict.fromkeys(off))
    want = run("reference", a)
    if drop == "all":  # nothing on: every row is the input
        assert same(want, a["target_logits"].float())
    for impl in ("cpu", "triton", "public"):
        assert same(run(impl, a), want), impl


@settings(max_examples=25)
@given(
    seed=st.integers(0, 10**6),
    on=st.lists(st.booleans(), min_size=5, max_size=5),
    V=st.sampled_from([1, 7, 32, 33, 64, 70]),
)
def test_random_feature_mixes_equal_the_reference(seed, on, V):
    a = random_args(seed, V=V)
    groups = [
        ("repetition_penalty", "frequency_penalty", "presence_penalty"),
        ("logit_bias_ids", "logit_bias_values"), ("allowed_token_mask", "grammar_mask"),
        ("bad_word_ids",), ("min_tokens", "stop_token_ids"),
    ]  # fmt: skip
    for keep, names in zip(on, groups, strict=True):
        if not keep:
            a.update(dict.fromkeys(names))
    want = run("reference", a)
    assert same(run("cpu", a), want)
    if seed % 5 == 0:  # the interpreter is slow: a fifth of the cases
        assert same(run("triton", a), want)


_UNCHECKED = r"""
import torch
from specdec_kernels.ops import process_logits
I32 = torch.int32
logits = torch.randn(4, 40)
# cu[B] = 6 > len(drafts) = 2 and 4 logits rows: rows past the drafts, a grammar mask of 3 rows
out = process_logits(
    logits, torch.tensor([1, 2], dtype=I32), torch.tensor([0, 6], dtype=I32),
    torch.zeros(1, 4, dtype=I32), torch.tensor([9], dtype=I32), torch.tensor([-3], dtype=I32),
    repetition_penalty=torch.tensor([1.5]), grammar_mask=torch.full((3, 2), -1, dtype=I32),
    bad_word_ids=torch.tensor([[[1, 2]]], dtype=I32), validate=False,
)
assert out.shape == (4, 40)
print("ok")
"""


def test_unchecked_values_stay_inside_the_arrays(tmp_path):
    # validate=False with cu past the drafts, lengths past the row, a negative prompt
    # length: the CPU path clamps and skips, with numba's bounds checks on (its own cache)
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", NUMBA_CACHE_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", _UNCHECKED], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


# ---------------------------------------------------------------- output invariance

V_TOY = 24
EOS = 1


def toy_logits(context: list[int]) -> torch.Tensor:
    """A deterministic 'model': logits from a hash of the last three tokens."""
    g = torch.Generator().manual_seed(hash(tuple(context[-3:])) % (2**31))
    return torch.randn(V_TOY, generator=g) * 3


def toy_grammar(context: list[int]) -> list[int]:
    """A 'grammar' whose allowed set depends on the context: no token repeats the last one."""
    return [t for t in range(V_TOY) if t != context[-1]]


def features_for(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    words = i32([[[5, -1], [7, 8]]])
    return dict(
        repetition_penalty=torch.tensor([1.0 + float(torch.rand(1, generator=g))]),
        frequency_penalty=torch.tensor([float(torch.rand(1, generator=g))]),
        presence_penalty=torch.tensor([float(torch.rand(1, generator=g)) - 0.5]),
        logit_bias_ids=i32([[2, 3]]), logit_bias_values=torch.tensor([[1.5, -0.5]]),
        allowed_token_mask=bits([list(range(V_TOY - 3))], V_TOY), bad_word_ids=words,
        min_tokens=i32([6]), stop_token_ids=i32([[EOS]]),
    )  # fmt: skip


def step(prompt_len, tokens, drafts, temperature, seed, feats, fused=False):
    """One verify step of the toy model with every feature: the emitted tokens. ``fused``:
    ``rejection_sample(..., processing=...)`` instead of the two ops in turn."""
    contexts = [tokens + drafts[:j] for j in range(len(drafts) + 1)]
    logits = torch.stack([toy_logits(c) for c in contexts])
    grammar = bits([toy_grammar(c) for c in contexts], V_TOY)
    L = len(tokens)
    token_ids = torch.zeros(1, 64, dtype=I32)
    token_ids[0, :L] = i32(tokens)
    flat = i32(drafts) if drafts else torch.zeros(0, dtype=I32)
    processing = LogitsProcessing(token_ids, i32([L]), i32([prompt_len]), grammar_mask=grammar,
                                  **feats)  # fmt: skip
    if not fused:
        logits = process_logits(logits, flat, i32([0, len(drafts)]), **processing._asdict())
    out = rejection_sample(
        logits, flat, i32([0, len(drafts)]), num_speculative_tokens=max(len(drafts), 0),
        temperature=torch.tensor([temperature]), seeds=torch.tensor([seed]),
        offsets=torch.tensor([L - 1]), processing=processing if fused else None,
    )  # fmt: skip
    return out.output_token_ids[0, : int(out.num_emitted[0])].tolist()


@pytest.mark.parametrize("fused", [False, True], ids=["two-ops", "fused"])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_verification_of_processed_rows_emits_what_plain_decoding_emits(seed, temperature, fused):
    feats = features_for(seed)
    prompt = [4, 9, 5, 7]
    plain = list(prompt)
    while len(plain) < len(prompt) + 14:
        plain += step(len(prompt), plain, [], temperature, seed, feats, fused)
    g = torch.Generator().manual_seed(100 + seed)
    spec = list(prompt)
    steps = 0
    while len(spec) < len(plain):
        steps += 1
        ahead = plain[len(spec) : len(spec) + 4]  # the plain sampler's own tokens, perturbed
        drafts = [t if float(torch.rand(1, generator=g)) < 0.8 else (t + 1) % V_TOY for t in ahead]
        spec += step(len(prompt), spec, drafts, temperature, seed, feats, fused)
    assert spec[: len(plain)] == plain
    assert steps < len(plain) - len(prompt)  # drafts were accepted
    out = plain[len(prompt) :]
    assert 5 not in out and EOS not in out[:6]  # a one-token bad word, min_tokens
    assert all(a != b for a, b in zip(plain[len(prompt) - 1 :], out, strict=False))  # the grammar
    assert max(out) < V_TOY - 3  # the allowed tokens


# ---------------------------------------------------------------- errors


def base_public(**kw):
    a = dict(BASE)
    pos = [a.pop(n) for n in ("target_logits", "draft_token_ids", "cu_num_draft_tokens",
                              "token_ids", "num_tokens", "num_prompt_tokens")]  # fmt: skip
    for n in list(kw):
        if n in ("target_logits", "num_prompt_tokens", "num_tokens", "cu_num_draft_tokens",
                 "token_ids"):  # fmt: skip
            pos[["target_logits", "draft_token_ids", "cu_num_draft_tokens", "token_ids",
                 "num_tokens", "num_prompt_tokens"].index(n)] = kw.pop(n)  # fmt: skip
    return process_logits(*pos, **kw)


ERRORS = [
    (dict(repetition_penalty=torch.tensor([0.0])), r"repetition_penalty must lie in \(0"),
    (dict(repetition_penalty=torch.tensor([float("inf")])), "repetition_penalty must lie in"),
    (dict(frequency_penalty=torch.tensor([float("nan")])), "frequency_penalty must lie in"),
    (dict(presence_penalty=torch.ones(2)), r"presence_penalty must have shape \(1,\)"),
    (dict(logit_bias_ids=i32([[6]]), logit_bias_values=torch.ones(1, 1)),
     r"logit_bias_ids must lie in \[-1, 5\]"),
    (dict(logit_bias_ids=i32([[1]])), "logit_bias_ids and logit_bias_values go together"),
    (dict(logit_bias_ids=i32([[1]]), logit_bias_values=torch.tensor([[float("inf")]])),
     "logit_bias_values must lie in"),
    (dict(allowed_token_mask=torch.zeros(1, 2, dtype=I32)),
     r"allowed_token_mask must have shape \(1, 1\)"),
    (dict(grammar_mask=torch.zeros(2, 1, dtype=I32)), "grammar_mask must have at least"),
    (dict(grammar_mask=torch.zeros(3, 2, dtype=I32)), r"grammar_mask must have shape \(3, 1\)"),
    (dict(bad_word_ids=torch.zeros(1, 1, 7, dtype=I32)), "longer than max_model_len"),
    (dict(bad_word_ids=i32([[[6, -1]]])), r"bad_word_ids must lie in \[-1, 5\]"),
    (dict(min_tokens=i32([-1]), stop_token_ids=i32([[1]])), r"min_tokens must lie in \[0"),
    (dict(min_tokens=i32([1])), "min_tokens and stop_token_ids go together"),
    (dict(target_logits=torch.zeros(2, 6)), "target_logits must have at least"),
    (dict(num_prompt_tokens=i32([5])), r"num_prompt_tokens must lie in \[0, num_tokens\]"),
    (dict(cu_num_draft_tokens=i32([0, 3])), r"cu_num_draft_tokens\[B\] must be <="),
    (dict(repetition_penalty=torch.tensor([1.0], dtype=torch.float64)), "repetition_penalty"),
    (dict(min_tokens=i32([1]), stop_token_ids=i32([[6]])), r"stop_token_ids must lie in \[-1, 5\]"),
    (dict(num_tokens=i32([7])), r"num_tokens must lie in \[0, 6\]"),
    (dict(cu_num_draft_tokens=i32([0, -1])), "cu_num_draft_tokens"),
    (dict(cu_num_draft_tokens=i32([1, 2])), r"cu_num_draft_tokens\[0\] must be 0"),
    (dict(target_logits=torch.zeros(3, 0)), "vocabulary of at least 1"),
    (dict(req_indices=i32([1])), "req_indices"),
    (dict(logit_bias_ids=i32([[1, 2]]), logit_bias_values=torch.ones(1, 1)),
     r"logit_bias_values must have shape \(1, 2\)"),
    (dict(bad_word_ids=i32([[1, 2]])), "bad_word_ids"),
    (dict(num_prompt_tokens=i32([1, 1])), r"num_prompt_tokens must have shape \(1,\)"),
    (dict(token_ids=torch.zeros(1, 6, dtype=I32, device="meta"),
          num_tokens=torch.zeros(1, dtype=I32, device="meta")), "token_ids must be on cpu"),
]  # fmt: skip


@pytest.mark.parametrize("kw,match", ERRORS, ids=[m for _, m in ERRORS])
def test_bad_input_raises_a_value_error(kw, match):
    with pytest.raises(ValueError, match=match):
        base_public(**kw)


def test_the_op_takes_the_three_penalties_together():
    a = full_args(**BASE, repetition_penalty=torch.tensor([2.0]))
    for impl in ("cpu", "triton"):
        with pytest.raises(ValueError, match="together"):
            run(impl, a)
    # the wrapper fills the others with their neutral values
    neutral = {**a, "frequency_penalty": torch.zeros(1), "presence_penalty": torch.zeros(1)}
    assert same(run("public", a), run("reference", neutral))


# ------------------------------------------------- rejection_sample(..., processing=...)

PROCESSING_FIELDS = LogitsProcessing._fields


def processing_of(a: dict) -> LogitsProcessing:
    return LogitsProcessing(**{n: a[n] for n in PROCESSING_FIELDS})


def verify_both(a: dict, **kw):
    """``rejection_sample`` with ``processing=`` (on CPU tensors: the one-kernel route) and
    on the rows ``process_logits`` returns (the two ops in turn)."""
    rows = (a["draft_token_ids"], a["cu_num_draft_tokens"])
    proc = processing_of(a)
    fused = rejection_sample(a["target_logits"], *rows, processing=proc, **kw)
    processed = process_logits(a["target_logits"], *rows, **proc._asdict())
    return fused, rejection_sample(processed, *rows, **kw)


def same_result(got, want) -> bool:
    lp_same = (got.logprobs is None and want.logprobs is None) or same(got.logprobs, want.logprobs)
    return (torch.equal(got.output_token_ids, want.output_token_ids)
            and torch.equal(got.num_emitted, want.num_emitted) and lp_same)  # fmt: skip


def accepted_drafts(a: dict, k: int) -> dict:
    """``a`` with each request's drafts set to its processed rows' argmax, so that greedy
    verification reaches every row (row ``j``'s processing depends on the drafts before
    it: built one position at a time)."""
    a = dict(a)
    cu = a["cu_num_draft_tokens"]
    drafts = a["draft_token_ids"].clone()
    for j in range(k):
        a["draft_token_ids"] = drafts
        rows = process_logits(a["target_logits"], drafts, cu, **processing_of(a)._asdict())
        for b in range(cu.shape[0] - 1):
            if j < int(cu[b + 1] - cu[b]):
                drafts[int(cu[b]) + j] = int(rows[int(cu[b]) + b + j].nan_to_num(-1e30).argmax())
    a["draft_token_ids"] = drafts
    return a


def sampled(B: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    temp = torch.rand(B, generator=g) * 1.5
    temp[0] = 0.0  # one greedy request in a sampled batch
    return dict(temperature=temp, top_k=torch.randint(0, 6, (B,), generator=g),
                top_p=torch.rand(B, generator=g) * 0.5 + 0.5,
                min_p=torch.rand(B, generator=g) * 0.2,
                seeds=torch.randint(0, 2**40, (B,), generator=g),
                offsets=torch.randint(0, 100, (B,), generator=g))  # fmt: skip


def verify_kwargs(a: dict, mode: str, seed: int, k: int) -> dict:
    """``rejection_sample``'s keyword arguments for ``a`` in ``mode`` (``greedy``,
    ``greedy-logprobs``, ``sampled`` or ``draft-probs``)."""
    kw = dict(num_speculative_tokens=k, return_logprobs=mode != "greedy")
    if mode in ("sampled", "draft-probs"):
        kw.update(sampled(a["cu_num_draft_tokens"].shape[0] - 1, seed))
    if mode == "draft-probs":
        g = torch.Generator().manual_seed(seed)
        q = torch.rand(a["draft_token_ids"].shape[0], a["target_logits"].shape[1], generator=g)
        kw["draft_probs"] = q / q.sum(-1, keepdim=True)
    return kw


@pytest.mark.parametrize("mode", ["greedy", "greedy-logprobs", "sampled", "draft-probs"])
@pytest.mark.parametrize("accept", [False, True], ids=["random-drafts", "accepted-drafts"])
@pytest.mark.parametrize(
    "dtype,transposed", [(torch.float32, False), (torch.bfloat16, False), (torch.float16, True)]
)
@pytest.mark.parametrize("seed", range(4))
def test_verification_with_processing_equals_verifying_the_processed_rows(
    seed, dtype, transposed, accept, mode
):  # fmt: skip
    a = random_args(seed, dtype=dtype, transposed=transposed)
    if accept:
        a = accepted_drafts(a, 3)
    fused, two = verify_both(a, **verify_kwargs(a, mode, seed, 3))
    assert same_result(fused, two)
    if accept and mode == "greedy":  # the drafts are the processed argmax: all accepted
        counts = a["cu_num_draft_tokens"].diff()
        live = a["req_indices"] >= 0
        assert torch.equal(fused.num_emitted[live], (counts + 1).to(I32)[live])


@settings(max_examples=60)
@given(
    seed=st.integers(0, 10**6),
    on=st.lists(st.booleans(), min_size=6, max_size=6),
    V=st.sampled_from([7, 9, 33, 64]),  # random_args names ids up to 6
    ties=st.booleans(),
    bf16=st.booleans(),
)
def test_the_greedy_shortcut_equals_the_processed_argmax(seed, on, V, ties, bf16):
    # greedy rows take the raw row's argmax and process only the ids that can beat it;
    # small integer logits make ties, +-0, named, masked and seen maxima common (V = 33
    # and 64: flat rows past the seen argmax's scan cap of 8 ids); decreasing and
    # increasing penalties, bias on the raw argmax, rows of -inf and NaN
    dtype = torch.bfloat16 if bf16 else torch.float32
    a = random_args(seed, V=V, dtype=dtype)
    a = accepted_drafts(a, 3) if on[5] else a
    g = torch.Generator().manual_seed(seed)
    logits = a["target_logits"]
    if ties:
        logits = torch.randint(-2, 3, logits.shape, generator=g).to(dtype)
        logits[logits == 0] = torch.tensor([0.0, -0.0])[torch.randint(0, 2, (1,), generator=g)]
        logits[2] = float("-inf")
        logits[3, : max(V // 2, 1)] = float("nan")
    a["target_logits"] = logits
    groups = [
        ("repetition_penalty", "frequency_penalty", "presence_penalty"),
        ("logit_bias_ids", "logit_bias_values"), ("allowed_token_mask", "grammar_mask"),
        ("bad_word_ids",), ("min_tokens", "stop_token_ids"),
    ]  # fmt: skip
    for keep, names in zip(on[:5], groups, strict=True):
        if not keep:
            a.update(dict.fromkeys(names))
    if a["repetition_penalty"] is not None and seed % 2:  # penalties that only lower logits
        B = a["repetition_penalty"].shape[0]
        a.update(repetition_penalty=torch.full((B,), 1.5), frequency_penalty=torch.full((B,), 0.5),
                 presence_penalty=torch.zeros(B))  # fmt: skip
    fused, two = verify_both(a, num_speculative_tokens=3)
    assert same_result(fused, two)


def test_the_routes_agree():
    # plain CPU tensors: one kernel; under a torch function mode (as compile, fake tensors
    # and other devices): process_logits then rejection_sample, the dispatcher's way
    a = accepted_drafts(random_args(5), 3)
    rows = (a["target_logits"], a["draft_token_ids"], a["cu_num_draft_tokens"])
    kw = dict(num_speculative_tokens=3, return_logprobs=True, processing=processing_of(a))
    direct = rejection_sample(*rows, **kw)
    with torch.device("cpu"):  # a torch function mode: the ops go through the dispatcher
        dispatched = rejection_sample(*rows, **kw)
    assert same_result(direct, dispatched)
    compiled = torch.compile(lambda *r: rejection_sample(*r, **kw), backend="aot_eager",
                             fullgraph=True)  # fmt: skip
    assert same_result(compiled(*rows), direct)


def test_plain_cpu_tensors_take_the_one_kernel_route(monkeypatch):
    # else every "fused" comparison above would compare the two ops with themselves
    from specdec_kernels.cpu import rejection as cpu_rejection

    calls = []
    kernel = cpu_rejection.rejection_sample_processed
    monkeypatch.setattr(cpu_rejection, "rejection_sample_processed",
                        lambda *a, **kw: calls.append(1) or kernel(*a, **kw))  # fmt: skip
    a = random_args(1)
    rows = (a["target_logits"], a["draft_token_ids"], a["cu_num_draft_tokens"])
    rejection_sample(*rows, num_speculative_tokens=3, processing=processing_of(a))
    assert calls == [1]
    with torch.device("cpu"):
        rejection_sample(*rows, num_speculative_tokens=3, processing=processing_of(a))
    assert calls == [1]  # a mode: the two ops


def test_a_logits_processing_unpacks_into_the_checks_in_order():
    # rejection_sample passes a LogitsProcessing to the checks positionally
    import inspect

    from specdec_kernels.ops._processing_args import prepare

    names = list(inspect.signature(prepare).parameters)
    assert names[3 : 3 + len(LogitsProcessing._fields)] == list(LogitsProcessing._fields)


@pytest.mark.parametrize("fused", [False, True], ids=["process_logits", "fused"])
def test_masked_ids_stay_minus_inf_whatever_the_penalties(fused):
    # a negative frequency penalty of -3e38 on a token seen twice overflows to +inf; the
    # mask still makes it -inf (not NaN): the mask's place in the order does not matter
    a = dict(BASE, target_logits=torch.tensor([[0.0, 1.0, 2.0, 3.0]]),
             draft_token_ids=torch.zeros(0, dtype=I32), cu_num_draft_tokens=i32([0, 0]),
             token_ids=i32([[2, 1, 1]]), num_tokens=i32([3]), num_prompt_tokens=i32([1]),
             req_indices=None, **dict.fromkeys(FEATURES))  # fmt: skip
    a.update(frequency_penalty=torch.tensor([-3e38]), repetition_penalty=torch.ones(1),
             presence_penalty=torch.zeros(1), allowed_token_mask=bits([[0, 2, 3]], 4))  # fmt: skip
    names = ("target_logits", "draft_token_ids", "cu_num_draft_tokens")
    rows = process_logits(*(a[n] for n in names), **processing_of(a)._asdict())
    assert same(rows, run("reference", a)) and rows[0, 1] == NEG
    fused_out, two = verify_both(a, num_speculative_tokens=0, return_logprobs=True)
    assert same_result(fused_out, two)


PROCESSING_ERRORS = [
    *ERRORS,  # process_logits' checks run first: its messages, also where both ops check
    (dict(cu_num_draft_tokens=torch.zeros(0, dtype=I32)), r"got \(0,\)$"),
]


@pytest.mark.parametrize("kw,match", PROCESSING_ERRORS, ids=[m for _, m in PROCESSING_ERRORS])
def test_bad_processing_raises_what_process_logits_raises(kw, match):
    a = {**BASE, **kw}
    rows = (a.pop("target_logits"), a.pop("draft_token_ids"), a.pop("cu_num_draft_tokens"))
    proc = LogitsProcessing(a.pop("token_ids"), a.pop("num_tokens"), a.pop("num_prompt_tokens"),
                            **a)  # fmt: skip
    with pytest.raises(ValueError, match=match):
        rejection_sample(*rows, num_speculative_tokens=2, processing=proc)


def test_processing_must_be_a_logits_processing():
    rows = (BASE["target_logits"], BASE["draft_token_ids"], BASE["cu_num_draft_tokens"])
    with pytest.raises(ValueError, match="processing must be a LogitsProcessing"):
        rejection_sample(*rows, num_speculative_tokens=2, processing={"token_ids": None})


@pytest.mark.parametrize("seed", range(200))
def test_the_kernel_refuses_exactly_what_the_wrappers_refuse(seed):
    # random single bad values: the one-kernel route's checks (inside the kernel) and the
    # two ops' (in Python) raise the same ValueError, or neither does
    g = torch.Generator().manual_seed(seed)
    a = random_args(seed)
    pick = int(torch.randint(0, 10, (1,), generator=g))
    bad = {
        0: ("req_indices", lambda t: t.index_fill(0, torch.tensor([0]), 7 + seed % 3)),
        1: ("num_tokens", lambda t: t.index_fill(0, torch.tensor([seed % 7]), 15)),
        2: ("num_prompt_tokens", lambda t: t.index_fill(0, torch.tensor([seed % 7]), 14)),
        3: ("repetition_penalty", lambda t: t.index_fill(0, torch.tensor([1]), -0.5 * (seed % 2))),
        4: ("frequency_penalty", lambda t: t.index_fill(0, torch.tensor([2]), float("inf"))),
        5: ("logit_bias_values", lambda t: t.index_fill(1, torch.tensor([0]), float("nan"))),
        6: ("logit_bias_ids", lambda t: t.index_fill(1, torch.tensor([1]), -2 + 47 * (seed % 2))),
        7: ("stop_token_ids", lambda t: t.index_fill(1, torch.tensor([0]), 45)),
        8: ("min_tokens", lambda t: t.index_fill(0, torch.tensor([seed % 5]), -(seed % 2))),
        9: ("presence_penalty", lambda t: t.index_fill(0, torch.tensor([3]), float("-inf"))),
    }[pick]
    a[bad[0]] = bad[1](a[bad[0]])
    rows = (a["target_logits"], a["draft_token_ids"], a["cu_num_draft_tokens"])
    errors = []
    for fused in (True, False):
        try:
            if fused:
                rejection_sample(*rows, num_speculative_tokens=3, processing=processing_of(a))
            else:
                processed = process_logits(*rows, **processing_of(a)._asdict())
                rejection_sample(processed, *rows[1:], num_speculative_tokens=3)
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    assert errors[0] == errors[1]


def bias(t: int, v: float) -> dict:
    return dict(logit_bias_ids=i32([[t]]), logit_bias_values=torch.tensor([[v]]))


SHORTCUT_CASES = {
    # (raw row, processing fields, expected greedy token); the raw argmax is never named
    "repetition-below-1-raises-a-seen-token": (
        [0.0, 3.0, 0.0, 3.5], dict(repetition_penalty=torch.tensor([0.5])), 1),
    "negative-frequency-raises-a-seen-token": (
        [0.0, 3.0, 0.0, 3.5], dict(frequency_penalty=torch.tensor([-1.0])), 1),
    "negative-presence-raises-a-seen-token": (
        [0.0, 3.0, 0.0, 3.5], dict(presence_penalty=torch.tensor([-0.75])), 1),
    "bias-ties-a-lower-id-which-wins": ([0.0, 1.0, 0.0, 3.0], bias(0, 3.0), 0),
    "bias-ties-a-higher-id-which-loses": ([0.0, 3.0, 0.0, 1.0], bias(3, 2.0), 1),
    "bias-ties-a-lower-id-with-decreasing-penalties-on": (
        [0.0, 1.0, 0.0, 3.0], dict(bias(0, 3.0), repetition_penalty=torch.tensor([1.5])), 0),
    "bias-raises-a-seen-token-past-its-penalty": (
        [0.0, 2.0, 0.0, 3.0], dict(bias(1, 4.0), repetition_penalty=torch.tensor([1.5])), 1),
    "bias-on-a-banned-id-stays-banned": (
        [0.0, 1.0, 0.0, 3.0], dict(bias(2, 9.0), bad_word_ids=i32([[[2]]])), 3),
    "bias-on-a-masked-id-stays-masked": (
        [0.0, 1.0, 0.0, 3.0], dict(bias(2, 9.0), allowed_token_mask=bits([[0, 1, 3]], 4)), 3),
    # a masked raw argmax: the masked row's argmax takes its place
    "masked-argmax-the-allowed-runner-up-wins": (
        [0.0, 1.0, 2.0, 3.0], dict(allowed_token_mask=bits([[0, 1, 2]], 4)), 2),
    "masked-argmax-ties-go-to-the-lower-allowed-id": (
        [0.0, 2.0, 2.0, 3.0], dict(allowed_token_mask=bits([[0, 2, 1]], 4)), 1),
    "masked-argmax-a-seen-runner-up-is-penalised-below-the-next": (
        [2.0, 2.5, 0.0, 3.0],
        dict(allowed_token_mask=bits([[0, 1]], 4), repetition_penalty=torch.tensor([2.0])), 0),
    "masked-argmax-a-bias-id-beats-the-runner-up": (
        [0.0, 1.0, 2.0, 3.0], dict(bias(0, 2.5), allowed_token_mask=bits([[0, 1, 2]], 4)), 0),
    "masked-argmax-the-runner-up-is-a-stop-token": (
        [0.0, 1.0, 2.0, 3.0], dict(allowed_token_mask=bits([[0, 1, 2]], 4),
                                   min_tokens=i32([5]), stop_token_ids=i32([[2]])), 1),
    "masked-argmax-every-allowed-id-is-minus-inf": (
        [float("-inf"), float("nan"), 0.0, 3.0], dict(allowed_token_mask=bits([[0, 1]], 4)), 0),
    # a seen argmax (history: prompt [2], output [1, 1]): its penalised value, then the
    # ids whose raw value reaches it, each processed alone
    "seen-argmax-penalised-below-the-runner-up": (
        [0.0, 3.0, 0.0, 2.9], dict(repetition_penalty=torch.tensor([2.0])), 3),
    "seen-argmax-still-wins-after-its-penalty": (
        [0.0, 3.0, 0.0, 1.0], dict(repetition_penalty=torch.tensor([1.2])), 1),
    "seen-argmax-a-seen-runner-up-is-penalised-too": (
        [0.0, 3.0, 2.8, 1.0], dict(repetition_penalty=torch.tensor([2.0])), 1),
    "seen-argmax-in-the-prompt-only-takes-no-frequency-penalty": (
        [0.0, 0.0, 3.0, 2.5], dict(frequency_penalty=torch.tensor([1.0])), 2),
    "seen-argmax-counted-twice-in-the-output": (
        [0.0, 3.0, 0.0, 1.5], dict(frequency_penalty=torch.tensor([0.8])), 3),
    "seen-argmax-ties-a-lower-unseen-id-which-wins": (
        [2.0, 4.0, 0.0, 0.0], dict(repetition_penalty=torch.tensor([2.0])), 0),
    "seen-argmax-of-the-masked-row": (
        [0.0, 2.0, 0.0, 9.0, 1.5], dict(allowed_token_mask=bits([[0, 1, 2, 4]], 5),
                                       presence_penalty=torch.tensor([1.0])), 4),
    "seen-argmax-a-bias-id-beats-its-penalised-value": (
        [0.0, 3.0, 0.0, 1.0], dict(bias(0, 2.0), repetition_penalty=torch.tensor([2.0])), 0),
    "seen-argmax-of-a-flat-row-past-the-scan-cap": (  # 10 masked ids reach 2.0: then 14
        [0.0, 4.0, 0.0] + [3.0] * 10 + [1.0, 2.5],
        dict(allowed_token_mask=bits([[0, 1, 2, 13, 14]], 15),
             repetition_penalty=torch.tensor([2.0])), 14),
    "seen-argmax-penalised-to-minus-inf": (  # the full row: all -inf or NaN, so id 0
        [float("nan"), -2.0, float("-inf"), float("-inf")],
        dict(repetition_penalty=torch.tensor([3e38])), 0),
    "seen-argmax-penalised-to-nan": (  # inf - inf: NaN reads as -inf, so id 0 (1.0) wins
        [1.0, float("inf"), 0.5, 0.0], dict(frequency_penalty=torch.tensor([2e38])), 0),
    "masked-argmax-from-the-grammar-mask": (
        [0.0, 1.0, 2.0, 3.0], dict(grammar_mask=bits([[1, 3]], 4), bad_word_ids=i32([[[3]]])),
        1),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SHORTCUT_CASES))
def test_greedy_shortcut_named_cases(name):
    row, fields, want = SHORTCUT_CASES[name]
    # history: prompt [2], output [1, 1]; no drafts (the bonus row only)
    a = dict(BASE, target_logits=torch.tensor([row]), draft_token_ids=torch.zeros(0, dtype=I32),
             cu_num_draft_tokens=i32([0, 0]), token_ids=i32([[2, 1, 1]]), num_tokens=i32([3]),
             num_prompt_tokens=i32([1]), req_indices=None, **dict.fromkeys(FEATURES))  # fmt: skip
    a.update(fields)
    fused, two = verify_both(a, num_speculative_tokens=0)
    assert same_result(fused, two)
    assert fused.output_token_ids.tolist() == [[want]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_shortcut_scans_other_blocks_for_ties_with_a_seen_argmax(dtype):
    # V past one 1024-id block: the seen argmax (2050, penalised 4 -> 2) ties id 5 of the
    # first block, whose maximum equals the best: that block must be read, and 5 wins
    V = 2100
    row = torch.zeros(1, V)
    row[0, 2050], row[0, 5], row[0, 1500] = 4.0, 2.0, 1.0
    a = dict(BASE, target_logits=row.to(dtype), draft_token_ids=torch.zeros(0, dtype=I32),
             cu_num_draft_tokens=i32([0, 0]), token_ids=i32([[2050, 7, 7]]), num_tokens=i32([3]),
             num_prompt_tokens=i32([1]), req_indices=None, **dict.fromkeys(FEATURES))  # fmt: skip
    a["repetition_penalty"] = torch.tensor([2.0])
    fused, two = verify_both(a, num_speculative_tokens=0)
    assert same_result(fused, two)
    assert fused.output_token_ids.tolist() == [[5]]


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(3))
def test_gpu_verification_with_processing_equals_the_cpu_route(seed):
    # on CUDA tensors the two ops run in turn (Triton); greedy: the CPU kernel's tokens
    a = accepted_drafts(random_args(seed, V=64), 3)
    cuda = {n: t.cuda() if isinstance(t, torch.Tensor) else t for n, t in a.items()}
    kw = dict(num_speculative_tokens=3, return_logprobs=True)
    rows = ("target_logits", "draft_token_ids", "cu_num_draft_tokens")
    want = rejection_sample(*(a[n] for n in rows), processing=processing_of(a), **kw)
    got = rejection_sample(*(cuda[n] for n in rows), processing=processing_of(cuda), **kw)
    assert torch.equal(got.output_token_ids.cpu(), want.output_token_ids)
    assert torch.equal(got.num_emitted.cpu(), want.num_emitted)
    live = torch.arange(4)[None, :] < want.num_emitted[:, None]
    torch.testing.assert_close(got.logprobs.cpu()[live], want.logprobs[live], rtol=1e-5, atol=1e-5)


def test_greedy_shortcut_counts_the_drafts_before_the_row():
    # row 1's raw argmax is d_0, in no history: with a penalty it is a seen token there
    a = dict(BASE, target_logits=torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 3.0]] * 2),
             draft_token_ids=i32([5]), cu_num_draft_tokens=i32([0, 1]),
             token_ids=i32([[2, 1, 1]]), num_tokens=i32([3]), num_prompt_tokens=i32([1]),
             req_indices=None, **dict.fromkeys(FEATURES))  # fmt: skip
    a["target_logits"][1, 4] = 2.0  # 5 penalised by 2: 1.5, below 4's 2.0
    a["repetition_penalty"] = torch.tensor([2.0])
    fused, two = verify_both(a, num_speculative_tokens=1)
    assert same_result(fused, two)
    assert fused.output_token_ids.tolist() == [[5, 4]]


_UNCHECKED_FUSED = r"""
import torch
from specdec_kernels.ops import LogitsProcessing, rejection_sample
I32 = torch.int32
g = torch.Generator().manual_seed(0)
for trial in range(300):
    V = int(torch.randint(1, 70, (1,), generator=g))
    logits = torch.randn(6, V, generator=g)
    ids = lambda *shape: torch.randint(-5, V + 5, shape, generator=g, dtype=I32)  # noqa: E731
    W = (V + 31) // 32
    words = lambda n: torch.randint(-2**31, 2**31, (n, W), generator=g).to(I32)  # noqa: E731
    proc = LogitsProcessing(
        ids(3, 5), torch.randint(-3, 9, (3,), generator=g, dtype=I32),
        torch.randint(-3, 9, (3,), generator=g, dtype=I32), req_indices=ids(2) % 5 - 1,
        repetition_penalty=torch.randn(2, generator=g),
        frequency_penalty=torch.randn(2, generator=g),
        presence_penalty=torch.randn(2, generator=g), logit_bias_ids=ids(2, 3),
        logit_bias_values=torch.randn(2, 3, generator=g),
        allowed_token_mask=words(2), grammar_mask=words(6),
        bad_word_ids=ids(2, 2, 3), min_tokens=ids(2), stop_token_ids=ids(2, 2),
    )
    cu = torch.tensor([0, int(torch.randint(-2, 5, (1,), generator=g)), 3], dtype=I32)
    out = rejection_sample(logits, ids(4), cu, num_speculative_tokens=2, processing=proc,
                           validate=False)
    assert out.output_token_ids.shape == (2, 3)
print("ok")
"""


def test_unchecked_values_stay_inside_the_arrays_with_processing(tmp_path):
    # validate=False with garbage everywhere (lengths, ids, rows, cu): the one-kernel route
    # clamps and skips, with numba's bounds checks on (its own cache)
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", NUMBA_CACHE_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", _UNCHECKED_FUSED], env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]
