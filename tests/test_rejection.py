"""rejection_sample: named cases, CPU path == reference == Triton kernel, registration, errors."""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels.cpu import _jit as cpu_jit
from specdec_kernels.cpu import rejection as cpu_rej
from specdec_kernels.cpu import sampling as cpu_sampling
from specdec_kernels.cpu.philox import philox_uniform
from specdec_kernels.kernels import rejection as triton_rej
from specdec_kernels.ops import rejection_sample
from specdec_kernels.ops.rejection import sampling_offsets
from specdec_kernels.reference import rejection as ref_rej

INF = float("inf")
IMPLS = {
    "reference": ref_rej.rejection_sample,
    "cpu": cpu_rej.rejection_sample,
    "triton": triton_rej.rejection_sample,
}


@dataclass
class Batch:
    logits: torch.Tensor
    drafts: torch.Tensor
    cu: torch.Tensor
    k: int
    draft_probs: torch.Tensor | None = None
    temperature: torch.Tensor | None = None
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    min_p: torch.Tensor | None = None
    seeds: torch.Tensor | None = None
    offsets: torch.Tensor | None = None

    def tensors(self):
        return (
            self.logits,
            self.drafts,
            self.cu,
            self.draft_probs,
            self.temperature,
            self.top_k,
            self.top_p,
            self.min_p,
            self.seeds,
            self.offsets,
        )


def run(impl: str, batch: Batch, device=None, *, logprobs: bool = True):
    """Run one implementation; returns (tokens, num_emitted, logprobs) on the CPU."""
    if impl == "public":
        out = rejection_sample(
            batch.logits,
            batch.drafts,
            batch.cu,
            num_speculative_tokens=batch.k,
            draft_probs=batch.draft_probs,
            temperature=batch.temperature,
            top_k=batch.top_k,
            top_p=batch.top_p,
            min_p=batch.min_p,
            seeds=batch.seeds,
            offsets=batch.offsets,
            return_logprobs=logprobs,
        )
        return tuple(out)
    args = batch.tensors()
    if impl == "triton" and device is None and torch.cuda.is_available():
        device = torch.device("cuda")  # the launchers run on CPU tensors only when interpreted
    if impl == "triton" and device is not None:
        args = tuple(None if t is None else t.to(device) for t in args)
    out = IMPLS[impl](*args, num_speculative_tokens=batch.k, return_logprobs=logprobs)
    return tuple(o.cpu() for o in out)


def assert_same(a, b, *, what=""):
    assert torch.equal(a[0], b[0]), f"{what} tokens\n{a[0]}\n{b[0]}"
    assert torch.equal(a[1], b[1]), f"{what} num_emitted\n{a[1]}\n{b[1]}"
    if a[2] is not None and b[2] is not None:
        torch.testing.assert_close(a[2], b[2], atol=2e-5, rtol=1e-5, msg=what)


def cu_of(counts: list[int]) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(counts).cumsum(0).tolist()), dtype=torch.int32)


