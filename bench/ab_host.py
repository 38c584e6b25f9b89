"""Host-side cells for an old / new comparison of two source trees, one process per tree.

``python -m bench.ab_host processing CELL ...`` with ``CELL = step,B,V,L[,R][,counts]``:
the cases of ``bench/cases_processing.py`` (``step`` = ``fused``, ``fused-sampled``,
``fused-state`` or ``process``; ``fused-state`` takes ``R`` and ``counts``), every feature
on; per cell the median of 3 rounds of (op, baseline), each round the median of
``n = 2000 / (B x V / 32000)`` calls (at least 10). The baseline is ``rejection_sample``
on the raw rows (fused steps) or ``process_logits`` with nothing on (``process``).
``python -m bench.ab_host kernels``: the ops whose kernels pass arrays on in their loops
(index builds, a frequency corpus append, proposals, ``top_logprobs``); per cell the median
of 5 rounds of n calls. One thread; prints one JSON object (cell -> microseconds).

To compare two commits, put each tree first on ``PYTHONPATH`` in turn, with this file's
tree's ``bench`` (``git worktree add /tmp/old <commit>``), and alternate them::

    for i in 1 2 3 4 5; do
      echo "old $(PYTHONPATH=/tmp/bench-new:/tmp/old python -m bench.ab_host kernels)"
      echo "new $(PYTHONPATH=/tmp/bench-new:. python -m bench.ab_host kernels)"
    done

(``/tmp/bench-new``: a folder holding a copy of this tree's ``bench/``.) The first call in
each tree compiles its kernels; timing starts after warm-up calls.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch


def _median_of(f, n: int, rounds: int = 5) -> float:
    for _ in range(2):
        f()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            f()
        times.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(times)


def processing(cells: list[str]) -> dict:
    from bench.cases_processing import _fused_case, build
    from bench.harness import OP, measure

    out = {}
    for cell in cells:
        step, B, V, L, *more = cell.split(",")  # fused-state: R, or "counts"
        spec = {"B": int(B), "V": int(V), "L": int(L), "features": "all", "step": step}
        for m in more:
            spec.update({"counts": True} if m == "counts" else {"R": int(m)})
        case = build(spec) if step == "process" else _fused_case(spec)
        op, base = case.impls[OP], case.impls["bare" if step == "process" else "verify"]
        n = max(10, int(2000 / (spec["B"] * spec["V"] / 32000)))
        for f in (op, base):
            for _ in range(max(3, n // 10)):
                f()
        rounds = {"op": [], "base": []}
        for _ in range(3):
            for name, f in (("op", op), ("base", base)):
                timing = measure(f, budget_s=0, min_rounds=n, max_rounds=n, warmup=0)
                rounds[name].append(timing.median)
        out[cell] = {k: statistics.median(v) for k, v in rounds.items()}
    return out


def kernels() -> dict:
    from bench import data
    from specdec_kernels.ops import (
        corpus_append,
        new_corpus,
        new_ngram_index,
        ngram_index_build,
        ngram_propose,
        rejection_sample,
        top_logprobs,
    )

    out = {}
    tok, n = data.ngram_histories(1, 32768)
    index = new_ngram_index(1, 32768, min_n=2, max_n=5)
    out["ngram_index_build, longest, 1 x 32k"] = _median_of(
        lambda: ngram_index_build(tok, n, index=index), 5
    )
    f_index = new_ngram_index(1, 32768, min_n=1, max_n=64, scoring="frequency")
    out["ngram_index_build, frequency D=64, 1 x 32k"] = _median_of(
        lambda: ngram_index_build(tok, n, index=f_index), 3
    )
    corpus = new_corpus(1 << 16, min_n=1, max_n=64, scoring="frequency")
    lens = torch.tensor([32768], dtype=torch.int32)
    out["corpus_append, frequency D=64, 32k tokens into C=64k"] = _median_of(
        lambda: corpus_append(tok, lens, corpus=corpus), 3
    )
    for B in (8, 64):
        t, m = data.ngram_histories(B, 8192)
        longest = new_ngram_index(B, 8192, min_n=2, max_n=5)
        ngram_index_build(t, m, index=longest)
        out[f"ngram_propose, longest, index, B={B}, 8k"] = _median_of(
            lambda t=t, m=m, ix=longest: ngram_propose(t, m, index=ix, min_n=2, max_n=5,
                                                      num_speculative_tokens=4), 200)  # fmt: skip
        freq = new_ngram_index(B, 8192, min_n=1, max_n=64, scoring="frequency")
        ngram_index_build(t, m, index=freq)
        shared = new_corpus(1 << 18, min_n=1, max_n=64, scoring="frequency")
        docs, doc_lens = data.ngram_histories(16, 8192)
        corpus_append(docs, doc_lens, corpus=shared)
        out[f"ngram_propose, frequency D=64, index + 128k corpus, B={B}, 8k"] = _median_of(
            lambda t=t, m=m, ix=freq, c=shared: ngram_propose(
                t, m, index=ix, corpus=c, scoring="frequency", min_n=1, max_n=64,
                num_speculative_tokens=8), 100)  # fmt: skip
    inp = data.verify_logits(8, 4, 32000, mode="greedy")
    rows, cu = inp["target_logits"], inp["cu_num_draft_tokens"]
    rs = rejection_sample(rows, inp["draft_token_ids"], cu, num_speculative_tokens=4)
    out["top_logprobs, B=8, k=4, V=32000, N=20"] = _median_of(
        lambda: top_logprobs(rows, rs.output_token_ids, rs.num_emitted, cu, num_logprobs=20),
        100,
    )
    return out


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    if not argv or argv[0] not in ("processing", "kernels"):
        raise SystemExit("usage: python -m bench.ab_host processing CELL ... | kernels")
    print(json.dumps(processing(argv[1:]) if argv[0] == "processing" else kernels()))


if __name__ == "__main__":
    main(sys.argv[1:])
