"""top_logprobs: named cases, reference == CPU path == CUDA path (its torch code and Triton
kernel on CPU tensors) on random slots with ties, NaN and rows without a finite maximum, in
the raw and the processed modes, agreement with rejection_sample's logprobs, its samples and
vLLM's rule (log_softmax, then topk), errors."""

from __future__ import annotations

import math

import pytest
import torch

from specdec_kernels.cpu.logprobs import top_logprobs as cpu_top
from specdec_kernels.cpu.logprobs import top_logprobs_checked as cpu_top_checked
from specdec_kernels.kernels.logprobs import top_logprobs as cuda_top
from specdec_kernels.ops import rejection_sample, top_logprobs
from specdec_kernels.reference.logprobs import top_logprobs as reference_top

I32 = torch.int32
INF = float("inf")
IMPLS = {"reference": reference_top, "cpu": cpu_top, "cuda": cuda_top}


def _i32(x):
    return torch.tensor(x, dtype=I32)


def _one_slot(row, tok, N, mode="raw_logprobs"):
    logits = torch.tensor([row], dtype=torch.float32)
    return top_logprobs(logits, _i32([[tok]]), _i32([1]), _i32([0, 0]), num_logprobs=N,
                        logprobs_mode=mode)  # fmt: skip


@pytest.mark.parametrize("impl", IMPLS)
def test_named_rows(impl):
    fn = IMPLS[impl]
    cases = [  # (row, token, N, mode) -> (ids, values, token value, rank)
        ([1.0, 3.0, 3.0, -1.0], 2, 3, "raw_logits", [1, 2, 0], [3.0, 3.0, 1.0], 3.0, 2),
        ([-0.0, 0.0, -5.0], 1, 2, "raw_logits", [0, 1], [0.0, 0.0], 0.0, 2),  # -0.0 == 0.0
        ([float("nan"), 2.0, -INF], 0, 3, "raw_logits", [1, 0, 2], [2.0, -INF, -INF], -INF, 3),
        ([-INF], 0, 1, "raw_logprobs", [0], [0.0], 0.0, 1),  # V = 1, -inf: log 1
        (
            [-INF, -INF, -INF],
            1,
            2,
            "raw_logprobs",
            [0, 1],
            [-1.0986123, -1.0986123],
            -1.0986123,
            3,
        ),  # fmt: skip
        (
            [INF, 0.0, INF],
            1,
            3,
            "raw_logprobs",
            [0, 2, 1],
            [-0.6931472, -0.6931472, -INF],
            -INF,
            3,
        ),  # fmt: skip
        ([0.0, 1.0], 1, 0, "raw_logprobs", [], [], -0.3132617, 1),
    ]
    for row, tok, N, mode, ids, values, tok_value, rank in cases:
        a = (torch.tensor([row]), _i32([[tok]]), _i32([1]), _i32([0, 0]))
        got = fn(*a, num_logprobs=N, logprobs_mode=mode)
        assert got[2][0, 0].tolist() == ids, (row, impl)
        torch.testing.assert_close(got[3][0, 0], torch.tensor(values), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got[0][0, 0], torch.tensor(tok_value), rtol=1e-5, atol=1e-6)
        assert int(got[1][0, 0]) == rank, (row, impl)


