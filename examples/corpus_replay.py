"""Own-history index vs + shared corpus, replayed on real text with a perfect greedy oracle.

Two reproducible request streams (``--stream``):

- ``stdlib``: the running interpreter's standard-library modules in path order (tests
  excluded, ``bench/data.py``'s file list and tokenizer); each module is a request whose
  prompt is its first ``--prompt-lines`` lines and whose output is the rest of the module
  (at most ``--max-output`` tokens). Modules of a package follow each other, so requests
  resemble each other the way an agent's or a code assistant's do.
- ``git``: a code-edit stream from this repository's own history over a pinned commit range
  (``--commits``, default ``f8d699e..4916f35``): for every ``.py`` file a commit modified,
  the prompt is the old version and the output the new one.

Each stream is decoded twice, ``--batch`` requests at a time, admitted in order: with the
own-history index only (``ngram_propose`` with an index and no corpus: exactly the
drafts of a scan), then with the shared corpus, to which every finished request
(prompt + output) is appended. Per step the oracle accepts the longest draft prefix that
equals the true continuation and emits one more token, as greedy verification would. The
report gives tokens per step (output tokens / decode steps) for both, over the whole
stream and per fifth of the stream in admission order (the corpus warms up).

Run: ``python examples/corpus_replay.py --stream stdlib`` (about a minute on one core),
``--stream git``; ``--out FILE.md`` appends the tables to a file.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import zlib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import data  # noqa: E402
from specdec_kernels.ops import (  # noqa: E402
    corpus_append,
    new_corpus,
    new_ngram_index,
    ngram_index_build,
    ngram_index_extend,
    ngram_propose,
)

DEFAULT_COMMITS = "f8d699e..4916f35"


def _ids(text: str, cache: dict[str, int]) -> list[int]:
    out = []
    for tok in data.tokenize(text):
        tid = cache.get(tok)
        if tid is None:
            tid = cache[tok] = zlib.crc32(tok.encode()) % data.DEFAULT_VOCAB
        out.append(tid)
    return out


def stdlib_requests(prompt_lines: int, max_output: int, count: int):
    """(name, prompt ids, output ids) for the first ``count`` modules in path order."""
    root = Path(data.stdlib_sources()[0]).parent
    cache: dict[str, int] = {}
    reqs = []
    for path in data.stdlib_sources():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        lines = text.splitlines(keepends=True)
        if len(lines) <= prompt_lines + 5:
            continue
        prompt = _ids("".join(lines[:prompt_lines]), cache)
        output = _ids("".join(lines[prompt_lines:]), cache)[:max_output]
        reqs.append((str(path.relative_to(root)), prompt, output))
        if len(reqs) == count:
            break
    return reqs


def git_requests(commits: str, max_output: int):
    """(name, old version ids, new version ids) for every .py file a commit modified."""
    cache: dict[str, int] = {}

    def git(*args):
        return subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
        ).stdout

    reqs = []
    for c in git("rev-list", "--reverse", commits).split():
        names = git("diff-tree", "--no-commit-id", "-r", "--diff-filter=M", "--name-only", c)
        for name in sorted(n for n in names.split() if n.endswith(".py")):
            old = _ids(git("show", f"{c}^:{name}"), cache)[:max_output]
            new = _ids(git("show", f"{c}:{name}"), cache)[:max_output]
            reqs.append((f"{c[:7]}:{name}", old, new))
    return reqs


def replay(reqs, *, batch, k, min_n, max_n, corpus_tokens, use_corpus):
    """Decode every request with the oracle; returns per-request (output tokens, steps,
    accepted drafts, accepted drafts that came from the corpus)."""
    B = batch
    width = max(len(p) + len(o) for _, p, o in reqs) + 1
    truth = torch.full((B, width), -1, dtype=torch.int32)
    token_ids = torch.zeros((B, width), dtype=torch.int32)
    num_tokens = torch.zeros(B, dtype=torch.int32)
    total = torch.zeros(B, dtype=torch.int32)
    slot_req = [-1] * B
    index = new_ngram_index(B, width, min_n=min_n, max_n=max_n)
    corpus = new_corpus(corpus_tokens, min_n=min_n, max_n=max_n) if use_corpus else None
    stats = [[0, 0, 0, 0] for _ in reqs]
    nxt = 0

    def admit(slots):
        nonlocal nxt
        taken = []
        for s in slots:
            if nxt >= len(reqs):
                slot_req[s] = -1
                continue
            _, p, o = reqs[nxt]
            seq = torch.tensor(p + o, dtype=torch.int32)
            truth[s] = -1
            truth[s, : seq.numel()] = seq
            token_ids[s, : len(p)] = seq[: len(p)]
            num_tokens[s] = len(p)
            total[s] = seq.numel()
            stats[nxt][0] = len(o)
            slot_req[s] = nxt
            nxt += 1
            taken.append(s)
        if taken:
            ngram_index_build(
                token_ids, num_tokens, torch.tensor(taken, dtype=torch.int32), index=index
            )

    admit(range(B))
    j = torch.arange(k)
    e = torch.arange(k + 1)
    while any(r >= 0 for r in slot_req):
        live = torch.tensor([r >= 0 for r in slot_req])
        req = torch.where(live, torch.arange(B), -1).to(torch.int32)
        out = ngram_propose(
            token_ids, num_tokens, req, min_n=index.min_n, max_n=index.max_n,
            num_speculative_tokens=k, index=index, corpus=corpus,
        )  # fmt: skip
        L = num_tokens.long()
        pos = (L[:, None] + j).clamp(max=width - 1)
        match = (out.draft_token_ids == truth.gather(1, pos)) & (j < out.num_draft_tokens[:, None])
        accepted = match.int().cumprod(1).sum(1)
        emitted = torch.minimum(accepted + 1, total - num_tokens) * live
        cols = (L[:, None] + e).clamp(max=width - 1)
        keep = e < emitted[:, None]
        rows = torch.arange(B)[:, None].expand_as(cols)
        token_ids[rows[keep], cols[keep]] = truth[rows[keep], cols[keep]]
        num_tokens += emitted.int()
        ngram_index_extend(token_ids, num_tokens, req, index=index)
        from_corpus = out.draft_source == 2
        for s in live.nonzero()[:, 0].tolist():
            st = stats[slot_req[s]]
            st[1] += 1
            st[2] += int(accepted[s])
            st[3] += int(accepted[s]) if bool(from_corpus[s]) else 0
        done = [s for s in range(B) if slot_req[s] >= 0 and num_tokens[s] >= total[s]]
        if done:
            if corpus is not None:  # finished requests join the corpus, in row order
                corpus_append(
                    token_ids, num_tokens, torch.tensor(done, dtype=torch.int32), corpus=corpus
                )
            admit(done)
    return stats


def _summary(stats, lo, hi):
    out = sum(s[0] for s in stats[lo:hi])
    steps = sum(s[1] for s in stats[lo:hi])
    corpus = sum(s[3] for s in stats[lo:hi])
    return out / max(steps, 1), corpus / max(out, 1)


def report(name, reqs, own, both, args, seconds) -> str:
    n = len(reqs)
    tokens = sum(len(o) for _, _, o in reqs)
    lines = [
        f"### {name}: {n} requests, {tokens} output tokens",
        "",
        f"k = {args.k}, n in [{args.min_n}, {args.max_n}], batch {args.batch}, corpus "
        f"{args.corpus_tokens} tokens, greedy oracle; replay took {seconds:.0f} s.",
        "",
        "| requests (admission order) | own history tokens/step | + corpus tokens/step | ratio "
        "| accepted from corpus (share of output) |",
        "|---|---|---|---|---|",
    ]
    cuts = [round(n * q / 5) for q in range(6)]
    rows = [(f"{lo + 1}-{hi}", lo, hi) for lo, hi in zip(cuts, cuts[1:], strict=False)]
    rows.append(("all", 0, n))
    for label, lo, hi in rows:
        a, _ = _summary(own, lo, hi)
        b, share = _summary(both, lo, hi)
        lines.append(f"| {label} | {a:.2f} | {b:.2f} | {b / a:.2f}x | {share:.1%} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stream", choices=["stdlib", "git"], default="stdlib")
    p.add_argument("-k", type=int, default=4)
    p.add_argument("--min-n", type=int, default=2)
    p.add_argument("--max-n", type=int, default=5)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--requests", type=int, default=240, help="stdlib: modules replayed")
    p.add_argument("--prompt-lines", type=int, default=8)
    p.add_argument("--max-output", type=int, default=2048, help="tokens per output (and prompt)")
    p.add_argument("--commits", default=DEFAULT_COMMITS, help="git: pinned commit range")
    p.add_argument("--corpus-tokens", type=int, default=1 << 20)
    p.add_argument("--out", type=Path, default=None, help="append the table to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.stream == "stdlib":
        reqs = stdlib_requests(args.prompt_lines, args.max_output, args.requests)
        name = f"stdlib modules ({sys.version.split()[0]}, first {len(reqs)} by path)"
    else:
        reqs = git_requests(args.commits, args.max_output)
        name = f"code edits, git {args.commits}"
    if not reqs:
        print("error: no requests in this stream", file=sys.stderr)
        return 1
    kw = dict(
        batch=args.batch,
        k=args.k,
        min_n=args.min_n,
        max_n=args.max_n,
        corpus_tokens=args.corpus_tokens,
    )
    t0 = time.perf_counter()
    own = replay(reqs, use_corpus=False, **kw)
    both = replay(reqs, use_corpus=True, **kw)
    text = report(name, reqs, own, both, args, time.perf_counter() - t0)
    print(text)
    if args.out is not None:
        with open(args.out, "a") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
