"""GPU timings: ``python -m bench.gpu`` (run by ``bench/gpu_check.sh`` after the GPU tests).

Every op at the CPU suite's shapes, on the CUDA device: the Triton path through the public
op, timed with ``triton.testing.do_bench`` (median of the kernel time, flushed L2) and,
for ops whose time is mostly launch overhead, also with CUDA-graph replay
(``do_bench_cudagraph``). Baselines in the same run: torch eager on the device
(n-gram: compare every window; rejection: the same rules in plain torch (softmax, then
argmax / cumsum + searchsorted / residual + multinomial), plus ``torch.softmax`` over the
same rows as the one-pass yardstick: the one-hot temperature-only case is the kernel's
<= 3-pass path; bookkeeping: eager torch), and for the n-gram op the numba proposer on
the host (what a CPU-side engine runs; host time only). Outputs are checked before
timing: the CUDA op against the CPU path (exactly; sampled rejection modes: same uniforms,
token mismatches only within rounding of a CDF boundary, counted) and against the
baselines.

Writes ``bench/results/<date>-<gpu name>.md``. Importing this module touches no GPU.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import re
import sys
import time
from pathlib import Path

import torch

from bench import cases_bookkeeping, cases_ngram, cases_rejection, data
from bench.baselines import bookkeeping_torch as eager_book
from bench.baselines.ngram_torch import ngram_propose_torch
from bench.baselines.rejection_torch import library_uniforms, rejection_sample_torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DEVICE = "cuda"  # tests/test_bench_smoke.py runs the check logic with "cpu"
QUANTILES = [0.25, 0.5, 0.75]


# ----------------------------------------------------------------------------- timing


def _call_with_quantiles(bench_fn, fn, **kw):
    """(q25, median, q75) in µs from a triton.testing bench function, across versions."""
    params = inspect.signature(bench_fn).parameters
    if "quantiles" in params:
        q = bench_fn(fn, quantiles=QUANTILES, **kw)
    elif "percentiles" in params:  # triton < 2.1
        q = bench_fn(fn, percentiles=QUANTILES, **kw)
    else:
        m = bench_fn(fn, **kw)
        q = (m, m, m)
    if not isinstance(q, list | tuple):
        q = (q, q, q)
    return tuple(float(x) * 1e3 for x in q)


def time_kernel(fn, *, warmup_ms: int = 25, rep_ms: int = 100):
    """``do_bench``: launches in a loop, L2 flushed between them; (q25, median, q75) µs."""
    from triton.testing import do_bench

    return _call_with_quantiles(do_bench, fn, warmup=warmup_ms, rep=rep_ms)


def time_graph(fn, *, rep_ms: int = 100):
    """CUDA-graph replay (``do_bench_cudagraph``); None if ``fn`` cannot be captured."""
    try:
        from triton.testing import do_bench_cudagraph
    except ImportError:
        return None
    try:
        with torch.cuda.stream(torch.cuda.Stream()):
            return _call_with_quantiles(do_bench_cudagraph, fn, rep=rep_ms)
    except Exception as exc:  # a host sync or an uncapturable op: not graph-safe
        print(f"    (no CUDA graph: {type(exc).__name__}: {str(exc)[:80]})", flush=True)
        torch.cuda.synchronize()
        return None


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device copy bandwidth in GB/s (read + write), ``dst.copy_(src)`` of 1 GiB."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").fill_(1.0)
    dst = torch.empty_like(src)
    _, med, _ = time_kernel(lambda: dst.copy_(src))
    return 2 * nbytes / (med * 1e-6) / 1e9


def time_host(fn, budget_s: float = 0.3):
    from bench.harness import measure

    t = measure(fn, budget_s=budget_s)
    return (t.q25, t.median, t.q75)


# ----------------------------------------------------------------------------- rows


class Rows:
    """Collects result rows: op, case, impl, how timed, (q25, median, q75) µs, bytes."""

    def __init__(self):
        self.rows = []
        self.notes = []

    def add(self, op, case, impl, how, q, nbytes, ref_med=None):
        self.rows.append((op, case, impl, how, q, nbytes, ref_med))
        print(f"  {op:24s} {case:34s} {impl:14s} {how:6s} {q[1]:10.1f} us", flush=True)

    def note(self, text):
        self.notes.append(text)
        print(f"  check: {text}", flush=True)


def _to(x, device):
    return x.to(device) if isinstance(x, torch.Tensor) else x


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a.cpu(), b.cpu())
    return all(_equal(x, y) for x, y in zip(a, b, strict=True))


# ----------------------------------------------------------------------------- ops


def bench_ngram(rows: Rows, specs, *, graphs: bool = True) -> None:
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
    gtok, gnt = tok.to(DEVICE), nt.to(DEVICE)
    want = ngram_propose(tok, nt, **kw)  # the CPU path
    got = ngram_propose(gtok, gnt, **kw)
    base = ngram_propose_torch(gtok, gnt, **kw)
    assert _equal(tuple(got), tuple(want)), f"ngram CUDA != CPU at {label}"
    assert _equal(base, tuple(want)[:2]), f"ngram torch-eager != CPU at {label}"
    if numba_fn is not None:
        nd, nc = numba_fn(tok.numpy(), nt.numpy(), **kw)
        assert _equal((torch.from_numpy(nd), torch.from_numpy(nc)), tuple(want)[:2])
    rows.note(
        f"ngram_propose {label}: CUDA op == CPU op == torch eager"
        + (" == numba" if numba_fn else "")
        + " exactly"
    )
    nbytes = cases_ngram.bytes_moved(B, L, k)
    op = lambda: ngram_propose(gtok, gnt, **kw)  # noqa: E731
    rows.add("ngram_propose", label, "op", "bench", time_kernel(op), nbytes)
    if graphs:
        q = time_graph(op)
        if q is not None:
            rows.add("ngram_propose", label, "op", "graph", q, nbytes)
    eager = lambda: ngram_propose_torch(gtok, gnt, **kw)  # noqa: E731
    rows.add("ngram_propose", label, "torch", "bench", time_kernel(eager), nbytes)
    if numba_fn is not None:
        tn, ln = tok.numpy(), nt.numpy()
        q = time_host(lambda: numba_fn(tn, ln, **kw))
        rows.add("ngram_propose", label, "numba (host)", "host", q, nbytes)


def bench_rejection(rows: Rows, specs) -> None:
    from specdec_kernels.ops import rejection_sample

    for spec in specs:
        _rejection_case(rows, spec, rejection_sample)


def _rejection_case(rows, spec, rejection_sample) -> None:
    K = cases_rejection.K
    B, V, mode, dt = spec["B"], spec["V"], spec["mode"], spec["dtype"]
    label = f"B={B} V={V} {mode} {dt}"
    inp = data.verify_logits(B, K, V, dtype=cases_rejection.DTYPES[dt], mode=mode)
    g = {n: _to(v, DEVICE) for n, v in inp.items()}
    args = ("target_logits", "draft_token_ids", "cu_num_draft_tokens")
    base_kw = {"num_speculative_tokens": K}
    for n in ("draft_probs", "temperature"):
        if n in g:
            base_kw[n] = g[n]
    op_kw = dict(base_kw)
    for n in ("seeds", "offsets"):
        if n in g:
            op_kw[n] = g[n]
    cpu_kw = {n: _to(v, "cpu") for n, v in op_kw.items()}
    want = rejection_sample(*(inp[a] for a in args), **cpu_kw)
    got = rejection_sample(*(g[a] for a in args), **op_kw)
    if mode == "greedy":
        base = rejection_sample_torch(*(g[a] for a in args), **base_kw)
        assert _equal(tuple(got[:2]), tuple(want[:2])), f"greedy CUDA != CPU at {label}"
        assert _equal(base, tuple(want[:2])), f"greedy torch != CPU at {label}"
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
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    a = tuple(g[x] for x in args)
    op = lambda: rejection_sample(*a, **op_kw)  # noqa: E731
    base_fn = lambda: rejection_sample_torch(*a, generator=gen, **base_kw)  # noqa: E731
    live = g["target_logits"][: B * (K + 1)]
    softmax = lambda: torch.softmax(live, dim=-1)  # noqa: E731
    rows.add("rejection_sample", label, "op", "bench", time_kernel(op), nbytes)
    rows.add("rejection_sample", label, "torch", "bench", time_kernel(base_fn), nbytes)
    rows.add("rejection_sample", label, "softmax", "bench", time_kernel(softmax), nbytes)


def _row_mismatch(out, ref) -> int:
    o, n = out[0].cpu(), out[1].cpu()
    ro, rn = ref[0].cpu(), ref[1].cpu()
    return int(((o != ro).any(dim=1) | (n != rn)).sum())


def bench_bookkeeping(rows: Rows, batches, *, graphs: bool = True) -> None:
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
    g = {n: _to(v, DEVICE) for n, v in st.items()}
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
    assert _equal(tuple(op()), want) and _equal(base(), want), f"verify inputs B={B}"
    T = B * (K + 1)
    nb = 4 * B * 4 + 4 * B * K + 4 * T + 24 * T + 8 * (B + 1) + 4 * B + 4 * B * K
    _bench_small(rows, "prepare_verify_inputs", f"B={B}", op, base, nb, graphs)

    # compute_slot_mapping on the verify layout
    positions, qsl = want[1].to(DEVICE), want[2].to(DEVICE)
    sa = (g["block_table"], positions, qsl, g["req_indices"])
    want_s = compute_slot_mapping(st["block_table"], want[1], want[2], st["req_indices"], **kw)
    op = lambda: compute_slot_mapping(*sa, **kw)  # noqa: E731
    base = lambda: eager_book.compute_slot_mapping_torch(*sa, **kw)  # noqa: E731
    assert _equal(op(), want_s) and _equal(base(), want_s), f"slot mapping B={B}"
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
    cpu_kw = {n: _to(v, "cpu") for n, v in ckw.items()}
    want_c = commit_accepted_tokens(
        cpu_tok, cpu_nt, st["output_token_ids"], st["num_emitted"], st["req_indices"], **cpu_kw
    )
    got_c = commit_accepted_tokens(tok_c, nt_c, *fixed, **ckw)
    assert _equal(tuple(got_c), tuple(want_c)) and _equal(nt_c, cpu_nt), f"commit B={B}"
    nt_c.copy_(nt0)
    got_b = eager_book.commit_accepted_tokens_torch(tok_c, nt_c, *fixed, **ckw)
    assert _equal(tuple(got_b), tuple(want_c)) and _equal(nt_c, cpu_nt), f"commit eager B={B}"

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
    rows.add(op_name, label, "op", "bench", time_kernel(op), nbytes)
    if graphs:
        q = time_graph(op)
        if q is not None:
            rows.add(op_name, label, "op", "graph", q, nbytes)
    rows.add(op_name, label, "torch", "bench", time_kernel(base), nbytes)
    if graphs and base_graph:
        q = time_graph(base)
        if q is not None:
            rows.add(op_name, label, "torch", "graph", q, nbytes)


# ----------------------------------------------------------------------------- ngram_index


def time_steps(fn, *, calls: int = 100, warmup: int = 10):
    """(q25, median, q75) µs of ``calls`` back-to-back calls of a state-mutating ``fn``,
    each bracketed by CUDA events (``do_bench`` would call it an unknown number of times)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(calls)
    ]
    for a, b in pairs:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    ms = sorted(a.elapsed_time(b) for a, b in pairs)
    q = lambda f: ms[min(len(ms) - 1, int(f * len(ms)))] * 1e3  # noqa: E731
    return (q(0.25), q(0.5), q(0.75))