def _random_case(g, dtype):
    B, k = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(0, 4, (1,), generator=g))
    V = int(torch.randint(1, 40, (1,), generator=g))
    counts = torch.randint(0, k + 1, (B,), generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]).to(I32)
    rows = int(cu[-1]) + B + int(torch.randint(0, 3, (1,), generator=g))
    logits = torch.randn(rows, V, generator=g) * 3
    if torch.rand(1, generator=g) < 0.5:
        logits = logits.round()  # ties
    special = torch.rand(rows, V, generator=g)
    logits[special < 0.05] = float("nan")
    logits[(special > 0.05) & (special < 0.1)] = -INF
    logits[special > 0.99] = INF
    logits[torch.rand(rows, generator=g) < 0.1] = -INF  # whole rows without a finite maximum
    emitted = torch.minimum(torch.randint(0, k + 2, (B,), generator=g), counts + 1).to(I32)
    out = torch.randint(0, V, (B, k + 1), generator=g, dtype=I32)
    out[torch.arange(k + 1)[None, :] >= emitted[:, None]] = -1
    N = int(torch.randint(0, V + 1, (1,), generator=g))
    return logits.to(dtype), out, emitted, cu, N


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["raw_logprobs", "raw_logits"])
def test_every_path_equals_the_reference_on_random_slots(dtype, mode, kernel_device):
    # the CUDA path on the device where there is one (bench/gpu_check.sh), else on CPU tensors
    g = torch.Generator().manual_seed(len(str(dtype)) * 7 + len(mode))
    for trial in range(60):
        logits, out, emitted, cu, N = _random_case(g, dtype)
        want = reference_top(logits, out, emitted, cu, num_logprobs=N, logprobs_mode=mode)
        for impl in ("cpu", "cuda"):
            a = (logits, out, emitted, cu)
            if impl == "cuda":
                a = tuple(t.to(kernel_device) for t in a)
            got = IMPLS[impl](*a, num_logprobs=N, logprobs_mode=mode)
            got = tuple(t.cpu() for t in got)
            what = (impl, trial)
            assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), what
            torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6, msg=str(what))
            torch.testing.assert_close(got[3], want[3], rtol=1e-5, atol=1e-6, msg=str(what))


@pytest.mark.parametrize("N", [3, 20, 100, 200])  # 200: past the kernel's MAX_KERNEL_N
def test_every_path_equals_the_reference_on_rows_of_several_blocks(N, kernel_device):
    # V past 2 x 1024: the CPU path skips the blocks below its top N (or, N > 64, sorts)
    g = torch.Generator().manual_seed(N)
    for trial, dtype in enumerate((torch.float32, torch.bfloat16, torch.float16) * 2):
        V = int(torch.randint(2100, 5000, (1,), generator=g))
        logits = (torch.randn(3, V, generator=g) * 4).round(decimals=trial % 2)  # ties
        logits[1, torch.randint(0, V, (40,), generator=g)] = logits[1].max()  # tied maxima
        logits[2, ::7] = float("nan")
        logits = logits.to(dtype)
        out, emitted, cu = _i32([[int(logits[0].argmax()), 5, 7]]), _i32([3]), _i32([0, 2])
        for mode in ("raw_logprobs", "raw_logits"):
            want = reference_top(logits, out, emitted, cu, num_logprobs=N, logprobs_mode=mode)
            for impl in ("cpu", "cuda"):
                a = (logits, out, emitted, cu)
                if impl == "cuda":
                    a = tuple(t.to(kernel_device) for t in a)
                got = tuple(t.cpu() for t in IMPLS[impl](*a, num_logprobs=N, logprobs_mode=mode))
                what = f"{impl} {trial} {mode}"
                assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), what
                torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6, msg=what)
                torch.testing.assert_close(got[3], want[3], rtol=1e-5, atol=1e-6, msg=what)


