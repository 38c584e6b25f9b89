"""The op cases of the GPU timings (``python -m bench.gpu``): each checks the CUDA op
against the CPU path and the baselines, then times both. Timing and reporting are
``bench/gpu.py``'s (read through the module, so a test can stub the timers)."""

from __future__ import annotations

import time

import torch

from bench import cases_bookkeeping, cases_ngram, cases_rejection, data
from bench import gpu as G
from bench.baselines import bookkeeping_torch as eager_book
from bench.baselines.ngram_torch import ngram_propose_torch
from bench.baselines.rejection_torch import library_uniforms, rejection_sample_torch

# ----------------------------------------------------------------------------- ops


def bench_ngram(rows: G.Rows, specs, *, graphs: bool = True) -> None:
    from specdec_kernels.ops import ngram_propose

    numba_fn = None
    if cases_ngram.numba_available():
        from bench.baselines.ngram_numba import ngram_propose_numba

        numba_fn = ngram_propose_numba
    for spec in specs:
        _ngram_case(rows, spec, ngram_propose, numba_fn, graphs)


def _ngram_case(rows, spec, ngram_propose, numba_fn, graphs) -> None:
    B, L, k = spec["B"], spec["L"], spec["k"]
    label = f"B={B} L={L} k={k}"
    kw = {"min_n": cases_ngram.MIN_N, "max_n": cases_ngram.MAX_N, "num_speculative_tokens": k}
    tok, nt = data.ngram_histories(B, L)
    gtok, gnt = tok.to(G.DEVICE), nt.to(G.DEVICE)
    want = ngram_propose(tok, nt, **kw)  # the CPU path
    got = ngram_propose(gtok, gnt, **kw)
    base = ngram_propose_torch(gtok, gnt, **kw)
    assert G._equal(tuple(got), tuple(want)), f"ngram CUDA != CPU at {label}"
    assert G._equal(base, tuple(want)[:2]), f"ngram torch-eager != CPU at {label}"
    if numba_fn is not None:
        nd, nc = numba_fn(tok.numpy(), nt.numpy(), **kw)
        assert G._equal((torch.from_numpy(nd), torch.from_numpy(nc)), tuple(want)[:2])
    rows.note(
        f"ngram_propose {label}: CUDA op == CPU op == torch eager"
        + (" == numba" if numba_fn else "")
        + " exactly"
    )
    nbytes = cases_ngram.bytes_moved(B, L, k)
    op = lambda: ngram_propose(gtok, gnt, **kw)  # noqa: E731
    rows.add("ngram_propose", label, "op", "bench", G.time_kernel(op), nbytes)
    if graphs:
        q = G.time_graph(op)
        if q is not None:
            rows.add("ngram_propose", label, "op", "graph", q, nbytes)
    eager = lambda: ngram_propose_torch(gtok, gnt, **kw)  # noqa: E731
    rows.add("ngram_propose", label, "torch", "bench", G.time_kernel(eager), nbytes)
    if numba_fn is not None:
        tn, ln = tok.numpy(), nt.numpy()
        q = G.time_host(lambda: numba_fn(tn, ln, **kw))
        rows.add("ngram_propose", label, "numba (host)", "host", q, nbytes)


def bench_rejection(rows: G.Rows, specs) -> None:
    from specdec_kernels.ops import rejection_sample

    for spec in specs:
        _rejection_case(rows, spec, rejection_sample)


