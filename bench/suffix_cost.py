"""The cost of a drafting step: ``ngram_propose(scoring="frequency")`` vs SuffixDecoding's
speculate + update loop, side by side (issue 19's cost goal).

``python -m bench.suffix_cost [--cells batch history corpus] [--steps 40] [--repeats 5]
[--out FILE.md]``. One thread. A step, in the steady state of decoding: every request
commits ``k + 1 = 9`` tokens and proposes up to ``k = 8`` drafts at depth 64 with
SuffixDecoding's stop rules (``min_token_prob`` 0.1, factor 1, offset 0).

- this library: one call, ``ngram_propose(..., index=FrequencyIndex, corpus=
  FrequencyCorpus, scoring="frequency", extend_index=True)`` over the batch (the index
  extended by the committed tokens in the same call), after ``num_tokens += 9``;
- SuffixDecoding (ArcticInference 0.3.0, built by ``bench/baselines/suffix_decoding.sh``):
  per request, its own tree ``extend`` by the 9 tokens, ``speculate`` on it and on the
  shared tree, the higher score wins (the raw trees, as ``bench/suffix_replay.py`` drives
  them: cheaper than vLLM's ``suffix`` proposer, which adds its cache's Python around them).

``--route-ab``: instead, the op's ``extend_index=True`` one-call route against the two
ops in turn (B = 1 and 8, 8k histories, with and without a 1M-token corpus; alternating call
by call).

Cells: ``batch`` (B = 1, 8, 64; 8k-token histories; a 1M-token corpus), ``history`` (B = 8,
histories of 1k .. 128k tokens, no corpus), ``corpus`` (B = 8, 8k histories, corpora of
1M .. 16M tokens). Tokens: the stdlib stream of ``examples/corpus_replay.py`` (every module,
prompt + output); request ``b``'s history starts at its own offset in the stream; the
corpus holds the stream's documents, and past the stream's size copies of them with token
ids mapped through a different permutation each (distinct contexts, the same structure).
Both drafters hold the same contents. Timing: the two step loops alternate step by step
(which goes first alternates too); per repeat the median step of each, ``--repeats``
repeats; the ratio is SuffixDecoding's median / the op's (> 1: the op is faster). Memory:
the corpus state's bytes (allocated) and SuffixDecoding's shared tree's RSS growth, per
corpus token.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

K, DEPTH, FACTOR, MIN_PROB = 8, 64, 1.0, 0.1
CELLS = {
    "batch": [(b, 8192, 1 << 20) for b in (1, 8, 64)],
    "history": [(8, n, 0) for n in (1024, 8192, 32768, 131072)],
    "corpus": [(8, 8192, m) for m in (1 << 20, 1 << 22, 1 << 24)],
}
GOAL = "<= SuffixDecoding's step at B >= 64, within 2x at B = 1 and 8; flat in L and corpus size"


def stream_documents() -> list[np.ndarray]:
    from examples.corpus_replay import stdlib_requests

    return [np.asarray(p + o, np.int32) for _, p, o in stdlib_requests(8, 1 << 30, 0)]


def corpus_documents(docs: list[np.ndarray], tokens: int, vocab: int) -> list[np.ndarray]:
    """Documents of ``tokens`` tokens in all: the stream's, then remapped copies."""
    out, n, copy = [], 0, 0
    odd = [m for m in range(7, 10_000, 2) if np.gcd(m, vocab) == 1]
    while n < tokens:
        for d in docs:
            mapped = d if copy == 0 else ((d.astype(np.int64) * odd[copy] + copy) % vocab)
            take = mapped[: tokens - n].astype(np.int32)
            out.append(take)
            n += take.shape[0]
            if n >= tokens:
                break
        copy += 1
    return out


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def op_corpus(docs: list[np.ndarray]):
    """A ``FrequencyCorpus`` holding ``docs`` (its budget: no eviction, no rebuild while
    they are appended) and its allocated bytes."""
    import torch

    from specdec_kernels import ops

    n = sum(d.shape[0] + 1 for d in docs)
    corpus = ops.new_corpus(int(n * 1.4) + 4096, min_n=1, max_n=DEPTH, scoring="frequency")
    append_documents(corpus, docs)
    return corpus, sum(t.nbytes for t in corpus if isinstance(t, torch.Tensor))