@pytest.mark.parametrize("N", [1, 5, 40, 128])
def test_every_path_equals_the_reference_when_ties_pass_the_kernels_candidate_buffer(
    N, kernel_device
):
    # the kernel gathers the ids at or above its lanes' N-th largest maximum into 4 x N
    # (>= 64) slots; ties there overflow them and it searches the N-th largest key: a
    # constant row, two levels, a few integer levels, tied maxima with a tail of -inf,
    # and a tie at the low ids that would fill the slots before the larger last ids
    V = 3000
    g = torch.Generator().manual_seed(N)
    late = torch.zeros(V)
    late[2900:] = -1.0
    late[-(N // 2 + 1) :] = 1.0
    levels = torch.randint(0, 4, (V,), generator=g).float()
    rows = torch.stack([
        torch.zeros(V), (torch.arange(V) % 2).float(), levels,
        torch.where(torch.arange(V) < 700, 5.0, float("-inf")), late,
    ])  # fmt: skip
    out, emitted, cu = _i32([[0, 1, 2, 3, 4]]), _i32([5]), _i32([0, 4])
    for dtype in (torch.float32, torch.bfloat16):
        for mode in ("raw_logprobs", "raw_logits"):
            a = (rows.to(dtype), out, emitted, cu)
            _paths_equal_the_reference(a, N, mode, kernel_device, f"N={N} {dtype} {mode}")


def _sampling_params(g, B):
    """Random per-request temperature (some greedy), top-k, top-p and min-p, each of the
    three filters absent now and then."""
    T = torch.rand(B, generator=g) * 1.5 + 0.05
    T[torch.rand(B, generator=g) < 0.3] = 0.0
    params = [
        T,
        torch.randint(0, 12, (B,), generator=g, dtype=I32),
        torch.where(torch.rand(B, generator=g) < 0.3, 1.0, torch.rand(B, generator=g)) + 1e-3,
        torch.rand(B, generator=g) * 0.3,
    ]
    params[2] = params[2].clamp(max=1.0)
    for i in (1, 2, 3):
        if torch.rand(1, generator=g) < 0.25:
            params[i] = None
    return params


@pytest.mark.parametrize("impl", IMPLS)
def test_processed_modes_on_a_named_row(impl):
    # T = 2, top-k 2 of [0, 1, 2, 3]: ids 3 and 2 are kept, with weights 1 and exp(-0.5)
    a = (torch.tensor([[0.0, 1.0, 2.0, 3.0]]), _i32([[2]]), _i32([1]), _i32([0, 0]))
    params = (torch.tensor([2.0]), _i32([2]), None, None)
    log_s = math.log(1 + math.exp(-0.5))
    for mode, values in (
        ("processed_logits", [1.5, 1.0, -INF, -INF]),
        ("processed_logprobs", [-log_s, -0.5 - log_s, -INF, -INF]),
    ):
        got = IMPLS[impl](*a, *params, num_logprobs=4, logprobs_mode=mode)
        assert got[2][0, 0].tolist() == [3, 2, 1, 0] and int(got[1][0, 0]) == 2, (impl, mode)
        torch.testing.assert_close(got[3][0, 0], torch.tensor(values), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got[0][0, 0], torch.tensor(values[1]), rtol=1e-5, atol=1e-6)
    # a greedy request (T = 0), or no temperature at all: the raw values
    for T in (torch.tensor([0.0]), None):
        for mode in ("processed_logits", "processed_logprobs"):
            got = IMPLS[impl](*a, T, *params[1:], num_logprobs=4, logprobs_mode=mode)
            raw = IMPLS[impl](*a, num_logprobs=4, logprobs_mode=mode.replace("processed", "raw"))
            assert all(torch.equal(x, y) for x, y in zip(got, raw, strict=True)), (impl, mode)


def _paths_equal_the_reference(a, N, mode, kernel_device, what):
    """The CPU and CUDA paths (the latter on ``kernel_device``) on arguments ``a``: ids and
    ranks exactly the reference's, values to 1e-5 relative or 1e-6 absolute."""
    want = reference_top(*a, num_logprobs=N, logprobs_mode=mode)
    for impl in ("cpu", "cuda"):
        args = a if impl == "cpu" else tuple(None if t is None else t.to(kernel_device) for t in a)
        got = tuple(t.cpu() for t in IMPLS[impl](*args, num_logprobs=N, logprobs_mode=mode))
        msg = f"{impl} {what}"
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), msg
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6, msg=msg)
        torch.testing.assert_close(got[3], want[3], rtol=1e-5, atol=1e-6, msg=msg)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_processed_modes_every_path_equals_the_reference_on_rows_of_several_blocks(
    dtype, kernel_device
):
    # V past 2 x 1024 and N past 64 (the CPU path's sorted top N) and past 128 (the CUDA
    # path's torch route), rounded logits (ties across blocks), every filter now and then
    g = torch.Generator().manual_seed(len(str(dtype)))
    for trial in range(5):
        V = int(torch.randint(2049, 2600, (1,), generator=g))
        logits = (torch.randn(4, V, generator=g) * 3).round(decimals=trial % 2).to(dtype)
        out = torch.randint(0, V, (2, 2), generator=g, dtype=I32)
        emitted, cu = _i32([2, 1]), _i32([0, 1, 2])
        out[1, 1] = -1
        params = _sampling_params(g, 2)
        N = (5, 70, 120, 3, 200)[trial]
        for mode in ("processed_logprobs", "processed_logits"):
            _paths_equal_the_reference((logits, out, emitted, cu, *params), N, mode,
                                       kernel_device, f"{trial} {mode}")  # fmt: skip


