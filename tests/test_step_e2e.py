"""End to end: ngram_propose -> prepare_verify_inputs -> fake model -> rejection_sample -> commit.

Several decoding steps of a static batch (permuted ``req_indices``, a padding row, a state
row that is never scheduled) against a plain-Python simulation of the same engine: drafts,
query layout, slot mapping, the KV cache the slots fill, committed tokens, lengths and
finish reasons. The fake model is a bigram model: the logits of query token ``t`` favour
``NEXT[input_ids[t]]`` by a wide margin, so greedy decoding follows ``NEXT`` exactly and
speculative decoding must produce the same sequence whatever the drafts.

Runs through the public ops on CPU tensors (the CPU paths) and through the Triton
launchers (the interpreter on CPU, the CUDA path on a GPU machine).
"""

from __future__ import annotations

import pytest
import torch

from specdec_kernels.kernels import commit as triton_commit
from specdec_kernels.kernels import ngram as triton_ngram
from specdec_kernels.kernels import rejection as triton_rejection
from specdec_kernels.kernels import verify_inputs as triton_verify
from specdec_kernels.ops import (
    commit_accepted_tokens,
    ngram_propose,
    prepare_verify_inputs,
    rejection_sample,
)

I32, I64 = torch.int32, torch.int64
V, K, BLOCK_SIZE, MAX_MODEL_LEN = 16, 3, 4, 40
MIN_N, MAX_N = 1, 3
# A permutation of the vocabulary with cycles (0 1 2 3 4 5) (6 7 8) (9 .. 15).
NEXT = [1, 2, 3, 4, 5, 0, 7, 8, 6, 10, 11, 12, 13, 14, 15, 9]
PROMPTS = [
    [3, 9, 4, 6, 1, 12, 7],  # state row 0
    [5, 5, 14, 2, 8, 8, 0, 11, 3],  # state row 1
    [10, 1, 6],  # state row 2
    [7, 2, 13, 4, 9, 15, 1, 1],  # state row 3
    [4, 4, 4, 4],  # state row 4: never scheduled, must stay untouched
]
REQ = [2, -1, 0, 3, 1]  # batch row -> state row (-1: padding row)
STOPS = [[8, -1], [-1, -1], [6, 15], [-1, -1], [2, -1]]  # per batch row
MIN_TOKENS = [0, 0, 4, 0, 0]
MAX_TOKENS = [30, 30, 30, 5, 40]
NUM_BLOCKS = 64


def _block_table(num_rows: int) -> list[list[int]]:
    """Non-contiguous blocks: a fixed shuffle of the block ids, one slice per state row."""
    per_row = -(-MAX_MODEL_LEN // BLOCK_SIZE)
    ids = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(5)).tolist()
    return [ids[r * per_row : (r + 1) * per_row] for r in range(num_rows)]


def _fake_logits(input_ids: torch.Tensor, positions: torch.Tensor, step: int) -> torch.Tensor:
    """A function of each query token's id and position only (like a real model, it does
    not see the batch layout): noise in ``[0, 1)`` plus 6 on ``NEXT[input_id]``."""
    g = torch.Generator().manual_seed(100 + step)
    noise = torch.rand((V, MAX_MODEL_LEN + K + 1, V), generator=g)
    ids, pos = input_ids.long().cpu(), positions.long().cpu()
    logits = noise[ids, pos]
    logits[torch.arange(ids.shape[0]), torch.tensor(NEXT)[ids]] += 6.0
    return logits.to(input_ids.device)


# ---------------------------------------------------------------- the plain-Python engine


def sim_propose(seq: list[int]) -> list[int]:
    L = len(seq)
    for n in range(MAX_N, MIN_N - 1, -1):
        for i in range(L - n):
            if seq[i : i + n] == seq[L - n :]:
                m = max(0, min(K, L - (i + n), MAX_MODEL_LEN - L))
                return seq[i + n : i + n + m]
    return []


def sim_greedy_verify(query: list[int]) -> list[int]:
    """Accept drafts while they equal the target's argmax, then one target token."""
    emitted = []
    for j, draft in enumerate(query[1:]):
        target = NEXT[query[j]]
        emitted.append(target)
        if draft != target:
            return emitted
    emitted.append(NEXT[query[-1]])
    return emitted


