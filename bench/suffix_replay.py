"""Draft quality on replayed request streams: this library vs SuffixDecoding (issue 19).

``python -m bench.suffix_replay [--stream stdlib|git|botocore] [-k 4 8 16] [--requests N]``
replays a stream (``examples/corpus_replay.py``'s: the stdlib modules of the running Python,
or code edits of this repository over a pinned commit range; or ``botocore``: the AWS API
models of botocore 1.35.99, JSON documents of one schema, as a structured-output stream,
see ``bench/streams.py``) with a perfect greedy oracle: per
step a request accepts the longest draft prefix that equals its true continuation and
emits one more token. Requests are admitted in order, at most ``--batch`` in flight (a
freed slot takes the next), the same for every drafter; in a step every request proposes,
then every one commits. Reported: tokens per step (output tokens / decode steps) for

- ``longest``: ``ngram_propose`` today (n in 2..5, first occurrence; the corpus: finished
  prompt + output);
- ``suffix``: SuffixDecoding (ArcticInference 0.3.0, built by
  ``bench/baselines/suffix_decoding.sh``; chain drafts at depth 64), with each
  ``max_spec_factor`` of ``--factors``;
- ``frequency``: the prototype of ``scoring="frequency"`` (``bench/baselines/
  frequency_prototype.py``), same factors;
- ``adaptive`` (with ``--drafters``): the prototype choosing the factor per request
  online among 0.5, 1, 2, 4 (:class:`Adaptive`);
- ``compact``, ``trie`` (with ``--drafters``): the prototype's drafts from the compact
  structure and from the path-compressed trie (``bench/baselines/frequency_*.py``);
  ``budget``: the trie with its finished store under each ``--corpus-budget``;
- ``oracle`` (with ``--drafters``): not a drafter but a bound: per step, of every match
  length's chain of most frequent continuations (no length cap, no ``min_token_prob``),
  the one the truth accepts most of (``frequency_trie.oracle``); no rule that drafts one
  such chain, whatever its parameters, does better;

each with its own history only and with earlier requests, in two store settings:
``native`` (SuffixDecoding's: every request's response, growing live) and ``finished``
(prompt + output of finished requests, this library's corpus). ``--out FILE.md`` appends
the table and writes a plot beside it (``FILE-<stream>.png``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.frequency_drafters import (  # noqa: E402
    Adaptive,
    Compact,
    Frequency,
    FrequencyOp,
    Trie,
    TrieBudget,
    TrieGenerations,
    TrieOracle,
    accepted,
)
from bench.streams import BOTOCORE, botocore_requests  # noqa: E402
from examples.corpus_replay import DEFAULT_COMMITS, git_requests, stdlib_requests  # noqa: E402


def replay(reqs, drafter, *, batch: int, k: int) -> float:
    """Tokens per step of ``drafter`` on ``reqs`` under the greedy oracle.

    At most ``batch`` requests in flight, a freed slot taking the next request. A step is
    an engine's: every live request proposes, then every one commits (and a finished one
    leaves), so no request sees another's tokens of the same step."""
    slot_req, hist, L = [-1] * batch, [None] * batch, [0] * batch
    nxt, out_tokens, steps = 0, 0, 0

    def admit(s):
        nonlocal nxt
        slot_req[s] = -1
        if nxt < len(reqs):
            _, prompt, output = reqs[nxt]
            hist[s], L[s], slot_req[s] = np.asarray(prompt + output, np.int32), len(prompt), nxt
            drafter.admit(s, hist[s], len(prompt))
            nxt += 1

    for s in range(batch):
        admit(s)
    while any(r >= 0 for r in slot_req):
        live = [s for s in range(batch) if slot_req[s] >= 0]
        proposals = {s: drafter.propose(s, hist[s], L[s], k) for s in live}
        for s in live:
            h, n = hist[s], L[s]
            acc = accepted(proposals[s], h, n, h.shape[0])
            L[s] = n + min(acc + 1, h.shape[0] - n)
            drafter.commit(s, h, n, L[s])
            out_tokens += L[s] - n
            steps += 1
        for s in live:
            if L[s] >= hist[s].shape[0]:
                drafter.finish(s, hist[s])
                admit(s)
    return out_tokens / steps


