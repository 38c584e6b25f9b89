"""CPU benchmark suite: ``python -m bench`` (from the repository root).

Checks every op against its baselines, times them, and writes
``bench/results/<date>-<machine>.md`` (tables) and ``.png`` (latency plots). Options:
``--quick`` (tiny shapes, for a smoke run), ``--only ngram,rejection,bookkeeping,
ngram_index,draft_plan``,
``--threads N`` (torch and numba threads; default: all cores), ``--budget S`` (seconds of
timed calls per implementation and case), ``--out DIR``, ``--machine NAME``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import re
import sys
import time
from pathlib import Path

FAMILIES = {
    "ngram": "bench.cases_ngram",
    "rejection": "bench.cases_rejection",
    "bookkeeping": "bench.cases_bookkeeping",
    "ngram_index": "bench.cases_ngram_index",
    "frequency": "bench.cases_frequency",
    "draft_plan": "bench.cases_draft_plan",
    "processing": "bench.cases_processing",
    "logprobs": "bench.cases_logprobs",
}
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny shapes (smoke run)")
    p.add_argument("--only", default=",".join(FAMILIES), help="comma-separated op families")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch/numba threads")
    p.add_argument("--budget", type=float, default=0.4, help="timed seconds per impl and case")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="output folder")
    p.add_argument("--machine", default=None, help="machine name in the file name")
    p.add_argument("--no-plot", action="store_true")
    return p.parse_args(argv)


def default_machine_name(threads: int) -> str:
    from bench.harness import _cpu_model

    model = _cpu_model().lower()
    model = re.sub(r"\(r\)|\(tm\)|cpu|processor|@.*", " ", model)
    model = re.sub(r"[^a-z0-9]+", "-", model).strip("-") or "cpu"
    return f"{model}-{threads}t"


def run(argv=None) -> Path:
    args = _parse(argv)
    families = [f.strip() for f in args.only.split(",") if f.strip()]
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise SystemExit(f"unknown families {sorted(unknown)}; choose from {list(FAMILIES)}")

    if args.threads > 1 and "torch" not in sys.modules:
        # torch's OpenMP pool and numba's pool share the cores; spinning idle workers of
        # one starve the other (a 2-thread torch op took 85 ms instead of 2 ms next to
        # numba's pool on the 2-core box). Passive waiting keeps both honest.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    torch.set_num_threads(args.threads)
    try:
        import numba

        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    except ImportError:
        pass

    from bench import data, harness

    t_start = time.perf_counter()
    load_before = harness.load_average()
    psi_before = harness.cpu_pressure()
    info = harness.machine_info()
    copy_bw = harness.cpu_copy_bandwidth()
    print(f"host copy bandwidth {copy_bw:.1f} GB/s; load average {load_before}", flush=True)

    sections = []
    all_results = []
    for fam in families:
        mod = importlib.import_module(FAMILIES[fam])
        print(f"[{fam}]", flush=True)
        notes = []
        results = []
        for case in mod.cases(quick=args.quick):
            note = case.check()
            notes.append((case.op, case.label, note))
            print(f"  check {case.op} {case.label}: {note}", flush=True)
            if hasattr(mod, "run_case"):  # a family that times its own cases (state grows)
                res = mod.run_case(case, budget_s=args.budget)
            else:
                res = harness.run_cases([_Prechecked(case)], budget_s=args.budget)
            results += res
        all_results += results
        sections.append((fam, mod, results, notes))

    elapsed = time.perf_counter() - t_start
    load_after = harness.load_average()
    date = datetime.date.today().isoformat()
    machine = args.machine or default_machine_name(args.threads)
    if args.quick:
        machine += "-quick"
    args.out.mkdir(parents=True, exist_ok=True)
    md_path = args.out / f"{date}-{machine}.md"
    png_path = md_path.with_suffix(".png")
    plotted = False
    if not args.no_plot:
        try:
            from bench.plot import plot_results

            plot_results(all_results, png_path, title=f"specdec-kernels CPU, {machine}, {date}")
            plotted = True
        except ImportError as exc:  # matplotlib is in the `bench` extra
            print(f"no plot: {exc}", file=sys.stderr)

    lines = [
        f"# CPU microbenchmarks: {date}, {machine}",
        "",
        f"Command: `python -m bench {' '.join(argv if argv is not None else sys.argv[1:])}`"
        f" (whole run {elapsed:.0f} s).",
        "",
        "| machine | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in info.items()],
        f"| threads used | {args.threads} (torch and numba; OMP_WAIT_POLICY="
        f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}) |",
        f"| host copy bandwidth | {copy_bw:.1f} GB/s (`dst.copy_(src)`, 256 MiB, read + write) |",
        f"| load average (1, 5, 15 min) | before {load_before}; after {load_after} |",
        f"| CPU pressure (`/proc/pressure/cpu`, some) | before {psi_before}; after "
        f"{harness.cpu_pressure()} |",
        "",
        "Method: every case is checked first (outputs compared with every baseline; the check",
        "is in the notes), then its implementations are timed call by call, round robin",
        "(`perf_counter_ns`; op, baseline, op, baseline, ...; so load changes hit all of them",
        f"alike), 2 warm-up calls each, at least 5 timed calls each and {args.budget} s per",
        "implementation in all. Median, IQR",
        "(25th-75th percentile) and min-max of the per-call times; `speedup vs X` = X's",
        "median / the op's median (> 1: the library op is faster). GB/s = the bytes the op",
        "must move (each input read once, each output written once; see each section) /",
        "median. `op` is the public `specdec_kernels.ops` function on CPU tensors (the",
        "numba CPU path, with its default value checks).",
        "",
        f"Token histories: {data.stream_description()}.",
        "",
    ]
    lines += _key_numbers(all_results)
    if plotted:
        lines += [f"![latency plots]({png_path.name})", ""]
    for fam, mod, results, notes in sections:
        lines += _section(fam, mod, results, notes)
    md_path.write_text("\n".join(lines) + "\n")
    harness.save_results(all_results, md_path.with_suffix(".json"))
    print(f"wrote {md_path}, its .json" + (f" and {png_path}" if plotted else ""))
    print(f"whole run {elapsed:.0f} s")
    return md_path


def _key_numbers(results) -> list[str]:
    """The numbers the README quotes, computed from this run."""
    from bench.harness import speedup

    lines = ["## Key numbers", ""]
    for k in (4, 8):
        wall = speedup(results, "ngram_propose", "numba", B=64, L=8192, k=k)
        cpu = speedup(results, "ngram_propose", "numba", cpu=True, B=64, L=8192, k=k)
        if wall == wall:  # not NaN
            lines.append(
                f"- `ngram_propose` CPU path vs numba KMP at B = 64, 8k-token histories, "
                f"k = {k}: **{wall:.2f}×** (median wall time; {cpu:.2f}× by CPU time)."
            )
    for mode in ("greedy", "onehot", "probs"):
        vals = [
            speedup(results, "rejection_sample", "torch", B=b, V=v, mode=mode, dtype=d)
            for b in (8, 64)
            for v in (32000, 151936)
            for d in ("fp32", "bf16")
        ]
        vals = [v for v in vals if v == v]
        if vals:
            lines.append(
                f"- `rejection_sample` {mode} vs plain torch: {min(vals):.2f}× – "
                f"{max(vals):.2f}× over B, V and dtype."
            )
    big = dict(B=64, V=151936, mode="onehot", dtype="fp32")
    vs_torch = speedup(results, "rejection_sample", "torch", **big)
    vs_softmax = speedup(results, "rejection_sample", "softmax", **big)
    if vs_torch == vs_torch and vs_softmax == vs_softmax:
        lines.append(
            "- `rejection_sample` onehot (coupled verification), B = 64, k = 4, V = 151936 "
            f"fp32: **{vs_torch:.2f}×** plain torch, and **{1 / vs_softmax:.2f}×** the time "
            "of one `torch.softmax` over the same rows."
        )
    # the two-call step at B = 256 (one_call=None: not the one-call cases)
    at = {"B": 256, "corpus": 0, "one_call": None}
    step = {L: harness_median(results, "ngram_index step", L=L, **at) for L in (1024, 131072)}
    vs_numba = speedup(results, "ngram_index step", "numba", L=32768, **at)
    if vs_numba == vs_numba and all(v == v for v in step.values()):
        lines.append(
            "- `ngram_index` step (extend by k + 1 tokens + propose, B = 256, k = 4) at 32k-token "
            f"histories: **{vs_numba:.1f}×** the numba KMP rescan; at 128k it takes "
            f"{step[131072] / step[1024]:.2f}× its time at 1k."
        )
    return lines + [""] if len(lines) > 2 else []


def harness_median(results, op, **spec) -> float:
    """The op's median (µs) at the cases matching ``spec`` (NaN if none)."""
    import statistics

    meds = [
        r.timing.median
        for r in results
        if r.op == op and r.impl == "op" and all(r.spec.get(k) == v for k, v in spec.items())
    ]
    return statistics.median(meds) if meds else float("nan")


