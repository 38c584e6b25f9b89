"""The frequency trie prototype's GPU timings (``python -m bench.gpu --only frequency_trie``,
and in ``bench/gpu_check.sh``'s default run): one decoding step per row (commit ``k + 1``
tokens, extend the row's trie, propose ``k`` drafts) with the Triton kernels of
``bench/baselines/frequency_trie_triton.py``, against the numba trie doing the same on the
host (what a host-side proposer runs; SuffixDecoding's speculate + update loop is the
CPU comparison in ``bench/suffix_memory.py``). Checked first: the device rows' tries and
drafts equal the numba trie's bit for bit. A design prototype's numbers, not an op's."""

from __future__ import annotations

import time

import numpy as np
import torch

from bench import data
from bench import gpu as G
from bench.baselines import frequency_trie as ft

SPECS = [{"B": b, "L": 8192, "k": 8, "D": 64} for b in (1, 64)]
QUICK_SPECS = [{"B": 2, "L": 64, "k": 4, "D": 8}]
CALLS = 50


def bench_frequency_trie(rows: G.Rows, specs) -> None:
    from bench.baselines import frequency_trie_triton as T

    for spec in specs:
        _case(rows, spec, T)
        if G.DEVICE == "cuda":
            torch.cuda.empty_cache()


def _case(rows, spec, T) -> None:
    B, L, k, D = spec["B"], spec["L"], spec["k"], spec["D"]
    label = f"B={B} L={L} k={k} D={D}"
    L_max = L + (CALLS + 30) * (k + 1) + 8  # both the device rows' and the host row's steps
    tok, _ = data.ngram_histories(B, L_max)  # real text past L: the committed tokens
    gtok = tok.to(G.DEVICE)
    zero = torch.zeros(B, dtype=torch.int32, device=G.DEVICE)
    n = torch.full((B,), L, dtype=torch.int32, device=G.DEVICE)
    store = T.new_rows(B, L_max, D, device=G.DEVICE)
    G._sync()
    t0 = time.perf_counter()
    T.extend(gtok, zero, n, store, D)
    G._sync()
    build_s = time.perf_counter() - t0
    drafts, count, _ = T.propose(gtok, n, store, D, k, 1.0, 0.1)
    host = [T.numba_row(tok[b].numpy(), L, L_max, D) for b in range(min(B, 2))]
    out, tmp = np.zeros(max(k, D), np.int32), np.zeros(max(k, D), np.int32)
    for b, want in enumerate(host):
        assert np.array_equal(store[2][b].cpu().numpy(), want[2]), f"trie nodes differ, {label}"
        t, _ = ft.propose(*want, tok[b].numpy(), L, D, k, 1.0, 0.1, out, tmp)
        assert drafts[b, :t].cpu().tolist() == out[:t].tolist(), f"trie drafts differ, {label}"
    rows.note(
        f"frequency_trie {label}: the device tries and drafts of {len(host)} rows == the "
        f"numba trie's bit for bit; initial extend of {B} x {L} tokens {build_s * 1e3:.1f} ms"
    )

    def step():
        T.extend(gtok, n, n + (k + 1), store, D)
        n.add_(k + 1)
        return T.propose(gtok, n, store, D, k, 1.0, 0.1)

    nbytes = B * (k + 1) * 4
    rows.add("frequency_trie step", label, "op", "events", G.time_steps(step, calls=CALLS), nbytes)
    row, m = tok[0].numpy(), [L]

    def host_step():  # one row on the host: multiply by B for the batch
        ft.append(*host[0], row, m[0], m[0] + k + 1, m[0], D)
        m[0] += k + 1
        ft.propose(*host[0], row, m[0], D, k, 1.0, 0.1, out, tmp)

    for _ in range(10):  # warm-up, then CALLS timed steps (the row has room for 20 more)
        host_step()
    times = []
    for _ in range(CALLS):
        t0 = time.perf_counter_ns()
        host_step()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    q = tuple(float(x) for x in np.quantile(times, [0.25, 0.5, 0.75]))
    rows.add("frequency_trie step", label, "numba (host, 1 row)", "host", q, nbytes // B)
