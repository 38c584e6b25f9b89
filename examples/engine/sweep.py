"""Batch-size sweep of the draft policies: is speculation ever slower than none?

``python -m examples.engine.sweep`` runs the example engine on the default model, greedy,
``k = 4``, at batch sizes 1, 4, 16 and 32 with ``4 x B`` distinct requests each (the
default prompts and a derived family: the same tasks with every number in them shifted,
so no two requests are duplicates), under the three draft policies ``none`` (plain
decoding), ``fixed`` (verify every proposed draft) and ``adaptive``
(``plan_draft_lengths`` with the engine's calibrated cost table). The throughput is the
decode tokens per second over the steps where the batch is full; each point is the median
of ``--repeats`` runs, the policies interleaved within each repeat so that a busy moment
of a shared machine hits all of them alike, with the spread (min-max over the repeats).
It checks that every policy emits the same tokens, and writes a table and a plot to
``bench/results/<date>-engine-sweep-<machine>.{md,png}``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import statistics
import time
from pathlib import Path

import torch

from examples.engine.cli import DEFAULT_PROMPTS, load_prompts, tokenize
from examples.engine.report import machine_name, write_atomic

POLICIES = ("none", "fixed", "adaptive")
RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def derived_prompts(texts: list[str], count: int) -> list[str]:
    """``count`` distinct prompts: the base texts, then variants with every number shifted.

    Variant ``v`` of a text adds ``v`` to each decimal number in it ("port 8080 to 9090"
    becomes "port 8081 to 9091"): the same kind of edit, the same structure for prompt
    lookup, different tokens.
    """
    out = []
    for i in range(count):
        v, text = divmod(i, len(texts))[0], texts[i % len(texts)]
        out.append(re.sub(r"\d+", lambda m, v=v: str(int(m.group()) + v), text) if v else text)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m examples.engine.sweep", description=__doc__)
    p.add_argument("--batch-sizes", default="1,4,16,32", help="comma-separated batch sizes")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repeats per point")
    p.add_argument("--max-tokens", type=int, default=48, help="output tokens per request")
    p.add_argument("-k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--requests-per-slot", type=int, default=4, help="requests = this x batch")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--model-path", default=None)
    p.add_argument("--out", default=None, help="results file stem (default bench/results/...)")
    return p


def _spread(values: list[float]) -> float:
    """(max - min) / median of the repeats."""
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else 0.0


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from examples.engine.engine import Engine, SamplingParams
    from examples.engine.llama import Llama, LlamaConfig
    from examples.engine.model import load_model, stop_token_ids

    loaded = load_model(args.model_path)
    model = Llama(LlamaConfig.from_dict(loaded.config), loaded.state_dict)
    stops = stop_token_ids(loaded)
    base = [text for _, text in load_prompts(DEFAULT_PROMPTS)]
    batches = [int(b) for b in args.batch_sizes.split(",")]
    rows = []
    for B in batches:
        texts = derived_prompts(base, args.requests_per_slot * B)
        prompts = [tokenize(loaded.tokenizer, t) for t in texts]
        max_len = max(map(len, prompts)) + args.max_tokens + args.k + 1
        engines = {
            pol: Engine(
                model,
                max_batch_size=B,
                max_model_len=max_len,
                num_speculative_tokens=args.k,
                min_n=1,
                max_n=3,
                stop_token_ids=stops,
                draft_policy=pol,
            )
            for pol in POLICIES
        }
        engines["adaptive"].calibrate()
        params = [SamplingParams(max_tokens=args.max_tokens) for _ in prompts]
        runs: dict[str, list] = {pol: [] for pol in POLICIES}
        outputs: dict[str, list] = {}
        for r in range(args.repeats):
            order = POLICIES[r % 3 :] + POLICIES[: r % 3]  # rotate who runs first
            for pol in order:
                comps, stats = engines[pol].generate(prompts, params)
                runs[pol].append(stats)
                outputs.setdefault(pol, [c.token_ids for c in comps])
        same = all(outputs[p] == outputs["none"] for p in POLICIES)
        for pol in POLICIES:
            tps = [s.full_batch_tokens_per_s for s in runs[pol]]
            last = runs[pol][-1]
            rows.append(
                dict(
                    B=B,
                    policy=pol,
                    median=statistics.median(tps),
                    spread=_spread(tps),
                    tokens_per_step=last.tokens_per_step,
                    verified_per_step=last.verified_per_step,
                    query_per_step=last.query_tokens / max(last.request_steps, 1),
                    full_steps=last.full_steps,
                    identical=same,
                    calibration_s=engines[pol].calibration_seconds,
                )
            )
            print(
                f"B={B:3d} {pol:9s} {rows[-1]['median']:8.1f} tok/s "
                f"(spread {rows[-1]['spread']:.0%}), {last.tokens_per_step:.2f} tok/step, "
                f"{last.verified_per_step:.2f} drafts verified/step, identical={same}",
                flush=True,
            )
    stem = args.out or str(
        RESULTS / f"{dt.date.today()}-engine-sweep-{machine_name(torch.get_num_threads())}"
    )
    write_atomic(Path(stem + ".md"), format_report(rows, args))
    plot(rows, Path(stem + ".png"))
    print(f"wrote {stem}.md and {stem}.png")
    return 0


def format_report(rows: list[dict], args) -> str:
    lines = [
        "# Example engine: draft policies across batch sizes",
        "",
        f"{dt.datetime.now():%Y-%m-%d %H:%M}, {machine_name(torch.get_num_threads())}; "
        f"`python -m examples.engine.sweep --batch-sizes {args.batch_sizes} --repeats "
        f"{args.repeats} --max-tokens {args.max_tokens} -k {args.k}`. Greedy, SmolLM2-135M "
        f"fp32, {args.requests_per_slot} x B distinct requests per batch size. Throughput = "
        "decode tokens/s over the steps with the batch full, median of the interleaved "
        "repeats; spread = (max - min) / median.",
        "",
        "| B | policy | tokens/s | spread | tokens/step | drafts verified/step | "
        "pass tokens/request | vs best of none/fixed | same tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    by_b: dict[int, dict] = {}
    for r in rows:
        by_b.setdefault(r["B"], {})[r["policy"]] = r
    for B, pols in by_b.items():
        best = max(pols["none"]["median"], pols["fixed"]["median"])
        for pol in POLICIES:
            r = pols[pol]
            lines.append(
                f"| {B} | {pol} | {r['median']:.1f} | {r['spread']:.0%} | "
                f"{r['tokens_per_step']:.2f} | {r['verified_per_step']:.2f} | "
                f"{r['query_per_step']:.2f} | "
                f"{r['median'] / best:.2f}x | {'yes' if r['identical'] else 'NO'} |"
            )
    lines += ["", "Goal: adaptive >= best of (none, fixed) - max(3%, spread) at every B.", ""]
    for B, pols in by_b.items():
        best = max(pols["none"]["median"], pols["fixed"]["median"])
        a = pols["adaptive"]
        tol = max(0.03, a["spread"], pols["none"]["spread"], pols["fixed"]["spread"])
        ok = a["median"] >= best * (1 - tol)
        lines.append(
            f"- B={B}: adaptive {a['median'] / best:.2f}x the best fixed policy "
            f"(tolerance {tol:.0%}): {'met' if ok else 'NOT met'}; calibration "
            f"{a['calibration_s']:.1f} s."
        )
    wins = [B for B, pols in by_b.items() if pols["adaptive"]["median"] > max(
        pols["none"]["median"], pols["fixed"]["median"])]  # fmt: skip
    lines.append(
        "- adaptive strictly faster than both at B = "
        + (", ".join(map(str, wins)) if wins else "none of the batch sizes")
        + " (medians)."
    )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the bench extra is not installed: the table is enough
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for pol, marker in zip(POLICIES, ("s", "^", "o"), strict=True):
        pts = [(r["B"], r["median"], r["spread"]) for r in rows if r["policy"] == pol]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        err = [p[1] * p[2] / 2 for p in pts]
        ax.errorbar(xs, ys, yerr=err, marker=marker, capsize=3, label=pol)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("decode tokens/s, full batch (median)")
    ax.set_title("draft policies, k = 4, greedy")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    t0 = time.perf_counter()
    rc = run(argv)
    print(f"sweep took {time.perf_counter() - t0:.0f} s")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