@pytest.mark.parametrize("impl", IMPLS)
def test_processed_values_of_huge_logits_do_not_overflow(impl):
    # l - m = -6e38 passes the float32 range, (l - m) / T = -2 does not: the token can be
    # drawn, so its processed logprob is finite (found by fuzzing)
    a = (torch.tensor([[3e38, -3e38]]), _i32([[1]]), _i32([1]), _i32([0, 0]))
    got = IMPLS[impl](*a, torch.tensor([3e38]), None, None, None, num_logprobs=2,
                      logprobs_mode="processed_logprobs")  # fmt: skip
    log_s = math.log(1 + math.exp(-2))
    torch.testing.assert_close(got[3][0, 0], torch.tensor([-log_s, -2 - log_s]))


@pytest.mark.parametrize("impl", IMPLS)
def test_ties_at_the_top_k_boundary_are_kept_together_across_blocks(impl):
    # two equal logits 2053 ids apart (different 1024-id blocks, the second after the
    # maximum) at the k-th place: both kept. The CPU path's one-pass weights once left them
    # a few ulps apart and kept one (found by fuzzing), and torch's fp32 exp2 in the
    # reference can do the same by position
    row = torch.full((2100,), -50.0)
    row[3], row[7], row[2060], row[2050] = -0.0777, -1.0562, -1.0562, 4.0
    a = (row[None], _i32([[7]]), _i32([1]), _i32([0, 0]))
    got = IMPLS[impl](*a, torch.tensor([1.3681574]), _i32([3]), None, None, num_logprobs=4,
                      logprobs_mode="processed_logprobs")  # fmt: skip
    assert got[2][0, 0].tolist() == [2050, 3, 7, 2060]
    assert torch.isfinite(got[3][0, 0]).all() and got[3][0, 0, 2] == got[3][0, 0, 3], impl


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["processed_logprobs", "processed_logits"])
def test_processed_modes_every_path_equals_the_reference(dtype, mode, kernel_device):
    g = torch.Generator().manual_seed(len(mode) + len(str(dtype)))
    for trial in range(60):
        logits, out, emitted, cu, N = _random_case(g, dtype)
        params = _sampling_params(g, out.shape[0])
        _paths_equal_the_reference((logits, out, emitted, cu, *params), N, mode, kernel_device,
                                   trial)  # fmt: skip