def rows_with_argmax(argmaxes: list[int], V: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(len(argmaxes) * 31 + V)
    rows = torch.rand(len(argmaxes), V, generator=g)
    for i, a in enumerate(argmaxes):
        rows[i, a] = 5.0
    return rows


MODES = ["greedy", "mixed", "sampled", "probs", "top_k", "top_p", "min_p", "filters", "ties"]


def make_batch(
    seed: int,
    mode: str,
    *,
    B: int = 6,
    k: int = 3,
    V: int = 37,
    dtype: torch.dtype = torch.float32,
) -> Batch:
    """A ragged batch (request 0 has no drafts) whose drafts are often accepted."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, k + 1, (B,), generator=g)
    if B:
        counts[0] = 0
    cu = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]).to(torch.int32)
    N = int(cu[-1])
    rows = N + B
    if mode == "ties":
        logits = torch.randint(-2, 2, (rows, V), generator=g).float()
    else:
        logits = torch.randn(rows, V, generator=g) * 1.5
        hot = torch.randint(0, V, (rows, 2), generator=g)
        logits.scatter_add_(1, hot, torch.full((rows, 2), 4.0))
    logits = logits.to(dtype)
    owner = torch.repeat_interleave(torch.arange(B), counts)  # request of each flat draft
    verify_rows = torch.arange(N) + owner  # flat draft i of request b: row i + b
    drafts = logits[verify_rows].float().argmax(-1).to(torch.int32)  # greedy accepts these
    flip = torch.rand(N, generator=g) < 0.25
    drafts = torch.where(flip, torch.randint(0, V, (N,), generator=g).int(), drafts)
    if N:
        drafts[torch.rand(N, generator=g) < 0.1] = -1
    b = Batch(logits=logits, drafts=drafts, cu=cu, k=k)
    if mode == "greedy":
        return b
    b.temperature = torch.rand(B, generator=g) * 1.2 + 0.3
    b.seeds = torch.randint(-(2**62), 2**62, (B,), generator=g)
    b.offsets = torch.randint(0, 10_000, (B,), generator=g)
    if mode in ("mixed", "filters", "probs") and B:
        b.temperature[torch.rand(B, generator=g) < 0.3] = 0.0
    if mode == "probs":
        noise = torch.randn(max(N, 1), V, generator=g)
        q = torch.softmax(noise if N == 0 else logits[verify_rows].float() * 0.7 + noise, dim=-1)
        b.draft_probs = q.to(dtype)
        if N:
            sampled = torch.multinomial(q[:N], 1, generator=g)[:, 0].int()
            b.drafts = torch.where(b.drafts >= 0, sampled, b.drafts)
    if mode in ("top_k", "filters", "ties"):
        b.top_k = torch.randint(0, 8, (B,), generator=g, dtype=torch.int32)
    if mode in ("top_p", "filters", "ties"):
        b.top_p = torch.rand(B, generator=g) * 0.9 + 0.1
        b.top_p[torch.rand(B, generator=g) < 0.2] = 1.0
    if mode in ("min_p", "filters"):
        b.min_p = torch.rand(B, generator=g) * 0.3
    return b


# ---------------------------------------------------------------- named cases


def test_mixed_batch_greedy_exact_sampled_accepts_iff_its_own_sample_is_the_draft(
    kernel_device,
):
    """req0 greedy -> [2, 3, -1]; every copy of req1 (T=1, p(0)=0.7, one-hot draft 0)
    samples its row with the stream-1 uniform u and accepts iff that sample is 0: iff
    u < p(0) (the inverse CDF's first bin)."""
    verify0 = [[0.1, 0.2, 3.0, 0.0], [0.0, 0.5, 0.1, 2.0]]
    bonus0 = [0.0, 4.0, 0.0, 0.0]
    p1 = torch.tensor([0.7, 0.1, 0.1, 0.1])
    n = 400
    logits = torch.tensor(verify0 + [bonus0] + [p1.log().tolist(), [0.0] * 4] * n)
    drafts = torch.tensor([2, 1] + [0] * n, dtype=torch.int32)
    b = Batch(
        logits=logits,
        drafts=drafts,
        cu=cu_of([2] + [1] * n),
        k=2,
        temperature=torch.tensor([0.0] + [1.0] * n),
        seeds=torch.arange(n + 1, dtype=torch.int64) * 7919,
        offsets=torch.arange(n + 1, dtype=torch.int64) * 3,
    )
    out = run("public", b)
    assert out[0][0].tolist() == [2, 3, -1]
    p0 = float(torch.softmax(p1.log(), 0)[0])
    u = philox_uniform(b.seeds[1:], b.offsets[1:], 1)
    accepted = out[0][1:, 0] == 0
    assert torch.equal(accepted, u < p0)
    assert abs(float(accepted.float().mean()) - 0.7) < 0.08
    assert torch.equal(out[1][1:], torch.where(accepted, 2, 1).int())
    small = replace(
        b,
        logits=logits[: 3 + 2 * 12],
        drafts=drafts[:14],
        cu=b.cu[:14],
        temperature=b.temperature[:13],
        seeds=b.seeds[:13],
        offsets=b.offsets[:13],
    )
    assert_same(run("triton", small, kernel_device), run("public", small), what="triton")
    assert_same(run("reference", small), run("public", small), what="reference")


@pytest.mark.parametrize("with_probs", [False, True])
def test_a_certain_draft_is_always_accepted_and_inputs_stay_intact(with_probs, kernel_device):
    n = 12
    verify = [-INF, 0.0, -INF, -INF]
    logits = torch.tensor([verify, [0.3, -1.0, 2.0, 0.5]] * n)
    b = Batch(
        logits=logits,
        drafts=torch.ones(n, dtype=torch.int32),
        cu=cu_of([1] * n),
        k=1,
        temperature=torch.tensor([1.0, 0.0, 0.7] * (n // 3)),
        seeds=torch.arange(n, dtype=torch.int64),
        offsets=torch.zeros(n, dtype=torch.int64),
        draft_probs=torch.full((n, 4), 0.25) if with_probs else None,
    )
    before = [None if t is None else t.clone() for t in b.tensors()]
    results = {impl: run(impl, b, kernel_device) for impl in ("public", "triton", "reference")}
    for impl, out in results.items():
        assert (out[0][:, 0] == 1).all(), impl
        assert out[1].tolist() == [2] * n, impl
        assert ((out[0][:, 1] >= 0) & (out[0][:, 1] < 4)).all(), impl
        assert (out[0][1::3, 1] == 2).all(), impl  # the greedy copies' bonus argmax
    assert_same(results["triton"], results["public"])
    assert_same(results["reference"], results["public"])
    for t0, t1 in zip(before, b.tensors(), strict=True):
        if t0 is not None:
            assert torch.equal(t0, t1)


def test_draft_probs_rejection_recovers_from_the_residual(kernel_device):
    """q = [.1,.6,.2,.1], p = [.4,.3,.2,.1], draft 1: a rejection always recovers token 0."""
    n = 2000
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    q = torch.tensor([0.1, 0.6, 0.2, 0.1])
    b = Batch(
        logits=torch.stack([p.log(), torch.zeros(4)]).repeat(n, 1),
        drafts=torch.ones(n, dtype=torch.int32),
        cu=cu_of([1] * n),
        k=1,
        draft_probs=q.repeat(n, 1),
        temperature=torch.ones(n),
        seeds=torch.arange(n, dtype=torch.int64) + 10**12,
        offsets=torch.zeros(n, dtype=torch.int64),
    )
    out = run("public", b)
    rejected = out[1] == 1
    assert (out[0][rejected, 0] == 0).all()
    assert (out[0][~rejected, 0] == 1).all()
    assert abs(float(rejected.float().mean()) - 0.5) < 0.05  # 1 - p(1)/q(1)
    m = 24
    small = replace(
        b,
        logits=b.logits[: 2 * m],
        drafts=b.drafts[:m],
        cu=b.cu[: m + 1],
        draft_probs=b.draft_probs[:m],
        temperature=b.temperature[:m],
        seeds=b.seeds[:m],
        offsets=b.offsets[:m],
    )
    tri = run("triton", small, kernel_device)
    assert_same(tri, (out[0][:m], out[1][:m], out[2][:m]))
    assert (tri[0][tri[1] == 1, 0] == 0).all()


@pytest.mark.parametrize("draft", [-1, 4, 1000, -7])
@pytest.mark.parametrize("sampled", [False, True])
def test_out_of_range_draft_is_rejected(draft, sampled, kernel_device):
    b = Batch(
        logits=torch.tensor([[-INF, -INF, -INF, 0.0], [1.0, 0.0, 0.0, 0.0]]),
        drafts=torch.tensor([draft], dtype=torch.int32),
        cu=cu_of([1]),
        k=1,
    )
    if sampled:
        b = replace(
            b,
            temperature=torch.tensor([1.0]),
            seeds=torch.tensor([5]),
            offsets=torch.tensor([0]),
        )
    for impl in ("public", "triton", "reference"):
        out = run(impl, b, kernel_device)
        assert out[0].tolist() == [[3, -1]], impl
        assert out[1].tolist() == [1], impl


def test_ragged_greedy_batch(kernel_device):
    # Rows: req0 bonus | req1 verify, verify, bonus | req2 bonus | req3 verify, bonus.
    logits = rows_with_argmax([10, 5, 6, 11, 12, 9, 13], V=16)
    b = Batch(
        logits=logits,
        drafts=torch.tensor([5, 6, 7], dtype=torch.int32),
        cu=cu_of([0, 2, 0, 1]),
        k=2,
    )
    want = [[10, -1, -1], [5, 6, 11], [12, -1, -1], [9, -1, -1]]
    for impl in ("public", "triton", "reference"):
        out = run(impl, b, kernel_device)
        assert out[0].tolist() == want, impl
        assert out[1].tolist() == [1, 3, 1, 1], impl


def test_batch_without_drafts_emits_the_bonus_token(kernel_device):
    b = Batch(
        logits=rows_with_argmax([3, 0, 2], V=5),
        drafts=torch.zeros(0, dtype=torch.int32),
        cu=cu_of([0, 0, 0]),
        k=2,
    )
    for impl in ("public", "triton", "reference"):
        out = run(impl, b, kernel_device)
        assert out[0].tolist() == [[3, -1, -1], [0, -1, -1], [2, -1, -1]], impl
        assert out[1].tolist() == [1, 1, 1], impl


@pytest.mark.parametrize("impl", ["public", "triton", "reference"])
def test_empty_batch(impl, kernel_device):
    b = Batch(
        logits=torch.zeros(0, 7),
        drafts=torch.zeros(0, dtype=torch.int32),
        cu=torch.zeros(1, dtype=torch.int32),
        k=3,
        temperature=torch.zeros(0),
        seeds=torch.zeros(0, dtype=torch.int64),
        offsets=torch.zeros(0, dtype=torch.int64),
    )
    tokens, num, lp = run(impl, b, kernel_device)
    assert tokens.shape == (0, 4) and tokens.dtype == torch.int32
    assert num.shape == (0,) and num.dtype == torch.int32
    assert lp.shape == (0, 4) and lp.dtype == torch.float32


# ---------------------------------------------------------------- CPU == reference == Triton


@pytest.mark.parametrize("mode", MODES)
def test_cpu_reference_triton_agree(mode, kernel_device):
    b = make_batch(100 + MODES.index(mode), mode)
    cpu = run("cpu", b)
    assert_same(run("reference", b), cpu, what="reference")
    assert_same(run("triton", b, kernel_device), cpu, what="triton")
    assert_same(run("public", b), cpu, what="public")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_agree(dtype, kernel_device):
    b = make_batch(7, "filters", B=4, k=2, V=50, dtype=dtype)
    b.draft_probs = torch.softmax(torch.randn(b.drafts.shape[0], 50), -1).to(dtype)
    cpu = run("cpu", b)
    assert_same(run("reference", b), cpu, what="reference")
    assert_same(run("triton", b, kernel_device), cpu, what="triton")


@pytest.mark.parametrize("layout", ["strided_columns", "transposed", "row_slice"])
def test_non_contiguous_logits_agree(layout, kernel_device):
    b = make_batch(11, "filters", B=4, k=2, V=21)
    R, V = b.logits.shape
    if layout == "strided_columns":
        wide = torch.full((R, 2 * V), float("nan"))
        wide[:, ::2] = b.logits
        logits = wide[:, ::2]
    elif layout == "transposed":
        logits = b.logits.t().contiguous().t()
    else:
        wide = torch.full((R, V + 9), float("nan"))
        wide[:, 3 : 3 + V] = b.logits
        logits = wide[:, 3 : 3 + V]
    assert not logits.is_contiguous()
    nc = replace(b, logits=logits)
    want = run("cpu", b)
    assert_same(run("cpu", nc), want)
    assert_same(run("triton", nc, kernel_device), want)


def test_static_buffers_longer_than_needed_are_ignored(kernel_device):
    b = make_batch(13, "probs", B=4, k=2, V=19)
    N = b.drafts.shape[0]
    padded = replace(
        b,
        logits=torch.cat([b.logits, torch.full((5, 19), float("nan"))]),
        drafts=torch.cat([b.drafts, torch.full((3,), 2, dtype=torch.int32)]),
        draft_probs=torch.cat([b.draft_probs[:N], torch.full((4, 19), float("nan"))]),
    )
    want = run("cpu", b)
    assert_same(run("public", padded), want)
    assert_same(run("triton", padded, kernel_device), want)


@pytest.mark.parametrize("mode", ["greedy", "filters", "probs"])
def test_inputs_unchanged(mode, kernel_device):
    b = make_batch(17, mode, B=3, k=2, V=13)
    before = [None if t is None else t.clone() for t in b.tensors()]
    run("public", b)
    dev = [None if t is None else t.to(kernel_device) for t in b.tensors()]
    triton_rej.rejection_sample(*dev, num_speculative_tokens=b.k, return_logprobs=True)
    for t0, t1, t2 in zip(before, b.tensors(), dev, strict=True):
        if t0 is not None:
            assert torch.equal(t0, t1)
            assert torch.equal(t0, t2.cpu())


def test_search_pivot_count_does_not_change_results(monkeypatch, kernel_device):
    """The threshold search is exact for any number of pivots per pass."""
    b = make_batch(23, "ties", B=3, k=1, V=29)
    want = run("cpu", b)
    args = tuple(None if t is None else t.to(kernel_device) for t in b.tensors())
    for pivots in (2, 16):
        monkeypatch.setattr(triton_rej, "SEARCH_PIVOTS", pivots)
        got = triton_rej.rejection_sample(*args, num_speculative_tokens=b.k, return_logprobs=True)
        assert_same(tuple(o.cpu() for o in got), want, what=f"{pivots} pivots")


@pytest.mark.parametrize("pivots", [None, 16])
def test_multi_block_vocabulary_agrees(pivots, monkeypatch, kernel_device):
    """V = 2500: several streaming blocks (running max, cumsum carry) and search blocks
    (some skipped once the search interval is narrow)."""
    b = make_batch(27, "filters", B=3, k=1, V=2500)
    b.top_k = torch.tensor([0, 40, 3], dtype=torch.int32)
    b.top_p = torch.tensor([0.6, 1.0, 0.9])
    b.temperature = torch.tensor([1.3, 0.8, 1.0])
    want = run("cpu", b)
    assert_same(run("reference", b), want)
    args = tuple(None if t is None else t.to(kernel_device) for t in b.tensors())
    monkeypatch.setattr(triton_rej, "SEARCH_PIVOTS", pivots)
    got = triton_rej.rejection_sample(*args, num_speculative_tokens=b.k, return_logprobs=True)
    assert_same(tuple(o.cpu() for o in got), want)


def test_cpu_triton_token_agreement_rate(kernel_device):
    """Tokens of the two paths over many random batches (uniforms are bit-identical, so
    they can differ only at float-rounding CDF boundaries); the rate is printed."""
    same = total = 0
    for i, mode in enumerate(MODES[1:]):
        b = make_batch(1000 + i, mode, B=8, k=3, V=33)
        cpu, tri = run("cpu", b), run("triton", b, kernel_device)
        emitted = torch.arange(b.k + 1)[None, :] < torch.maximum(cpu[1], tri[1])[:, None]
        same += int(((cpu[0] == tri[0]) & emitted).sum())
        total += int(emitted.sum())
    rate = same / total
    print(f"\nCPU/Triton token agreement: {same}/{total} = {rate:.4%}")
    assert rate >= 0.99


@settings(max_examples=30)
@given(
    seed=st.integers(0, 2**31 - 1),
    mode=st.sampled_from(MODES),
    B=st.integers(0, 5),
    k=st.integers(0, 3),
    V=st.integers(1, 24),
)
def test_cpu_matches_reference_hypothesis(seed, mode, B, k, V):
    b = make_batch(seed, mode, B=B, k=k, V=V)
    assert_same(run("cpu", b), run("reference", b))


@settings(max_examples=8)
@given(
    seed=st.integers(0, 2**31 - 1),
    mode=st.sampled_from(MODES),
    B=st.integers(0, 3),
    k=st.integers(0, 2),
    V=st.integers(1, 20),
)
def test_triton_matches_cpu_hypothesis(seed, mode, B, k, V):
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    b = make_batch(seed, mode, B=B, k=k, V=V)
    assert_same(run("triton", b, device), run("cpu", b))


# ---------------------------------------------------------------- semantics


def test_greedy_ties_take_the_lowest_id_and_nan_counts_as_neg_inf(kernel_device):
    nan = float("nan")
    rows = [
        [nan, 1.0, 3.0, 3.0, nan],
        [nan] * 5,
        [-INF] * 5,
        [INF, nan, INF, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],
    ]
    b = Batch(
        logits=torch.tensor(rows),
        drafts=torch.zeros(0, dtype=torch.int32),
        cu=cu_of([0] * 5),
        k=0,
    )
    for impl in ("public", "triton", "reference"):
        out = run(impl, b, kernel_device, logprobs=False)
        assert out[0][:, 0].tolist() == [2, 0, 0, 0, 0], impl


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy (the interpreter) on inf - inf
def test_non_finite_logits_never_yield_out_of_range_ids(kernel_device):
    nan = float("nan")
    V = 6
    rows = torch.tensor(
        [
            [nan] * V,
            [-INF] * V,
            [INF, 0.0, nan, INF, -INF, 1.0],
            [nan, -INF, 3.0, nan, 2.0, -INF],
            [1e38, -1e38, 3e38, nan, 0.0, 0.0],
        ]
    )
    n = rows.shape[0]
    b = Batch(  # request i: verify row rows[i], bonus row rows[i - 1]
        logits=torch.stack([rows, rows.roll(1, 0)], 1).reshape(2 * n, V),
        drafts=torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32),
        cu=cu_of([1] * n),
        k=1,
        temperature=torch.tensor([1.0, 0.5, 1.0, 2.0, 1e-3]),
        top_k=torch.tensor([0, 2, 3, 0, 1], dtype=torch.int32),
        top_p=torch.tensor([1.0, 0.5, 0.9, 1.0, 0.3]),
        seeds=torch.arange(n, dtype=torch.int64),
        offsets=torch.zeros(n, dtype=torch.int64),
    )
    outs = {impl: run(impl, b, kernel_device, logprobs=False) for impl in ("public", "triton")}
    for impl, out in outs.items():
        emitted = out[0][torch.arange(2)[None, :] < out[1][:, None]]
        assert ((emitted >= 0) & (emitted < V)).all(), impl
    assert_same(outs["triton"], outs["public"])
    # +inf logits take all the mass: request 2 rejects its draft (a NaN logit, p = 0)
    # and recovers one of the two +inf ids.
    assert int(outs["public"][1][2]) == 1
    assert int(outs["public"][0][2, 0]) in (0, 3)


def test_top_k_keeps_every_token_tied_with_the_kth():
    n = 3000
    row = torch.tensor([2.0, 0.0, 2.0, 2.0, 1.0, 0.0])
    b = Batch(
        logits=row.repeat(n, 1),
        drafts=torch.zeros(0, dtype=torch.int32),
        cu=cu_of([0] * n),
        k=0,
        temperature=torch.ones(n),
        top_k=torch.full((n,), 2, dtype=torch.int32),
        seeds=torch.arange(n, dtype=torch.int64),
        offsets=torch.zeros(n, dtype=torch.int64),
    )
    got = torch.bincount(run("public", b)[0][:, 0].long(), minlength=6)
    assert got[[1, 4, 5]].sum() == 0 and (got[[0, 2, 3]] > 800).all()


def test_top_k_keeps_ties_split_across_blocks():
    # the tie at the k-th place sits in blocks 0 and 2, on either side of the maximum (block
    # 2): the CPU path's one-pass weights once rescaled them a few ulps apart and never drew
    # id 2060; both must be drawn about equally (found by fuzzing processed logprobs)
    n = 3000
    row = torch.full((2100,), -50.0)
    row[3], row[7], row[2060], row[2050] = -0.0777, -1.0562, -1.0562, 4.0
    b = Batch(
        logits=row.repeat(n, 1),
        drafts=torch.zeros(0, dtype=torch.int32),
        cu=cu_of([0] * n),
        k=0,
        temperature=torch.full((n,), 1.3681574),
        top_k=torch.full((n,), 3, dtype=torch.int32),
        seeds=torch.arange(n, dtype=torch.int64),
        offsets=torch.zeros(n, dtype=torch.int64),
    )
    got = torch.bincount(run("public", b)[0][:, 0].long(), minlength=2100)
    assert got[7] > 40 and got[2060] > 40 and got.sum() == got[[3, 7, 2050, 2060]].sum()


def test_the_reference_gives_equal_logits_equal_weights():
    # torch's fp32 exp2 on an AVX-512 CPU gave 100 equal inputs two results an ulp apart
    # (its vector body and scalar tail), so the oracle itself split ties at a filter's cut
    for x in torch.linspace(-9.0, -0.5, 40).tolist():
        row = torch.full((100,), x)
        row[0] = 0.0
        e, keep = ref_rej.kept_set(row, 1.0, 2, 1.0, 0.0)
        assert torch.unique(e[1:]).numel() == 1 and bool(keep[1:].all()), x


def test_top_p_keeps_ties_and_the_token_that_crosses_the_mass():
    n = 3000
    row = torch.tensor([1.0, 1.0, 0.0, -1.0])  # p ~ [.39, .39, .15, .05]
    b = Batch(
        logits=row.repeat(2 * n, 1),
        drafts=torch.zeros(0, dtype=torch.int32),
        cu=cu_of([0] * (2 * n)),
        k=0,
        temperature=torch.ones(2 * n),
        top_p=torch.tensor([0.1] * n + [0.8] * n),
        seeds=torch.arange(2 * n, dtype=torch.int64),
        offsets=torch.zeros(2 * n, dtype=torch.int64),
    )
    tok = run("public", b)[0][:, 0].long()
    first = torch.bincount(tok[:n], minlength=4)  # mass above tokens 0/1 is 0 < 0.1
    assert first[2:].sum() == 0 and (first[:2] > 1300).all()
    second = torch.bincount(tok[n:], minlength=4)  # mass above token 2 is .79 < .8
    assert second[3] == 0 and second[2] > 300


def test_min_p_keeps_tokens_at_the_threshold():
    n = 3000
    row = torch.tensor([0.0, math.log(0.5), math.log(0.2), math.log(0.05)])
    b = Batch(
        logits=row.repeat(n, 1),
        drafts=torch.zeros(0, dtype=torch.int32),
        cu=cu_of([0] * n),
        k=0,
        temperature=torch.ones(n),
        min_p=torch.full((n,), 0.1),
        seeds=torch.arange(n, dtype=torch.int64),
        offsets=torch.zeros(n, dtype=torch.int64),
    )
    got = torch.bincount(run("public", b)[0][:, 0].long(), minlength=4)
    assert got[3] == 0 and (got[:3] > 200).all()


def _cpu_inverse_cdf(mass, u, blocks=None):
    """The CPU path's inverse CDF on each row of ``mass`` (its own block sums unless given)."""
    toks, totals = [], []
    for i, row in enumerate(mass.numpy()):
        V = row.shape[0]
        nb = (V + cpu_sampling.BLOCK - 1) // cpu_sampling.BLOCK
        own = np.zeros(nb, dtype=np.float64)
        total = cpu_sampling.block_sums(row, V, own)
        if blocks is not None:
            own, total = blocks[i].double().numpy(), float(blocks[i].sum())
        toks.append(cpu_sampling.inverse_cdf(row, V, own, total, np.float32(u[i])))
        totals.append(float(total))
    return torch.tensor(toks), torch.tensor(totals)


def test_inverse_cdf_never_picks_a_zero_mass_token():
    mass = torch.tensor([[0.0, 0.0, 0.5, 0.0, 0.5]] * 3 + [[0.0] * 5])
    u = torch.tensor([0.0, 0.5, 1.0 - 2**-24, 0.3])
    tok, total = _cpu_inverse_cdf(mass, u)
    assert tok.tolist() == [2, 4, 4, -1]  # u = 0: the first positive id; no mass: -1
    assert total.tolist() == [1.0, 1.0, 1.0, 0.0]
    # A block total above the running mass inside it (rounding): its last positive id.
    tok, _ = _cpu_inverse_cdf(mass, u, torch.tensor([[1.0], [1.0], [2.0], [0.0]]))
    assert tok.tolist() == [2, 4, 4, -1]


def test_blocked_inverse_cdf_matches_one_flat_cumsum():
    """Block sums, then a cumsum inside one block: the flat definition, on exact (small
    integer) masses with whole blocks of zeros, a partial last block and u on the edges."""
    V = 3 * cpu_sampling.BLOCK + 77
    g = torch.Generator().manual_seed(3)
    mass = torch.randint(0, 4, (6, V), generator=g).float()
    mass[:, : 2 * cpu_sampling.BLOCK] *= torch.rand(6, 1, generator=g) < 0.5  # empty blocks
    mass[0, :-1] = 0.0  # all the mass on the very last id
    for u in (0.0, 0.5, 1 - 2**-24, 0.123):
        u_t = torch.full((6,), u)
        tok, total = _cpu_inverse_cdf(mass, u_t)
        run = mass.cumsum(-1)
        want = torch.searchsorted(run, (u_t * run[:, -1])[:, None], right=True)[:, 0]
        assert torch.equal(total, run[:, -1]) and torch.equal(tok, want), u


def test_top_k_accepts_int64():
    b = make_batch(73, "top_k", B=4, k=2, V=10)
    want = run("public", b)
    assert_same(run("public", replace(b, top_k=b.top_k.long())), want)


def test_empty_draft_buffers_with_draft_probs(kernel_device):
    b = make_batch(79, "sampled", B=3, k=2, V=9)
    b = replace(
        b,
        logits=b.logits[:3],
        drafts=torch.zeros(0, dtype=torch.int32),
        cu=torch.zeros(4, dtype=torch.int32),
        draft_probs=torch.zeros(0, 9),
    )
    want = run("public", replace(b, draft_probs=None))
    for impl in ("public", "triton", "reference"):
        assert_same(run(impl, b, kernel_device), want, what=impl)


def test_k_zero_is_a_plain_sampler(kernel_device):
    b = make_batch(29, "filters", B=5, k=0, V=17)
    assert b.drafts.numel() == 0
    cpu = run("cpu", b)
    assert cpu[0].shape == (5, 1) and cpu[1].tolist() == [1] * 5
    assert_same(run("reference", b), cpu)
    assert_same(run("triton", b, kernel_device), cpu)


def test_request_randomness_does_not_depend_on_batch_row_or_neighbours(kernel_device):
    base = make_batch(31, "filters", B=1, k=3, V=23)
    base.cu = cu_of([3])
    base.drafts = torch.tensor([1, 2, 3], dtype=torch.int32)
    base.logits = torch.randn(4, 23, generator=torch.Generator().manual_seed(3))
    base.logits[:, :4] += 3.0
    base.temperature = torch.tensor([0.9])
    other = make_batch(37, "filters", B=3, k=3, V=23)
    # The same request, alone and as batch row 2 between two other requests.
    N0 = int(other.cu[2])
    mixed = Batch(
        logits=torch.cat([other.logits[: N0 + 2], base.logits, other.logits[N0 + 2 :]]),
        drafts=torch.cat([other.drafts[:N0], base.drafts, other.drafts[N0:]]),
        cu=cu_of(
            [
                int(other.cu[1] - other.cu[0]),
                int(other.cu[2] - other.cu[1]),
                3,
                int(other.cu[3] - other.cu[2]),
            ]
        ),
        k=3,
    )
    for name in ("temperature", "top_k", "top_p", "min_p", "seeds", "offsets"):
        o, s = getattr(other, name), getattr(base, name)
        setattr(mixed, name, torch.cat([o[:2], s, o[2:]]))
    for impl in ("public", "triton"):
        alone = run(impl, base, kernel_device)
        together = run(impl, mixed, kernel_device)
        assert torch.equal(together[0][2], alone[0][0]), impl
        assert int(together[1][2]) == int(alone[1][0]), impl


def test_greedy_rows_ignore_sampling_parameters(kernel_device):
    b = make_batch(41, "filters", B=4, k=2, V=15)
    b.temperature = torch.tensor([0.0, 0.0, 1.0, 0.0])
    greedy = run("public", replace(b, temperature=None, top_k=None, top_p=None, min_p=None))
    for impl in ("public", "triton"):
        for top_k in (b.top_k, torch.ones(4, dtype=torch.int32)):
            out = run(impl, replace(b, top_k=top_k), kernel_device)
            for r in (0, 1, 3):
                assert torch.equal(out[0][r], greedy[0][r]), impl


def test_logprobs_are_log_softmax_of_raw_logits_at_emitted_tokens():
    b = make_batch(43, "filters", B=5, k=3, V=19)
    tokens, num, lp = run("public", b)
    for r in range(5):
        start = int(b.cu[r]) + r
        for j in range(4):
            if j < int(num[r]):
                want = torch.log_softmax(b.logits[start + j], 0)[int(tokens[r, j])]
                assert abs(float(lp[r, j]) - float(want)) < 1e-5
            else:
                assert float(lp[r, j]) == 0.0


def test_sampling_offsets_is_the_first_query_position():
    num_tokens = torch.tensor([5, 9, 1], dtype=torch.int32)
    assert sampling_offsets(num_tokens).tolist() == [4, 8, 0]
    req = torch.tensor([2, -1, 0], dtype=torch.int32)
    out = sampling_offsets(num_tokens, req)
    assert out.tolist() == [0, 0, 4] and out.dtype == torch.int64


# ---------------------------------------------------------------- registration


def _op_kwargs(b: Batch, logprobs: bool):
    return {"num_speculative_tokens": b.k, "return_logprobs": logprobs}


def test_torch_op_returns_an_empty_logprobs_tensor_and_wrapper_none():
    b = make_batch(53, "sampled", B=2, k=1, V=5)
    out = torch.ops.specdec.rejection_sample(*b.tensors(), **_op_kwargs(b, False))
    assert out[2].shape == (0,) and out[2].dtype == torch.float32
    assert run("public", b, logprobs=False)[2] is None


@pytest.mark.parametrize("missing", ["seeds", "offsets"])
def test_torch_op_requires_seeds_and_offsets_for_sampled_rows(missing, kernel_device):
    b = replace(make_batch(59, "sampled", B=2, k=1, V=5), **{missing: None})
    with pytest.raises(ValueError, match="needs seeds and offsets"):
        torch.ops.specdec.rejection_sample(*b.tensors(), **_op_kwargs(b, False))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:  # the fake (what torch.compile traces) checks it too
        fake = [None if t is None else mode.from_tensor(t) for t in b.tensors()]
        with pytest.raises(ValueError, match="needs seeds and offsets"):
            torch.ops.specdec.rejection_sample(*fake, **_op_kwargs(b, False))
    dev = [None if t is None else t.to(kernel_device) for t in b.tensors()]
    with pytest.raises(ValueError, match="needs seeds and offsets"):
        triton_rej.rejection_sample(*dev, **_op_kwargs(b, False))


@pytest.mark.parametrize("given", ["seeds", "offsets"])
def test_seeds_and_offsets_go_together(given):
    b = make_batch(60, "sampled", B=2, k=1, V=5)
    other = "offsets" if given == "seeds" else "seeds"
    for temperature in (b.temperature, None):  # with or without sampled rows
        with pytest.raises(ValueError, match=f"seeds and offsets go together: {given} .*{other}"):
            run("public", replace(b, temperature=temperature, **{other: None}))


def test_torch_compile_fullgraph_draws_seeds_on_device():
    b = make_batch(67, "sampled", B=3, k=2, V=12)

    def step(logits, drafts, cu, temperature):
        out = rejection_sample(
            logits, drafts, cu, num_speculative_tokens=2, temperature=temperature
        )
        return out.output_token_ids, out.num_emitted

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    tokens, num = compiled(b.logits, b.drafts, b.cu, b.temperature)
    assert tokens.shape == (3, 3) and ((num >= 1) & (num <= 3)).all()


def test_wrapper_draws_fresh_seeds_when_none_given():
    n, V = 64, 1000
    logits = torch.zeros(n, V)
    kw = dict(num_speculative_tokens=0, temperature=torch.ones(n))
    args = (logits, torch.zeros(0, dtype=torch.int32), torch.zeros(n + 1, dtype=torch.int32))
    torch.manual_seed(0)
    a = rejection_sample(*args, **kw).output_token_ids
    b = rejection_sample(*args, **kw).output_token_ids
    torch.manual_seed(0)
    c = rejection_sample(*args, **kw).output_token_ids
    assert not torch.equal(a, b)
    assert torch.equal(a, c)


# ---------------------------------------------------------------- errors


def _good(**overrides):
    b = make_batch(71, "filters", B=3, k=2, V=8)
    kw = dict(
        num_speculative_tokens=b.k,
        temperature=b.temperature,
        top_k=b.top_k,
        top_p=b.top_p,
        min_p=b.min_p,
        seeds=b.seeds,
        offsets=b.offsets,
    )
    args = {"target_logits": b.logits, "draft_token_ids": b.drafts, "cu_num_draft_tokens": b.cu}
    for key, value in overrides.items():
        if key in args:
            args[key] = value
        else:
            kw[key] = value
    return args, kw


def _cu(*values):
    return torch.tensor(values, dtype=torch.int32)


BAD = [
    ("target_logits", torch.zeros(3, 8, dtype=torch.int32), "target_logits must have dtype"),
    ("target_logits", torch.zeros(20, 8, 1), "target_logits must be 2-D"),
    ("target_logits", torch.zeros(2, 8), "at least len\\(draft_token_ids\\) \\+ B"),
    ("target_logits", torch.zeros(20, 0), "vocabulary of at least 1"),
    ("draft_token_ids", torch.zeros(4, dtype=torch.int64), "draft_token_ids must have dtype"),
    ("cu_num_draft_tokens", torch.zeros(0, dtype=torch.int32), "shape \\(B \\+ 1,\\)"),
    ("cu_num_draft_tokens", torch.zeros(4, dtype=torch.int64), "cu_num_draft_tokens must have"),
    ("cu_num_draft_tokens", _cu(1, 1, 2, 3), "cu_num_draft_tokens\\[0\\] must be 0"),
    ("cu_num_draft_tokens", _cu(0, 2, 1, 1), "cu non-decreasing"),
    ("cu_num_draft_tokens", _cu(0, 3, 3, 3), "<= num_speculative_tokens = 2"),
    ("num_speculative_tokens", -1, "num_speculative_tokens must be >= 0"),
    ("num_speculative_tokens", 1.0, "num_speculative_tokens must be a Python int"),
    ("draft_probs", torch.zeros(0, 8), "draft_probs must have at least N"),
    ("draft_probs", torch.zeros(20, 7), "draft_probs must have shape"),
    ("draft_probs", torch.zeros(20, 8, dtype=torch.int32), "draft_probs must have dtype"),
    ("temperature", torch.ones(2), "temperature must have shape \\(3,\\)"),
    ("temperature", torch.ones(3, dtype=torch.float64), "temperature must have dtype"),
    (
        "temperature",
        torch.tensor([1.0, -0.5, 1.0]),
        r"temperature must lie in \[0, 3.4\S+\] \(finite",
    ),
    (
        "temperature",
        torch.tensor([1.0, INF, 1.0]),
        r"temperature must lie in \[0, 3.4\S+\] \(finite",
    ),
    (
        "temperature",
        torch.tensor([1.0, float("nan"), 1.0]),
        r"temperature must lie in .* got a NaN",
    ),
    ("top_k", torch.tensor([1, -1, 0], dtype=torch.int32), r"top_k must lie in \[0, "),
    # int64 negatives that a cast to int32 would wrap to 0, 5 or 2**31 - 1 (found by review)
    ("top_k", torch.tensor([1, -(2**32), 0]), r"top_k must lie in \[0, "),
    ("top_k", torch.tensor([1, -(2**32) + 5, 0]), r"top_k must lie in \[0, "),
    ("top_k", torch.tensor([1, -(2**31) - 1, 0]), r"top_k must lie in \[0, "),
    ("top_k", torch.ones(3), "top_k must have dtype"),
    ("top_p", torch.tensor([0.5, 0.0, 1.0]), r"top_p must lie in \(0, 1\]"),
    ("top_p", torch.tensor([0.5, 1.5, 1.0]), r"top_p must lie in \(0, 1\]"),
    ("min_p", torch.tensor([0.5, -0.1, 1.0]), r"min_p must lie in \[0, 1\]"),
    ("min_p", torch.tensor([0.5, 1.1, 1.0]), r"min_p must lie in \[0, 1\]"),
    ("seeds", torch.ones(3, dtype=torch.int32), "seeds must have dtype int64"),
    ("offsets", torch.ones(5, dtype=torch.int64), "offsets must have shape \\(3,\\)"),
    ("offsets", torch.ones(4, dtype=torch.int64), "offsets has 4 entries .* inclusive"),
]


@pytest.mark.parametrize("name,value,match", BAD, ids=[f"{n}-{m[:24]}" for n, _, m in BAD])
def test_bad_input_raises_value_error(name, value, match):
    args, kw = _good(**{name: value})
    with pytest.raises(ValueError, match=match):
        rejection_sample(*args.values(), **kw)


def test_cu_past_the_draft_buffer_raises():
    args, kw = _good()
    args["cu_num_draft_tokens"] = _cu(0, 2, 4, 60)
    kw["num_speculative_tokens"] = 60
    args["target_logits"] = torch.zeros(80, 8)
    with pytest.raises(ValueError, match="cu_num_draft_tokens\\[B\\] must be <="):
        rejection_sample(*args.values(), **kw)


def test_the_kernels_value_checks_agree_with_the_wrappers():
    # random batches, half with one bad value: the CPU kernel refuses exactly what the
    # wrapper's checks refuse (writing nothing) and computes the op's result for the others
    from specdec_kernels.ops.rejection import _check_values

    g = torch.Generator().manual_seed(4)
    refused = 0
    for trial in range(300):
        mode = ("greedy", "sampled", "probs", "filters")[trial % 4]
        b = make_batch(trial, mode, B=int(torch.randint(0, 4, (1,), generator=g)), k=2, V=9)
        B, k = b.cu.shape[0] - 1, b.k
        params = {n: getattr(b, n) for n in ("temperature", "top_k", "top_p", "min_p")}
        cu, drafts, probs = b.cu.clone(), b.drafts, b.draft_probs
        if trial % 2:  # one bad value
            what = int(torch.randint(0, 6, (1,), generator=g))
            i = int(torch.randint(0, B + 1, (1,), generator=g))
            if what == 0:
                cu[i] += 1 if trial % 4 == 1 else -1
            elif what == 1:
                drafts = drafts[: max(drafts.shape[0] - 1, 0)]
            elif what == 2 and probs is not None:
                probs = probs[: max(probs.shape[0] - 1, 0)]
            elif what == 3 and params["temperature"] is not None and B:
                params["temperature"][i % B] = [-0.5, float("nan"), float("inf")][trial % 3]
            elif what == 4 and params["top_p"] is not None and B:
                params["top_p"][i % B] = [0.0, 1.5][trial % 2]
            elif what == 5 and params["top_k"] is not None and B:
                params["top_k"][i % B] = -1
        seeds, offsets = b.seeds, b.offsets
        if params["temperature"] is not None and seeds is None:
            seeds, offsets = torch.zeros(B, dtype=torch.int64), torch.zeros(B, dtype=torch.int64)
        top_k = params["top_k"]
        args = (b.logits, drafts, cu, probs, params["temperature"],
                None if top_k is None else top_k.to(torch.int32), params["top_p"],
                params["min_p"], seeds, offsets)  # fmt: skip
        kw = dict(num_speculative_tokens=k, return_logprobs=True)
        got = cpu_rej.rejection_sample_checked(*args, **kw)
        try:
            _check_values(cu, k, drafts.shape[0], probs, params["temperature"], top_k,
                          params["top_p"], params["min_p"])  # fmt: skip
        except ValueError:
            assert got is None, trial
            refused += 1
            continue
        assert got is not None, trial
        want = cpu_rej.rejection_sample(*args, **kw)
        assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True)), trial
    assert 50 < refused < 160, refused


def test_checks_that_disagree_are_a_runtime_error(monkeypatch):
    from specdec_kernels.ops import _library

    info = _library.OPS["rejection_sample"]
    monkeypatch.setitem(
        _library.OPS, "rejection_sample", info._replace(cpu_checked=lambda **kw: None)
    )
    args, kw = _good()
    with pytest.raises(RuntimeError, match="the two copies of the checks disagree"):
        rejection_sample(*args.values(), **kw)


def test_value_checks_can_be_turned_off():
    args, kw = _good(top_p=torch.tensor([0.5, 1.5, 1.0]))
    out = rejection_sample(*args.values(), validate=False, **kw)
    assert out.output_token_ids.shape == (3, 3)


def test_unchecked_drafts_without_their_draft_prob_row_are_rejected():
    # validate=False with fewer draft-prob rows than drafts: the CPU kernel must not read
    # past the rows it was given; such a draft is rejected (the row's own sample is emitted)
    g = torch.Generator().manual_seed(72)
    B, k, V = 2, 2, 8
    logits = torch.randn(B * (k + 1), V, generator=g)
    flat = [0, 1, 3, 4]  # the target rows of the four drafts (rows 2 and 5 are bonus rows)
    q = torch.softmax(logits[flat], dim=-1)  # q = p: every draft with its q row is kept
    drafts = torch.multinomial(q, 1, generator=g).flatten().int()
    cu = torch.tensor([0, 2, 4], dtype=torch.int32)
    kw = dict(num_speculative_tokens=k, temperature=torch.ones(B),
              seeds=torch.tensor([1, 2]), offsets=torch.zeros(B, dtype=torch.int64),
              validate=False)  # fmt: skip
    full = rejection_sample(logits, drafts, cu, draft_probs=q, **kw)
    assert full.num_emitted.tolist() == [3, 3]
    cut = rejection_sample(logits, drafts, cu, draft_probs=q[:1], **kw)
    assert cut.num_emitted.tolist() == [2, 1]
    assert int(cut.output_token_ids[0, 0]) == int(drafts[0])
    none = rejection_sample(logits, drafts, cu, draft_probs=q[:0], **kw)
    assert none.num_emitted.tolist() == [1, 1]


def test_device_mismatch_raises():
    args, kw = _good(temperature=torch.ones(3, device="meta"))
    with pytest.raises(ValueError, match="temperature must be on cpu"):
        rejection_sample(*args.values(), **kw)


# ---------------------------------------------------------------- regressions


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy: 2 log2(e) / T = inf, 0 * inf
@pytest.mark.parametrize("impl", ["reference", "cpu", "triton"])
def test_tiny_temperature_does_not_overflow_to_a_uniform_choice(impl, kernel_device):
    # logits / T would overflow to +inf on both tokens (a 50/50 choice); the distribution
    # at T -> 0 is the argmax, token 1.
    B = 64
    batch = Batch(
        logits=torch.tensor([[40.0, 50.0], [1.0, 2.0]]).repeat(B // 2, 1),
        drafts=torch.zeros(0, dtype=torch.int32),
        cu=torch.zeros(B + 1, dtype=torch.int32),
        k=0,
        temperature=torch.tensor([1e-37, 1e-39]).repeat(B // 2),
        seeds=torch.arange(B, dtype=torch.int64),
        offsets=torch.zeros(B, dtype=torch.int64),
    )
    tokens, _, _ = run(impl, batch, kernel_device)
    assert tokens[:, 0].tolist() == [1] * B


@pytest.mark.parametrize("impl", ["reference", "cpu", "triton"])
def test_nan_logits_count_as_neg_inf_in_logprobs(impl, kernel_device):
    batch = Batch(
        logits=torch.tensor([[float("nan"), 1.0, 1.0]]),
        drafts=torch.zeros(0, dtype=torch.int32),
        cu=torch.zeros(2, dtype=torch.int32),
        k=0,
    )
    tokens, _, logprobs = run(impl, batch, kernel_device)
    assert tokens[0, 0] == 1
    assert logprobs[0, 0].item() == pytest.approx(math.log(0.5))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy (the interpreter) on inf - inf
@pytest.mark.parametrize("impl", ["reference", "cpu", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [None, 1.0])
@pytest.mark.parametrize(
    ("row", "maximal", "logprob"),
    [
        ([-INF], {0}, 0.0),  # V = 1: the one token is certain
        ([float("nan")], {0}, 0.0),
        ([-INF] * 5, {0, 1, 2, 3, 4}, -math.log(5)),  # no finite maximum: 5 ids share it
        ([float("nan"), -INF, float("nan"), -INF], {0, 1, 2, 3}, -math.log(4)),
        ([INF, 0.0, INF, float("nan"), -INF], {0, 2}, -math.log(2)),
    ],
)
def test_rows_without_a_finite_maximum_share_it_among_their_maximal_ids(
    impl, dtype, temperature, row, maximal, logprob, kernel_device
):
    # log_softmax gives NaN on these rows; docs/design.md ("logprobs") fixes -log(n) at the
    # n ids holding the maximum, the limit of equal finite maxima, on every path: the
    # distribution the sampler draws from (greedy: the lowest of those ids).
    n = 32
    batch = Batch(
        logits=torch.tensor([row] * n, dtype=dtype),
        drafts=torch.zeros(0, dtype=torch.int32),
        cu=torch.zeros(n + 1, dtype=torch.int32),
        k=0,
        temperature=None if temperature is None else torch.full((n,), temperature),
        seeds=torch.arange(n, dtype=torch.int64),
        offsets=torch.zeros(n, dtype=torch.int64),
    )
    out, emitted, logprobs = run(impl, batch, kernel_device)
    assert emitted.tolist() == [1] * n
    if temperature is None:
        assert out[:, 0].tolist() == [min(maximal)] * n
    else:
        assert set(out[:, 0].tolist()) == maximal
    assert logprobs[:, 0].tolist() == pytest.approx([logprob] * n, abs=1e-6)
    assert not logprobs.isnan().any()


def test_draft_probs_need_rows_for_the_drafts_only():
    # Static draft buffer of 4 slots, N = cu[B] = 2 real drafts: 2 rows of q suffice.
    V = 5
    out = rejection_sample(
        torch.zeros(4 + 2, V),
        torch.tensor([1, 2, -1, -1], dtype=torch.int32),
        torch.tensor([0, 1, 2], dtype=torch.int32),
        num_speculative_tokens=1,
        draft_probs=torch.full((2, V), 0.2),
        temperature=torch.ones(2),
    )
    assert out.num_emitted.shape == (2,)
    with pytest.raises(ValueError, match="draft_probs must have at least N"):
        rejection_sample(
            torch.zeros(6, V),
            torch.tensor([1, 2, -1, -1], dtype=torch.int32),
            torch.tensor([0, 1, 2], dtype=torch.int32),
            num_speculative_tokens=1,
            draft_probs=torch.full((1, V), 0.2),
            temperature=torch.ones(2),
        )


@pytest.mark.parametrize(
    ("num_tokens", "req_indices", "match"),
    [
        (torch.tensor([3.0, 4.0]), None, "num_tokens must have dtype"),
        (torch.tensor([[3, 4]]), None, "num_tokens must be 1-D"),
        (torch.tensor([3, 4]), torch.tensor([0.0]), "req_indices must have dtype int32"),
        (torch.tensor([3, 4]), torch.tensor([2], dtype=torch.int32), r"req_indices must lie in"),
        (torch.tensor([3, 4]), torch.tensor([-3], dtype=torch.int32), r"req_indices must lie in"),
    ],
)
def test_sampling_offsets_bad_input(num_tokens, req_indices, match):
    with pytest.raises(ValueError, match=match):
        sampling_offsets(num_tokens, req_indices)


def test_sampling_offsets_of_padding_rows_over_empty_state():
    out = sampling_offsets(
        torch.zeros(0, dtype=torch.int32), torch.tensor([-1, -1], dtype=torch.int32)
    )
    assert out.tolist() == [0, 0]


def _cpu_weights(row: torch.Tensor, T: float) -> torch.Tensor:
    """The CPU path's weights of one fp32 row at temperature ``T`` (no filters)."""
    V = row.shape[0]
    f32 = row.float()[None].numpy()
    none = np.zeros((0, 0), dtype=np.uint16)
    buf = np.zeros(cpu_sampling.BLOCK, dtype=np.float32)
    m = cpu_sampling.row_max(f32, none, False, 0, V, buf)
    w = np.zeros(V, dtype=np.float32)
    blocks = np.zeros((V + cpu_sampling.BLOCK - 1) // cpu_sampling.BLOCK, dtype=np.float64)
    cpu_sampling.weights(f32, none, False, 0, V, m, np.float32(T), w, blocks, buf)
    return torch.from_numpy(w)


@pytest.mark.parametrize("impl", ["reference", "cpu", "triton"])
def test_logit_differences_near_the_float32_limit_do_not_overflow(impl, kernel_device):
    # l - max l = -4e38 overflows float32; the weights must still be softmax(l / T).
    logits = torch.tensor([[2e38, -2e38, 0.0]])
    T = 3e38
    p = torch.softmax(torch.tensor([2e38 / T, -2e38 / T, 0.0], dtype=torch.float64), 0)
    w = _cpu_weights(logits[0], T)
    torch.testing.assert_close(w.double() / w.double().sum(), p, atol=1e-6, rtol=0)
    B = 400
    batch = Batch(
        logits=logits.repeat(B, 1),
        drafts=torch.zeros(0, dtype=torch.int32),
        cu=torch.zeros(B + 1, dtype=torch.int32),
        k=0,
        temperature=torch.full((B,), T),
        seeds=torch.arange(B, dtype=torch.int64),
        offsets=torch.zeros(B, dtype=torch.int64),
    )
    tokens, _, _ = run(impl, batch, kernel_device, logprobs=False)
    assert (tokens[:, 0] == 1).sum() > 20  # p(1) = 0.148; the overflow made it 0


# ---------------------------------------------------------------- coupled verification


def prefix_logits(prefix: list[int], V: int) -> torch.Tensor:
    """A toy model: fp32 logits that are a deterministic function of the whole prefix,
    peaked on a few ids so that a plain sampler's tokens are often predictable."""
    g = torch.Generator().manual_seed(zlib.crc32(bytes(str(prefix), "ascii")))
    logits = torch.randn(V, generator=g) * 1.5
    logits[torch.randint(0, V, (3,), generator=g)] += torch.tensor([4.0, 3.0, 2.5])
    return logits


# Per-request sampling parameters: greedy, plain temperature, each filter, all of them,
# and filters that are present but off (top_p = 1.0, top_k = 0 or >= V, min_p = 0).
REQUESTS = [
    dict(T=0.0),
    dict(T=0.8),
    dict(T=1.3, top_k=5),
    dict(T=1.0, top_p=0.8),
    dict(T=0.9, min_p=0.05),
    dict(T=1.1, top_k=6, top_p=0.9, min_p=0.02),
    dict(T=0.7, top_p=1.0, top_k=0, min_p=0.0),
    dict(T=1.2, top_k=1000),
]


def _sampling_batch(logits, drafts, counts, k, req_ids, seeds, offsets):
    """A Batch for the requests ``req_ids`` (in batch-row order); a filter tensor is passed
    only if some request of this batch sets that filter (so requests whose filters are
    off see it passed in some batches and absent in others)."""
    params = [REQUESTS[r] for r in req_ids]
    b = Batch(
        logits=logits,
        drafts=torch.tensor(drafts, dtype=torch.int32),
        cu=cu_of(counts),
        k=k,
        temperature=torch.tensor([p["T"] for p in params]),
        seeds=torch.tensor([seeds[r] for r in req_ids], dtype=torch.int64),
        offsets=torch.tensor(offsets, dtype=torch.int64),
    )
    for name, off, dtype in (("top_k", 0, torch.int32), ("top_p", 1.0, None), ("min_p", 0.0, None)):
        if any(name in p for p in params):
            setattr(b, name, torch.tensor([p.get(name, off) for p in params], dtype=dtype))
    return b


def plain_sampling_loop(impl, prompts, seeds, n, V, device):
    """k = 0: one call per step for every request, in order; returns n tokens each."""
    seqs = [list(p) for p in prompts]
    R = len(prompts)
    for _ in range(n):
        logits = torch.stack([prefix_logits(s, V) for s in seqs])
        b = _sampling_batch(logits, [], [0] * R, 0, range(R), seeds, [len(s) - 1 for s in seqs])
        tokens = run(impl, b, device, logprobs=False)[0][:, 0].tolist()
        for s, t in zip(seqs, tokens, strict=True):
            s.append(t)
    return [s[len(p) :] for s, p in zip(seqs, prompts, strict=True)]


def speculative_loop(impl, prompts, seeds, want, V, device, *, k, perturb, rng):
    """n-gram-style speculation with drafts taken from ``want`` (the plain sampler's own
    tokens), some perturbed; every step verifies a random subset of the requests in a random
    batch order with ragged draft counts. Returns the tokens and (accepted, rejected)."""
    seqs = [list(p) for p in prompts]
    out = [[] for _ in prompts]
    n = len(want[0])
    accepted = rejected = 0
    while any(len(o) < n for o in out):
        live = [r for r in range(len(prompts)) if len(out[r]) < n]
        rng.shuffle(live)
        batch = live[: rng.randint(1, len(live))]
        rows, drafts, counts = [], [], []
        for r in batch:
            have = len(out[r])
            d = list(want[r][have : have + rng.randint(0, k)])
            if d and rng.random() < perturb:
                i = rng.randrange(len(d))
                d[i] = (d[i] + 1 + rng.randrange(V - 1)) % V if rng.random() < 0.8 else -1
            rows += [prefix_logits(seqs[r] + d[:j], V) for j in range(len(d) + 1)]
            drafts += d
            counts.append(len(d))
        offsets = [len(seqs[r]) - 1 for r in batch]
        b = _sampling_batch(torch.stack(rows), drafts, counts, k, batch, seeds, offsets)
        tokens, num, _ = run(impl, b, device, logprobs=False)
        for i, r in enumerate(batch):
            emitted = tokens[i, : int(num[i])].tolist()
            accepted += len(emitted) - 1
            rejected += len(emitted) - 1 < counts[i]
            take = emitted[: n - len(out[r])]
            out[r] += take
            seqs[r] += take
    return out, (accepted, rejected)


@pytest.mark.parametrize(
    "impl,V,n",
    [("public", 3001, 24), ("public", 37, 24), ("reference", 37, 10), ("triton", 29, 8)],
)
def test_speculation_emits_exactly_the_plain_samplers_tokens(impl, V, n, kernel_device):
    """Coupled verification: whatever the drafts (the plain sampler's own tokens, so they
    are accepted, or perturbed, so they are rejected early), the batch, the batch order and
    the filters of the other requests, every request gets the tokens of a plain k = 0
    sampling loop, token for token."""
    rng = random.Random(V * 1000 + n)
    prompts = [[rng.randrange(V) for _ in range(rng.randint(1, 6))] for _ in REQUESTS]
    seeds = [rng.randrange(-(2**62), 2**62) for _ in REQUESTS]
    want = plain_sampling_loop(impl, prompts, seeds, n, V, kernel_device)
    counts = [0, 0]
    for perturb in (0.0, 0.5):
        got, (acc, rej) = speculative_loop(
            impl, prompts, seeds, want, V, kernel_device, k=3, perturb=perturb, rng=rng
        )
        assert got == want, f"perturb={perturb}"
        counts[0] += acc
        counts[1] += rej
    assert counts[0] > 2 * len(REQUESTS) and counts[1] > 0  # both paths were exercised


@pytest.mark.parametrize("impl", ["public", "reference", "triton"])
def test_a_rows_tokens_do_not_depend_on_other_rows_filters(impl, kernel_device):
    """A row with no filter gives the same tokens whether the filter tensors are absent or
    passed with the row's "off" value (top_p = 1.0, top_k = 0, min_p = 0) while the other
    rows turn them on."""
    b = make_batch(83, "sampled", B=4, k=3, V=23)
    alone = run(impl, b, kernel_device)
    others = replace(  # rows 1-3: only the top token is left (top-k 1, top-p ~0, min-p 1)
        b,
        top_k=torch.tensor([0, 1, 0, 0], dtype=torch.int32),
        top_p=torch.tensor([1.0, 1.0, 1e-6, 1.0]),
        min_p=torch.tensor([0.0, 0.0, 0.0, 1.0]),
    )
    mixed = run(impl, others, kernel_device)
    assert torch.equal(mixed[0][0], alone[0][0]) and int(mixed[1][0]) == int(alone[1][0])
    first_rows = b.cu[1:4].long() + torch.arange(1, 4)  # row 0 of requests 1-3
    assert torch.equal(mixed[0][1:, 0].long(), b.logits[first_rows].argmax(-1))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy (the interpreter) on inf - inf
@pytest.mark.parametrize("impl", ["public", "reference", "triton"])
def test_logprobs_match_log_softmax_for_logits_of_any_magnitude(impl, kernel_device):
    """(l - m) - log S, not l - (m + log S): with |m| ~ 1e30 the latter rounds log S away."""
    V = 40
    g = torch.Generator().manual_seed(5)
    scales = [1.0, 1e4, 1e15, 1e30, 1e37, 1.5e38]
    rows = [torch.randn(V, generator=g) * s for s in scales]
    tie = torch.full((V,), -1e30)
    tie[[3, 17]] = 1e30  # two tied maxima at a huge magnitude: log p = -log 2
    near = torch.full((V,), 3e38)
    near[::2] = -3e38  # l - m overflows to -inf: log p = -inf there
    rows += [tie, near, torch.linspace(-1.0, 1.0, V) * 3e38]
    logits = torch.stack(rows).clamp(-3.4e38, 3.4e38)
    R = logits.shape[0]
    # Sampled at T = the row's own scale (diverse tokens), and greedy (the maxima).
    T = torch.tensor([max(float(r.abs().max()), 1.0) for r in logits])
    for temperature in (T, torch.zeros(R)):
        b = Batch(
            logits=logits,
            drafts=torch.zeros(0, dtype=torch.int32),
            cu=torch.zeros(R + 1, dtype=torch.int32),
            k=0,
            temperature=temperature,
            seeds=torch.arange(R, dtype=torch.int64) * 7,
            offsets=torch.arange(R, dtype=torch.int64),
        )
        tokens, _, lp = run(impl, b, kernel_device)
        want = torch.log_softmax(logits, dim=-1).gather(1, tokens.long())[:, 0]
        got = lp[:, 0]
        finite = torch.isfinite(want)
        assert torch.equal(got[~finite], want[~finite])  # -inf where log_softmax is -inf
        torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-6)
    assert float(lp[R - 3, 0]) == pytest.approx(-math.log(2), abs=1e-6)  # the tie row


def test_cpu_path_runs_inside_and_then_outside_inference_mode(monkeypatch):
    # An engine decodes under torch.inference_mode(); a test or a second caller then runs
    # outside it. The CPU path's reused scratch buffer, first made inside, must still be
    # writable outside (a torch inference tensor was not: found by the suite's test order).
    monkeypatch.setattr(cpu_jit, "_SCRATCH", type(cpu_jit._SCRATCH)())  # no buffer yet
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 50, generator=g)
    drafts = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    cu = torch.tensor([0, 2, 4], dtype=torch.int32)
    kw = dict(
        num_speculative_tokens=2,
        temperature=torch.tensor([0.7, 1.0]),
        seeds=torch.tensor([5, 6]),
        offsets=torch.tensor([0, 0]),
    )
    with torch.inference_mode():
        inside = rejection_sample(logits, drafts, cu, **kw)
    outside = rejection_sample(logits, drafts, cu, **kw)
    assert torch.equal(inside.output_token_ids, outside.output_token_ids)
    assert torch.equal(inside.num_emitted, outside.num_emitted)


def test_cpu_path_keeps_no_autograd_graph_of_its_inputs():
    # Logits that require grad (a caller outside no_grad): the op has no gradient, and its
    # reused scratch buffer must not chain the callers' graphs from call to call.
    drafts = torch.tensor([1, 2], dtype=torch.int32)
    cu = torch.tensor([0, 2], dtype=torch.int32)
    kw = dict(num_speculative_tokens=2, temperature=torch.tensor([0.7]),
              seeds=torch.tensor([5]), offsets=torch.tensor([0]))  # fmt: skip
    for _ in range(2):
        w = torch.randn(50, 50, requires_grad=True)
        logits = torch.randn(3, 50) @ w
        out = rejection_sample(logits, drafts, cu, **kw, return_logprobs=True)
        want = rejection_sample(logits.detach(), drafts, cu, **kw, return_logprobs=True)
        assert all(torch.equal(a.detach(), b) for a, b in zip(out, want, strict=True))
    assert isinstance(cpu_jit._SCRATCH.buf, np.ndarray)  # numpy: no graph to keep


def _i32t(x):
    return torch.tensor(x, dtype=torch.int32)


def test_rejection_sample_names_the_inclusive_exclusive_mix_up():
    # Three requests with 2, 0, 3 drafts; vLLM's inclusive cu passed as is.
    logits = torch.randn(5 + 3, 7)
    drafts = _i32t([1, 2, 3, 4, 5])
    inclusive = _i32t([2, 2, 5])
    with pytest.raises(ValueError, match="cu_num_draft_tokens\\[0\\] must be 0.*inclusive"):
        rejection_sample(logits, drafts, inclusive, num_speculative_tokens=3)
    # ... and a per-request argument of length B tells the same story without value checks
    temperature = torch.ones(3)
    with pytest.raises(ValueError, match="temperature has 3 entries.*exclusive_cu_num_draft"):
        rejection_sample(
            logits, drafts, inclusive, num_speculative_tokens=3, temperature=temperature,
            validate=False,
        )  # fmt: skip


# ---------------------------------------------------------------- GPU (bench/gpu_check.sh)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["sampled", "probs", "filters"])
def test_gpu_large_vocab_tokens_agree_with_cpu_path(mode):
    """Real vocabulary, bf16 logits: the GPU's approximate exp and its summation order move
    CDF boundaries by float rounding only, so almost every token agrees with the CPU path; the
    rate is printed. These random rows are nearly flat (boundaries ~1e-5 of the mass apart,
    the order of fp32 sums over 152k terms), so rounding flips a few percent of them: the
    H200 gave 98.5% (sampled) and 95.1% (filters) on 2026-12-04; a wrong rule gives far less."""
    b = make_batch(5, mode, B=64, k=3, V=151_936, dtype=torch.bfloat16)
    cpu = run("cpu", b)
    gpu = run("triton", b, torch.device("cuda"))
    emitted = torch.arange(b.k + 1)[None, :] < torch.maximum(cpu[1], gpu[1])[:, None]
    same, total = int(((cpu[0] == gpu[0]) & emitted).sum()), int(emitted.sum())
    print(f"\nGPU/CPU token agreement ({mode}, V=151936): {same}/{total} = {same / total:.4%}")
    assert same / total >= 0.9
    # a logprob belongs to its token: compared where both paths emitted the same one
    both = (torch.arange(b.k + 1)[None, :] < torch.minimum(cpu[1], gpu[1])[:, None]) & (
        cpu[0] == gpu[0]
    )
    torch.testing.assert_close(gpu[2][both], cpu[2][both], atol=1e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("sampled", [False, True])
def test_gpu_rows_past_2_31_elements_use_int64_offsets(sampled):
    V, B, k = 262_144, 2100, 3  # 8400 rows x 262144 > 2**31 elements
    rows = B * (k + 1)
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(rows, V, device="cuda", dtype=torch.bfloat16, generator=g)
    spike = torch.randint(0, V, (rows,), device="cuda", generator=g)
    logits[torch.arange(rows, device="cuda"), spike] = 100.0  # a unique, certain maximum
    per_request = spike.view(B, k + 1)
    drafts = per_request[:, :k].reshape(-1).int().contiguous()
    cu = torch.arange(0, k * B + 1, k, dtype=torch.int32, device="cuda")
    kw = {}
    if sampled:
        kw = dict(
            temperature=torch.ones(B, device="cuda"),
            top_k=torch.full((B,), 5, dtype=torch.int32, device="cuda"),
            top_p=torch.full((B,), 0.5, device="cuda"),
            seeds=torch.arange(B, device="cuda"),
            offsets=torch.zeros(B, dtype=torch.int64, device="cuda"),
        )
    out = rejection_sample(logits, drafts, cu, num_speculative_tokens=k, **kw)
    assert torch.equal(out.output_token_ids, per_request.int())
    assert (out.num_emitted == k + 1).all()


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_and_replay():
    b = make_batch(9, "filters", B=16, k=3, V=4096)
    dev = {
        name: None if t is None else t.cuda()
        for name, t in zip(
            (
                "logits",
                "drafts",
                "cu",
                "draft_probs",
                "temperature",
                "top_k",
                "top_p",
                "min_p",
                "seeds",
                "offsets",
            ),
            b.tensors(),
            strict=True,
        )
    }

    def step():
        return rejection_sample(
            dev["logits"],
            dev["drafts"],
            dev["cu"],
            num_speculative_tokens=b.k,
            temperature=dev["temperature"],
            top_k=dev["top_k"],
            top_p=dev["top_p"],
            min_p=dev["min_p"],
            seeds=dev["seeds"],
            offsets=dev["offsets"],
            return_logprobs=True,
        )

    eager = step()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up (compiles the kernels) outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for a, c in zip(eager, captured, strict=True):
        assert torch.equal(a, c)
