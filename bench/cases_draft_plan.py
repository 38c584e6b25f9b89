"""Draft-length planning cases: ``plan_draft_lengths`` and ``update_acceptance_stats``.

What a step of the adaptive draft policy adds to a decode step, at k = 4 with three
match-length classes, a permuted ``req_indices``, ragged proposals and a linear cost table.
The baseline is the plain reference (there is no standard implementation to compare with:
engines that adapt the draft length do it on the host with a per-batch threshold). The
check is exact equality with the reference, plan and estimates alike.
"""

from __future__ import annotations

import torch

from bench.harness import OP, Case
from specdec_kernels.ops import plan_draft_lengths, update_acceptance_stats
from specdec_kernels.reference import draft_plan as ref

K, M = 4, 3
BATCHES = (1, 16, 64, 256)
OPS = ("plan_draft_lengths", "update_acceptance_stats")
SPECS = [{"op": op, "B": b} for op in OPS for b in BATCHES]
QUICK_SPECS = [{"op": op, "B": 3} for op in OPS]
BASELINES = ["reference"]


def _state(B: int) -> dict:
    g = torch.Generator().manual_seed(B)
    R = B + 3
    req = torch.randperm(R, generator=g)[:B].to(torch.int32)
    proposed = torch.randint(0, K + 1, (B,), generator=g, dtype=torch.int32)
    drafts = torch.randint(0, 5, (B, K), generator=g, dtype=torch.int32)
    drafts = torch.where(torch.arange(K)[None] < proposed[:, None], drafts, -1)
    out = torch.randint(0, 5, (B, K + 1), generator=g, dtype=torch.int32)
    return dict(
        acceptance=torch.rand((R, M, K), generator=g),
        num_draft_tokens=proposed,
        match_len=torch.randint(0, M + 2, (B,), generator=g, dtype=torch.int32),
        verify_cost=1.0 + 0.05 * torch.arange(B * (K + 1) + 1, dtype=torch.float32),
        req_indices=req,
        draft_token_ids=drafts,
        output_token_ids=out,
        num_emitted=torch.randint(1, K + 2, (B,), generator=g, dtype=torch.int32),
    )


def _plan_case(B: int) -> Case:
    st = _state(B)
    args = (st["num_draft_tokens"], st["match_len"], st["verify_cost"], st["req_indices"])
    acc = st["acceptance"]
    impls = {
        OP: lambda: tuple(plan_draft_lengths(*args, acceptance=acc)),
        "reference": lambda: ref.plan_draft_lengths(*args, acc, max_num_tokens=None),
    }

    def check() -> str:
        got, want = impls[OP](), impls["reference"]()
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), "plan != ref"
        return f"op == reference exactly; {float(got[0].float().mean()):.2f} drafts planned/row"

    nbytes = 4 * B * 3 + 4 * B * K + 4 * (B * (K + 1) + 1) + 8 * B
    return Case("plan_draft_lengths", {"B": B, "k": K}, impls, check, nbytes)


def _update_case(B: int) -> Case:
    st = _state(B)
    initial = st["acceptance"].clone()
    state = {impl: initial.clone() for impl in (OP, "reference")}
    rest = (
        st["draft_token_ids"],
        st["num_draft_tokens"],
        st["match_len"],
        st["output_token_ids"],
        st["num_emitted"],
        st["req_indices"],
    )

    def call(impl):
        if impl == OP:
            update_acceptance_stats(*rest, acceptance=state[impl], decay=0.8)
        else:
            ref.update_acceptance_stats(*rest, state[impl], decay=0.8)

    impls = {impl: (lambda impl=impl: call(impl)) for impl in state}

    def check() -> str:
        for impl in impls:
            state[impl].copy_(initial)
            call(impl)
        assert torch.equal(state[OP], state["reference"]), "estimates != reference"
        return "op == reference exactly (estimates after one update)"

    nbytes = 4 * B * (K + K + 1 + 4) + 2 * 4 * B * K
    return Case("update_acceptance_stats", {"B": B, "k": K}, impls, check, nbytes)


def build(spec: dict) -> Case:
    return (_plan_case if spec["op"] == "plan_draft_lengths" else _update_case)(spec["B"])


def cases(quick: bool = False):
    for spec in QUICK_SPECS if quick else SPECS:
        yield build(spec)