class Longest:
    """``ngram_propose`` as it is (one row per call; the corpus gets finished requests:
    it has no live store, so ``main`` runs it in the finished setting only)."""

    stores = ("finished",)

    def __init__(self, shared: bool, store: str, min_n: int = 2, max_n: int = 5):
        import torch

        from specdec_kernels.ops import corpus_append, new_corpus, ngram_propose

        self.torch, self.propose_op, self.append_op = torch, ngram_propose, corpus_append
        self.corpus = new_corpus(1 << 22, min_n=min_n, max_n=max_n) if shared else None
        self.min_n, self.max_n = min_n, max_n

    def admit(self, s, h, n):
        pass

    def propose(self, s, h, n, k):
        t = self.torch
        out = self.propose_op(
            t.from_numpy(h[None]), t.tensor([n], dtype=t.int32), min_n=self.min_n,
            max_n=self.max_n, num_speculative_tokens=k, corpus=self.corpus,
        )  # fmt: skip
        return out.draft_token_ids[0, : int(out.num_draft_tokens[0])].tolist()

    def commit(self, s, h, n0, n1):
        pass

    def finish(self, s, h):
        if self.corpus is not None:
            t = self.torch
            self.append_op(
                t.from_numpy(h[None]), t.tensor([h.shape[0]], dtype=t.int32),
                t.tensor([0], dtype=t.int32), corpus=self.corpus,
            )  # fmt: skip


class Suffix:
    """SuffixDecoding's trees: one per request (prompt + output) and one shared; the
    higher score wins, ties to the request's own (``SuffixDecodingCache.speculate``)."""

    def __init__(self, shared: bool, store: str, factor: float = 1.0, depth: int = 64):
        from arctic_inference.suffix_decoding._C import SuffixTree

        self.tree, self.depth, self.factor = SuffixTree, depth, factor
        self.shared, self.live = shared, store == "native"
        self.glob, self.local, self.seq, self.next_seq = SuffixTree(depth), {}, {}, 0

    def admit(self, s, h, n):
        self.local[s] = self.tree(self.depth)
        self.local[s].extend(0, h[:n].tolist())
        self.seq[s], self.next_seq = self.next_seq, self.next_seq + 1

    def propose(self, s, h, n, k):
        ctx = h[max(0, n - self.depth) : n].tolist()
        draft = self.local[s].speculate(ctx, k, self.factor, 0.0, 0.1, False)
        if self.shared:
            other = self.glob.speculate(ctx, k, self.factor, 0.0, 0.1, False)
            draft = other if other.score > draft.score else draft
        return list(draft.token_ids)

    def commit(self, s, h, n0, n1):
        self.local[s].extend(0, h[n0:n1].tolist())
        if self.shared and self.live:
            self.glob.extend(self.seq[s], h[n0:n1].tolist())

    def finish(self, s, h):
        del self.local[s]
        if self.shared and not self.live:
            self.glob.extend(self.seq[s], h.tolist())


def suffix_decoding_path() -> str | None:
    """The built peer's folder (``bench/baselines/suffix_decoding.sh``), or None if it
    cannot be built here."""
    script = Path(__file__).resolve().parent / "baselines" / "suffix_decoding.sh"
    env = dict(os.environ, PYTHON=sys.executable)
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    if run.returncode != 0:
        print(f"SuffixDecoding not built: {run.stderr.strip()[-500:]}", file=sys.stderr)
        return None
    return run.stdout.strip().splitlines()[-1]


