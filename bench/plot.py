"""Latency plots of a benchmark run (needs matplotlib, the ``bench`` extra)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.harness import Result  # noqa: E402

# Line style and marker per implementation, so the legend tells the op from its baselines
# even where one colour stands for one group (B, V/dtype).
_STYLE = {"op": "-", "numba": "--", "torch": "--", "reference": ":"}
_MARKER = {"op": "o", "numba": "s", "torch": "^", "reference": "x"}
_COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _series(results, op, x, group, where=None):
    """{(group values..., impl): [(x, median, q25, q75)]} for one op."""
    out: dict[tuple, list] = {}
    for r in results:
        if r.op != op or (where and any(r.spec.get(k) != v for k, v in where.items())):
            continue
        key = tuple(r.spec[g] for g in group) + (r.impl,)
        t = r.timing
        out.setdefault(key, []).append((r.spec[x], t.median, t.q25, t.q75))
    return {k: sorted(v) for k, v in out.items()}


def _draw(ax, series, group_names, xlabel, title):
    groups = sorted({k[:-1] for k in series}, key=str)
    impls = sorted({k[-1] for k in series})
    for key, pts in sorted(series.items(), key=lambda kv: str(kv[0])):
        # one colour per group (B, V/dtype); a single group: one colour per implementation
        which = groups.index(key[:-1]) if len(groups) > 1 else impls.index(key[-1])
        color = _COLORS[which % len(_COLORS)]
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        label = " ".join(f"{g}={v}" for g, v in zip(group_names, key[:-1], strict=True))
        ax.plot(
            xs,
            ys,
            _STYLE.get(key[-1], "-."),
            color=color,
            marker=_MARKER.get(key[-1], "d"),
            ms=4,
            lw=1.8 if key[-1] == "op" else 1.0,
            label=f"{key[-1]} {label}".strip(),
        )
        ax.fill_between(xs, [p[2] for p in pts], [p[3] for p in pts], color=color, alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("median latency (µs), band = IQR")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    if series:
        ax.legend(fontsize=6, ncol=2)


def plot_results(results: list[Result], path: Path, *, title: str = "") -> None:
    """One panel per op (and k / mode): latency vs history length or batch size."""
    panels = []
    ops = {r.op for r in results}
    if "ngram_propose" in ops:
        for k in sorted({r.spec["k"] for r in results if r.op == "ngram_propose"}):
            panels.append(
                (
                    _series(results, "ngram_propose", "L", ["B"], {"k": k}),
                    ["B"],
                    "history length L (tokens)",
                    f"ngram_propose, k={k}, n in [2, 5]",
                )
            )
    if "rejection_sample" in ops:
        for mode in ("greedy", "onehot", "probs"):
            s = _series(results, "rejection_sample", "B", ["V", "dtype"], {"mode": mode})
            if s:
                panels.append((s, ["V", "dtype"], "batch size B", f"rejection_sample, {mode}, k=4"))
    if "process_logits" in ops:
        for step in ("process", "verify"):
            where = {"step": step, "features": "all", "L": 1024}
            s = _series(results, "process_logits", "B", ["V"], where)
            if s:
                panels.append((s, ["V"], "batch size B", f"process_logits, step={step}, k=4"))
    if "top_logprobs" in ops:
        s = _series(results, "top_logprobs", "B", ["V", "N"])
        panels.append((s, ["V", "N"], "batch size B", "top_logprobs, k=4, raw_logprobs"))
    book = [
        o
        for o in ("compute_slot_mapping", "prepare_verify_inputs", "commit_accepted_tokens")
        if o in ops
    ]
    for op in book:
        panels.append((_series(results, op, "B", []), [], "batch size B", f"{op}, k=4"))
    if not panels:
        return
    ncols = 3
    nrows = (len(panels) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.0 * nrows), squeeze=False)
    for ax, (series, groups, xlabel, ptitle) in zip(axes.flat, panels, strict=False):
        _draw(ax, series, groups, xlabel, ptitle)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":  # python -m bench.plot results.json: redraw a run's plot
    import sys

    from bench.harness import load_results

    src = Path(sys.argv[1])
    plot_results(load_results(src), src.with_suffix(".png"), title=src.stem)
    print(f"wrote {src.with_suffix('.png')}")
