"""Frequency-scored drafting on the GPU (``python -m bench.gpu --only frequency``, in
``bench/gpu_check.sh``'s default run): one decoding step (commit ``k + 1`` tokens,
``ngram_index_extend`` on a ``FrequencyIndex``, ``ngram_propose(scoring="frequency")``)
with the Triton kernels, timed by CUDA events and replayed from a CUDA graph (a capture
that fails, e.g. on a host synchronisation, is reported), beside the same step on the
n-gram index and the CPU path's step on the host. Checked first: the device index and
drafts equal the CPU path's bit for bit."""

from __future__ import annotations

import time

import numpy as np
import torch

from bench import cases_frequency, data
from bench import gpu as G
from bench.harness import measure
from specdec_kernels.ops import (
    corpus_append,
    new_ngram_index,
    ngram_index_build,
    ngram_index_extend,
    ngram_propose,
)

SPECS = [{"B": b, "L": 8192, "k": 8, "D": 64} for b in (1, 64)]  # inside gpu_check's 100 s
SPECS += [{"B": 64, "L": 8192, "k": 8, "D": 64, "corpus": 1 << 18}]  # with the corpus
QUICK_SPECS = [{"B": 2, "L": 64, "k": 4, "D": 8}, {"B": 2, "L": 64, "k": 4, "D": 8, "corpus": 64}]
APPEND_CALLS = 5  # a finished request appended on the device: one sequential program
CALLS = 50


def bench_frequency(rows: G.Rows, specs, *, graphs: bool = True) -> None:
    for spec in specs:
        _case(rows, spec, graphs)
        if G.DEVICE == "cuda":
            torch.cuda.empty_cache()


def _case(rows, spec, graphs) -> None:
    B, L, k, D, C = spec["B"], spec["L"], spec["k"], spec["D"], spec.get("corpus", 0)
    label = f"B={B} L={L} k={k} D={D}" + (f" corpus={C}" if C else "")
    L_max = L + 8 * (CALLS + 20) * (k + 1)  # room for every timed step (events, graph, host)
    tok, _ = data.ngram_histories(B, L_max)  # real text past L: the committed tokens
    nt = torch.full((B,), L, dtype=torch.int32)
    gtok, gnt = tok.to(G.DEVICE), nt.to(G.DEVICE)
    fk = {"min_n": 1, "max_n": D, "scoring": "frequency"}
    index = new_ngram_index(B, L_max, device=G.DEVICE, **fk)
    G._sync()
    t0 = time.perf_counter()
    ngram_index_build(gtok, gnt, index=index)
    G._sync()
    build_s = time.perf_counter() - t0
    cpu_index = new_ngram_index(B, L_max, **fk)
    ngram_index_build(tok, nt, index=cpu_index)
    cpu_corpus = corpus = None
    if C:  # filled on the host (a device append is one sequential program), then copied
        from bench.cases_frequency import _filled

        cpu_corpus = _filled(C, "frequency", D)[0]
        corpus = cpu_corpus._replace(**{f: getattr(cpu_corpus, f).to(G.DEVICE)
                                        for f in cpu_corpus._fields[:7]})  # fmt: skip
    kw = {"min_n": 1, "max_n": D, "num_speculative_tokens": k, "scoring": "frequency"}
    got = ngram_propose(gtok, gnt, **kw, index=index, corpus=corpus)
    want = ngram_propose(tok, nt, **kw, index=cpu_index, corpus=cpu_corpus)
    assert G._equal(tuple(index[:5]), tuple(cpu_index[:5])), f"frequency index CUDA != CPU {label}"
    assert G._equal(tuple(got), tuple(want)), f"frequency drafts CUDA != CPU at {label}"
    rows.note(
        f"frequency {label}: the CUDA index and drafts == the CPU path's bit for bit; initial "
        f"indexing of {B} x {L} tokens {build_s * 1e3:.1f} ms"
    )

    def step():
        gnt.add_(k + 1)  # the commit (a real engine's commit_accepted_tokens)
        ngram_index_extend(gtok, gnt, index=index)
        return ngram_propose(gtok, gnt, **kw, index=index, corpus=corpus)

    nbytes = cases_frequency.bytes_moved(B, k)  # the CPU suite's count, comparable
    rows.add("frequency step", label, "op", "events", G.time_steps(step, calls=CALLS), nbytes)
    if graphs:
        q = G._graph_steps(step, CALLS)
        if q is not None:
            rows.add("frequency step", label, "op", "graph", q, nbytes)
    longest = new_ngram_index(B, L_max, min_n=2, max_n=5, device=G.DEVICE)
    ln = gnt.clone()
    ngram_index_build(gtok, ln, index=longest)

    def longest_step():
        ln.add_(k + 1)
        ngram_index_extend(gtok, ln, index=longest)
        return ngram_propose(gtok, ln, min_n=2, max_n=5, num_speculative_tokens=k, index=longest)

    q = G.time_steps(longest_step, calls=CALLS)
    rows.add("frequency step", label, "longest_index", "events", q, nbytes)
    host_nt = gnt.cpu()
    ngram_index_extend(tok, host_nt, index=cpu_index)

    def host_step():  # the CPU path over the same batch, on the host
        host_nt.add_(k + 1)
        ngram_index_extend(tok, host_nt, index=cpu_index)
        ngram_propose(tok, host_nt, **kw, index=cpu_index, corpus=cpu_corpus)

    t = measure(host_step, budget_s=0.3, max_rounds=CALLS)
    rows.add("frequency step", label, "CPU path (host)", "host", (t.q25, t.median, t.q75), nbytes)
    if corpus is not None:
        _append(rows, label, tok, corpus, cpu_corpus)


def _append(rows, label, tok, corpus, cpu_corpus) -> None:
    """One finished request (512 tokens) appended to the full corpus, on the device and by
    the CPU path, checked equal."""
    n = min(512, tok.shape[1])  # one sequential program: keep the device call short
    doc, lens = tok[:1, :n].contiguous(), torch.full((1,), n, dtype=torch.int32)
    gdoc, glens = doc.to(G.DEVICE), lens.to(G.DEVICE)
    times = []
    for _ in range(APPEND_CALLS):
        G._sync()
        t0 = time.perf_counter()
        corpus_append(gdoc, glens, corpus=corpus)
        G._sync()
        times.append((time.perf_counter() - t0) * 1e6)
        corpus_append(doc, lens, corpus=cpu_corpus)
    assert G._equal(tuple(corpus[:7]), tuple(cpu_corpus[:7])), f"corpus CUDA != CPU {label}"
    rows.note(f"frequency corpus_append {label}: the CUDA corpus == the CPU path's bit for bit")
    q = tuple(float(x) for x in np.quantile(times, [0.25, 0.5, 0.75]))
    rows.add("frequency corpus_append", f"{n} tokens, {label}", "op", "wall", q, n * 4)
    t = measure(lambda: corpus_append(doc, lens, corpus=cpu_corpus), budget_s=0.3,
                max_rounds=APPEND_CALLS)  # fmt: skip
    rows.add("frequency corpus_append", f"{n} tokens, {label}", "CPU path (host)", "host",
             (t.q25, t.median, t.q75), n * 4)  # fmt: skip
