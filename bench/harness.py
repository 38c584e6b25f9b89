"""Timing, cases and reporting shared by the CPU suite, the pytest-benchmark files, the GPU suite.

A :class:`Case` is one op at one shape: a zero-argument callable per implementation (the
library op first, then the baselines), a ``check`` that runs them once and compares their
outputs (it raises ``AssertionError`` on any mismatch, so nothing is timed unless it is
right), and the number of bytes the op must move (for GB/s). Cases are built one at a time
from small spec dicts, so large inputs never pile up in memory.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

OP = "op"  # the implementation name of the library op in every case


@dataclasses.dataclass
class Case:
    op: str
    spec: dict
    impls: dict[str, Callable[[], Any]]
    check: Callable[[], str]
    bytes_moved: int
    setup: Callable[[], None] | None = None
    untimed: tuple[str, ...] = ()  # impls used in the check but too slow to time here

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.spec.items())


@dataclasses.dataclass
class Timing:
    samples_us: np.ndarray  # wall time per call
    cpu_us: np.ndarray | None = None  # process CPU time per call (all threads)

    @property
    def cpu_median(self) -> float:
        return float("nan") if self.cpu_us is None else float(np.median(self.cpu_us))

    @property
    def median(self) -> float:
        return float(np.median(self.samples_us))

    @property
    def q25(self) -> float:
        return float(np.percentile(self.samples_us, 25))

    @property
    def q75(self) -> float:
        return float(np.percentile(self.samples_us, 75))

    @property
    def min(self) -> float:
        return float(self.samples_us.min())

    @property
    def max(self) -> float:
        return float(self.samples_us.max())

    @property
    def rounds(self) -> int:
        return int(self.samples_us.size)


@dataclasses.dataclass
class Result:
    op: str
    spec: dict
    impl: str
    timing: Timing
    bytes_moved: int
    note: str = ""

    @property
    def gbps(self) -> float:
        return self.bytes_moved / (self.timing.median * 1e-6) / 1e9


def measure(
    fn: Callable[[], Any],
    *,
    setup: Callable[[], None] | None = None,
    budget_s: float = 0.5,
    min_rounds: int = 5,
    max_rounds: int = 2000,
    warmup: int = 2,
) -> Timing:
    """Time ``fn()`` call by call with ``perf_counter_ns``; ``setup()`` runs untimed before each.

    Runs ``warmup`` untimed calls, then at least ``min_rounds`` timed ones and more until
    ``budget_s`` of timed calls have passed (or ``max_rounds``).
    """
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    samples = []
    spent = 0
    budget_ns = budget_s * 1e9
    while len(samples) < max_rounds and (len(samples) < min_rounds or spent < budget_ns):
        if setup is not None:
            setup()
        t0 = time.perf_counter_ns()
        fn()
        dt = time.perf_counter_ns() - t0
        samples.append(dt)
        spent += dt
    return Timing(np.asarray(samples, dtype=np.float64) / 1e3)


def measure_interleaved(
    fns: dict[str, Callable[[], Any]],
    *,
    setup: Callable[[], None] | None = None,
    budget_s: float = 0.5,
    min_rounds: int = 5,
    max_rounds: int = 2000,
    warmup: int = 2,
) -> dict[str, Timing]:
    """Time several implementations call by call, round robin (A, B, C, A, B, C, ...).

    On a shared machine the load changes from second to second; interleaving exposes
    every implementation to the same interference, so their ratio stays meaningful even
    when the absolute times drift. Stops when every implementation has ``min_rounds`` and
    ``budget_s`` per implementation has been spent in all (or at ``max_rounds``).
    """
    for fn in fns.values():
        for _ in range(warmup):
            if setup is not None:
                setup()
            fn()
    samples: dict[str, list[int]] = {name: [] for name in fns}
    cpu: dict[str, list[int]] = {name: [] for name in fns}
    spent = 0
    budget_ns = budget_s * 1e9 * len(fns)
    rounds = 0
    while rounds < max_rounds and (rounds < min_rounds or spent < budget_ns):
        for name, fn in fns.items():
            if setup is not None:
                setup()
            c0 = time.process_time_ns()
            t0 = time.perf_counter_ns()
            fn()
            dt = time.perf_counter_ns() - t0
            cpu[name].append(time.process_time_ns() - c0)
            samples[name].append(dt)
            spent += dt
        rounds += 1
    return {
        n: Timing(np.asarray(v, dtype=np.float64) / 1e3, np.asarray(cpu[n], dtype=np.float64) / 1e3)
        for n, v in samples.items()
    }


def run_cases(
    cases: Iterable[Case], *, budget_s: float = 0.5, log: Callable[[str], None] | None = print
) -> list[Result]:
    """Check, then time every implementation of every case (interleaved)."""
    results = []
    for case in cases:
        note = case.check()
        fns = {n: fn for n, fn in case.impls.items() if n not in case.untimed}
        timings = measure_interleaved(fns, setup=case.setup, budget_s=budget_s)
        for name, timing in timings.items():
            results.append(Result(case.op, case.spec, name, timing, case.bytes_moved, note))
            if log is not None:
                log(
                    f"  {case.op:24s} {case.label:42s} {name:10s} "
                    f"median {timing.median:10.1f} us  IQR {timing.q25:.1f}-{timing.q75:.1f}  "
                    f"({timing.rounds} rounds)"
                )
    return results


def cpu_copy_bandwidth(nbytes: int = 256 << 20) -> float:
    """Measured host copy bandwidth in GB/s (read + write counted), ``dst.copy_(src)``."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), budget_s=0.5, min_rounds=5)
    return 2 * nbytes / (t.median * 1e-6) / 1e9


