"""``ngram_propose`` cases: the library's CPU path vs numba KMP vs the plain reference."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from bench import data
from bench.harness import OP, Case
from specdec_kernels.ops import ngram_propose
from specdec_kernels.reference.ngram import ngram_propose as reference_ngram

OP_NAME = "ngram_propose"
MIN_N, MAX_N = 2, 5
BATCHES = (1, 64, 256)
HISTORIES = (1024, 8192, 32768)
KS = (4, 8)
# The reference is a Python loop over requests, n and start positions (~0.1 s per 32k
# tokens): it is checked and timed only where B * L stays small.
REFERENCE_MAX_TOKENS = 64 * 1024

SPECS = [{"B": b, "L": h, "k": k} for b, h, k in itertools.product(BATCHES, HISTORIES, KS)]
QUICK_SPECS = [{"B": 1, "L": 256, "k": 4}, {"B": 4, "L": 512, "k": 8}]

BASELINES = ["numba", "reference"]


def numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def bytes_moved(B: int, L: int, k: int) -> int:
    """Every history token read once (int32), lengths read, drafts and counts written."""
    return 4 * B * L + 4 * B + 4 * B * k + 4 * B


def build(spec: dict) -> Case:
    B, L, k = spec["B"], spec["L"], spec["k"]
    token_ids, num_tokens = data.ngram_histories(B, L)
    kw = {"min_n": MIN_N, "max_n": MAX_N, "num_speculative_tokens": k}

    impls = {OP: lambda: ngram_propose(token_ids, num_tokens, **kw)}
    if numba_available():
        from bench.baselines.ngram_numba import ngram_propose_numba

        tok_np, len_np = token_ids.numpy(), num_tokens.numpy()
        impls["numba"] = lambda: ngram_propose_numba(tok_np, len_np, **kw)
    use_reference = B * L <= REFERENCE_MAX_TOKENS
    if use_reference:
        impls["reference"] = lambda: reference_ngram(
            token_ids,
            num_tokens,
            None,
            None,
            None,
            None,
            max_model_len=None,
            tie_break="first",
            **kw,
        )

    def check() -> str:
        drafts, counts = impls[OP]()[:2]
        if "numba" in impls:
            nd, nc = impls["numba"]()
            assert np.array_equal(drafts.numpy(), nd), "ngram_propose != numba (drafts)"
            assert np.array_equal(counts.numpy(), nc), "ngram_propose != numba (counts)"
        if use_reference:
            rd, rc = impls["reference"]()[:2]
            assert torch.equal(drafts, rd) and torch.equal(counts, rc), "ngram_propose != ref"
        hit = float((counts > 0).float().mean())
        mean = float(counts.float().mean())
        checked = " == ".join(["op"] + [name for name in impls if name != OP])
        return f"{checked} exactly; {hit:.0%} of rows drafted, {mean:.2f} drafts/row"

    return Case(OP_NAME, dict(spec), impls, check, bytes_moved(B, L, k))


def cases(quick: bool = False):
    for spec in QUICK_SPECS if quick else SPECS:
        yield build(spec)