def _rejection_case(rows, spec, rejection_sample) -> None:
    K = cases_rejection.K
    B, V, mode, dt = spec["B"], spec["V"], spec["mode"], spec["dtype"]
    label = f"B={B} V={V} {mode} {dt}"
    inp = data.verify_logits(B, K, V, dtype=cases_rejection.DTYPES[dt], mode=mode)
    g = {n: G._to(v, G.DEVICE) for n, v in inp.items()}
    args = ("target_logits", "draft_token_ids", "cu_num_draft_tokens")
    base_kw = {"num_speculative_tokens": K}
    for n in ("draft_probs", "temperature"):
        if n in g:
            base_kw[n] = g[n]
    op_kw = dict(base_kw)
    for n in ("seeds", "offsets"):
        if n in g:
            op_kw[n] = g[n]
    cpu_kw = {n: G._to(v, "cpu") for n, v in op_kw.items()}
    want = rejection_sample(*(inp[a] for a in args), **cpu_kw)
    got = rejection_sample(*(g[a] for a in args), **op_kw)
    if mode == "greedy":
        base = rejection_sample_torch(*(g[a] for a in args), **base_kw)
        assert G._equal(tuple(got[:2]), tuple(want[:2])), f"greedy CUDA != CPU at {label}"
        assert G._equal(base, tuple(want[:2])), f"greedy torch != CPU at {label}"
        rows.note(f"rejection_sample {label}: CUDA op == CPU op == torch exactly")
    else:
        u = library_uniforms(g["seeds"], g["offsets"], K)
        base = rejection_sample_torch(*(g[a] for a in args), uniforms=u, **base_kw)
        d_cpu = _row_mismatch(got, (want.output_token_ids, want.num_emitted))
        d_base = _row_mismatch(got, base)
        frac = cases_rejection.MAX_MISMATCH_FRACTION
        assert d_cpu <= frac * B + 1 and d_base <= frac * B + 1, f"sampled mismatch {label}"
        rows.note(
            f"rejection_sample {label}: same Philox uniforms; rows differing from the CPU "
            f"op: {d_cpu}/{B}, from torch: {d_base}/{B}"
        )
    nbytes = cases_rejection.bytes_moved(B, V, mode, dt)
    gen = torch.Generator(device=G.DEVICE).manual_seed(0)
    a = tuple(g[x] for x in args)
    op = lambda: rejection_sample(*a, **op_kw)  # noqa: E731
    base_fn = lambda: rejection_sample_torch(*a, generator=gen, **base_kw)  # noqa: E731
    live = g["target_logits"][: B * (K + 1)]
    softmax = lambda: torch.softmax(live, dim=-1)  # noqa: E731
    rows.add("rejection_sample", label, "op", "bench", G.time_kernel(op), nbytes)
    rows.add("rejection_sample", label, "torch", "bench", G.time_kernel(base_fn), nbytes)
    rows.add("rejection_sample", label, "softmax", "bench", G.time_kernel(softmax), nbytes)


def bench_processing(rows: G.Rows, specs) -> None:
    """``process_logits`` on the device vs its CPU path (bit for bit) and vs the torch
    processing; ``verify`` = ``rejection_sample`` on the raw rows, the yardstick."""
    for spec in specs:
        _processing_case(rows, spec)


def _processing_case(rows, spec) -> None:
    from bench import cases_processing as P
    from specdec_kernels.ops import process_logits, rejection_sample

    B, V, L, feats = spec["B"], spec["V"], spec["L"], spec["features"]
    label = f"B={B} V={V} L={L} {feats}"
    op_in, base_in = P._inputs(B, V, L, feats)
    names = ("target_logits", "draft_token_ids", "cu_num_draft_tokens", "token_ids",
             "num_tokens", "num_prompt_tokens")  # fmt: skip
    kw = {n: G._to(t, G.DEVICE) for n, t in op_in["kw"].items()}
    a = tuple(G._to(op_in[n], G.DEVICE) for n in names)
    want = process_logits(*(op_in[n] for n in names), **op_in["kw"])
    got = process_logits(*a, **kw)
    assert G._equal(got.view(torch.int32), want.view(torch.int32)), f"CUDA != CPU at {label}"
    rows.note(f"process_logits {label}: CUDA op == CPU op bit for bit")
    nbytes = P.bytes_moved(B, V, L)
    base = {n: G._to(v, G.DEVICE) for n, v in base_in.items()}
    op = lambda: process_logits(*a, **kw)  # noqa: E731
    torch_fn = lambda: P.process_logits_torch(a[0], **base)  # noqa: E731
    verify = lambda: rejection_sample(a[0], a[1], a[2], num_speculative_tokens=P.K)  # noqa: E731
    rows.add("process_logits", label, "op", "bench", G.time_kernel(op), nbytes)
    rows.add("process_logits", label, "torch", "bench", G.time_kernel(torch_fn), nbytes)
    rows.add("process_logits", label, "verify", "bench", G.time_kernel(verify), nbytes)