def sim_commit(seq: list[int], emitted: list[int], b: int, prompt_len: int) -> int:
    """Append to ``seq`` in place; returns the finish reason."""

    def at_budget():
        return len(seq) >= MAX_MODEL_LEN or len(seq) - prompt_len >= MAX_TOKENS[b]

    if at_budget():
        return 2
    for tok in emitted:
        out_index = len(seq) - prompt_len
        seq.append(tok)
        if tok in STOPS[b] and out_index >= MIN_TOKENS[b]:
            return 1
        if at_budget():
            return 2
    return 0


def sim_slot(table: list[list[int]], r: int, pos: int) -> int:
    return table[r][pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE


# ---------------------------------------------------------------- the two backends


class PublicOps:
    """The public wrappers on CPU tensors: the CPU paths of every op."""

    device = torch.device("cpu")

    def propose(self, tok, nt, req):
        return ngram_propose(
            tok,
            nt,
            req,
            min_n=MIN_N,
            max_n=MAX_N,
            num_speculative_tokens=K,
            max_model_len=MAX_MODEL_LEN,
        )[:3]

    def prepare(self, tok, nt, drafts, nd, bt, req):
        return prepare_verify_inputs(
            tok, nt, drafts, nd, bt, req, block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN
        )

    def sample(self, logits, drafts, cu, temperature=None, seeds=None, offsets=None):
        out = rejection_sample(
            logits,
            drafts,
            cu,
            num_speculative_tokens=K,
            temperature=temperature,
            seeds=seeds,
            offsets=offsets,
        )
        return out.output_token_ids, out.num_emitted

    def commit(self, tok, nt, out, ne, req, nc, params):
        return commit_accepted_tokens(
            tok, nt, out, ne, req, max_model_len=MAX_MODEL_LEN, num_computed_tokens=nc, **params
        )


class TritonLaunchers(PublicOps):
    """The Triton launchers (interpreter on CPU tensors, CUDA on a GPU machine)."""

    def __init__(self, device):
        self.device = torch.device(device)

    def propose(self, tok, nt, req):
        return triton_ngram.ngram_propose(
            tok,
            nt,
            req,
            None,
            None,
            None,
            min_n=MIN_N,
            max_n=MAX_N,
            num_speculative_tokens=K,
            max_model_len=MAX_MODEL_LEN,
            tie_break="first",
        )[:3]

    def prepare(self, tok, nt, drafts, nd, bt, req):
        return triton_verify.prepare_verify_inputs(
            tok, nt, drafts, nd, bt, req, block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN
        )

    def sample(self, logits, drafts, cu, temperature=None, seeds=None, offsets=None):
        out, ne, _ = triton_rejection.rejection_sample(
            logits,
            drafts,
            cu,
            None,
            temperature,
            None,
            None,
            None,
            seeds,
            offsets,
            num_speculative_tokens=K,
            return_logprobs=False,
        )
        return out, ne

    def commit(self, tok, nt, out, ne, req, nc, params):
        return triton_commit.commit_accepted_tokens(
            tok,
            nt,
            out,
            ne,
            req,
            params["stop_token_ids"],
            params["num_prompt_tokens"],
            params["min_tokens"],
            params["max_tokens"],
            nc,
            max_model_len=MAX_MODEL_LEN,
        )


def _backend(name, kernel_device):
    return PublicOps() if name == "public" else TritonLaunchers(kernel_device)


# ---------------------------------------------------------------- engine state


def _initial_state(device):
    R = len(PROMPTS)
    tok = torch.full((R, MAX_MODEL_LEN), -5, dtype=I32)
    for r, p in enumerate(PROMPTS):
        tok[r, : len(p)] = torch.tensor(p, dtype=I32)
    nt = torch.tensor([len(p) for p in PROMPTS], dtype=I32)
    table = _block_table(R)
    state = dict(
        token_ids=tok.to(device),
        num_tokens=nt.to(device),
        num_computed=(nt - 1).to(device),
        block_table=torch.tensor(table, dtype=I32).to(device),
        kv=torch.full((NUM_BLOCKS * BLOCK_SIZE,), -1, dtype=I32, device=device),
    )
    params = dict(
        stop_token_ids=torch.tensor(STOPS, dtype=I32).to(device),
        num_prompt_tokens=nt.clone().to(device),
        min_tokens=torch.tensor(MIN_TOKENS, dtype=I32).to(device),
        max_tokens=torch.tensor(MAX_TOKENS, dtype=I32).to(device),
    )
    return state, params, table


def _prefill_kv(state, table):
    """Write the KV of every prompt token but the last (the first query token of step 1)."""
    kv = state["kv"]
    for r in REQ:
        if r >= 0:
            for pos in range(len(PROMPTS[r]) - 1):
                kv[sim_slot(table, r, pos)] = PROMPTS[r][pos]


def _write_kv(kv, slot_mapping, input_ids):
    """Store each query token's "KV" (here: its id) at its slot; slot -1 writes nothing."""
    ok = slot_mapping >= 0
    kv[slot_mapping[ok]] = input_ids[ok]


def _segment(t, v, b):
    lo, hi = int(v[2][b]), int(v[2][b + 1])  # query_start_loc
    return t[lo:hi].tolist()


def _run_greedy(ops, num_steps):
    """Run up to ``num_steps`` greedy steps, checking each against the plain-Python engine.

    Returns the device state, the parameters, the simulated histories, the batch's state
    rows (finished requests turned into padding rows) and what happened.
    """
    dev = ops.device
    state, params, table = _initial_state(dev)
    _prefill_kv(state, table)
    hist = [list(p) for p in PROMPTS]
    req = list(REQ)
    finished_at = {}
    accepted = rejected = 0

    for step in range(num_steps):
        if all(r < 0 for r in req):
            break
        req_t = torch.tensor(req, dtype=I32, device=dev)
        tok, nt = state["token_ids"], state["num_tokens"]
        drafts, nd, _ = ops.propose(tok, nt, req_t)
        v = ops.prepare(tok, nt, drafts, nd, state["block_table"], req_t)
        _write_kv(state["kv"], v[4], v[0])  # what the model's attention layers do
        v = tuple(t.cpu() for t in v)
        ids, pos, qsl, seq_lens, slots, cu, flat = v
        logits = _fake_logits(ids.to(dev), pos, step)
        out, ne = ops.sample(logits, flat.to(dev), cu.to(dev))
        res = ops.commit(tok, nt, out, ne, req_t, state["num_computed"], params)
        committed, finished, reason = (t.cpu() for t in res)
        out, ne = out.cpu(), ne.cpu()

        for b, r in enumerate(req):
            if r < 0:
                assert _segment(ids, v, b) == [0] and _segment(slots, v, b) == [-1]
                assert committed[b] == 0 and not finished[b]
                continue
            seq = hist[r]
            L = len(seq)
            want_drafts = sim_propose(seq)
            query = [seq[-1], *want_drafts]
            assert flat[int(cu[b]) : int(cu[b + 1])].tolist() == want_drafts, (step, b)
            assert _segment(ids, v, b) == query, (step, b)
            assert _segment(pos, v, b) == list(range(L - 1, L - 1 + len(query))), (step, b)
            want_slots = [sim_slot(table, r, p) for p in range(L - 1, L - 1 + len(query))]
            assert _segment(slots, v, b) == want_slots, (step, b)
            assert int(seq_lens[b]) == L - 1 + len(query)
            emitted = sim_greedy_verify(query)
            assert out[b, : int(ne[b])].tolist() == emitted, (step, b)
            accepted += len(emitted) - 1
            rejected += len(emitted) - 1 < len(want_drafts)
            want_reason = sim_commit(seq, emitted, b, len(PROMPTS[r]))
            assert int(committed[b]) == len(seq) - L, (step, b)
            assert int(reason[b]) == want_reason and bool(finished[b]) == (want_reason != 0)
            if want_reason:
                finished_at[r] = (step, want_reason)

        # Persistent state == the simulation, every row (row 4 and the tails untouched).
        tok_cpu = state["token_ids"].cpu()
        for r, seq in enumerate(hist):
            assert tok_cpu[r, : len(seq)].tolist() == seq, (step, r)
            assert (tok_cpu[r, len(seq) :] == -5).all(), (step, r)
        assert state["num_tokens"].cpu().tolist() == [len(s) for s in hist]
        assert state["num_computed"].cpu().tolist() == [len(s) - 1 for s in hist]
        # The KV cache holds every token that the next step does not query again.
        kv = state["kv"].cpu()
        for r in REQ:
            if r >= 0:
                got = [int(kv[sim_slot(table, r, p)]) for p in range(len(hist[r]) - 1)]
                assert got == hist[r][:-1], (step, r)
        req = [-1 if r in finished_at else r for r in req]
    stats = dict(accepted=accepted, rejected=rejected, finished_at=finished_at)
    return state, params, hist, req, stats


@pytest.mark.parametrize("backend", ["public", "triton"])
def test_greedy_steps_match_plain_python_engine(backend, kernel_device):
    ops = _backend(backend, kernel_device)
    _, _, hist, req, stats = _run_greedy(ops, 16)
    assert all(r < 0 for r in req), "every request finishes within 16 steps"
    # The run exercised what it is meant to: acceptances, rejections, both finish reasons.
    assert stats["accepted"] > 0 and stats["rejected"] > 0
    assert {why for _, why in stats["finished_at"].values()} == {1, 2}
    assert hist[4] == PROMPTS[4]


def _sampled_step(ops, state, params, req, seeds, step=0):
    """One sampled step on copies of ``state``; returns the per-request outcome."""
    dev = ops.device
    tok, nt, nc = (state[k].clone() for k in ("token_ids", "num_tokens", "num_computed"))
    req_t = torch.tensor(req, dtype=I32, device=dev)
    drafts, nd, _ = ops.propose(tok, nt, req_t)
    v = ops.prepare(tok, nt, drafts, nd, state["block_table"], req_t)
    ids, pos, qsl = v[0], v[1], v[2]
    offsets = pos[qsl[:-1].long()]  # position of each first query token (0: padding row)
    temperature = torch.full((len(req),), 0.9, device=dev)
    logits = _fake_logits(ids, pos, step) * 0.7  # flatter: drafts get rejected now and then
    out, ne = ops.sample(logits, v[6], v[5], temperature, seeds.to(dev), offsets)
    res = ops.commit(tok, nt, out, ne, req_t, nc, params)
    per_request = {}
    for b, r in enumerate(req):
        if r >= 0:
            k_b = int(nd[b])
            per_request[r] = dict(
                drafts=drafts[b, :k_b].tolist(),
                emitted=out[b, : int(ne[b])].tolist(),
                row=tok[r].tolist(),
                length=int(nt[r]),
                computed=int(nc[r]),
                reason=int(res[2][b]),
            )
    return per_request


def _permute_params(params, perm):
    """Batch-row parameters of a batch whose row ``b`` is the old row ``perm[b]``."""
    p = dict(params)
    for name in ("stop_token_ids", "min_tokens", "max_tokens"):
        p[name] = params[name][perm]
    return p


GREEDY_WARMUP = 3  # greedy steps before the sampled one, so that drafts exist


@pytest.mark.parametrize("backend", ["public", "triton"])
def test_sampled_step_is_deterministic_consistent_and_independent_of_batch_row(
    backend, kernel_device
):
    ops = _backend(backend, kernel_device)
    state, params, hist, req, _ = _run_greedy(ops, GREEDY_WARMUP)
    seeds = torch.tensor([11, 0, 12, 13, 14], dtype=I64)
    first = _sampled_step(ops, state, params, req, seeds)
    again = _sampled_step(ops, state, params, req, seeds)
    assert first == again  # fixed seeds: the same step twice gives the same result

    # Another batch order (and another padding position), each request keeping its seed
    # and parameters: the same outcome per request.
    perm = [3, 0, 4, 1, 2]
    moved = _sampled_step(
        ops, state, _permute_params(params, perm), [req[i] for i in perm], seeds[perm]
    )
    assert moved == first

    for b, r in enumerate(req):
        if r < 0:
            continue
        got = first[r]
        emitted, drafts = got["emitted"], got["drafts"]
        # Accepted drafts are a prefix of the drafts, then exactly one more token.
        assert 1 <= len(emitted) <= len(drafts) + 1
        assert emitted[:-1] == drafts[: len(emitted) - 1]
        assert all(0 <= t < V for t in emitted)
        # The commit is the plain rules applied to the emitted tokens.
        seq = list(hist[r])
        assert got["reason"] == sim_commit(seq, emitted, b, len(PROMPTS[r]))
        assert got["row"][: len(seq)] == seq and got["length"] == len(seq)
        assert got["computed"] == len(seq) - 1
    # The flattened logits accept some drafts and reject others (fixed seeds: checked once).
    accepted = sum(len(g["emitted"]) - 1 for g in first.values())
    rejected = sum(len(g["emitted"]) - 1 < len(g["drafts"]) for g in first.values())
    assert accepted > 0 and rejected > 0, first


def test_sampled_step_cpu_path_and_triton_agree(kernel_device):
    seeds = torch.tensor([21, 0, 22, 23, 24], dtype=I64)
    outcomes = []
    for ops in (PublicOps(), TritonLaunchers(kernel_device)):
        state, params, _, req, _ = _run_greedy(ops, GREEDY_WARMUP)
        outcomes.append(_sampled_step(ops, state, params, req, seeds, step=3))
    assert outcomes[0] == outcomes[1]
