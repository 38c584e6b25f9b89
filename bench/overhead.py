"""What one call costs on the host, per op: ``python -m bench.overhead``.

For each case of the conformance registry (tests/conformance.py: every op, small shapes):

- ``cpu``: the public function on CPU tensors as a user calls it (validation with value
  checks, the CPU function called directly in plain eager mode, the numba kernel);
- ``cuda host``: what a CUDA call costs the host, measured on the CPU: the public function
  with ``validate=False`` (CUDA tensors get no value checks), the dispatcher (a CUDA call
  always goes through it), and the
  Triton launcher's Python (allocations, grid, arguments) with every kernel launch
  stubbed (the launch itself, ~5-20 us on a GPU, is not in it);
- ``dispatch``: ``torch.ops.specdec.<op>`` alone, its implementation a stub.

With ``--device cuda`` (on a GPU machine; ``bench/gpu_check.sh`` runs it) the same cases
run on CUDA tensors with real launches instead: ``cuda``, the host's wall time per call of
the public function (no value checks, as for every CUDA call), the device synchronised once
per round, so a round is host-bound whenever the kernels are shorter than their launches.

Medians of interleaved rounds, one thread. Writes ``bench/results/<date>-overhead-<machine>.md``
(``<date>-overhead-<gpu>.md`` with ``--device cuda``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


class _NoLaunch:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _stub_launches() -> None:
    from specdec_kernels.ops._library import OPS

    for info in OPS.values():
        module = importlib.import_module(info.cuda.split(":")[0])
        for name, obj in list(vars(module).items()):
            if name.endswith("_kernel") and hasattr(obj, "arg_names"):
                setattr(module, name, _NoLaunch())


WARMUP = 20


def _argument_sets(case, args: dict, n: int) -> list[dict]:
    """``n`` argument sets for ``case``: the same inputs, but own copies of what the op
    writes, so a stateful op (commit, index, corpus, statistics) meets the state one call
    would meet, not one filled up by all the calls before it."""

    def copy(v):
        return [t.clone() for t in v] if isinstance(v, list) else v.clone()

    return [{k: copy(v) if k in case.mutated else v for k, v in args.items()} for _ in range(n)]


def _time(fn, sets: list[dict], sync=lambda: None) -> float:
    """Mean seconds per call of ``fn`` over ``sets`` (after ``WARMUP`` untimed calls);
    ``sync`` waits for the device before and after the timed calls."""
    for a in sets[:WARMUP]:
        fn(a)
    sync()
    t0 = time.perf_counter()
    for a in sets[WARMUP:]:
        fn(a)
    sync()
    return (time.perf_counter() - t0) / (len(sets) - WARMUP)


def _to(value, device: str):
    """A case argument on ``device`` (tensors and lists of tensors; other values as they are)."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list):
        return [_to(v, device) for v in value]
    return value