def test_processed_logprobs_are_the_distribution_the_sampler_draws_from():
    # one row, sampled 400 times (k = 0, 400 seeds) with every filter on: each emitted
    # token has a finite processed logprob, the kept set's probabilities sum to 1, and the
    # token frequencies follow them (chi-square, ids expected < 5 times pooled into one
    # bin: a bound a correct sampler passes but for ~4e-5 of seed sets; these seeds are
    # fixed)
    g = torch.Generator().manual_seed(11)
    V, B = 40, 400
    row = torch.randn(V, generator=g) * 2
    logits = row.expand(B, V).contiguous()
    cu = torch.zeros(B + 1, dtype=I32)
    params = dict(temperature=torch.full((B,), 0.9), top_k=torch.full((B,), 12, dtype=I32),
                  top_p=torch.full((B,), 0.85), min_p=torch.full((B,), 0.02))  # fmt: skip
    rs = rejection_sample(logits, torch.zeros(0, dtype=I32), cu, num_speculative_tokens=0,
                          seeds=torch.arange(B), offsets=torch.zeros(B, dtype=torch.int64),
                          **params)  # fmt: skip
    got = top_logprobs(logits, rs.output_token_ids, rs.num_emitted, cu, num_logprobs=V,
                       logprobs_mode="processed_logprobs", **params)  # fmt: skip
    assert torch.isfinite(got.token_logprobs).all()
    p = torch.zeros(V, dtype=torch.float64)
    p[got.top_token_ids[0, 0].long()] = got.top_logprobs[0, 0].double().exp()
    assert abs(float(p.sum()) - 1) < 1e-5 and 2 <= int((p > 0).sum()) <= 12
    counts = torch.bincount(rs.output_token_ids[:, 0].long(), minlength=V).double()
    assert counts[p == 0].sum() == 0
    big, small = B * p >= 5, (p > 0) & (B * p < 5)
    observed = torch.cat([counts[big], counts[small].sum().view(1)])
    expected = torch.cat([B * p[big], (B * p[small]).sum().view(1)])
    chi2 = float(((observed - expected) ** 2 / expected.clamp(min=1e-12)).sum())
    assert chi2 < 40.0, chi2  # at most 11 degrees of freedom: P(chi2 > 40) ~ 3.4e-5


@pytest.mark.parametrize("impl", ["cpu", "cuda"])
def test_values_are_float64_accurate_at_a_large_vocabulary(impl):
    # an fp32 log_softmax drifts by up to ~5e-5 over 152k logits (here: rows whose maximum
    # holds 80% of the mass, logprob -0.22); the contract says 1e-5 / 1e-6
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 152000, generator=g) * 3
    logits[:, 0] = (torch.logsumexp(logits.double(), -1) + math.log(4)).float()
    out, emitted, cu = _i32([[1, 2, 3, 4]]), _i32([4]), _i32([0, 3])
    got = IMPLS[impl](logits, out, emitted, cu, num_logprobs=8, logprobs_mode="raw_logprobs")
    exact = torch.log_softmax(logits.double(), -1)
    want = exact.gather(1, got[2][0].long()).float()
    torch.testing.assert_close(got[3][0], want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[0][0], exact[torch.arange(4), out[0].long()].float(),
                               rtol=1e-5, atol=1e-6)  # fmt: skip


def test_the_kernels_value_checks_agree_with_the_wrappers():
    # random batches, some with one bad value: the CPU kernel refuses exactly what the
    # wrapper's checks refuse, and computes the op's result for the others
    from specdec_kernels.ops.logprobs import _check_values

    g = torch.Generator().manual_seed(2)
    refused = 0
    for trial in range(300):
        logits, out, emitted, cu, N = _random_case(g, torch.float32)
        B, K1 = out.shape
        what = trial % 6
        if what == 1:
            emitted[int(torch.randint(0, B, (1,), generator=g))] += 1 + trial % 3
        elif what == 2 and int(emitted.sum()):
            b = int(emitted.argmax())
            out[b, 0] = -1 if trial % 2 else logits.shape[1]
        elif what == 3:
            cu[int(torch.randint(0, B + 1, (1,), generator=g))] += 1 if trial % 2 else -1
        elif what == 4:
            logits = logits[: max(int(cu[-1]) + B - 1, 0)]
        params = [None] * 4
        if what == 5:  # a sampling parameter, in range or not
            i = (trial // 6) % 4  # each of the four in turn
            bad = [torch.tensor([-0.5, 0.7, 1.0]), torch.tensor([-1, 0, 3]),
                   torch.tensor([0.0, 0.5, 1.0]), torch.tensor([1.5, 0.0, 0.2])][i]  # fmt: skip
            params[i] = bad[torch.randint(0, 3, (B,), generator=g)].to(bad.dtype)
            if i == 1:
                params[i] = params[i].to(I32)
        mode = "processed_logits" if what == 5 else "raw_logits"
        got = cpu_top_checked(logits, out, emitted, cu, *params, num_logprobs=N,
                              logprobs_mode=mode)  # fmt: skip
        try:
            _check_values(logits.shape[0], logits.shape[1], out, emitted, cu, params)
        except ValueError:
            assert got is None, trial
            refused += 1
            continue
        assert got is not None, trial
        want = cpu_top(logits, out, emitted, cu, *params, num_logprobs=N, logprobs_mode=mode)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), trial
    assert 50 < refused < 250, refused


