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

from bench import cases_bookkeeping, cases_ngram, cases_rejection

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


def file_name(gpu: str) -> str:
    """The GPU's name as results files spell it (``NVIDIA H200`` -> ``nvidia-h200``)."""
    return re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")


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
    if a is None or b is None:  # an output the call did not ask for
        return a is b
    if isinstance(a, torch.Tensor):
        return torch.equal(a.cpu(), b.cpu())
    return all(_equal(x, y) for x, y in zip(a, b, strict=True))


# ----------------------------------------------------------------------------- steps


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
    p.add_argument(
        "--only",
        default="ngram,rejection,bookkeeping,ngram_index,processing,logprobs,frequency",
    )
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
    name = file_name(gpu)
    args.out.mkdir(parents=True, exist_ok=True)
    date = datetime.date.today().isoformat()
    path = args.out / f"{date}-{name}{'-quick' if args.quick else ''}.md"

    def write(partial: str = "") -> None:
        text = render(rows, gpu=gpu, copy_bw=copy_bw, elapsed=time.perf_counter() - t0, argv=argv)
        path.write_text(text + (f"\n**Incomplete run**: {partial}\n" if partial else ""))

    try:
        from bench import gpu_cases as C

        if "ngram" in fams:
            specs = cases_ngram.QUICK_SPECS if args.quick else cases_ngram.SPECS
            C.bench_ngram(rows, specs, graphs=graphs)
            write("stopped after ngram_propose")
        if "rejection" in fams:
            specs = cases_rejection.QUICK_SPECS if args.quick else cases_rejection.SPECS
            C.bench_rejection(rows, specs)
            write("stopped after rejection_sample")
        if "bookkeeping" in fams:
            batches = (3,) if args.quick else cases_bookkeeping.BATCHES
            C.bench_bookkeeping(rows, batches, graphs=graphs)
            write("stopped after bookkeeping")
        if "ngram_index" in fams:
            from bench import cases_ngram_index

            specs = cases_ngram_index.QUICK_SPECS if args.quick else cases_ngram_index.SPECS
            # on the device a one-call step is the same two launches: timed once
            C.bench_ngram_index(rows, [s for s in specs if not s.get("one_call")], graphs=graphs)
            write("stopped after the index step")
        if "processing" in fams:
            from bench import cases_processing

            specs = cases_processing.QUICK_SPECS if args.quick else cases_processing.SPECS
            C.bench_processing(rows, [s for s in specs if s["step"] == "process"])
            write("stopped after process_logits")
        if "logprobs" in fams:
            from bench import cases_logprobs

            specs = cases_logprobs.QUICK_SPECS if args.quick else cases_logprobs.SPECS
            C.bench_logprobs(rows, specs)
            write("stopped after top_logprobs")
        if "frequency" in fams:
            from bench import gpu_frequency as F

            F.bench_frequency(rows, F.QUICK_SPECS if args.quick else F.SPECS, graphs=graphs)
    except KeyboardInterrupt:  # gpu_check.sh's time limit sends SIGINT: keep what we have
        write("interrupted by the time limit")
        print(f"interrupted; partial results in {path}", file=sys.stderr)
        return 124
    write()
    print(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