def bench_ngram_index(rows: Rows, specs, *, graphs: bool = True) -> None:
    """One decoding step (commit k + 1 tokens, ``ngram_index_extend``, ``ngram_propose`` on
    the index) on the device at bench/cases_ngram_index.py's shapes, against the full rescan
    (``ngram_propose`` on the device, numba on the host); initial indexing timed once."""
    numba_fn = None
    if cases_ngram.numba_available():
        from bench.baselines.ngram_numba import ngram_propose_numba

        numba_fn = ngram_propose_numba
    for spec in specs:
        _ngram_index_case(rows, spec, numba_fn, graphs)
        if DEVICE == "cuda":
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
    gtok, gnt = tok.to(DEVICE), nt.to(DEVICE)
    nk = {"min_n": cases.MIN_N, "max_n": cases.MAX_N}
    index = new_ngram_index(B, L + room, device=DEVICE, **nk)
    _sync()
    t0 = time.perf_counter()
    ngram_index_build(gtok, gnt, index=index)
    _sync()
    build_s = time.perf_counter() - t0
    corpus = cpu_corpus = None
    if C:
        cpu_corpus, _ = cases._corpus(C)
        fields = ("tokens", "meta", "index", "state")
        corpus = cpu_corpus._replace(**{f: getattr(cpu_corpus, f).to(DEVICE) for f in fields})
    kw = {**nk, "num_speculative_tokens": k}
    # checks: the device index's own-history proposals == ngram_propose on the CPU; with a
    # corpus, the device proposals == the CPU path's over the same index and corpus
    got = ngram_propose(gtok, gnt, **kw, index=index)
    want = ngram_propose(tok, nt, **kw)
    assert _equal(tuple(got), tuple(want)), f"ngram_index CUDA != ngram_propose at {label}"
    note = f"ngram_index {label}: CUDA index proposals == ngram_propose (CPU) exactly"
    if corpus is not None:
        cpu_index = index._replace(table=index.table.cpu(), length=index.length.cpu())
        got_c = ngram_propose(gtok, gnt, **kw, index=index, corpus=corpus)
        want_c = ngram_propose(tok, nt, **kw, index=cpu_index, corpus=cpu_corpus)
        assert _equal(tuple(got_c), tuple(want_c)), f"ngram_index corpus CUDA != CPU at {label}"
        note += "; with the corpus CUDA == CPU path exactly"
    rows.note(f"{note}; initial indexing of {B} x {L} tokens {build_s * 1e3:.1f} ms")

    def step():
        gnt.add_(k + 1)  # the commit (a real engine's commit_accepted_tokens)
        ngram_index_extend(gtok, gnt, index=index)
        return ngram_propose(gtok, gnt, **kw, index=index, corpus=corpus)

    nbytes = cases.bytes_moved(B, k, corpus is not None)
    rows.add("ngram_index step", label, "op", "events", time_steps(step, calls=calls), nbytes)
    if graphs:
        q = _graph_steps(step, calls)
        if q is not None:
            rows.add("ngram_index step", label, "op", "graph", q, nbytes)
    scan = lambda: ngram_propose(gtok, gnt, **kw)  # noqa: E731
    rows.add("ngram_index step", label, "ngram_propose", "bench", time_kernel(scan), nbytes)
    if numba_fn is not None:
        tn, ln = tok.numpy(), gnt.cpu().numpy()
        q = time_host(lambda: numba_fn(tn, ln, **kw))
        rows.add("ngram_index step", label, "numba (host)", "host", q, nbytes)


