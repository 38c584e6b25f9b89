"""Memory per corpus token and per-call cost of the compact frequency structure (issue 19).

``python -m bench.suffix_memory [--stream stdlib git botocore] [--depth 64]`` builds one
store from every request of a stream (prompt + output, each its own document; the
streams of ``bench/suffix_replay.py``) with ``bench/baselines/frequency_compact.py`` and
reports its entries (nodes: contexts seen at least twice; leaves: a position's shortest
context seen once) and bytes per corpus token, beside SuffixDecoding's (ArcticInference
0.3.0, built by ``bench/baselines/suffix_decoding.sh``): the RSS growth of a fresh process
building its tree from the same documents. Then the cost of an append per token and of a
propose (``k`` drafts, factor 1) from the tail of every ``--stride``-th position of the
stream against the whole store, for both; one thread, medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.baselines import frequency_compact as fc  # noqa: E402
from bench.streams import botocore_requests  # noqa: E402
from examples.corpus_replay import DEFAULT_COMMITS, git_requests, stdlib_requests  # noqa: E402

PEER = """
import json, sys, time
import numpy as np
sys.path.append(sys.argv[1])
from arctic_inference.suffix_decoding._C import SuffixTree
docs = np.load(sys.argv[2], allow_pickle=True)
queries = np.load(sys.argv[3], allow_pickle=True)
depth, k = int(sys.argv[4]), int(sys.argv[5])
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
docs = [d.tolist() for d in docs]
queries = [q.tolist() for q in queries]
r0, t0 = rss(), time.perf_counter()
tree = SuffixTree(depth)
for i, d in enumerate(docs):
    tree.extend(i, d)
t1 = time.perf_counter()
r1 = rss()
for q in queries:
    tree.speculate(q, k, 1.0, 0.0, 0.1, False)
t2 = time.perf_counter()
print(json.dumps({"rss": r1 - r0, "append_s": t1 - t0, "propose_s": t2 - t1}))
"""


def stream(name: str):
    if name == "stdlib":
        return stdlib_requests(8, 2048, 711)
    if name == "botocore":
        return botocore_requests(14, 2048, 711)
    return git_requests(DEFAULT_COMMITS, 2048)


def build(docs, depth: int, log2_slots: int | None = None):
    """One store of ``docs`` and the seconds its appends took. Without ``log2_slots``, a
    table for the worst case (``D / 2 + 1`` entries a position at most 3/4 full)."""
    tokens = sum(d.shape[0] for d in docs)
    if log2_slots is None:
        log2_slots = fc.log2_slots_for(tokens * (depth // 2 + 1))
    store = fc.new_store(log2_slots, tokens + len(docs))
    t0 = time.perf_counter()
    for d in docs:
        fc.append(*store, d, 0, d.shape[0], fc.reserve(store, d.shape[0]), depth)
    return store, time.perf_counter() - t0


def census(store) -> tuple[int, int]:
    """(nodes, leaves) in the store."""
    count = store[1]
    return int((count >= 2).sum()), int((count == 1).sum())


def propose_all(store, queries, depth: int, k: int) -> float:
    out, tmp = np.zeros(depth, np.int32), np.zeros(depth, np.int32)
    t0 = time.perf_counter()
    for q in queries:
        fc.propose(*store, q, q.shape[0], depth, k, 1.0, 0.1, out, tmp)
    return time.perf_counter() - t0


def peer(docs, queries, depth: int, k: int) -> dict | None:
    from bench.suffix_replay import suffix_decoding_path

    path = suffix_decoding_path()
    if path is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        d, q = Path(tmp) / "docs.npy", Path(tmp) / "queries.npy"
        np.save(d, np.array(docs, dtype=object), allow_pickle=True)
        np.save(q, np.array(queries, dtype=object), allow_pickle=True)
        run = subprocess.run(
            [sys.executable, "-c", PEER, path, str(d), str(q), str(depth), str(k)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    return json.loads(run.stdout.strip().splitlines()[-1])


def per_document(docs, depth: int) -> str:
    """Entries per token of one store per document (prompt + output): median / p90 / max."""
    ratios = []
    for d in docs:
        store, _ = build([d], depth)
        ratios.append(int(store[-1][1]) / max(1, d.shape[0]))
    q = np.quantile(ratios, [0.5, 0.9, 1.0])
    return " / ".join(f"{x:.2f}" for x in q)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stream", nargs="+", default=["stdlib", "git", "botocore"])
    p.add_argument("--depth", type=int, default=64)
    p.add_argument("-k", type=int, default=8)
    p.add_argument("--stride", type=int, default=97, help="a query every this many positions")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--per-document", action="store_true",
        help="only: entries per token of a store per document (a request's own history)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.per_document:
        for name in args.stream:
            docs = [np.asarray(pr + out, np.int32) for _, pr, out in stream(name)]
            print(f"{name}: entries / token, median / p90 / max: {per_document(docs, args.depth)}")
        return 0
    lines = [
        f"D = depth = {args.depth}; propose: k = {args.k}, factor 1, min_token_prob 0.1; "
        f"medians of {args.repeats} runs, one thread",
        "",
        "| stream | corpus tokens | nodes / token | leaves / token | compact B / token "
        "allocated (if exactly 3/4 full) | SuffixDecoding RSS B / token | "
        "append ns / token, compact : SD | propose us, compact : SD |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in args.stream:
        docs = [np.asarray(pr + out, np.int32) for _, pr, out in stream(name)]
        tokens = sum(d.shape[0] for d in docs)
        flat = np.concatenate(docs)
        queries = [flat[max(0, i - args.depth) : i] for i in range(1, flat.shape[0], args.stride)]
        entries = int(build(docs, args.depth)[0][-1][1])  # count, then size the table
        log2 = fc.log2_slots_for(entries)
        runs, props, sd = [], [], []
        for _ in range(args.repeats):  # interleaved: compact build, its proposals, the peer
            runs.append(build(docs, args.depth, log2))
            props.append(propose_all(runs[-1][0], queries, args.depth, args.k))
            runs[-1] = (census(runs[-1][0]), runs[-1][1])
            sd.append(peer(docs, queries, args.depth, args.k))
        nodes, leaves = runs[-1][0]
        ideal = fc.BYTES_PER_SLOT * (nodes + leaves) * 4 / 3 / tokens + 4  # + the token ids
        allocated = (fc.BYTES_PER_SLOT * (1 << log2) + 4 * (tokens + len(docs))) / tokens
        append_ns = 1e9 * float(np.median([r[1] for r in runs])) / tokens
        prop_us = 1e6 * float(np.median(props)) / len(queries)
        if sd[0] is None:
            sd_b = sd_append = sd_prop = "n/a"
        else:
            sd_b = f"{float(np.median([r['rss'] for r in sd])) / tokens:.0f}"
            sd_append = f"{1e9 * float(np.median([r['append_s'] for r in sd])) / tokens:.0f}"
            sd_prop = f"{1e6 * float(np.median([r['propose_s'] for r in sd])) / len(queries):.2f}"
        row = (
            f"| {name} | {tokens:,} | {nodes / tokens:.2f} | {leaves / tokens:.2f} | "
            f"{allocated:.0f} ({ideal:.0f}) | {sd_b} | {append_ns:.0f} : {sd_append} | "
            f"{prop_us:.2f} : {sd_prop} |"
        )
        print(row, flush=True)
        lines.append(row)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        with open(args.out, "a") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
