"""``process_logits`` cases: the library's CPU path vs the torch processing an engine runs
without it (vLLM 0.33.0's, restated in ``bench/baselines/penalties_torch.py``).

``step=process``: the processing alone; ``bare`` is ``process_logits`` with nothing on (a
copy of the rows: the floor of any processing). ``step=verify``: processing then
``rejection_sample`` vs ``rejection_sample`` on the raw rows (``verify``: what every feature
costs a verify step) and vs the torch processing then ``rejection_sample``.
``step=fused`` / ``fused-sampled``: ``rejection_sample(..., processing=...)`` (greedy; or
temperature 0.8, top-p 0.9) vs ``verify`` (the same sampling on the raw rows), ``two_ops``
(``process_logits`` then ``rejection_sample``) and ``torch`` (the torch processing then
``rejection_sample``). ``step=fused-state``: the same greedy verification with the
parameters kept in a ``ProcessingState`` of ``R`` rows (default ``B``; ``state.batch()``;
``counts``: with ``keep_counts``) vs ``verify`` and ``fused`` (the same parameters as a
``LogitsProcessing``); ``fused-state-sampled``: the same, sampled as ``fused-sampled``.
``features=all``:
repetition, frequency and presence penalties, 8 logit-bias entries, an allowed-token mask,
4 bad words, min_tokens with 2 stop tokens; ``features=neutral``: penalties 1, 0, 0 only.
Histories are real text (``bench/data.py``), half prompt, half output; ``k = 4``.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from bench import data
from bench.baselines.penalties_torch import process_logits_torch
from bench.harness import OP, Case
from specdec_kernels.ops import (
    LogitsProcessing,
    ProcessingState,
    StateBatch,
    process_logits,
    rejection_sample,
    token_bitmask,
)

OP_NAME = "process_logits"
K = 4
SPECS = [
    {"B": b, "V": v, "L": 1024, "features": "all", "step": s}
    for s, v, b in itertools.product(("process", "verify"), (32000, 151936), (1, 8, 64))
]
SPECS += [{"B": 8, "V": 32000, "L": 8192, "features": "all", "step": "process"}]
SPECS += [{"B": 8, "V": 32000, "L": 1024, "features": "neutral", "step": "process"}]
# the extremes: B = 256, and 32k-token histories
SPECS += [
    {"B": 256, "V": 32000, "L": 1024, "features": "all", "step": s} for s in ("process", "verify")
]
SPECS += [{"B": 8, "V": 32000, "L": 32768, "features": "all", "step": "process"}]
# verification with the processing inside (issue 20's "within 1.5x of verification without")
SPECS += [
    {"B": b, "V": v, "L": 1024, "features": "all", "step": s}
    for s, v, b in itertools.product(("fused", "fused-sampled"), (32000, 151936), (1, 8, 64))
]
SPECS += [{"B": 256, "V": 32000, "L": 1024, "features": "all", "step": "fused"}]
SPECS += [{"B": b, "V": 32000, "L": 1024, "features": "neutral", "step": "fused"} for b in (1, 8)]
SPECS += [{"B": 8, "V": 32000, "L": 32768, "features": "all", "step": "fused"}]
# every row's argmax a token of its request's output (real text repeats itself): the
# greedy shortcut's seen-argmax path
SPECS += [
    {"B": b, "V": 32000, "L": L, "features": "all", "step": "fused", "rows": "seen"}
    for b, L in ((1, 1024), (8, 1024), (8, 32768))
]
# the same with the parameters kept in a ProcessingState (what a persistent batch passes)
SPECS += [
    {"B": b, "V": 32000, "L": L, "features": "all", "step": "fused-state"}
    for b, L in ((1, 1024), (8, 1024), (64, 1024), (8, 32768))
]
# a state of 1024 rows (a persistent batch's capacity), the batch spread over it
SPECS += [
    {"B": b, "V": 32000, "L": 1024, "features": "all", "step": "fused-state", "R": 1024}
    for b in (1, 8)
]
# a state that keeps each row's history counts (keep_counts=True)
SPECS += [
    {"B": b, "V": 32000, "L": L, "features": "all", "step": "fused-state", "counts": True}
    for b, L in ((1, 1024), (8, 1024), (8, 32768))
]
# sampled (temperature 0.8, top-p 0.9), with and without kept counts, 1k and 32k histories
SPECS += [
    {"B": b, "V": 32000, "L": L, "features": "all", "step": s}
    for s, b, L in itertools.product(
        ("fused-sampled", "fused-state-sampled"), (1, 8), (1024, 32768)
    )  # fmt: skip
    if not (s == "fused-sampled" and L == 1024)  # (in the list above)
]
SPECS += [
    {"B": b, "V": 32000, "L": L, "features": "all", "step": "fused-state-sampled",
     "counts": True}
    for b, L in itertools.product((1, 8), (1024, 32768))
]  # fmt: skip
SPECS += [
    {"B": 8, "V": 151936, "L": 1024, "features": "all", "step": "fused-state-sampled",
     "counts": True}
]  # fmt: skip
QUICK_SPECS = [
    {"B": 2, "V": 1000, "L": 64, "features": f, "step": s}
    for f, s in (
        ("all", "process"),
        ("all", "verify"),
        ("neutral", "process"),
        ("all", "fused"),
        ("all", "fused-sampled"),
        ("all", "fused-state"),
    )  # fmt: skip
]
QUICK_SPECS += [{"B": 2, "V": 1000, "L": 64, "features": "all", "step": "fused", "rows": "seen"}]
QUICK_SPECS += [
    {"B": 2, "V": 1000, "L": 64, "features": "all", "step": "fused-state-sampled", "counts": True}
]
BASELINES = ["torch", "bare", "verify", "two_ops"]


def _inputs(
    B: int, V: int, L: int, features: str, mode: str = "greedy", rows: str = "random"
) -> tuple[dict, dict]:
    """The op's arguments and, per verify row, the baseline's. ``rows="seen"``: request
    ``b``'s output ends with its rows' argmaxes (row ``j``'s ``j`` tokens from the end)."""
    inp = data.verify_logits(B, K, V, mode=mode)
    token_ids, num_tokens = data.ngram_histories(B, L)
    token_ids = token_ids % V
    if rows == "seen":
        top = inp["target_logits"].float().argmax(1).view(B, K + 1).to(token_ids.dtype)
        token_ids[:, L - K - 1 : L] = top.flip(1)
    prompt = torch.full((B,), L // 2, dtype=torch.int32)
    g = torch.Generator().manual_seed(B * 7 + V)
    kw = dict(
        repetition_penalty=torch.full((B,), 1.2), frequency_penalty=torch.full((B,), 0.3),
        presence_penalty=torch.full((B,), 0.2),
    )  # fmt: skip
    if features == "neutral":
        kw = dict(repetition_penalty=torch.ones(B), frequency_penalty=torch.zeros(B),
                  presence_penalty=torch.zeros(B))  # fmt: skip
    allowed = torch.rand(B, V, generator=g) < 0.9
    words = torch.randint(0, V, (B, 4, 3), generator=g, dtype=torch.int32)
    words[:, :2, 1:] = -1  # two one-token words, two of three tokens
    if features == "all":
        kw.update(
            logit_bias_ids=torch.randint(0, V, (B, 8), generator=g, dtype=torch.int32),
            logit_bias_values=torch.randn(B, 8, generator=g),
            allowed_token_mask=token_bitmask(allowed),
            bad_word_ids=words, min_tokens=torch.full((B,), L, dtype=torch.int32),
            stop_token_ids=torch.randint(0, V, (B, 2), generator=g, dtype=torch.int32),
        )  # fmt: skip
    op = dict(inp, token_ids=token_ids, num_tokens=num_tokens, num_prompt_tokens=prompt, kw=kw)

    drafts = inp["draft_token_ids"].view(B, K).tolist()
    rows = {n: [] for n in ("prompts", "outputs", "bias", "words", "min", "stops")}
    per_row = torch.arange(B).repeat_interleave(K + 1)
    for b in range(B):
        hist = token_ids[b, :L].tolist()
        for j in range(K + 1):
            rows["prompts"].append(hist[: L // 2])
            rows["outputs"].append(hist[L // 2 :] + drafts[b][:j])
            if features == "all":
                ids, vals = kw["logit_bias_ids"][b].tolist(), kw["logit_bias_values"][b].tolist()
                entries: dict[int, float] = {}
                for t, v in zip(ids, vals, strict=True):
                    entries[t] = entries.get(t, 0.0) + v
                rows["bias"].append(entries)
                rows["words"].append([[t for t in w if t >= 0] for w in words[b].tolist()])
                rows["min"].append(L)
                rows["stops"].append(kw["stop_token_ids"][b].tolist())
            else:
                rows["bias"].append({})
                rows["words"].append([])
                rows["min"].append(0)
                rows["stops"].append([])
    base = dict(
        prompts=rows["prompts"], outputs=rows["outputs"],
        repetition=kw["repetition_penalty"][per_row], frequency=kw["frequency_penalty"][per_row],
        presence=kw["presence_penalty"][per_row], bias=rows["bias"],
        disallowed=~allowed[per_row] if features == "all" else None, bad_words=rows["words"],
        min_tokens=rows["min"], stop_ids=rows["stops"],
    )  # fmt: skip
    return op, base


def bytes_moved(B: int, V: int, L: int) -> int:
    """The ``B (k+1)`` rows read (fp32) and written (fp32), the histories read."""
    return B * (K + 1) * V * 8 + B * L * 4


def build(spec: dict) -> Case:
    B, V, L, features, step = (spec[n] for n in ("B", "V", "L", "features", "step"))
    op, base = _inputs(B, V, L, features)
    args = (op["target_logits"], op["draft_token_ids"], op["cu_num_draft_tokens"],
            op["token_ids"], op["num_tokens"], op["num_prompt_tokens"])  # fmt: skip
    verify_args = (op["draft_token_ids"], op["cu_num_draft_tokens"])

    def processed():
        return process_logits(*args, **op["kw"])

    def torch_processed():
        return process_logits_torch(op["target_logits"], **base)

    def verify(rows):
        return rejection_sample(rows, *verify_args, num_speculative_tokens=K)

    if step == "process":
        impls = {OP: processed, "torch": torch_processed, "bare": lambda: process_logits(*args)}
    elif step.startswith("fused"):
        return _fused_case(spec)
    else:
        impls = {
            OP: lambda: verify(processed()),
            "torch": lambda: verify(torch_processed()),
            "verify": lambda: verify(op["target_logits"]),
        }

    def check() -> str:
        got, want = processed(), torch_processed()
        masked = torch.isinf(want) & (want < 0)
        assert torch.equal(torch.isinf(got) & (got < 0), masked), "masked tokens differ"
        torch.testing.assert_close(got[~masked], want[~masked], rtol=1e-6, atol=1e-6)
        same = torch.equal(verify(got).output_token_ids, verify(want).output_token_ids)
        assert same, "greedy verification differs"
        share = float(masked.float().mean())
        return (f"op == torch processing to 1e-6 ({share:.1%} of entries masked), greedy "
                "verification identical")  # fmt: skip

    return Case(OP_NAME, dict(spec), impls, check, bytes_moved(B, V, L))


def _fused_case(spec: dict) -> Case:
    B, V, L, features, step = (spec[n] for n in ("B", "V", "L", "features", "step"))
    mode = "onehot" if step.endswith("sampled") else "greedy"
    op, base = _inputs(B, V, L, features, mode, spec.get("rows", "random"))
    logits, drafts, cu = (op[n] for n in ("target_logits", "draft_token_ids",
                                          "cu_num_draft_tokens"))  # fmt: skip
    processing = LogitsProcessing(op["token_ids"], op["num_tokens"], op["num_prompt_tokens"],
                                  **op["kw"])  # fmt: skip
    kw = dict(num_speculative_tokens=K)
    if mode == "onehot":
        kw.update(temperature=torch.full((B,), 0.8), top_p=torch.full((B,), 0.9),
                  seeds=op["seeds"], offsets=op["offsets"])  # fmt: skip

    def verify(rows, **more):
        return rejection_sample(rows, drafts, cu, **kw, **more)

    reference = processing  # the parameters the check's two ops take

    def two_ops():
        return verify(process_logits(logits, drafts, cu, **reference._asdict()))

    impls = {
        OP: lambda: verify(logits, processing=processing),
        "verify": lambda: verify(logits),
        "two_ops": two_ops,
        "torch": lambda: verify(process_logits_torch(logits, **base)),
    }
    if step.startswith("fused-state"):
        batch = _state_of(op, V, spec.get("R", B), spec.get("counts", False))
        reference = batch.logits_processing(B)  # (a dict's bias: repeated ids summed first)
        impls = {
            OP: lambda: verify(logits, processing=batch),
            "verify": lambda: verify(logits),
            "fused": lambda: verify(logits, processing=processing),
        }

    def check() -> str:
        got, want = impls[OP](), two_ops()
        assert torch.equal(got.output_token_ids, want.output_token_ids), "tokens differ"
        assert torch.equal(got.num_emitted, want.num_emitted), "emitted counts differ"
        mean = float(got.num_emitted.float().mean())
        return f"tokens identical to process_logits + rejection_sample ({mean:.2f} emitted)"

    return Case(OP_NAME, dict(spec), impls, check, bytes_moved(B, V, L))


def _state_of(op: dict, V: int, R: int, counts: bool) -> StateBatch:
    """The ``batch()`` of a ``ProcessingState`` of ``R >= B`` rows holding ``op``'s
    requests and their per-request features (``_inputs``' ``features=all``), request ``b``
    in state row ``b * (R // B)`` (neutral rows between them); ``counts``: ``keep_counts``
    (the histories are counted by the first call; the timed calls append nothing)."""
    kw = op["kw"]
    B, L = op["token_ids"].shape
    rows = torch.arange(B, dtype=torch.int32) * (R // B)
    buffer = [torch.zeros((R, L), dtype=torch.int32), torch.zeros(R, dtype=torch.int32),
              torch.zeros(R, dtype=torch.int32)]  # fmt: skip
    for t, given in zip(buffer, (op["token_ids"], op["num_tokens"], op["num_prompt_tokens"]),
                        strict=True):  # fmt: skip
        t[rows.long()] = given
    state = ProcessingState(
        *buffer, vocab_size=V,
        max_logit_bias=8, max_bad_words=4, max_bad_word_tokens=3, max_stop_tokens=2,
        allowed_tokens=True, keep_counts=counts,
    )  # fmt: skip
    for b in range(op["num_tokens"].shape[0]):
        words = kw["allowed_token_mask"][b].numpy().view(np.uint8)
        allowed = np.unpackbits(words, bitorder="little")[:V].nonzero()[0].tolist()
        bias: dict[int, float] = {}
        for t, v in zip(kw["logit_bias_ids"][b].tolist(), kw["logit_bias_values"][b].tolist(),
                        strict=True):  # fmt: skip
            bias[t] = bias.get(t, 0.0) + v
        state.set_request(
            int(rows[b]), repetition_penalty=float(kw["repetition_penalty"][b]),
            frequency_penalty=float(kw["frequency_penalty"][b]),
            presence_penalty=float(kw["presence_penalty"][b]), logit_bias=bias,
            allowed_token_ids=allowed,
            bad_words=[[t for t in w if t >= 0] for w in kw["bad_word_ids"][b].tolist()],
            min_tokens=int(kw["min_tokens"][b]),
            stop_token_ids=kw["stop_token_ids"][b].tolist(),
        )  # fmt: skip
    return state.batch(None if R == B else rows)


def cases(quick: bool = False):
    for spec in QUICK_SPECS if quick else SPECS:
        yield build(spec)