def bench_logprobs(rows: G.Rows, specs) -> None:
    """``top_logprobs`` on the device vs its CPU path (ids and ranks exactly, values to
    1e-5) and vs vLLM's torch rule on every slot (bench/cases_logprobs.py)."""
    for spec in specs:
        _logprobs_case(rows, spec["B"], spec["V"], spec["N"], spec.get("mode"))


def _logprobs_case(rows, B, V, N, mode=None) -> None:
    from bench import cases_logprobs as P
    from specdec_kernels.ops import top_logprobs

    label = f"B={B} V={V} N={N}" + (f" mode={mode}" if mode else "")
    cpu_in = P._inputs(B, V)
    a = tuple(G._to(t, G.DEVICE) for t in cpu_in)
    kw = dict(num_logprobs=N)
    T, p = torch.full((B,), P.TEMPERATURE), torch.full((B,), P.TOP_P)
    if mode:  # the processed mode: sampled rows at temperature 0.8, top-p 0.9
        kw.update(logprobs_mode=mode, temperature=G._to(T, G.DEVICE), top_p=G._to(p, G.DEVICE))
    want = top_logprobs(*cpu_in, **dict(kw, temperature=T, top_p=p) if mode else kw)
    got = top_logprobs(*a, **kw)
    assert G._equal(got.top_token_ids, want.top_token_ids), f"CUDA ids != CPU at {label}"
    assert G._equal(got.token_ranks, want.token_ranks), f"CUDA ranks != CPU at {label}"
    torch.testing.assert_close(got.top_logprobs.cpu(), want.top_logprobs, rtol=1e-5, atol=1e-6)
    rows.note(f"top_logprobs {label}: CUDA op == CPU op (ids, ranks; values to 1e-5)")
    nbytes = P.bytes_moved(B, V, N)
    op = lambda: top_logprobs(*a, **kw)  # noqa: E731
    torch_fn = lambda: P.top_logprobs_torch(a[0], a[1], a[3], N)  # noqa: E731
    if mode:
        torch_fn = lambda: P.processed_top_logprobs_torch(  # noqa: E731
            a[0], a[1], a[3], N, kw["temperature"], kw["top_p"]
        )
    rows.add("top_logprobs", label, "op", "bench", G.time_kernel(op), nbytes)
    rows.add("top_logprobs", label, "torch", "bench", G.time_kernel(torch_fn), nbytes)


def _row_mismatch(out, ref) -> int:
    o, n = out[0].cpu(), out[1].cpu()
    ro, rn = ref[0].cpu(), ref[1].cpu()
    return int(((o != ro).any(dim=1) | (n != rn)).sum())


def bench_bookkeeping(rows: G.Rows, batches, *, graphs: bool = True) -> None:
    from specdec_kernels.ops import (
        commit_accepted_tokens,
        compute_slot_mapping,
        prepare_verify_inputs,
    )

    for B in batches:
        _bookkeeping_case(
            rows, B, graphs, commit_accepted_tokens, compute_slot_mapping, prepare_verify_inputs
        )


