"""The first-call cost of the CPU path: ``python -m bench.first_call``.

numba compiles each CPU kernel at its first call in a process and caches the machine code
on disk (``specdec_kernels/cpu/_jit.py``). This runs every case of the conformance registry
(tests/conformance.py) in a fresh process twice, with one empty cache directory
(``NUMBA_CACHE_DIR``): the first process compiles (``cold``), the second loads the cache
(``warm``); ``then`` is the same call once more in the same process (compiled). Writes
``bench/results/<date>-first-call-<machine>.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
torch.set_num_threads(1)
import specdec_kernels.ops
sys.path.insert(0, sys.argv[1])
from tests.conformance import CASES
out = {"import": time.perf_counter() - t0}
for case in CASES:
    t0 = time.perf_counter()  # make() too: building an index or corpus calls ops
    args = case.make()
    case.public(args)
    first = time.perf_counter() - t0
    args = case.make()
    t0 = time.perf_counter()
    case.public(args)
    out[case.name] = (first, time.perf_counter() - t0)
print("RESULT " + json.dumps(out))
"""


def _run(cache: str) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(ROOT)], env=env, capture_output=True, text=True,
        check=True, timeout=1200,
    )  # fmt: skip
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.first_call", description=__doc__)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as cache:
        cold, warm = _run(cache), _run(cache)
    from bench.__main__ import default_machine_name
    from bench.harness import write_report

    lines = [
        "# First call of each op on the CPU: numba's compile, and its on-disk cache",
        "",
        "`python -m bench.first_call`: every conformance case (tests/conformance.py) in a "
        "fresh process, one thread, an empty `NUMBA_CACHE_DIR` (`cold`: compiles), then "
        "a second fresh process over that cache (`warm`: loads it). `first`: making the "
        "case's inputs (an index or a corpus is built by ops) and the first call, so every "
        "compile is counted once, in the first case that needs it; `then`: the call again "
        "in the warm process.",
        "",
        "| case | cold first (ms) | warm first (ms) | then (us) |",
        "|---|---:|---:|---:|",
    ]
    for name in cold:
        if name == "import":
            continue
        lines.append(
            f"| {name} | {cold[name][0] * 1e3:.0f} | {warm[name][0] * 1e3:.1f} | "
            f"{warm[name][1] * 1e6:.0f} |"
        )
    total_cold = sum(v[0] for k, v in cold.items() if k != "import")
    total_warm = sum(v[0] for k, v in warm.items() if k != "import")
    lines += [
        "",
        f"Every op's first call: {total_cold:.1f} s with an empty cache, {total_warm:.2f} s "
        f"from the cache; `import torch, specdec_kernels.ops` {cold['import']:.2f} s / "
        f"{warm['import']:.2f} s.",
    ]
    date = datetime.date.today().isoformat()
    path = args.out / f"{date}-first-call-{default_machine_name(1)}.md"
    write_report(path, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
