"""Step bookkeeping cases: slot mapping, verify-input packing and token commit.

Each against eager torch (what an engine writes without fused kernels) and the plain
reference, on a paged-KV state with ragged lengths, a permuted ``req_indices`` and a
shuffled block table (``bench.data.paged_state``).
"""

from __future__ import annotations

import itertools

import torch

from bench import data
from bench.baselines import bookkeeping_torch as eager
from bench.harness import OP, Case
from specdec_kernels.ops import (
    commit_accepted_tokens,
    compute_slot_mapping,
    prepare_verify_inputs,
)
from specdec_kernels.reference import commit as ref_commit
from specdec_kernels.reference import verify_inputs as ref

K = 4
BATCHES = (1, 16, 64, 256)
OPS = ("compute_slot_mapping", "prepare_verify_inputs", "commit_accepted_tokens")
SPECS = [{"op": op, "B": b} for op, b in itertools.product(OPS, BATCHES)]
QUICK_SPECS = [{"op": op, "B": 3} for op in OPS]
BASELINES = ["torch", "reference"]


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _verify_args(st: dict) -> tuple:
    """``prepare_verify_inputs``' tensors, in its order."""
    names = ("token_ids", "num_tokens", "draft_token_ids", "num_draft_tokens", "block_table")
    return (*(st[n] for n in names), st["req_indices"])


def _slot_case(B: int, st: dict) -> Case:
    bs, mml = st["block_size"], st["max_model_len"]
    verify = ref.prepare_verify_inputs(*_verify_args(st), block_size=bs, max_model_len=mml)
    positions, qsl = verify[1], verify[2]
    args = (st["block_table"], positions, qsl, st["req_indices"])
    kw = {"block_size": bs, "max_model_len": mml}
    impls = {
        OP: lambda: compute_slot_mapping(*args, **kw),
        "torch": lambda: eager.compute_slot_mapping_torch(*args, **kw),
        "reference": lambda: ref.compute_slot_mapping(*args, **kw),
    }
    T = positions.shape[0]
    nbytes = 8 * T + 4 * (B + 1) + 4 * B + 4 * T + 8 * T
    return Case("compute_slot_mapping", {"B": B, "T": T}, impls, _check_all(impls), nbytes)


def _verify_case(B: int, st: dict) -> Case:
    args = _verify_args(st)
    kw = {"block_size": st["block_size"], "max_model_len": st["max_model_len"]}
    impls = {
        OP: lambda: tuple(prepare_verify_inputs(*args, **kw)),
        "torch": lambda: eager.prepare_verify_inputs_torch(*args, **kw),
        "reference": lambda: ref.prepare_verify_inputs(*args, **kw),
    }
    T = B * (K + 1)
    reads = 4 * B * 4 + 4 * B * K + 4 * T  # lengths, last tokens, counts, rows; drafts; blocks
    writes = 4 * T + 8 * T + 8 * T + 4 * (B + 1) * 2 + 4 * B + 4 * B * K
    return Case("prepare_verify_inputs", {"B": B, "k": K}, impls, _check_all(impls), reads + writes)


def _commit_case(B: int, st: dict) -> Case:
    names = ("token_ids", "num_tokens", "num_computed_tokens")
    st = dict(st, num_computed_tokens=st["num_tokens"] - 1)
    initial = {n: st[n].clone() for n in names}
    state = {impl: {n: st[n].clone() for n in names} for impl in (OP, "torch", "reference")}
    kw = {
        "stop_token_ids": st["stop_token_ids"],
        "num_prompt_tokens": st["num_prompt_tokens"],
        "min_tokens": st["min_tokens"],
        "max_tokens": st["max_tokens"],
        "max_model_len": st["max_model_len"],
    }
    fixed = (st["output_token_ids"], st["num_emitted"], st["req_indices"])

    def call(impl):
        s = state[impl]
        if impl == "reference":
            return ref_commit.commit_accepted_tokens(
                s["token_ids"],
                s["num_tokens"],
                *fixed,
                kw["stop_token_ids"],
                kw["num_prompt_tokens"],
                kw["min_tokens"],
                kw["max_tokens"],
                s["num_computed_tokens"],
                max_model_len=kw["max_model_len"],
            )
        fn = commit_accepted_tokens if impl == OP else eager.commit_accepted_tokens_torch
        res = fn(
            s["token_ids"],
            s["num_tokens"],
            *fixed,
            num_computed_tokens=s["num_computed_tokens"],
            **kw,
        )
        return tuple(res)

    def reset():  # the op appends: put the lengths back (the written tokens lie past them)
        for s in state.values():
            s["num_tokens"].copy_(initial["num_tokens"])
            s["num_computed_tokens"].copy_(initial["num_computed_tokens"])

    impls = {impl: (lambda impl=impl: call(impl)) for impl in state}

    def check() -> str:
        for s in state.values():
            for n in names:
                s[n].copy_(initial[n])
        outs = {impl: call(impl) for impl in impls}
        for impl in impls:
            assert _equal(outs[impl], outs[OP]), f"commit results: {impl} != op"
            for n in names:
                assert torch.equal(state[impl][n], state[OP][n]), f"commit state {n}: {impl} != op"
        committed, finished, reason = outs[OP]
        return (
            f"op == torch == reference exactly (results and mutated state); "
            f"{float(committed.float().mean()):.2f} committed/row, "
            f"{int((reason == 1).sum())} stopped, {int((reason == 2).sum())} at length budget"
        )

    S = st["stop_token_ids"].shape[1]
    nbytes = 4 * B * (K + 1) + 4 * B * 5 + 4 * B * S + 4 * B * (K + 1) + 4 * B * 2 + 6 * B
    return Case("commit_accepted_tokens", {"B": B, "k": K}, impls, check, nbytes, setup=reset)


def _check_all(impls):
    def check() -> str:
        outs = {name: fn() for name, fn in impls.items()}
        for name, out in outs.items():
            assert _equal(out, outs[OP]), f"{name} != op"
        return " == ".join(["op", *[n for n in impls if n != OP]]) + " exactly"

    return check


def build(spec: dict) -> Case:
    B = spec["B"]
    st = data.paged_state(B, K)
    return {
        "compute_slot_mapping": _slot_case,
        "prepare_verify_inputs": _verify_case,
        "commit_accepted_tokens": _commit_case,
    }[spec["op"]](B, st)


def cases(quick: bool = False):
    for spec in QUICK_SPECS if quick else SPECS:
        yield build(spec)