def append_documents(corpus, docs: list[np.ndarray], batch: int = 64) -> None:
    """``corpus_append`` every document, ``batch`` rows a call, oldest first."""
    import torch

    from specdec_kernels import ops

    for i in range(0, len(docs), batch):
        chunk = docs[i : i + batch]
        lens = torch.tensor([d.shape[0] for d in chunk], dtype=torch.int32)
        pad = torch.zeros((len(chunk), int(lens.max())), dtype=torch.int32)
        for j, d in enumerate(chunk):
            pad[j, : d.shape[0]] = torch.from_numpy(d)
        ops.corpus_append(pad, lens, corpus=corpus)


def peer_corpus(docs: list[np.ndarray]):
    """SuffixDecoding's shared tree holding ``docs`` and the RSS it added."""
    from arctic_inference.suffix_decoding._C import SuffixTree

    before = rss()
    tree = SuffixTree(DEPTH)
    for i, d in enumerate(docs):
        tree.extend(i, d.tolist())
    return tree, rss() - before


class Op:
    def __init__(self, hist: np.ndarray, L: int, corpus, width: int):
        import torch

        from specdec_kernels import ops

        self.torch, self.ops, self.corpus = torch, ops, corpus
        B = hist.shape[0]
        self.tok = torch.from_numpy(np.ascontiguousarray(hist[:, :width]))
        self.nt = torch.full((B,), L, dtype=torch.int32)
        self.index = ops.new_ngram_index(B, width, min_n=1, max_n=DEPTH, scoring="frequency")
        ops.ngram_index_build(self.tok, self.nt, index=self.index)

    def step(self) -> None:
        self.nt += K + 1
        self.ops.ngram_propose(
            self.tok, self.nt, None, min_n=1, max_n=DEPTH, num_speculative_tokens=K,
            index=self.index, corpus=self.corpus, scoring="frequency",
            min_token_prob=MIN_PROB, max_spec_factor=FACTOR, extend_index=True,
        )  # fmt: skip


class Peer:
    def __init__(self, hist: np.ndarray, L: int, glob):
        from arctic_inference.suffix_decoding._C import SuffixTree

        self.hist, self.n, self.glob = hist, [L] * hist.shape[0], glob
        self.local = []
        for row in hist:
            tree = SuffixTree(DEPTH)
            tree.extend(0, row[:L].tolist())
            self.local.append(tree)

    def step(self) -> None:
        for b, tree in enumerate(self.local):
            row, n = self.hist[b], self.n[b]
            tree.extend(0, row[n : n + K + 1].tolist())
            n = self.n[b] = n + K + 1
            ctx = row[max(0, n - DEPTH) : n].tolist()
            draft = tree.speculate(ctx, K, FACTOR, 0.0, MIN_PROB, False)
            if self.glob is not None:
                other = self.glob.speculate(ctx, K, FACTOR, 0.0, MIN_PROB, False)
                draft = other if other.score > draft.score else draft


_CORPORA: dict = {}


def corpora(docs, M: int) -> dict:
    """Both drafters' corpora of ``M`` tokens (the last size asked for is kept: cells of one
    size share them; the steps never change them). The previous size is freed after the
    new one is built: freed tree nodes would be reused and hide RSS growth."""
    if M not in _CORPORA:
        cdocs = corpus_documents(docs, M, 32000)
        t0 = time.perf_counter()
        op, op_bytes = op_corpus(cdocs)
        t1 = time.perf_counter()
        peer, peer_bytes = peer_corpus(cdocs)
        t2 = time.perf_counter()
        _CORPORA.clear()
        _CORPORA[M] = dict(op=op, peer=peer, op_bytes=op_bytes, peer_bytes=peer_bytes,
                           op_build_s=t1 - t0, peer_build_s=t2 - t1)  # fmt: skip
    return _CORPORA[M]