def main_cuda(args) -> int:
    """``--device cuda``: every conformance case's public call on CUDA tensors, real launches."""
    from tests.conformance import CASES

    torch.cuda.init()
    inputs = {c.name: {k: _to(v, "cuda") for k, v in c.make().items()} for c in CASES}
    rows = {c.name: [] for c in CASES}
    for _ in range(args.repeats):  # interleaved: every case once per repeat
        for c in CASES:
            sets = _argument_sets(c, inputs[c.name], WARMUP + args.rounds)
            rows[c.name].append(_time(c.public, sets, torch.cuda.synchronize))
    from bench.gpu import file_name
    from bench.harness import write_report

    gpu = torch.cuda.get_device_name()
    path = args.out / f"{datetime.date.today().isoformat()}-overhead-{file_name(gpu)}.md"
    lines = [
        f"# Host cost of one call per op on {gpu}",
        "",
        f"`python -m bench.overhead --device cuda --rounds {args.rounds} --repeats "
        f"{args.repeats}`, one thread, torch {torch.__version__}; medians of {args.repeats} "
        "interleaved repeats of the mean of a round (the device synchronised once per "
        "round). `cuda`: the public function on CUDA tensors as an engine calls it (no value "
        "checks), dispatcher, launcher and the real kernel launches: the host's cost per "
        "call while the kernels are shorter than it. Ops that write state in place get a "
        "fresh copy of it for every call.",
        "",
        "| op / case | cuda (us) | spread (us) |",
        "|---|---:|---:|",
    ]
    for case, r in rows.items():
        us = [x * 1e6 for x in r]
        lines.append(f"| {case} | {statistics.median(us):.1f} | {min(us):.1f} – {max(us):.1f} |")
    write_report(path, lines)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__)
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if args.device == "cuda":
        return main_cuda(args)
    from specdec_kernels.ops import _library
    from specdec_kernels.ops._library import OPS, lib
    from tests.conformance import CASES

    families = {
        importlib.import_module(f"specdec_kernels.ops.{info.cuda.split(':')[0].rsplit('.', 1)[1]}")
        for info in OPS.values()
    }
    real_checks = {m: m.should_check_values for m in families}

    def value_checks(on: bool) -> None:
        """Value checks on (CPU tensors' default) or off (what a CUDA caller gets)."""
        for m, fn in real_checks.items():
            m.should_check_values = fn if on else (lambda tensors, validate: False)

    rows = {c.name: {"cpu": [], "cuda host": [], "dispatch": []} for c in CASES}
    inputs = {c.name: c.make() for c in CASES}
    outputs = {}
    for c in CASES:  # the outputs a stub returns: the op's own, made once
        out = getattr(torch.ops.specdec, c.op)(**c.make())
        outputs[c.op] = out
    cpu_impls = {op: info.cpu for op, info in OPS.items()}
    launchers = {}
    _stub_launches()
    for op, info in OPS.items():
        module, name = info.cuda.split(":")
        launchers[op] = getattr(importlib.import_module(module), name)
    override = torch.library.Library("specdec", "IMPL")
    # re-registering the CPU kernel is the point here: torch's warning says nothing new
    warnings.filterwarnings("ignore", message="Warning only once for all operators")

    direct = _library.calls_cpu_directly

    def use(kind):
        # the public wrappers call the CPU function themselves in plain eager mode: the
        # stubbed kinds must reach the dispatcher, where the override sits
        _library.calls_cpu_directly = direct if kind == "cpu" else lambda kwargs: False
        for op in OPS:
            if kind == "cpu":
                fn = cpu_impls[op]
            elif kind == "cuda host":
                fn = launchers[op]
            else:
                fn = (lambda out: lambda *a, **k: out)(outputs[op])
            override.impl(op, fn, "CPU")

    for _ in range(args.repeats):  # interleaved: every kind once per repeat
        for kind in ("cpu", "cuda host", "dispatch"):
            use(kind)
            value_checks(kind == "cpu")
            for c in CASES:
                sets = _argument_sets(c, inputs[c.name], WARMUP + args.rounds)
                if kind == "dispatch":
                    fn = lambda a, c=c: getattr(torch.ops.specdec, c.op)(**a)  # noqa: E731
                else:
                    fn = c.public
                rows[c.name][kind].append(_time(fn, sets))
    use("cpu")
    value_checks(True)
    del lib  # (imported for the registrations only)

    from bench.__main__ import default_machine_name
    from bench.harness import write_report

    date = datetime.date.today().isoformat()
    path = args.out / f"{date}-overhead-{default_machine_name(1)}.md"
    lines = [
        "# Host cost of one call per op",
        "",
        f"`python -m bench.overhead --rounds {args.rounds} --repeats {args.repeats}`, one "
        f"thread, torch {torch.__version__}; medians of {args.repeats} interleaved repeats "
        "of the mean of a round. `cpu`: the public function on CPU tensors (value checks, "
        "the CPU function called directly, numba kernel). `cuda host`: the public function "
        "without value checks (as for CUDA tensors), the dispatcher and the Triton "
        "launcher's Python with the "
        "kernel launches stubbed. `dispatch`: `torch.ops.specdec.<op>` with a stub behind it. "
        "Ops that write state in place get a fresh copy of it for every call.",
        "",
        "| op / case | cpu (us) | cuda host (us) | dispatch (us) |",
        "|---|---:|---:|---:|",
    ]
    for name, r in rows.items():
        med = {k: statistics.median(v) * 1e6 for k, v in r.items()}
        lines.append(
            f"| {name} | {med['cpu']:.1f} | {med['cuda host']:.1f} | {med['dispatch']:.1f} |"
        )
    write_report(path, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
