"""rejection_sample statistics: emitted tokens are distributed exactly as the target ``p``.

For every sampled mode (one-hot drafts, explicit draft probabilities, temperature, top-k,
top-p, min-p) many requests with the same logits and drafts but their own seeds go
through the op in one call. The tokens emitted at each position are compared with the
exact (float64) target distribution of that row by a chi-square test, and the acceptance
rate of each draft, among the requests that reached it, with ``sum_x min(p(x), q(x))``
(``p(d)`` for a one-hot draft ``d``: coupled verification keeps ``d`` iff the row's own
sample is ``d``) by a binomial z-test. Seeds are fixed, so each test is deterministic;
were the seeds random, a correct sampler would fail a chi-square test with probability
``ALPHA = 1e-4`` and a z-test with probability ``6.8e-6`` (``|z| > 4.5``): over the 30
chi-square and 19 z-tests below (the count depends on how many requests reach each row),
a false failure of the file about once in 320 runs with fresh seeds (never with these).
Large N runs on the CPU path; a smaller N (small vocabulary) runs on the Triton kernel,
which under the interpreter costs tens of milliseconds per row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from specdec_kernels.kernels import rejection as triton_rej
from specdec_kernels.ops import rejection_sample

ALPHA = 1e-4
Z_MAX = 4.5


def target_probs(logits: torch.Tensor, T: float, top_k=0, top_p=1.0, min_p=0.0) -> torch.Tensor:
    """The exact target distribution (float64) by DESIGN.md's definitions."""
    p = torch.softmax(logits.double() / T, dim=-1)
    V = p.shape[0]
    if 0 < top_k < V:
        keep = torch.tensor([int((p > p[x]).sum()) < top_k for x in range(V)])
        p = torch.where(keep, p, 0.0)
        p = p / p.sum()
    if top_p < 1.0:
        keep = torch.tensor([float(p[p > p[x]].sum()) < top_p for x in range(V)])
        p = torch.where(keep, p, 0.0)
        p = p / p.sum()
    if min_p > 0.0:
        p = torch.where(p >= min_p * p.max(), p, 0.0)
        p = p / p.sum()
    return p


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Upper-tail p-value of Pearson's statistic over the bins with ``probs > 0``."""
    n = float(counts.sum())
    support = probs > 0
    expected = probs[support] * n
    chi2 = float(((counts[support].double() - expected) ** 2 / expected).sum())
    df = int(support.sum()) - 1
    if df == 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(chi2 / 2.0)))


def assert_distributed_as(tokens: torch.Tensor, probs: torch.Tensor, what: str) -> None:
    counts = torch.bincount(tokens.long(), minlength=probs.shape[0])
    assert counts.shape[0] == probs.shape[0], f"{what}: an id outside [0, V)"
    zero = probs == 0
    assert int(counts[zero].sum()) == 0, f"{what}: emitted a token with p = 0: {counts}"
    p_value = chi_square_p_value(counts, probs)
    assert p_value > ALPHA, f"{what}: counts {counts.tolist()}, p {probs.tolist()}, p={p_value}"


def assert_rate(hits: int, n: int, rate: float, what: str) -> None:
    sd = math.sqrt(n * rate * (1 - rate))
    z = 0.0 if sd == 0 else (hits - n * rate) / sd
    assert abs(z) < Z_MAX, f"{what}: {hits}/{n} vs expected rate {rate:.4f} (z = {z:.2f})"


@dataclass
class Mode:
    """Sampling parameters of one request, repeated ``n`` times with different seeds."""

    T: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    with_probs: bool = False


MODES = {
    "one_hot": Mode(),
    "draft_probs": Mode(with_probs=True),
    "temperature_low": Mode(T=0.6),
    "temperature_high": Mode(T=2.5, with_probs=True),
    "top_k": Mode(top_k=3),
    "top_p": Mode(top_p=0.7),
    "min_p": Mode(min_p=0.15),
    "all_filters_with_probs": Mode(T=0.9, top_k=4, top_p=0.85, min_p=0.1, with_probs=True),
}

LOGITS = torch.tensor(
    [
        [1.2, 0.3, -0.4, 2.0, 0.9, -1.3, 0.1],
        [0.0, 1.5, 0.7, -0.6, 1.1, 0.4, -1.0],
        [-0.5, 0.2, 1.8, 0.6, -1.1, 1.0, 0.3],
    ]
)
DRAFT_Q = torch.softmax(torch.tensor([[0.9, 0.1, -0.2, 1.5, 1.2, -1.0, 0.6]] * 2), dim=-1)
FIXED_DRAFTS = [4, 1]  # one-hot drafts: mid-probability tokens of rows 0 and 1


def _rows(k: int) -> torch.Tensor:
    """Target rows of one request with ``k`` drafts: ``LOGITS[:k]``, then the bonus row."""
    return torch.cat([LOGITS[:k], LOGITS[2:]])