def _graph_steps(step, calls):
    """The step captured in a CUDA graph and replayed; None if it cannot be captured."""
    try:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            step()  # warm-up on the capture stream
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            step()
        torch.cuda.synchronize()
        return time_steps(g.replay, calls=calls, warmup=0)
    except Exception as exc:  # a host sync makes the capture fail
        print(f"    (no CUDA graph: {type(exc).__name__}: {str(exc)[:80]})", flush=True)
        torch.cuda.synchronize()
        return None


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- report


def render(rows: Rows, *, gpu: str, copy_bw: float, elapsed: float, argv) -> str:
    import triton

    lines = [
        f"# GPU microbenchmarks: {datetime.date.today().isoformat()}, {gpu}",
        "",
        f"Command: `python -m bench.gpu {' '.join(argv)}` (run by `bench/gpu_check.sh`; "
        f"timings took {elapsed:.0f} s). torch {torch.__version__}, triton {triton.__version__}, "
        f"CUDA {torch.version.cuda}.",
        "",
        f"Device copy bandwidth: {copy_bw:.0f} GB/s (`dst.copy_(src)`, 1 GiB, read + write).",
        "",
        "`bench` = `triton.testing.do_bench` (launch in a loop, L2 flushed, median and IQR of",
        "the per-launch time); `graph` = `do_bench_cudagraph` (the call captured in a CUDA",
        "graph and replayed: no Python or launch overhead); `host` = wall time on the CPU",
        "(numba, all cores, no transfers). GB/s = bytes the op must move / median; `% copy`",
        "= that over the copy bandwidth. `speedup` = the baseline's median / the op's median",
        "with the same timing method (`numba (host)` against the op's `graph` time).",
        "",
        "| op | case | impl | timing | median µs | IQR µs | GB/s | % copy | speedup vs op |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    op_med = {}
    for op, case, impl, how, q, _, _ in rows.rows:
        if impl == "op":
            op_med[(op, case, how)] = q[1]
    for op, case, impl, how, q, nbytes, _ in rows.rows:
        gbps = nbytes / (q[1] * 1e-6) / 1e9
        speed = ""
        if impl != "op":
            ref = op_med.get((op, case, "graph" if how == "host" else how))
            if ref is None:
                ref = op_med.get((op, case, "bench"))
            if ref:
                speed = f"{q[1] / ref:.2f}×"
        lines.append(
            f"| {op} | {case} | {impl} | {how} | {q[1]:.1f} | {q[0]:.1f} – {q[2]:.1f} | "
            f"{gbps:.1f} | {100 * gbps / copy_bw:.1f} | {speed} |"
        )
    lines += ["", "Checks:", ""] + [f"- {n}" for n in rows.notes] + [""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu")
    p.add_argument("--quick", action="store_true", help="a few small shapes")
    p.add_argument("--only", default="ngram,rejection,bookkeeping,ngram_index")
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    if not torch.cuda.is_available():
        print("bench.gpu: no CUDA device; nothing timed, nothing written", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    gpu = torch.cuda.get_device_name()
    copy_bw = copy_bandwidth()
    print(f"{gpu}: copy bandwidth {copy_bw:.0f} GB/s", flush=True)
    rows = Rows()
    fams = args.only.split(",")
    graphs = not args.no_graphs
    name = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    args.out.mkdir(parents=True, exist_ok=True)
    date = datetime.date.today().isoformat()
    path = args.out / f"{date}-{name}{'-quick' if args.quick else ''}.md"

    def write(partial: str = "") -> None:
        text = render(rows, gpu=gpu, copy_bw=copy_bw, elapsed=time.perf_counter() - t0, argv=argv)
        path.write_text(text + (f"\n**Incomplete run**: {partial}\n" if partial else ""))

    try:
        if "ngram" in fams:
            specs = cases_ngram.QUICK_SPECS if args.quick else cases_ngram.SPECS
            bench_ngram(rows, specs, graphs=graphs)
            write("stopped after ngram_propose")
        if "rejection" in fams:
            specs = cases_rejection.QUICK_SPECS if args.quick else cases_rejection.SPECS
            bench_rejection(rows, specs)
            write("stopped after rejection_sample")
        if "bookkeeping" in fams:
            batches = (3,) if args.quick else cases_bookkeeping.BATCHES
            bench_bookkeeping(rows, batches, graphs=graphs)
            write("stopped after bookkeeping")
        if "ngram_index" in fams:
            from bench import cases_ngram_index

            specs = cases_ngram_index.QUICK_SPECS if args.quick else cases_ngram_index.SPECS
            bench_ngram_index(rows, specs, graphs=graphs)
    except KeyboardInterrupt:  # gpu_check.sh's time limit sends SIGINT: keep what we have
        write("interrupted by the time limit")
        print(f"interrupted; partial results in {path}", file=sys.stderr)
        return 124
    write()
    print(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