class _Prechecked:
    """A case whose check already ran (so ``run_cases`` does not run it twice)."""

    def __init__(self, case):
        self._case = case

    def __getattr__(self, name):
        return getattr(self._case, name)

    def check(self):
        return ""


SECTION_TEXT = {
    "ngram": (
        "## ngram_propose\n\n"
        'min_n = 2, max_n = 5, `tie_break="first"`; every request has exactly L tokens, a '
        "contiguous window of the token stream. Baselines: `numba` = single-pass KMP over the "
        "reversed history, `prange` over requests (bench/baselines/ngram_numba.py); "
        "`reference` = the plain Python oracle (checked and timed only where B*L <= 64k "
        "tokens). GB/s counts each history token once (4 B)."
    ),
    "rejection": (
        "## rejection_sample\n\n"
        "k = 4 drafts per request, temperature 1 for the sampled modes (`onehot`: n-gram "
        "drafts, no draft probs, coupled verification; `probs`: draft probs given, fp32), no "
        "top-k/top-p/min-p. Baseline `torch` = plain torch with the same rules (softmax; "
        "greedy: argmax; onehot: one inverse-CDF sample per row by cumsum + searchsorted, "
        "compare with the drafts; probs: gather, compare, residual, multinomial; "
        "bench/baselines/rejection_torch.py). `softmax` = `torch.softmax` over the same "
        "B*(k+1) rows, the yardstick of one pass: `speedup vs softmax` 0.5 means the op "
        "costs two softmaxes. Greedy is checked exactly, sampled modes with the library's "
        "Philox uniforms fed to the baseline (inverse CDF instead of multinomial) and "
        "compared row by row. GB/s counts every logits row once (+ the draft-prob rows)."
    ),
    "bookkeeping": (
        "## Step bookkeeping\n\n"
        "k = 4, block size 16, max_model_len 8192, permuted `req_indices`, ragged lengths "
        "and draft counts. Baselines: `torch` = eager torch (bench/baselines/"
        "bookkeeping_torch.py), `reference` = the plain Python oracle. The byte counts are "
        "tiny; at these sizes the times are per-call overhead (Python, dispatcher, value "
        "checks), not bandwidth."
    ),
    "processing": (
        "## process_logits\n\n"
        "k = 4, histories of L real-text tokens (half prompt, half output). `step=process`: "
        "the processing alone vs `torch` = vLLM 0.33.0's torch processing of the same rows, "
        "restated (bin counts by scatter_add, the repetition penalty as a multiply by 1/p, "
        "bool masks, Python loops for bad words and stop tokens; bench/baselines/"
        "penalties_torch.py) and `bare` = `process_logits` with nothing on (a copy of the "
        "rows). `step=verify`: processing + greedy `rejection_sample` vs `verify` = "
        "`rejection_sample` on the raw rows (what every feature costs a verify step). "
        "`features=all`: penalties 1.2 / 0.3 / 0.2, 8 bias entries, a 90% allowed-token "
        "mask, 4 bad words, min_tokens with 2 stop tokens; `neutral`: penalties 1 / 0 / 0. "
        "Checked: the op equals the torch processing to 1e-6 and both verify identically. "
        "GB/s counts each row read and written once in fp32 and the histories."
    ),
    "logprobs": (
        "## top_logprobs\n\n"
        "k = 4, every request with 4 drafts and 1-5 emitted tokens (random fp32 logits, "
        "`raw_logprobs`): the emitted token's logprob and rank and the top N. `torch` = "
        "vLLM's rule for a verify step (every output slot's row, `log_softmax`, `topk`, a "
        "count for the rank; bench/cases_logprobs.py). Checked: the same ids and ranks, "
        "values to 1e-5, on the emitted slots. GB/s counts the emitted rows read once."
    ),
    "ngram_index": (
        "## Own-history n-gram index and shared corpus (one step)\n\n"
        "B requests, k = 4, n in [2, 5]: `op` = `ngram_index_extend` with the k + 1 tokens "
        "each row committed (untimed `setup` appends them before every op call) + "
        "`ngram_propose` on the index (`corpus` = tokens in the shared corpus, 4096-token "
        "documents, "
        "0 = none). Baselines over the same histories: `numba` = single-pass KMP rescan of "
        "every history (bench/baselines/ngram_numba.py), `full_scan` = `ngram_propose`'s CPU "
        "path. At most 100 timed rounds per implementation, so the histories grow by at most "
        "~500 tokens while a case is timed (the notes say how much). GB/s counts the slots "
        "and tokens a step touches; initial indexing is timed once, in the checks."
    ),
    "frequency": (
        "## Frequency-scored drafting (one step)\n\n"
        "B requests, k = 8: `op` = `ngram_index_extend` on a `FrequencyIndex` (D = 64) with "
        'the k + 1 tokens each row committed + `ngram_propose(scoring="frequency")` '
        "(SuffixDecoding's stop rules: min_token_prob 0.1, factor 1, offset 0). Baseline "
        "`longest_index` = the same step on the n-gram index (n in [2, 5], the default "
        "rule): what counting costs over today's drafts. Each implementation grows its own "
        "`num_tokens` by k + 1 inside its timed call; at most 100 timed rounds. GB/s counts "
        "an upper bound of the nodes and slots a step touches."
    ),
    "draft_plan": (
        "## Draft-length planning (adaptive policy)\n\n"
        "What the adaptive draft policy adds to a step, k = 4, three match-length classes: "
        "`plan_draft_lengths` (exact optimum over a linear cost table) and "
        "`update_acceptance_stats`, B requests with ragged proposals and permuted "
        "`req_indices`. `reference` = the plain Python oracle (engines that adapt draft "
        "lengths do it on the host with a per-batch threshold: there is no standard "
        "implementation to compare with)."
    ),
}


def _section(fam, mod, results, notes) -> list[str]:
    from bench.harness import results_table

    lines = [SECTION_TEXT[fam], ""]
    if not results:
        return lines + ["(no results)", ""]
    lines += [results_table(results, baselines=mod.BASELINES), ""]
    lines += ["Checks:", ""]
    lines += [f"- {op} {label}: {note}" for op, label, note in notes]
    lines.append("")
    return lines


if __name__ == "__main__":
    run()