def _requests(mode: Mode, n: int, seed: int, k: int = 2):
    g = torch.Generator().manual_seed(seed)
    if mode.with_probs:  # the drafts must be samples from q for the theorem to apply
        drafts = torch.multinomial(DRAFT_Q[:k], n, replacement=True, generator=g).T.int()
        probs = DRAFT_Q[:k].repeat(n, 1)
    else:
        drafts = torch.tensor(FIXED_DRAFTS[:k], dtype=torch.int32).repeat(n, 1)
        probs = None
    kw = dict(
        num_speculative_tokens=k,
        draft_probs=probs,
        temperature=torch.full((n,), mode.T),
        top_k=torch.full((n,), mode.top_k, dtype=torch.int32) if mode.top_k else None,
        top_p=torch.full((n,), mode.top_p) if mode.top_p < 1 else None,
        min_p=torch.full((n,), mode.min_p) if mode.min_p > 0 else None,
        seeds=torch.randint(-(2**62), 2**62, (n,), generator=g),
        offsets=torch.randint(0, 2**40, (n,), generator=g),
    )
    cu = torch.arange(0, k * n + 1, k, dtype=torch.int32)
    return (_rows(k).repeat(n, 1), drafts.reshape(-1).contiguous(), cu), kw, drafts


def _check(mode: Mode, tokens, num_emitted, drafts, *, min_count: int, what: str):
    k = drafts.shape[1]
    probs = [target_probs(row, mode.T, mode.top_k, mode.top_p, mode.min_p) for row in _rows(k)]
    assert ((num_emitted >= 1) & (num_emitted <= k + 1)).all()
    # Every emitted token, position by position, among the requests that got that far.
    for j in range(k + 1):
        reached = num_emitted > j
        if int(reached.sum()) >= min_count:
            assert_distributed_as(tokens[reached, j], probs[j], f"{what} position {j}")
    # Acceptance of draft j among the requests that reached row j: sum_x min(p_j, q_j) for
    # sampled drafts, p_j(d_j) for fixed (one-hot) drafts.
    for j in range(k):
        q = (
            DRAFT_Q[j].double()
            if mode.with_probs
            else torch.nn.functional.one_hot(torch.tensor(FIXED_DRAFTS[j]), 7).double()
        )
        reached = num_emitted > j
        n_j = int(reached.sum())
        if j == 0 or n_j >= min_count:
            rate = float(torch.minimum(probs[j], q).sum())
            hits = int((num_emitted > j + 1).sum())
            assert_rate(hits, n_j, rate, f"{what} acceptance of draft {j}")
    kept = num_emitted >= 2
    assert torch.equal(tokens[kept, 0], drafts[kept, 0])


@pytest.mark.parametrize("name", list(MODES))
def test_cpu_emitted_tokens_follow_the_target_distribution(name):
    mode = MODES[name]
    n = 40_000
    args, kw, drafts = _requests(mode, n, seed=list(MODES).index(name))
    out = rejection_sample(*args, **kw)
    _check(mode, out.output_token_ids, out.num_emitted, drafts, min_count=2000, what=name)


def test_cpu_plain_sampler_k0_follows_the_target_distribution():
    n = 40_000
    mode = MODES["all_filters_with_probs"]
    out = rejection_sample(
        LOGITS[2].repeat(n, 1),
        torch.zeros(0, dtype=torch.int32),
        torch.zeros(n + 1, dtype=torch.int32),
        num_speculative_tokens=0,
        temperature=torch.full((n,), mode.T),
        top_k=torch.full((n,), mode.top_k, dtype=torch.int32),
        top_p=torch.full((n,), mode.top_p),
        min_p=torch.full((n,), mode.min_p),
        seeds=torch.arange(n, dtype=torch.int64),
        offsets=torch.zeros(n, dtype=torch.int64),
    )
    probs = target_probs(LOGITS[2], mode.T, mode.top_k, mode.top_p, mode.min_p)
    assert_distributed_as(out.output_token_ids[:, 0], probs, "k = 0")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["temperature_low", "draft_probs", "all_filters_with_probs"])
def test_triton_emitted_tokens_follow_the_target_distribution(name, kernel_device):
    """Smaller N on the kernel; it must also emit the CPU path's tokens."""
    mode = MODES[name]
    n = 160
    args, kw, drafts = _requests(mode, n, seed=7 + list(MODES).index(name), k=1)
    dev = lambda t: t.to(kernel_device) if isinstance(t, torch.Tensor) else t  # noqa: E731
    tokens, num, _ = triton_rej.rejection_sample(
        *(dev(a) for a in args),
        *(dev(kw[key]) for key in ("draft_probs", "temperature", "top_k", "top_p", "min_p")),
        dev(kw["seeds"]),
        dev(kw["offsets"]),
        num_speculative_tokens=1,
        return_logprobs=False,
    )
    tokens, num = tokens.cpu(), num.cpu()
    _check(mode, tokens, num, drafts, min_count=60, what=f"triton {name}")
    cpu = rejection_sample(*args, **kw)
    assert torch.equal(tokens, cpu.output_token_ids)
    assert torch.equal(num, cpu.num_emitted)