def _bookkeeping_case(
    rows, B, graphs, commit_accepted_tokens, compute_slot_mapping, prepare_verify_inputs
) -> None:
    K = cases_bookkeeping.K
    st = data.paged_state(B, K)
    g = {n: G._to(v, G.DEVICE) for n, v in st.items()}
    bs, mml = st["block_size"], st["max_model_len"]
    vkeys = (
        "token_ids",
        "num_tokens",
        "draft_token_ids",
        "num_draft_tokens",
        "block_table",
        "req_indices",
    )
    kw = {"block_size": bs, "max_model_len": mml}

    # prepare_verify_inputs
    want = tuple(prepare_verify_inputs(*(st[x] for x in vkeys), **kw))
    va = tuple(g[x] for x in vkeys)
    op = lambda: prepare_verify_inputs(*va, **kw)  # noqa: E731
    base = lambda: eager_book.prepare_verify_inputs_torch(*va, **kw)  # noqa: E731
    assert G._equal(tuple(op()), want) and G._equal(base(), want), f"verify inputs B={B}"
    T = B * (K + 1)
    nb = 4 * B * 4 + 4 * B * K + 4 * T + 24 * T + 8 * (B + 1) + 4 * B + 4 * B * K
    _bench_small(rows, "prepare_verify_inputs", f"B={B}", op, base, nb, graphs)

    # compute_slot_mapping on the verify layout
    positions, qsl = want[1].to(G.DEVICE), want[2].to(G.DEVICE)
    sa = (g["block_table"], positions, qsl, g["req_indices"])
    want_s = compute_slot_mapping(st["block_table"], want[1], want[2], st["req_indices"], **kw)
    op = lambda: compute_slot_mapping(*sa, **kw)  # noqa: E731
    base = lambda: eager_book.compute_slot_mapping_torch(*sa, **kw)  # noqa: E731
    assert G._equal(op(), want_s) and G._equal(base(), want_s), f"slot mapping B={B}"
    nb = 8 * T + 4 * (B + 1) + 4 * B + 4 * T + 8 * T
    _bench_small(rows, "compute_slot_mapping", f"B={B} T={T}", op, base, nb, graphs)

    # commit_accepted_tokens (mutates: the lengths are restored before every call)
    ckw = {n: g[n] for n in ("stop_token_ids", "min_tokens", "max_tokens")}
    ckw["num_prompt_tokens"] = g["num_prompt_tokens"]
    ckw["max_model_len"] = mml
    fixed = (g["output_token_ids"], g["num_emitted"], g["req_indices"])
    tok_c, nt_c = g["token_ids"].clone(), g["num_tokens"].clone()
    nt0 = g["num_tokens"].clone()
    cpu_tok, cpu_nt = st["token_ids"].clone(), st["num_tokens"].clone()
    cpu_kw = {n: G._to(v, "cpu") for n, v in ckw.items()}
    want_c = commit_accepted_tokens(
        cpu_tok, cpu_nt, st["output_token_ids"], st["num_emitted"], st["req_indices"], **cpu_kw
    )
    got_c = commit_accepted_tokens(tok_c, nt_c, *fixed, **ckw)
    assert G._equal(tuple(got_c), tuple(want_c)) and G._equal(nt_c, cpu_nt), f"commit B={B}"
    nt_c.copy_(nt0)
    got_b = eager_book.commit_accepted_tokens_torch(tok_c, nt_c, *fixed, **ckw)
    assert G._equal(tuple(got_b), tuple(want_c)) and G._equal(nt_c, cpu_nt), f"commit eager B={B}"

    def op_c():
        nt_c.copy_(nt0)
        return commit_accepted_tokens(tok_c, nt_c, *fixed, **ckw)

    def base_c():
        nt_c.copy_(nt0)
        return eager_book.commit_accepted_tokens_torch(tok_c, nt_c, *fixed, **ckw)

    S = st["stop_token_ids"].shape[1]
    nb = 8 * B * (K + 1) + 4 * B * 7 + 4 * B * S + 6 * B
    # the eager commit writes through boolean masks (a host sync): no graph for it
    _bench_small(
        rows,
        "commit_accepted_tokens",
        f"B={B} (+reset)",
        op_c,
        base_c,
        nb,
        graphs,
        base_graph=False,
    )
    rows.note(f"bookkeeping B={B}: CUDA op == CPU op == torch eager exactly (3 ops)")


def _bench_small(rows, op_name, label, op, base, nbytes, graphs, *, base_graph=True):
    rows.add(op_name, label, "op", "bench", G.time_kernel(op), nbytes)
    if graphs:
        q = G.time_graph(op)
        if q is not None:
            rows.add(op_name, label, "op", "graph", q, nbytes)
    rows.add(op_name, label, "torch", "bench", G.time_kernel(base), nbytes)
    if graphs and base_graph:
        q = G.time_graph(base)
        if q is not None:
            rows.add(op_name, label, "torch", "graph", q, nbytes)


