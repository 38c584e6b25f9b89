"""Memory per corpus token and per-call cost of the frequency structures (issue 19).

``python -m bench.suffix_memory [--stream stdlib git botocore] [--depth 64] [--structure
compact|trie]`` builds one store from every request of a stream (prompt + output, each its
own document; the streams of ``bench/suffix_replay.py``) with
``bench/baselines/frequency_compact.py`` or ``frequency_trie.py`` (the path-compressed trie)
and reports its entries (nodes: count >= 2; leaves: count 1) and bytes per corpus token,
beside SuffixDecoding's (ArcticInference 0.3.0, built by
``bench/baselines/suffix_decoding.sh``): the RSS growth of a fresh process building its
tree from the same documents. Then the cost of an append per token and of a propose (``k``
drafts, factor 1) from the tail of every ``--stride``-th position of the stream against the
whole store, for both; one thread, medians of ``--repeats`` runs.

``--op-nodes 2C+1 1 0.5 ...`` measures the library's own corpus instead
(``new_corpus(C, scoring="frequency", nodes=M)``, every document appended in batches of
64, ``C`` the smallest budget that never rebuilds on slots: ``6/8 C`` >= the stream's
slots): for each node budget ``M`` (``2C+1``, the exact default, or a fraction of ``C``),
its allocated bytes per live corpus token (every tensor of the state, token ids
included), the share of the stream still live (a short budget evicts), and the nodes a
live token used, beside SuffixDecoding's RSS growth per token (``--repeats`` peer runs).
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
from bench.baselines import frequency_trie as ft  # noqa: E402
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


class Structure:
    """The compact structure (``frequency_compact``): one table of nodes and leaves."""

    mod = fc

    def new(self, tokens: int, docs: int, depth: int, entries: int | None):
        """A store for ``tokens`` in ``docs`` documents; ``entries`` (from :meth:`entries`
        of an earlier build) sizes it exactly, None: for the worst case (``D / 2 + 1``
        entries a position)."""
        slots = tokens * (depth // 2 + 1) if entries is None else entries
        return fc.new_store(fc.log2_slots_for(slots), tokens + docs)

    def entries(self, store) -> int:
        return int(store[-1][1])

    def census(self, store) -> tuple[int, int]:
        """(nodes, leaves) in the store: count >= 2, count 1."""
        count = store[1]
        return int((count >= 2).sum()), int((count == 1).sum())

    def nbytes(self, store, ideal: bool) -> int:
        """Bytes of the counts (not the token ids): as allocated, or ``ideal``: a table
        exactly 3/4 full."""
        if ideal:
            return int(fc.BYTES_PER_SLOT * self.entries(store) * 4 / 3)
        return sum(a.nbytes for a in store[:5])


class Trie(Structure):
    """The path-compressed trie (``frequency_trie``): a table of keys and node arrays."""

    mod = ft

    def new(self, tokens, docs, depth, entries):
        if entries is None:
            return ft.store_for(tokens, tokens + docs)
        nodes = entries + 3  # the root, the entries, the two an append checks for
        return ft.new_store(ft.log2_slots_for(nodes), tokens + docs, nodes)

    def entries(self, store) -> int:
        return int(store[-1][2]) - 1  # every node but the root has a key

    def census(self, store):
        used = int(store[-1][2])
        count = store[2][0, 1:used]
        return int((count >= 2).sum()), int((count == 1).sum())

    def nbytes(self, store, ideal):
        if ideal:  # the nodes used and a table exactly 3/4 full of their keys
            nodes = self.entries(store) + 1
            return int(ft.BYTES_PER_SLOT * self.entries(store) * 4 / 3) + ft.BYTES_PER_NODE * nodes
        return store[0].nbytes + store[1].nbytes + store[2].nbytes


STRUCTURES = {"compact": Structure(), "trie": Trie()}


def build(docs, depth: int, structure: Structure, entries: int | None = None):
    """One store of ``docs`` and the seconds its appends took (``Structure.new``)."""
    tokens = sum(d.shape[0] for d in docs)
    store = structure.new(tokens, len(docs), depth, entries)
    mod = structure.mod
    t0 = time.perf_counter()
    for d in docs:
        mod.append(*store, d, 0, d.shape[0], mod.reserve(store, d.shape[0]), depth)
    return store, time.perf_counter() - t0


def propose_all(store, queries, depth: int, k: int, structure: Structure) -> float:
    out, tmp = np.zeros(depth, np.int32), np.zeros(depth, np.int32)
    propose = structure.mod.propose
    t0 = time.perf_counter()
    for q in queries:
        propose(*store, q, q.shape[0], depth, k, 1.0, 0.1, out, tmp)
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


def per_document(docs, depth: int, structure: Structure) -> str:
    """Entries per token of one store per document (prompt + output): median / p90 / max."""
    ratios = []
    for d in docs:
        store, _ = build([d], depth, structure)
        ratios.append(structure.entries(store) / max(1, d.shape[0]))
    q = np.quantile(ratios, [0.5, 0.9, 1.0])
    return " / ".join(f"{x:.2f}" for x in q)


def op_memory(name: str, docs, depth: int, budgets: list[str], repeats: int) -> list[str]:
    """Rows of the ``--op-nodes`` table for one stream (see the module docstring)."""
    from bench.suffix_cost import append_documents
    from specdec_kernels import ops
    from specdec_kernels.reference.frequency_corpus import live_documents

    tokens = sum(d.shape[0] for d in docs)
    C = -(-8 * (tokens + len(docs)) // 6) + 8
    sd = [peer(docs, [], depth, 1) for _ in range(repeats)]
    sd_b = "n/a" if sd[0] is None else f"{np.median([r['rss'] for r in sd]) / tokens:.0f}"
    rows = []
    for budget in budgets:
        M = 2 * C + 1 if budget == "2C+1" else int(float(budget) * C)
        corpus = ops.new_corpus(C, min_n=1, max_n=depth, scoring="frequency", nodes=M)
        nbytes = sum(t.nbytes for t in corpus[:7])
        append_documents(corpus, docs)
        live = sum(len(d) for d in live_documents(corpus[:7]))
        used = int(corpus.num_nodes[int(corpus.state[0])]) - 1
        rows.append(
            f"| {name} | {tokens:,} | {C:,} | {budget if budget == '2C+1' else budget + ' C'} "
            f"| {M:,} | {corpus.keys.shape[1]:,} | {live / tokens:.3f} | {used / max(live, 1):.2f} "
            f"| {nbytes / max(live, 1):.0f} | {sd_b} |"
        )
        print(rows[-1], flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stream", nargs="+", default=["stdlib", "git", "botocore"])
    p.add_argument("--depth", type=int, default=64)
    p.add_argument("-k", type=int, default=8)
    p.add_argument("--stride", type=int, default=97, help="a query every this many positions")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--structure", choices=sorted(STRUCTURES), default="compact")
    p.add_argument(
        "--per-document", action="store_true",
        help="only: entries per token of a store per document (a request's own history)",
    )  # fmt: skip
    p.add_argument(
        "--op-nodes",
        nargs="+",
        default=None,
        help="the library's corpus at these node budgets: 2C+1 or fractions of C",
    )
    args = p.parse_args(argv)
    if args.op_nodes:
        lines = [
            f"the library's FrequencyCorpus, D = {args.depth}; SuffixDecoding: median RSS growth "
            f"of {args.repeats} fresh processes building its tree from the same documents",
            "",
            "| stream | corpus tokens | C (slots) | node budget | M | S (table) | live share | "
            "nodes / live token | op B / live token, allocated | SuffixDecoding RSS B / token |",
            "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name in args.stream:
            docs = [np.asarray(pr + out, np.int32) for _, pr, out in stream(name)]
            lines += op_memory(name, docs, args.depth, args.op_nodes, args.repeats)
        return emit(lines, args.out)
    structure = STRUCTURES[args.structure]
    if args.per_document:
        for name in args.stream:
            docs = [np.asarray(pr + out, np.int32) for _, pr, out in stream(name)]
            spread = per_document(docs, args.depth, structure)
            print(f"{name}: entries / token, median / p90 / max: {spread}")
        return 0
    lines = [
        f"{args.structure} structure; D = depth = {args.depth}; propose: k = {args.k}, "
        f"factor 1, min_token_prob 0.1; medians of {args.repeats} runs, one thread",
        "",
        f"| stream | corpus tokens | nodes / token | leaves / token | {args.structure} B / "
        "token allocated (if the table were exactly 3/4 full) | SuffixDecoding RSS B / token "
        f"| append ns / token, {args.structure} : SD | propose us, {args.structure} : SD |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in args.stream:
        docs = [np.asarray(pr + out, np.int32) for _, pr, out in stream(name)]
        tokens = sum(d.shape[0] for d in docs)
        flat = np.concatenate(docs)
        queries = [flat[max(0, i - args.depth) : i] for i in range(1, flat.shape[0], args.stride)]
        # count, then size the store
        entries = structure.entries(build(docs, args.depth, structure)[0])
        runs, props, sd = [], [], []
        for _ in range(args.repeats):  # interleaved: our build, its proposals, the peer
            store, seconds = build(docs, args.depth, structure, entries)
            props.append(propose_all(store, queries, args.depth, args.k, structure))
            sizes = (structure.nbytes(store, False), structure.nbytes(store, True))
            runs.append(((structure.census(store), sizes), seconds))
            del store
            sd.append(peer(docs, queries, args.depth, args.k))
        (nodes, leaves), (allocated, ideal) = runs[-1][0]
        ideal = (ideal + 4 * (tokens + len(docs))) / tokens  # + the token ids
        allocated = (allocated + 4 * (tokens + len(docs))) / tokens
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
    return emit(lines, args.out)


def emit(lines: list[str], out: Path | None) -> int:
    """Print the table and append it to ``out`` if given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out is not None:
        with open(out, "a") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
