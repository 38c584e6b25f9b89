"""This library's vLLM proposer against vLLM's own ``NgramProposer``, step by step.

``make bench-vllm`` (= this module in the ``make test-vllm`` venv, which has vLLM 0.33.0).
Both proposers get the same vLLM-shaped buffers: ``token_ids_cpu`` of real text (bench/
data.py), ``num_tokens_no_spec`` and ``sampled_token_ids``; each step every request gains
``GROWTH`` tokens (what an accepted block adds), then ours and vLLM's propose in turn,
drafts compared, each timed. B in {1, 8, 64, 256} x histories {1k, 8k, 32k}, k = 4, n in
[2, 5]; ``--repeats`` interleaved repeats of ``--steps`` steps, medians. The first step of a
batch (our index is built from vLLM's rows: an admission) is timed apart. One thread each
by default (``--threads 1``: torch and numba); vLLM 0.33.0's own default is one numba thread
too (``NgramProposer.num_numba_thread_available = min(1, cpu_count // 2)``). Writes
``bench/results/<date>-vllm-proposer-<machine>.md`` and ``.png``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

K, MIN_N, MAX_N, GROWTH = 4, 2, 5, 3
BATCHES = (1, 8, 64, 256)
HISTORIES = (1024, 8192, 32768)
RESULTS = Path(__file__).resolve().parent / "results"


def config(B, L, *, custom_class):
    spec = SimpleNamespace(
        method="custom_class" if custom_class else "ngram", num_speculative_tokens=K,
        prompt_lookup_min=0 if custom_class else MIN_N,
        prompt_lookup_max=0 if custom_class else MAX_N,
    )  # fmt: skip
    extra = {"specdec_kernels": {"prompt_lookup_min": MIN_N, "prompt_lookup_max": MAX_N}}
    return SimpleNamespace(
        speculative_config=spec,
        model_config=SimpleNamespace(max_model_len=L),
        scheduler_config=SimpleNamespace(max_num_seqs=B),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
        additional_config=extra if custom_class else {},
    )


def run_case(B, L, steps, repeats):
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer as Theirs

    from bench import data
    from specdec_kernels.integrations.vllm import NgramProposer as Ours

    room = (steps * repeats + 2) * GROWTH + 8
    cap = L + room
    tok, _ = data.ngram_histories(B, cap)  # real text past L too: the tokens to come
    token_ids = tok.numpy().copy()
    num_tokens = np.full(B, L, dtype=np.int32)
    ours, theirs = (
        Ours(config(B, cap, custom_class=True)),
        Theirs(config(B, cap, custom_class=False)),
    )
    sampled = [[1]] * B

    def step(proposer, is_theirs):
        t0 = time.perf_counter()
        if is_theirs:
            out = proposer.propose(K, sampled, num_tokens, token_ids, slot_mappings=None)
        else:
            out = proposer.propose(sampled, num_tokens, token_ids, slot_mappings=None)
        return time.perf_counter() - t0, out

    first, out = step(ours, False)  # our index is built here: the rows' admission
    step(theirs, True)
    times = {"ours": [], "vllm": []}
    for _ in range(repeats):
        per = {"ours": [], "vllm": []}
        for _ in range(steps):
            num_tokens += GROWTH
            t_o, d_o = step(ours, False)
            t_v, d_v = step(theirs, True)
            assert d_o == d_v, f"drafts differ at B={B} L={L}"
            per["ours"].append(t_o)
            per["vllm"].append(t_v)
        for key in per:
            times[key].append(statistics.median(per[key]))
    ours_s, vllm_s = statistics.median(times["ours"]), statistics.median(times["vllm"])
    ratios = sorted(v / o for v, o in zip(times["vllm"], times["ours"], strict=True))
    return dict(B=B, L=L, ours=ours_s, vllm=vllm_s, speedup=vllm_s / ours_s, ratios=ratios,
                admission=first, drafted=sum(map(len, out)))  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.vllm_proposer", description=__doc__)
    p.add_argument("--threads", type=int, default=1, help="torch and numba threads (default 1)")
    p.add_argument("--steps", type=int, default=40, help="timed steps per repeat")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repeats (default 5)")
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--histories", default=",".join(map(str, HISTORIES)))
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--plot", type=Path, help="only draw the plot of a results .json")
    args = p.parse_args(argv)
    if args.plot:  # (the vLLM venv has no matplotlib: the main venv draws it)
        plot(json.loads(args.plot.read_text()), args.plot.with_suffix(".png"))
        return 0
    import numba
    import torch
    import vllm

    torch.set_num_threads(args.threads)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    from bench.harness import machine_info, write_report

    rows = []
    for L in map(int, args.histories.split(",")):
        for B in map(int, args.batches.split(",")):
            r = run_case(B, L, args.steps, args.repeats)
            rows.append(r)
            print(f"B={B} L={L}: ours {r['ours'] * 1e6:.0f} us, vLLM {r['vllm'] * 1e6:.0f} us, "
                  f"{r['speedup']:.2f}x", flush=True)  # fmt: skip
    from bench.__main__ import default_machine_name

    info = machine_info()
    date = datetime.date.today().isoformat()
    path = args.out / f"{date}-vllm-proposer-{default_machine_name(args.threads)}.md"
    lines = [
        f"# vLLM proposer: specdec-kernels' `NgramProposer` vs vLLM {vllm.__version__}'s",
        "",
        f"`python -m bench.vllm_proposer --threads {args.threads} --steps {args.steps} "
        f"--repeats {args.repeats}` on {info['cpu']} ({info['cores']} "
        f"cores), torch {torch.__version__}, numba {numba.__version__}. Per step (every "
        f"request +{GROWTH} tokens, then one propose), k = {K}, n in [{MIN_N}, {MAX_N}], "
        "real text (bench/data.py); medians of the repeats' median steps; drafts equal "
        "every step. `admission`: our first call, which indexes every row.",
        "",
        "| B | history | ours (us) | vLLM (us) | speedup | min-max over repeats | admission (ms) |",
        "|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['B']} | {r['L']} | {r['ours'] * 1e6:.1f} | {r['vllm'] * 1e6:.1f} | "
            f"{r['speedup']:.2f}x | {r['ratios'][0]:.2f}-{r['ratios'][-1]:.2f}x | "
            f"{r['admission'] * 1e3:.1f} |"
        )
    write_report(path, lines, echo=False)
    path.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    plot(rows, path.with_suffix(".png"))
    return 0


def plot(rows, path):
    """The speedups per batch size, one line per history length (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for L in sorted({r["L"] for r in rows}):
        sel = [r for r in rows if r["L"] == L]
        ax.plot([r["B"] for r in sel], [r["speedup"] for r in sel], marker="o", label=f"L={L}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("vLLM time / ours (per step)")
    ax.set_title("vLLM proposer step: specdec-kernels vs vLLM's NgramProposer")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
