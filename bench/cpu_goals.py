"""Issue 18's CPU goals, cell by cell, over one or more runs of ``python -m bench``.

``python -m bench.cpu_goals RUN.json [RUN.json ...]`` reads the results JSON that
``python -m bench --threads 1`` writes and prints, per case, the ratio of the goal's
baseline to the op (> 1: the op is faster) in each run, their median, and whether the median
meets the goal ('>= 1.0x' passes at >= 0.97x, and so with the same slack for the others):

- every op's CPU call at B = 1 within 2x of its baseline (ratio >= 0.5);
- >= 1.0x at every larger B;
- ``rejection_sample`` at B = 8, V = 32000 within 1.5x of one ``torch.softmax`` (>= 2/3);
- the index step at B = 1 in at most 0.1 ms.

Baselines: numba KMP for ``ngram_propose`` and the index step, eager torch for the
bookkeeping ops, the plain reference for the draft planner (its only baseline), one
``torch.softmax`` over the same rows for sampled ``rejection_sample`` (greedy rows have no
softmax to compare with and are left out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict

BASELINE = {
    "ngram_propose": "numba",
    "ngram_index step": "numba",
    "rejection_sample": "softmax",
    "compute_slot_mapping": "torch",
    "prepare_verify_inputs": "torch",
    "commit_accepted_tokens": "torch",
    "plan_draft_lengths": "reference",
    "update_acceptance_stats": "reference",
}
SLACK = 0.97


def goal(op: str, spec: dict) -> tuple[float, str]:
    """The ratio a case must reach, and the goal's words."""
    if op == "rejection_sample" and spec["B"] == 8 and spec["V"] == 32000:
        return 2 / 3, "within 1.5x of softmax"
    if spec["B"] == 1:
        return 0.5, "B = 1: within 2x"
    return 1.0, ">= 1.0x"


def cells(runs: list[list[dict]]) -> list[dict]:
    """One row per case: its ratio in each run, the median, the goal and the verdict."""
    table: dict[tuple, list[dict]] = defaultdict(lambda: [{} for _ in runs])
    for i, results in enumerate(runs):
        for r in results:
            key = (r["op"], json.dumps(r["spec"], sort_keys=True))
            table[key][i][r["impl"]] = r["median"]
    rows = []
    for (op, spec_s), per_run in table.items():
        spec, base = json.loads(spec_s), BASELINE.get(op)
        if base is None or (op == "rejection_sample" and spec["mode"] == "greedy"):
            continue
        ratios = [m[base] / m["op"] for m in per_run if base in m and "op" in m]
        if not ratios:
            continue
        need, words = goal(op, spec)
        med = statistics.median(ratios)
        step_us = None
        if op == "ngram_index step" and spec["B"] == 1:
            step_us = statistics.median(m["op"] for m in per_run if "op" in m)
        ok = med >= SLACK * need and (step_us is None or step_us <= 100.0)
        rows.append(dict(op=op, spec=spec, ratios=ratios, median=med, goal=words, ok=ok,
                         step_us=step_us))  # fmt: skip
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cpu_goals", description=__doc__)
    p.add_argument("runs", nargs="+", help="results JSON files of python -m bench")
    p.add_argument("--misses", action="store_true", help="print the missed cells only")
    args = p.parse_args(argv)
    runs = [json.load(open(path)) for path in args.runs]
    rows = cells(runs)
    print(f"| op | case | {' | '.join(f'run {i + 1}' for i in range(len(runs)))} | median "
          "| goal | |")  # fmt: skip
    print("|---|---|" + "---:|" * len(runs) + "---:|---|---|")
    for r in rows:
        if args.misses and r["ok"]:
            continue
        case = " ".join(f"{k}={v}" for k, v in r["spec"].items())
        extra = f" (step {r['step_us']:.1f} us)" if r["step_us"] is not None else ""
        ratios = " | ".join(f"{x:.3f}" for x in r["ratios"])
        print(f"| {r['op']} | {case} | {ratios} | {r['median']:.3f} | {r['goal']}{extra} | "
              f"{'pass' if r['ok'] else '**miss**'} |")  # fmt: skip
    n_ok = sum(r["ok"] for r in rows)
    print(f"\n{n_ok} of {len(rows)} cells meet their goal; {len(rows) - n_ok} miss.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
