"""Prompt-lookup drafting on real source text, with a greedy oracle as the "model".

Each request is one of this library's own source files, tokenized into ids by a small
regex tokenizer. Decoding is simulated with a perfect oracle (the text itself): at each
step ``ngram_propose`` drafts up to k tokens from the request's committed history, the
oracle accepts the longest prefix that matches the true continuation and emits one more
token (the recovered/bonus token), and the step commits ``accepted + 1`` tokens. The
mean tokens per step is the most a greedy verifier could gain from n-gram drafting on
this text.

Run: ``python examples/ngram_demo.py [-k 4] [--min-n 2] [--max-n 5] [--prefix 64]``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

from specdec_kernels.ops import ngram_propose

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [
    "ops/ngram.py",
    "specdec_kernels/cpu/ngram.py",
    "specdec_kernels/kernels/ngram.py",
    "tests/test_ngram.py",
]
TOKEN = re.compile(r"\w+|\s+|[^\w\s]")


def tokenize(texts: list[str]) -> tuple[list[list[int]], list[str]]:
    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(w, len(vocab)) for w in TOKEN.findall(t)] for t in texts]
    return ids, list(vocab)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=4)
    p.add_argument("--min-n", type=int, default=2)
    p.add_argument("--max-n", type=int, default=5)
    p.add_argument("--prefix", type=int, default=64, help="tokens given as the prompt")
    args = p.parse_args(argv)
    try:
        texts = [(ROOT / s).read_text() for s in SOURCES]
    except OSError as e:
        print(
            f"error: cannot read the embedded source text ({e}); run from a checkout",
            file=sys.stderr,
        )
        return 1
    ids, vocab = tokenize(texts)
    B, width = len(ids), max(len(x) for x in ids)
    truth = torch.full((B, width), -1, dtype=torch.int32)
    for b, x in enumerate(ids):
        truth[b, : len(x)] = torch.tensor(x, dtype=torch.int32)
    total = torch.tensor([len(x) for x in ids], dtype=torch.int32)

    token_ids = torch.zeros((B, width), dtype=torch.int32)  # committed history only
    num_tokens = torch.minimum(total, torch.tensor(args.prefix, dtype=torch.int32))
    token_ids[:, : args.prefix] = truth[:, : args.prefix]
    steps = torch.zeros(B, dtype=torch.long)
    accepted_total = torch.zeros(B, dtype=torch.long)
    k = args.num_speculative_tokens
    shown = 0
    try:
        while bool((num_tokens < total).any()):
            live = num_tokens < total
            out = ngram_propose(
                token_ids,
                num_tokens,
                min_n=args.min_n,
                max_n=args.max_n,
                num_speculative_tokens=k,
                max_model_len=width,
            )
            j = torch.arange(k)
            pos = (num_tokens.long()[:, None] + j).clamp(max=width - 1)
            match = (out.draft_token_ids == truth.gather(1, pos)) & (
                j < out.num_draft_tokens[:, None]
            )
            accepted = match.int().cumprod(1).sum(1)
            emitted = torch.minimum(accepted + 1, total - num_tokens) * live
            for b in range(B):  # commit: copy the true tokens (the oracle's output)
                L, e = int(num_tokens[b]), int(emitted[b])
                token_ids[b, L : L + e] = truth[b, L : L + e]
            if shown < 3 and int(accepted.max()) >= 3:
                b = int(accepted.argmax())
                d = out.draft_token_ids[b, : int(out.num_draft_tokens[b])].tolist()
                print(
                    f"[{SOURCES[b]} @ {int(num_tokens[b])}] drafts "
                    f"{''.join(vocab[i] for i in d)!r}: {int(accepted[b])} accepted"
                )
                shown += 1
            num_tokens += emitted.int()
            steps += live
            accepted_total += accepted * live
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    print(f"\nn-gram drafting with k={k}, n in [{args.min_n}, {args.max_n}], greedy oracle")
    print(
        f"{'source':40s} {'tokens':>7s} {'steps':>6s} {'accepted/step':>14s} {'tokens/step':>12s}"
    )
    for b in range(B):
        new = int(total[b]) - min(args.prefix, int(total[b]))
        s = max(int(steps[b]), 1)
        print(
            f"{SOURCES[b]:40s} {new:7d} {s:6d} {int(accepted_total[b]) / s:14.2f} {new / s:12.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
