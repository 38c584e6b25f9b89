"""``top_logprobs`` cases: the top-N logprobs of a verify step's emitted tokens vs what an
engine otherwise runs.

The baseline ``torch`` is vLLM's rule for a verify step (its rejection sampler's
``_get_logprobs_tensors`` with its ``Sampler`` helpers): the fp32 rows of every output
slot, ``log_softmax``, ``topk``, the emitted token's logprob and its rank by a count; it
works on all ``B (k + 1)`` slots (no host synchronisation), where the op reads only the
rows that emitted a token. The check: the same ids, ranks and values (to 1e-5) on the
emitted slots (random fp32 logits: no ties).

``mode=processed_logprobs`` cases (temperature 0.8, top-p 0.9): the op's processed mode vs
vLLM's processed rule restated in torch (every slot's row divided by its temperature, the
sort-based top-p mask of its ``apply_top_k_top_p``, then the same ``log_softmax`` and
``topk``).
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
SPECS += [
    {"B": b, "V": v, "N": 20, "mode": "processed_logprobs"}
    for b, v in itertools.product(BATCHES, VOCABS)
]
QUICK_SPECS = [{"B": 2, "V": 300, "N": 5}, {"B": 2, "V": 300, "N": 5, "mode": "processed_logprobs"}]
TEMPERATURE, TOP_P = 0.8, 0.9
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


def processed_rows_torch(rows, temperature, top_p):
    """vLLM's processed rows: ``rows / T``, then its sort-based top-p mask (ascending sort,
    softmax, cumsum; drop while the mass below is ``<= 1 - p``, keep the top one) at -inf."""
    x = rows.float() / temperature[:, None]
    sorted_x, order = x.sort(dim=-1)
    below = sorted_x.softmax(-1).cumsum(-1) <= (1 - top_p[:, None])
    below[:, -1] = False
    return x.scatter(1, order, sorted_x.masked_fill(below, float("-inf")))


def processed_top_logprobs_torch(logits, out, cu, N, temperature, top_p):
    """vLLM's verify-step processed logprobs: the processed rows, then log_softmax, topk."""
    B, K1 = out.shape
    start = cu[:-1].long() + torch.arange(B, device=logits.device)
    index = (start[:, None] + torch.arange(K1, device=logits.device)).flatten()
    per_slot = torch.arange(B, device=logits.device).repeat_interleave(K1)
    rows = processed_rows_torch(logits[index.clamp(max=logits.shape[0] - 1)],
                                temperature[per_slot], top_p[per_slot])  # fmt: skip
    lsm = rows.log_softmax(-1)
    top = lsm.topk(N, dim=-1)
    tok_lp = lsm.gather(1, out.flatten().long().clamp(min=0)[:, None])
    return tok_lp, (lsm >= tok_lp).sum(-1), top.indices, top.values


def _slot_rows(logits, cu, B, temperature):
    """Every slot's row divided by its request's temperature, in float64."""
    index = ((cu[:-1].long() + torch.arange(B))[:, None] + torch.arange(K + 1)).flatten()
    per_slot = torch.arange(B).repeat_interleave(K + 1)
    x = logits[index.clamp(max=logits.shape[0] - 1)].double()
    return x / temperature[per_slot, None].double()


def _top_p_float64(x, top_p):
    """The top-p set of each row of ``x`` in float64 (largest first, kept while the mass
    above is ``< p`` of the total)."""
    p, order = x.softmax(-1).sort(dim=-1, descending=True)
    keep = (p.cumsum(-1) - p) < top_p[0].double()
    return torch.zeros_like(x, dtype=torch.bool).scatter(1, order, keep)


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
    if spec.get("mode") == "processed_logprobs":
        return _processed_case(spec)
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


def _processed_case(spec: dict) -> Case:
    B, V, N = spec["B"], spec["V"], spec["N"]
    logits, out, emitted, cu = _inputs(B, V)
    T, P = torch.full((B,), TEMPERATURE), torch.full((B,), TOP_P)
    impls = {
        OP: lambda: top_logprobs(
            logits,
            out,
            emitted,
            cu,
            num_logprobs=N,
            temperature=T,
            top_p=P,
            logprobs_mode="processed_logprobs",
        ),  # fmt: skip
        "torch": lambda: processed_top_logprobs_torch(logits, out, cu, N, T, P),
    }

    def check() -> str:
        got, want = impls[OP](), impls["torch"]()
        live = (torch.arange(K + 1)[None, :] < emitted[:, None]).flatten()
        ids, vals = got.top_token_ids.flatten(0, 1)[live], got.top_logprobs.flatten(0, 1)[live]
        finite = torch.isfinite(vals)  # unkept ids tie at -inf: torch's order among them is its own
        assert torch.equal(finite, torch.isfinite(want[3][live])), "kept sets differ"
        assert torch.equal(ids[finite], want[2][live][finite].to(torch.int32)), "top ids != torch"
        # values against float64 over the op's own kept set (all V values: the op keeps
        # the set its sampler draws from; the counts below compare that set with a float64
        # top-p walk and torch's rule, whose fp32 log_softmax over the kept ids drifts)
        full = top_logprobs(logits, out, emitted, cu, num_logprobs=V, temperature=T, top_p=P,
                            logprobs_mode="processed_logprobs")  # fmt: skip
        ids_all = full.top_token_ids.flatten(0, 1)[live].long()
        vals_all = full.top_logprobs.flatten(0, 1)[live]
        x = _slot_rows(logits, cu, B, T)[live].gather(1, ids_all)
        kept_op = torch.isfinite(vals_all)
        exact = x.masked_fill(~kept_op, float("-inf")).log_softmax(-1)
        torch.testing.assert_close(vals_all, exact.float(), rtol=1e-5, atol=1e-5)
        n_op = kept_op.sum(-1)
        n_64 = _top_p_float64(_slot_rows(logits, cu, B, T)[live], P).sum(-1)
        n = int(live.sum())
        raw_rows = _slot_rows(logits, cu, B, torch.ones(B))[live].float()
        n_torch = torch.isfinite(processed_rows_torch(raw_rows, T[:1].expand(n), P[:1].expand(n)))
        n_torch = n_torch.sum(-1)
        kept = torch.isfinite(got.token_logprobs.flatten()[live])
        assert torch.equal(kept, torch.isfinite(want[0][live, 0])), "kept status differs"
        err = float((want[3][live][finite] - exact[:, :N][finite]).abs().max())
        return (
            f"op == vLLM's processed rule (ids; kept status of the emitted tokens) on "
            f"{int(live.sum())} slots; all V values == float64 over the op's kept set to 1e-5; "
            f"kept ids a slot, median: op {int(n_op.median())}, float64 walk "
            f"{int(n_64.median())}, torch {int(n_torch.median())}; torch fp32 values {err:.1e} "
            "off float64"
        )

    return Case(OP_NAME, dict(spec), impls, check, bytes_moved(B, V, N))


def cases(quick: bool = False):
    for spec in QUICK_SPECS if quick else SPECS:
        yield build(spec)