def machine_info() -> dict:
    info = {
        "machine": platform.node() or "unknown",
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "torch threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
    }
    try:
        import numba

        info["numba"] = f"{numba.__version__} ({numba.get_num_threads()} threads)"
    except ImportError:
        info["numba"] = "not installed"
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


@dataclasses.dataclass
class TimingSummary:
    """The statistics of a :class:`Timing`, as saved in a results ``.json`` file."""

    median: float
    q25: float
    q75: float
    min: float
    max: float
    cpu_median: float
    rounds: int


def write_report(path, lines: list[str], *, echo: bool = True) -> None:
    """Write a Markdown results file (making its folder); print it (``echo``) and its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    if echo:
        print("\n".join(lines))
    print(f"wrote {path}")


def save_results(results: list[Result], path) -> None:
    """Write the per-result statistics (µs) as JSON, so tables and plots can be redone."""
    import json

    rows = []
    for r in results:
        t = r.timing
        stats = {k: getattr(t, k) for k in ("median", "q25", "q75", "min", "max", "cpu_median")}
        rows.append(
            {
                "op": r.op,
                "spec": r.spec,
                "impl": r.impl,
                "bytes_moved": r.bytes_moved,
                "note": r.note,
                "rounds": t.rounds,
                **{k: round(v, 3) for k, v in stats.items()},
            }
        )
    with open(path, "w") as f:
        json.dump(rows, f, indent=0)


def load_results(path) -> list[Result]:
    import json

    with open(path) as f:
        rows = json.load(f)
    out = []
    for d in rows:
        t = TimingSummary(
            d["median"], d["q25"], d["q75"], d["min"], d["max"], d["cpu_median"], d["rounds"]
        )
        out.append(Result(d["op"], d["spec"], d["impl"], t, d["bytes_moved"], d.get("note", "")))
    return out


def cpu_pressure() -> str:
    """Linux PSI: share of time runnable tasks waited for a CPU (avg10/avg60), or n/a."""
    try:
        with open("/proc/pressure/cpu") as f:
            fields = dict(kv.split("=") for kv in f.readline().split()[1:])
        return f"{fields['avg10']}% (10 s), {fields['avg60']}% (60 s)"
    except (OSError, KeyError, ValueError):
        return "n/a"


# ----------------------------------------------------------------------------- reporting


def _fmt_us(x: float) -> str:
    if math.isnan(x):
        return "—"
    if x >= 1e5:
        return f"{x / 1e3:,.0f} ms"
    if x >= 1e3:
        return f"{x / 1e3:,.2f} ms"
    return f"{x:,.1f} µs"


def _fmt_speed(x: float) -> str:
    if math.isnan(x):
        return "—"
    return f"{x:.2f}×" if x < 10 else f"{x:.1f}×"


def results_table(results: list[Result], *, baselines: list[str]) -> str:
    """A markdown table: one row per (case, implementation).

    ``op / <baseline>`` columns give the baseline's median over the op's median (above 1:
    the library op is faster), filled on the op's row.
    """
    by_case: dict[tuple, dict[str, Result]] = {}
    for r in results:
        by_case.setdefault((r.op, tuple(r.spec.items())), {})[r.impl] = r
    head = ["case", "impl", "median", "IQR", "min – max", "CPU time", "rounds", "GB/s"]
    head += [f"speedup vs {b}" for b in baselines]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    several_ops = len({op for op, _ in by_case}) > 1
    for (op, spec), impls in by_case.items():
        label = " ".join(f"{k}={v}" for k, v in spec)
        if several_ops:
            label = f"{op} {label}"
        op_res = impls.get(OP)
        for name, r in impls.items():
            t = r.timing
            row = [
                label,
                name,
                _fmt_us(t.median),
                f"{_fmt_us(t.q25)} – {_fmt_us(t.q75)}",
                f"{_fmt_us(t.min)} – {_fmt_us(t.max)}",
                _fmt_us(t.cpu_median),
                str(t.rounds),
                f"{r.gbps:.2f}",
            ]
            for b in baselines:
                if name == OP and b in impls and op_res is not None:
                    bt, ot = impls[b].timing, op_res.timing
                    row.append(
                        f"{_fmt_speed(bt.median / ot.median)} "
                        f"(CPU {_fmt_speed(bt.cpu_median / ot.cpu_median)})"
                    )
                else:
                    row.append("")
            lines.append("| " + " | ".join(row) + " |")
            label = ""
    return "\n".join(lines)


def speedup(results: list[Result], op: str, baseline: str, *, cpu: bool = False, **spec) -> float:
    """Baseline median / op median (wall, or CPU time) at the cases matching ``spec``."""
    med = {}
    for r in results:
        if r.op == op and all(r.spec.get(k) == v for k, v in spec.items()):
            t = r.timing
            med.setdefault(r.impl, []).append(t.cpu_median if cpu else t.median)
    if OP not in med or baseline not in med:
        return float("nan")
    return statistics.median(med[baseline]) / statistics.median(med[OP])