def test_checks_that_disagree_are_a_runtime_error(monkeypatch):
    from specdec_kernels.ops import _library

    info = _library.OPS["top_logprobs"]
    monkeypatch.setitem(_library.OPS, "top_logprobs", info._replace(cpu_checked=lambda **kw: None))
    with pytest.raises(RuntimeError, match="the two copies of the checks disagree"):
        _one_slot([0.0, 1.0], 1, 1)


def test_token_logprobs_are_rejection_samples_and_the_top_n_is_vllms_rule():
    # finite logits without ties: vLLM's gather_logprobs rule, log_softmax then topk
    g = torch.Generator().manual_seed(3)
    B, k, V = 6, 3, 50
    cu = _i32([0, 3, 4, 4, 7, 9, 12])
    logits = torch.randn(12 + B, V, generator=g) * 4
    owner = torch.repeat_interleave(torch.arange(B), (cu[1:] - cu[:-1]).long())
    drafts = logits[torch.arange(12) + owner].argmax(-1).to(I32)
    drafts[::3] = (drafts[::3] + 1) % V
    temperature = torch.tensor([0.0, 0.8, 1.0, 0.0, 1.3, 0.7])
    rs = rejection_sample(logits, drafts, cu, num_speculative_tokens=k, temperature=temperature,
                          seeds=torch.arange(B), offsets=torch.zeros(B, dtype=torch.int64),
                          return_logprobs=True)  # fmt: skip
    got = top_logprobs(logits, rs.output_token_ids, rs.num_emitted, cu, num_logprobs=4)
    torch.testing.assert_close(got.token_logprobs, rs.logprobs, rtol=1e-5, atol=1e-6)
    for b in range(B):
        for j in range(int(rs.num_emitted[b])):
            lsm = torch.log_softmax(logits[int(cu[b]) + b + j], -1)
            top = lsm.topk(4)
            assert got.top_token_ids[b, j].tolist() == top.indices.tolist()
            torch.testing.assert_close(got.top_logprobs[b, j], top.values, rtol=1e-5, atol=1e-6)
            tok = int(rs.output_token_ids[b, j])
            assert int(got.token_ranks[b, j]) == int((lsm >= lsm[tok]).sum())
        past = slice(int(rs.num_emitted[b]), None)
        assert (got.top_token_ids[b, past] == -1).all() and (got.token_ranks[b, past] == 0).all()
        assert (got.top_logprobs[b, past] == 0).all() and (got.token_logprobs[b, past] == 0).all()


def test_n_zero_and_an_empty_batch_have_static_shapes():
    got = _one_slot([0.0, 1.0], 1, 0)
    assert got.top_token_ids.shape == (1, 1, 0) and got.top_logprobs.shape == (1, 1, 0)
    empty = top_logprobs(torch.zeros(0, 5), torch.zeros(0, 3, dtype=I32),
                         torch.zeros(0, dtype=I32), _i32([0]), num_logprobs=2)  # fmt: skip
    assert empty.top_token_ids.shape == (0, 3, 2) and empty.token_logprobs.shape == (0, 3)