def bench_ngram_index(rows: G.Rows, specs, *, graphs: bool = True) -> None:
    """One decoding step (commit k + 1 tokens, ``ngram_index_extend``, ``ngram_propose`` on
    the index) on the device at bench/cases_ngram_index.py's shapes, against the full rescan
    (``ngram_propose`` on the device, numba on the host); initial indexing timed once."""
    numba_fn = None
    if cases_ngram.numba_available():
        from bench.baselines.ngram_numba import ngram_propose_numba

        numba_fn = ngram_propose_numba
    for spec in specs:
        _ngram_index_case(rows, spec, numba_fn, graphs)
        if G.DEVICE == "cuda":
            torch.cuda.empty_cache()


def _ngram_index_case(rows, spec, numba_fn, graphs) -> None:
    from bench import cases_ngram_index as cases
    from specdec_kernels.ops import (
        new_ngram_index,
        ngram_index_build,
        ngram_index_extend,
        ngram_propose,
    )

    B, L, k, C = spec["B"], spec["L"], spec["k"], spec["corpus"]
    label = f"B={B} L={L} k={k} corpus={C}"
    calls = 100
    room = 2 * (calls + 20) * (k + 1) + 8
    tok, _ = data.ngram_histories(B, L + room)  # real text past L: the committed tokens
    nt = torch.full((B,), L, dtype=torch.int32)
    gtok, gnt = tok.to(G.DEVICE), nt.to(G.DEVICE)
    nk = {"min_n": cases.MIN_N, "max_n": cases.MAX_N}
    index = new_ngram_index(B, L + room, device=G.DEVICE, **nk)
    G._sync()
    t0 = time.perf_counter()
    ngram_index_build(gtok, gnt, index=index)
    G._sync()
    build_s = time.perf_counter() - t0
    corpus = cpu_corpus = None
    if C:
        cpu_corpus, _ = cases._corpus(C)
        fields = ("tokens", "meta", "index", "state")
        corpus = cpu_corpus._replace(**{f: getattr(cpu_corpus, f).to(G.DEVICE) for f in fields})
    kw = {**nk, "num_speculative_tokens": k}
    # checks: the device index's own-history proposals == ngram_propose on the CPU; with a
    # corpus, the device proposals == the CPU path's over the same index and corpus
    got = ngram_propose(gtok, gnt, **kw, index=index)
    want = ngram_propose(tok, nt, **kw)
    assert G._equal(tuple(got), tuple(want)), f"ngram_index CUDA != ngram_propose at {label}"
    note = f"ngram_index {label}: CUDA index proposals == ngram_propose (CPU) exactly"
    if corpus is not None:
        cpu_index = index._replace(table=index.table.cpu(), length=index.length.cpu())
        got_c = ngram_propose(gtok, gnt, **kw, index=index, corpus=corpus)
        want_c = ngram_propose(tok, nt, **kw, index=cpu_index, corpus=cpu_corpus)
        assert G._equal(tuple(got_c), tuple(want_c)), f"ngram_index corpus CUDA != CPU at {label}"
        note += "; with the corpus CUDA == CPU path exactly"
    rows.note(f"{note}; initial indexing of {B} x {L} tokens {build_s * 1e3:.1f} ms")

    def step():
        gnt.add_(k + 1)  # the commit (a real engine's commit_accepted_tokens)
        ngram_index_extend(gtok, gnt, index=index)
        return ngram_propose(gtok, gnt, **kw, index=index, corpus=corpus)

    nbytes = cases.bytes_moved(B, k, corpus is not None)
    rows.add("ngram_index step", label, "op", "events", G.time_steps(step, calls=calls), nbytes)
    if graphs:
        q = G._graph_steps(step, calls)
        if q is not None:
            rows.add("ngram_index step", label, "op", "graph", q, nbytes)
    scan = lambda: ngram_propose(gtok, gnt, **kw)  # noqa: E731
    rows.add("ngram_index step", label, "ngram_propose", "bench", G.time_kernel(scan), nbytes)
    if numba_fn is not None:
        tn, ln = tok.numpy(), gnt.cpu().numpy()
        q = G.time_host(lambda: numba_fn(tn, ln, **kw))
        rows.add("ngram_index step", label, "numba (host)", "host", q, nbytes)