def plot(rows, path: Path, title: str) -> None:
    """Grouped bars: tokens per step per drafter, one group per (k, setting)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = ("own history", "+ earlier, native", "+ earlier, finished")
    ks = sorted({k for _, k, _ in rows})
    labels = list(dict.fromkeys(label for label, _, _ in rows))
    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * len(ks) * len(settings), 4.5))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        xs, ys = [], []
        for g, (k, setting) in enumerate((k, s) for k in ks for s in range(len(settings))):
            for lab, kk, values in rows:
                if lab == label and kk == k:
                    xs.append(g + (i - (len(labels) - 1) / 2) * width)
                    ys.append(values[setting])
        ax.bar(xs, ys, width, label=label)
    groups = [f"k={k}\n{s}" for k in ks for s in settings]
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set_ylabel("tokens per step (greedy oracle)")
    ax.set_ylim(1.0, None)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stream", choices=["stdlib", "git", "botocore"], default="stdlib")
    p.add_argument("-k", type=int, nargs="+", default=[4])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument(
        "--requests", type=int, default=711, help="stdlib / botocore: modules / models replayed"
    )
    p.add_argument("--max-output", type=int, default=2048)
    p.add_argument("--factors", type=float, nargs="+", default=[1.0, 4.0])
    p.add_argument("--drafters", default="longest,suffix,frequency", help="which to run")
    p.add_argument(
        "--corpus-budget", type=int, nargs="+", default=[1 << 16],
        help="budget: the finished store's budgets in slots (tokens + one a document)",
    )  # fmt: skip
    p.add_argument(
        "--generations", type=int, nargs="+", default=[4],
        help="generations: how many tries the finished store's budget is split into",
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.stream == "stdlib":
        reqs = stdlib_requests(8, args.max_output, args.requests)
        name = f"stdlib modules (Python {sys.version.split()[0]}, first {len(reqs)} by path)"
    elif args.stream == "botocore":
        reqs = botocore_requests(14, args.max_output, args.requests)
        name = f"AWS API models ({BOTOCORE}, first {len(reqs)} by path)"
    else:
        reqs = git_requests(DEFAULT_COMMITS, args.max_output)
        name = f"code edits, git {DEFAULT_COMMITS}"
    chosen = set(args.drafters.split(","))
    known = {"longest", "suffix", "frequency", "adaptive", "compact", "trie", "budget", "op",
             "generations", "oracle"}  # fmt: skip
    if chosen - known:
        p.error(f"unknown drafters {sorted(chosen - known)}")
    drafters = [("longest", Longest, {})] if "longest" in chosen else []
    peer = suffix_decoding_path() if "suffix" in chosen else None
    if peer is not None:
        sys.path.append(peer)
        drafters += [(f"suffix f={f:g}", Suffix, {"factor": f}) for f in args.factors]
    positions = sum(len(prompt) + len(out) for _, prompt, out in reqs)
    for label, cls in (("frequency", Frequency), ("compact", Compact), ("trie", Trie)):
        if label in chosen:  # the same drafts from three structures, at every factor
            drafters += [
                (f"{label} f={f:g}", cls, {"factor": f, "shared_positions": positions})
                for f in args.factors
            ]
    if "budget" in chosen:
        drafters += [
            (f"trie f={f:g} budget {b}", TrieBudget, {"factor": f, "budget": b})
            for f in args.factors
            for b in args.corpus_budget
        ]
    if "generations" in chosen:
        drafters += [
            (f"trie f={f:g} {g} generations of {b // g}", TrieGenerations,
             {"factor": f, "budget": b, "generations": g})
            for f in args.factors
            for b in args.corpus_budget
            for g in args.generations
        ]  # fmt: skip
    if "op" in chosen:
        width = max(len(prompt) + len(out) for _, prompt, out in reqs)
        drafters += [
            (f"op f={f:g} budget {b}", FrequencyOp,
             {"factor": f, "rows": args.batch, "width": width, "budget": b})
            for f in args.factors
            for b in args.corpus_budget
        ]  # fmt: skip
    if "adaptive" in chosen:
        drafters.append(("frequency adaptive", Adaptive, {"shared_positions": positions}))
    if "oracle" in chosen:  # reads the truth: the bound of one-chain rules, not a drafter
        drafters.append(("oracle over m (bound)", TrieOracle, {"shared_positions": positions}))
    tokens = sum(len(o) for _, _, o in reqs)
    lines = [
        f"### {name}: {len(reqs)} requests, {tokens} output tokens, batch {args.batch}",
        "",
        "| drafter | k | own history | + earlier, native store | + earlier, finished store |",
        "|---|---|---|---|---|",
    ]
    rows = []
    for k in args.k:
        for label, cls, kw in drafters:
            t0 = time.perf_counter()
            stores = getattr(cls, "stores", ("native", "finished"))
            own = replay(reqs, cls(False, (*stores, "own")[0], **kw), batch=args.batch, k=k)
            native, finished = (
                replay(reqs, cls(True, store, **kw), batch=args.batch, k=k)
                if store in stores
                else float("nan")
                for store in ("native", "finished")
            )
            cells = " | ".join("n/a" if v != v else f"{v:.4f}" for v in (own, native, finished))
            row = f"| {label} | {k} | {cells} |"
            print(row, f"({time.perf_counter() - t0:.0f} s)", flush=True)
            lines.append(row)
            rows.append((label, k, (own, native, finished)))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        with open(args.out, "a") as f:
            f.write(text + "\n")
        plot(rows, args.out.with_name(f"{args.out.stem}-{args.stream}.png"), lines[0][4:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
