"""Ratios of the drafting replay's tables: ``python -m bench.suffix_summary FILE.md ...``.

Reads the tables ``python -m bench.suffix_replay --out`` appends (several files and runs
merge by stream and ``k``) and prints, per (stream, k), SuffixDecoding's best chain per
store setting (own history / + earlier native / + earlier finished, its factor) and every
other drafter's tokens per step over it; last, each drafter's worst ratio over the cells
where all of SuffixDecoding's factors were run.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict

ROW = re.compile(r"\| (.+?) \| (\d+) \| ([\d.]+) \| ([\d.]+|n/a) \| ([\d.]+) \|")


def read(paths) -> dict:
    """``{(stream, k): {drafter: (own, native or None, finished)}}``."""
    rows: dict = defaultdict(dict)
    for path in paths:
        stream = None
        for line in open(path):
            if line.startswith("### "):
                stream = line[4:].split(" (")[0].split(",")[0]
            m = ROW.match(line)
            if m and stream:
                values = tuple(None if v == "n/a" else float(v) for v in m.group(3, 4, 5))
                rows[(stream, int(m.group(2)))][m.group(1)] = values
    return rows


def summarize(rows: dict, factors: int = 4) -> tuple[list[str], dict[str, float]]:
    """The report's lines and each drafter's worst ratio (cells with ``factors`` peers)."""
    lines, worst = [], {}
    for (stream, k), cell in sorted(rows.items()):
        peer = {d: v for d, v in cell.items() if d.startswith("suffix")}
        if not peer:
            continue
        best = [max(peer, key=lambda d: peer[d][i]) for i in range(3)]
        lines.append(
            f"{stream} k={k}: SuffixDecoding best "
            + " / ".join(f"{peer[d][i]:.4f} ({d.split()[-1]})" for i, d in enumerate(best))
        )
        for d, v in cell.items():
            if d in peer:
                continue
            ratios = [None if v[i] is None else v[i] / peer[best[i]][i] for i in range(3)]
            lines.append(
                f"  {d:20s} " + " / ".join("n/a" if r is None else f"{r:.3f}" for r in ratios)
            )
            if len(peer) == factors:
                worst[d] = min([worst.get(d, float("inf"))] + [r for r in ratios if r is not None])
    return lines, worst


def main(argv=None) -> int:
    lines, worst = summarize(read(sys.argv[1:] if argv is None else argv))
    print("\n".join(lines))
    print("worst ratio per drafter:", ", ".join(f"{d} {r:.3f}" for d, r in worst.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