def histories(docs, B: int, L: int, steps: int) -> tuple[np.ndarray, int]:
    """``B`` rows of the stream (each from its own offset) wide enough for ``L`` tokens and
    ``steps`` commits of ``K + 1``; and that width."""
    stream = np.concatenate(docs)
    width = L + (steps + 2) * (K + 1) + DEPTH
    stream = np.concatenate([stream] * (1 + (B * width) // stream.shape[0]))
    stride = (stream.shape[0] - width) // max(B, 1)
    return np.stack([stream[b * stride : b * stride + width] for b in range(B)]), width


def measure(B: int, L: int, M: int, docs, steps: int, repeats: int) -> dict:
    hist, width = histories(docs, B, L, steps * repeats)
    c = corpora(docs, M) if M else dict(op=None, peer=None, op_bytes=0, peer_bytes=0,
                                        op_build_s=0.0, peer_build_s=0.0)  # fmt: skip
    op, peer = Op(hist, L, c["op"], width), Peer(hist, L, c["peer"])
    op.step(), peer.step()  # warm (compiled kernels, caches)
    ratios, op_med, peer_med = [], [], []
    for _ in range(repeats):
        times = {"op": [], "peer": []}
        for s in range(steps):
            order = (("op", op), ("peer", peer)) if s % 2 == 0 else (("peer", peer), ("op", op))
            for name, d in order:
                a = time.perf_counter_ns()
                d.step()
                times[name].append(time.perf_counter_ns() - a)
        o, p = (float(np.median(times[n])) / 1e3 for n in ("op", "peer"))
        op_med.append(o), peer_med.append(p), ratios.append(p / o)
    return dict(
        B=B, L=L, M=M, op_us=float(np.median(op_med)), peer_us=float(np.median(peer_med)),
        ratio=float(np.median(ratios)), ratio_lo=min(ratios), ratio_hi=max(ratios),
        op_build_s=c["op_build_s"], peer_build_s=c["peer_build_s"],
        op_bytes=c["op_bytes"] / M if M else 0.0, peer_bytes=c["peer_bytes"] / M if M else 0.0,
    )  # fmt: skip


def route_ab(docs, steps: int, repeats: int) -> str:
    """``extend_index=True``'s one-call route against the two ops in turn (the route before
    it: ``ngram_index_extend`` then ``frequency_propose``), the op's step only, alternating
    call by call in one process; B = 1 and 8, 8k histories, with and without the 1M-token
    corpus."""
    from specdec_kernels.ops import ngram as ops_ngram

    direct = ops_ngram.calls_cpu_directly
    lines = ["| B | corpus tokens | one call | two ops | two ops / one call (median, min-max) |",
             "|---|---|---|---|---|"]  # fmt: skip
    for B, M in ((1, 1 << 20), (8, 1 << 20), (1, 0), (8, 0)):
        hist, width = histories(docs, B, 8192, 2 * steps * repeats)
        op = Op(hist, 8192, corpora(docs, M)["op"] if M else None, width)
        ratios, one, two = [], [], []
        for _ in range(repeats):
            t = {True: [], False: []}
            for s in range(2 * steps):
                fused = s % 2 == 0
                ops_ngram.calls_cpu_directly = direct if fused else (lambda kwargs: False)
                a = time.perf_counter_ns()
                op.step()
                t[fused].append(time.perf_counter_ns() - a)
            ops_ngram.calls_cpu_directly = direct
            o, w = float(np.median(t[True])) / 1e3, float(np.median(t[False])) / 1e3
            one.append(o), two.append(w), ratios.append(w / o)
        spread = f"{np.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        lines.append(
            f"| {B} | {M:,} | {np.median(one):.1f} us | {np.median(two):.1f} us | {spread} |"
        )
        print(lines[-1], flush=True)
    return "\n".join(lines) + "\n"


def table(rows: list[dict]) -> str:
    lines = [
        "| B | history L | corpus tokens | op step | SuffixDecoding step | ratio (median, min-max) "
        "| op corpus B/token (allocated, budget 1.4x the tokens) | SuffixDecoding B/token (RSS) "
        "| corpus build op / SD |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mem = f"{r['op_bytes']:.0f} | {r['peer_bytes']:.0f}" if r["M"] else "- | -"
        lines.append(
            f"| {r['B']} | {r['L']} | {r['M']:,} | {r['op_us']:.1f} us | {r['peer_us']:.1f} us "
            f"| {r['ratio']:.2f}x ({r['ratio_lo']:.2f}-{r['ratio_hi']:.2f}) | {mem} "
            f"| {r['op_build_s']:.1f} s / {r['peer_build_s']:.1f} s |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--route-ab", action="store_true",
                   help="instead: the op's one-call route against the two ops in turn")  # fmt: skip
    args = p.parse_args(argv)

    import torch

    from bench.suffix_replay import suffix_decoding_path

    torch.set_num_threads(1)
    path = suffix_decoding_path()
    if path is None:
        return 1
    sys.path.append(path)
    docs = stream_documents()
    if args.route_ab:
        text = route_ab(docs, args.steps, args.repeats)
        if args.out is not None:
            with open(args.out, "a") as f:
                f.write(text)
        return 0
    rows = []
    for cell in args.cells:
        for B, L, M in CELLS[cell]:
            r = measure(B, L, M, docs, args.steps, args.repeats)
            print(table([r]).splitlines()[-1], flush=True)
            rows.append(r)
    text = f"Goal: {GOAL}.\n\n" + table(rows)
    print(text)
    if args.out is not None:
        with open(args.out, "a") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
