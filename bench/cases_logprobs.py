"""``top_logprobs`` cases: the top-N logprobs of a verify step's emitted tokens vs what an
engine otherwise runs.

The baseline ``torch`` is vLLM's rule for a verify step (its rejection sampler's
``_get_logprobs_tensors`` with its ``Sampler`` helpers): the fp32 rows of every output
slot, ``log_softmax``, ``topk``, the emitted token's logprob and its rank by a count; it
works on all ``B (k + 1)`` slots (no host synchronisation), where the op reads only the
rows that emitted a token. The check: the same ids, ranks and values (to 1e-5) on the
emitted slots (random fp32 logits: no ties).
"""

from __future__ import annotations

import itertools

import torch

from bench.harness import OP, Case
from specdec_kernels.ops import top_logprobs

OP_NAME = "top_logprobs"
K = 4
BATCHES = (1, 8, 64)
VOCABS = (32000, 151936)
NS = (5, 20)
SPECS = [{"B": b, "V": v, "N": n} for b, v, n in itertools.product(BATCHES, VOCABS, NS)]
QUICK_SPECS = [{"B": 2, "V": 300, "N": 5}]
BASELINES = ["torch"]


def _inputs(B: int, V: int):
    g = torch.Generator().manual_seed(B * 7 + V)
    counts = torch.full((B,), K, dtype=torch.int32)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), counts.cumsum(0).to(torch.int32)])
    logits = torch.randn(K * B + B, V, generator=g) * 3
    emitted = torch.randint(1, K + 2, (B,), generator=g, dtype=torch.int32)  # ~3 of 5 rows
    out = torch.randint(0, V, (B, K + 1), generator=g, dtype=torch.int32)
    out[torch.arange(K + 1)[None, :] >= emitted[:, None]] = -1
    return logits, out, emitted, cu


def top_logprobs_torch(logits, out, cu, N):
    """vLLM's verify-step logprobs: every slot's row, log_softmax, topk, token and rank."""
    B, K1 = out.shape
    ar = lambda n: torch.arange(n, device=logits.device)  # noqa: E731
    start = cu[:-1].long() + ar(B)
    index = (start[:, None] + ar(K1)).flatten().clamp(max=logits.shape[0] - 1)
    lsm = logits[index].float().log_softmax(-1)
    top = lsm.topk(N, dim=-1)
    tok = out.flatten().long().clamp(min=0)[:, None]
    tok_lp = lsm.gather(1, tok)
    ranks = (lsm >= tok_lp).sum(-1)
    return tok_lp, ranks, top.indices, top.values


def _float64_top(logits, out, cu, N):
    """Every slot's token logprob and top-N values from a float64 log_softmax, and the
    token's rank counted on the logits."""
    _, _, ids, _ = top_logprobs_torch(logits, out, cu, N)
    B, K1 = out.shape
    index = ((cu[:-1].long() + torch.arange(B))[:, None] + torch.arange(K1)).flatten()
    rows = logits[index.clamp(max=logits.shape[0] - 1)]
    lsm = rows.double().log_softmax(-1)
    tok = out.flatten().long().clamp(min=0)[:, None]
    ranks = (rows >= rows.gather(1, tok)).sum(-1)
    return lsm.gather(1, tok).float(), lsm.gather(1, ids).float(), ranks


def bytes_moved(B: int, V: int, N: int) -> int:
    """The emitted rows read once (about 3 of 5 per request here), the outputs."""
    return 4 * V * B * 3 + (4 + 4 + 8 * N) * B * (K + 1)


def build(spec: dict) -> Case:
    B, V, N = spec["B"], spec["V"], spec["N"]
    logits, out, emitted, cu = _inputs(B, V)
    impls = {
        OP: lambda: top_logprobs(logits, out, emitted, cu, num_logprobs=N),
        "torch": lambda: top_logprobs_torch(logits, out, cu, N),
    }

    def check() -> str:
        got, want = impls[OP](), impls["torch"]()
        live = (torch.arange(K + 1)[None, :] < emitted[:, None]).flatten()
        ids, vals = got.top_token_ids.flatten(0, 1)[live], got.top_logprobs.flatten(0, 1)[live]
        assert torch.equal(ids, want[2][live].to(torch.int32)), "top ids != torch"
        # ranks by the logits (the contract); vLLM counts on fp32 logprobs, where rounding
        # can merge a few near-equal logits into a tie
        exact = _float64_top(logits, out, cu, N)
        ranks = got.token_ranks.flatten()[live]
        assert torch.equal(ranks, exact[2][live].to(torch.int32)), "ranks != the logits' count"
        merged = int((ranks != want[1][live]).sum())
        # values against float64: torch's fp32 log_softmax drifts by ~4e-6 at V = 152k
        torch.testing.assert_close(vals, exact[1][live], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got.token_logprobs.flatten()[live], exact[0][live, 0],
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
        err = float((want[3][live] - exact[1][live]).abs().max())
        return (
            f"op == torch (ids) on {int(live.sum())} slots, ranks == the logits' count "
            f"({merged} of torch's differ), values == float64 log_softmax to 1e-5 (torch "
            f"fp32: {err:.1e} off)"
        )

    return Case(OP_NAME, dict(spec), impls, check, bytes_moved(B, V, N))


def cases(quick: bool = False):
    for spec in QUICK_SPECS if quick else SPECS:
        yield build(spec)
