"""Plot of the ``ngram_index`` step bench: ``python -m bench.plot_ngram_index OUT.png RUN.json``.

Left: per-step time vs history length (log-log) for the op (with and without the corpus)
and the rescanning baselines, one line style per run; right: the op's speedup over numba.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.harness import load_results

OP_NAME = "ngram_index step"


def plot(out: Path, runs: list[Path]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = ["-", "--", ":"]
    for style, run in zip(styles, runs, strict=False):
        res = [  # the B = 256 two-call steps (the small-batch and one-call cases are not drawn)
            r
            for r in load_results(run)
            if r.op == OP_NAME and r.spec["B"] == 256 and not r.spec.get("one_call")
        ]
        tag = run.stem.split("-", 3)[-1]
        med = {(r.impl, r.spec["corpus"], r.spec["L"]): r.timing.median / 1e3 for r in res}
        Ls = sorted({r.spec["L"] for r in res})
        for impl, corpus, color in (
            ("op", 0, "C0"),
            ("op", 1 << 20, "C1"),
            ("numba", 0, "C2"),
            ("full_scan", 0, "C3"),
        ):
            ys = [med.get((impl, corpus, L)) for L in Ls]
            if all(y is not None for y in ys):
                name = impl if impl != "op" else f"index step, corpus {corpus >> 20}M"
                ax.plot(Ls, ys, style, color=color, marker="o", ms=3, label=f"{name} ({tag})")
        for corpus, color in ((0, "C0"), (1 << 20, "C1")):
            ys = [med.get(("numba", corpus, L), 0) / med.get(("op", corpus, L), 1) for L in Ls]
            bx.plot(
                Ls,
                ys,
                style,
                color=color,
                marker="o",
                ms=3,
                label=f"corpus {corpus >> 20}M ({tag})",
            )
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xlabel("history length L (tokens), B = 256, k = 4")
        a.grid(alpha=0.3)
        a.legend(fontsize=6)
    ax.set_yscale("log")
    ax.set_ylabel("ms per step (median)")
    ax.set_title("extend by k+1 tokens + propose vs rescanning")
    bx.set_ylabel("numba time / index step time")
    bx.axhline(5, color="grey", lw=0.8)
    bx.set_title("speedup over the numba KMP rescan (line: 5x)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    plot(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])