def _bad(**kw):
    a = dict(
        target_logits=torch.zeros(5, 4), output_token_ids=_i32([[1, 2], [3, -1]]),
        num_emitted=_i32([2, 1]), cu_num_draft_tokens=_i32([0, 1, 2]), num_logprobs=2,
    )  # fmt: skip
    a.update(kw)
    return top_logprobs(**a)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(num_logprobs=5), r"num_logprobs must be <= 4"),
        (dict(num_logprobs=-1), r"num_logprobs must be >= 0"),
        (dict(logprobs_mode="processed"), "logprobs_mode must be one of"),
        (dict(temperature=torch.ones(4)), r"temperature must have shape \(2,\)"),
        (dict(top_k=torch.ones(2)), "top_k must have dtype"),
        (
            dict(logprobs_mode="processed_logprobs", temperature=torch.tensor([1.0, -1.0])),
            "temperature must lie in",
        ),  # fmt: skip
        (dict(logprobs_mode="processed_logits", top_p=torch.tensor([0.0, 1.0])), "top_p must lie"),
        (dict(logprobs_mode="processed_logits", min_p=torch.tensor([0.0, 2.0])), "min_p must lie"),
        (dict(logprobs_mode="processed_logits", top_k=_i32([1, -2])), "top_k must lie"),
        (dict(target_logits=torch.zeros(5, 4, dtype=torch.int32)), "target_logits must have dtype"),
        (dict(output_token_ids=_i32([1, 2])), "output_token_ids must be 2-D"),
        (dict(num_emitted=_i32([2])), r"num_emitted must have shape \(2,\)"),
        (dict(cu_num_draft_tokens=_i32([0, 1])), r"cu_num_draft_tokens must have shape \(3,\)"),
        (dict(output_token_ids=torch.zeros(2, 0, dtype=I32)), "k \\+ 1 >= 1 columns"),
        (dict(num_emitted=_i32([3, 1])), r"num_emitted must lie in \[0, k_b \+ 1\]"),
        (dict(output_token_ids=_i32([[1, 4], [3, -1]])), "output_token_ids must lie in"),
        (dict(target_logits=torch.zeros(3, 4)), "target_logits must have at least cu"),
        (dict(cu_num_draft_tokens=_i32([0, 2, 2])), "cu_num_draft_tokens"),
        (dict(cu_num_draft_tokens=_i32([1, 1, 2])), "rejection_sample took"),  # the hint
        (dict(target_logits=torch.zeros(5, 0), num_logprobs=0), "vocabulary of at least 1"),
    ],
)
def test_bad_input_raises_value_error(kw, match):
    with pytest.raises(ValueError, match=match):
        _bad(**kw)


def test_the_cuda_path_stays_in_bounds_with_more_logprobs_than_the_vocabulary():
    # torch.ops.specdec.top_logprobs called directly skips the wrapper's N <= V: the kernel
    # (N <= 128) and the torch route find the top V and fill the rest with -1 and 0
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, -1.0]])
    a = (logits, _i32([[1]]), _i32([1]), _i32([0, 0]))
    want = reference_top(*a, num_logprobs=5, logprobs_mode="raw_logprobs")
    for N in (8, 200):
        got = cuda_top(*a, num_logprobs=N, logprobs_mode="raw_logprobs")
        assert got[2][0, 0, :5].tolist() == want[2][0, 0].tolist() == [1, 3, 2, 0, 4]
        assert (got[2][0, 0, 5:] == -1).all() and (got[3][0, 0, 5:] == 0).all()
        torch.testing.assert_close(got[3][0, 0, :5], want[3][0, 0], rtol=1e-5, atol=1e-6)


def test_value_checks_can_be_turned_off():
    # unchecked bad values never read outside the rows: such a slot is left empty
    got = _bad(num_emitted=_i32([3, 1]), output_token_ids=_i32([[1, 4], [3, -1]]), validate=False)
    assert got.top_token_ids[0, 1].tolist() == [-1, -1]  # token 4 of V = 4: not read
    assert got.top_token_ids[1, 0].tolist() == [0, 1]  # a live slot (all-zero row: ties)
