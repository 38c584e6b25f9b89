"""Benchmark inputs built from real text with real repetition.

Token histories for ``ngram_propose`` come from the Python standard library's own source
files, read from disk and cut into tokens by a small deterministic tokenizer (identifiers
and numbers, single punctuation characters, a newline with its indentation, runs of
spaces). Each token maps to ``crc32(token) % vocab_size``, so the ids are stable across
runs and machines with the same Python version. Source code repeats itself (keywords,
``self.``, call patterns, whole lines), which is what prompt lookup exploits; uniform random
ids would almost never match and would flatter or punish a proposer for the wrong reason.

Rejection-sampling inputs are synthetic but shaped like a model's: peaked logits (a few
likely tokens over a Gaussian floor), drafts that agree with the target's argmax about as
often as a good n-gram draft does, and draft probabilities close to the target's.
"""

from __future__ import annotations

import functools
import math
import re
import sys
import sysconfig
import zlib
from pathlib import Path

import numpy as np
import torch

_TOKEN_RE = re.compile(r"\w+|\n[ \t]*|[ \t]+|[^\w\s]")

DEFAULT_VOCAB = 32000
STREAM_TOKENS = 1 << 22  # 4M tokens: ~1.5 s to build, enough distinct text for 256 requests


def stdlib_sources() -> list[Path]:
    """The standard library's ``.py`` files, sorted by path (tests and site-packages skipped)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if rel and rel[0] in ("site-packages", "test", "idlelib", "lib2to3"):
            continue
        files.append(path)
    return files


def tokenize(text: str) -> list[str]:
    """Split source text into tokens; deterministic and lossless (tokens join back to text,
    except characters that are neither word, space nor punctuation, which are dropped)."""
    return _TOKEN_RE.findall(text)


@functools.lru_cache(maxsize=4)
def token_stream(num_tokens: int = STREAM_TOKENS, vocab_size: int = DEFAULT_VOCAB) -> np.ndarray:
    """The first ``num_tokens`` token ids of the concatenated standard-library sources.

    Returns int32 ``[num_tokens]``; files are concatenated in sorted path order and the
    stream wraps around if the library has fewer tokens (it has ~20M).
    """
    ids: list[int] = []
    cache: dict[str, int] = {}
    files = stdlib_sources()
    if not files:
        raise RuntimeError("no standard-library sources found; cannot build token streams")
    while len(ids) < num_tokens:
        for path in files:
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for tok in tokenize(text):
                tid = cache.get(tok)
                if tid is None:
                    tid = zlib.crc32(tok.encode()) % vocab_size
                    cache[tok] = tid
                ids.append(tid)
            if len(ids) >= num_tokens:
                break
    arr = np.asarray(ids[:num_tokens], dtype=np.int32)
    arr.setflags(write=False)
    return arr


def stream_description() -> str:
    """One line that says where the token streams come from (for result files)."""
    root = sysconfig.get_paths()["stdlib"]
    v = sys.version_info
    return (
        f"Python {v.major}.{v.minor}.{v.micro} standard library ({root}), "
        f"{len(stdlib_sources())} .py files in path order, regex tokenizer, "
        f"ids = crc32(token) % {DEFAULT_VOCAB}"
    )


def ngram_histories(
    batch: int, history: int, *, extra: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` token histories of ``history`` tokens each, cut from the stream.

    Request ``b`` takes the window starting at a deterministic, well spread offset, so
    rows differ (different files) but each row is one contiguous piece of real code.

    Returns
    -------
    token_ids : int32 ``[batch, history + extra]`` (the ``extra`` columns are zero, room to
        grow as an engine's persistent buffer has), num_tokens : int32 ``[batch]`` (all
        ``history``).
    """
    stream = token_stream()
    span = stream.shape[0] - history
    if span <= 0:
        raise ValueError(f"history {history} is longer than the token stream")
    # Golden-ratio stride: offsets spread evenly over the stream for any batch size.
    offsets = (np.arange(batch, dtype=np.int64) * int(span * 0.6180339887) + 7919) % span
    rows = np.zeros((batch, history + extra), dtype=np.int32)
    for b, off in enumerate(offsets):
        rows[b, :history] = stream[off : off + history]
    token_ids = torch.from_numpy(rows)
    num_tokens = torch.full((batch,), history, dtype=torch.int32)
    return token_ids, num_tokens


def verify_logits(
    batch: int,
    k: int,
    vocab: int,
    *,
    dtype: torch.dtype = torch.float32,
    mode: str = "greedy",
    seed: int = 0,
) -> dict:
    """Inputs of one ``rejection_sample`` call: every request has ``k`` drafts.

    ``mode`` is ``"greedy"`` (temperature None), ``"onehot"`` (sampled, no draft probs:
    an n-gram draft) or ``"probs"`` (sampled, with the draft model's probabilities).

    Logits: ``N(0, 1)`` floor plus 8 boosted tokens per row at ``log(V) + [0.5, 3.5)`` (a
    peaked next-token distribution: the largest probability is typically 0.2-0.4).
    Drafts: the row's argmax with probability 0.75 (so acceptance runs are 0 .. k long),
    else one of the other boosted tokens. Draft probs: softmax of the target logits plus noise.
    """
    if mode not in ("greedy", "onehot", "probs"):
        raise ValueError(f"unknown mode {mode!r}")
    gen = torch.Generator().manual_seed(seed)
    rows = batch * (k + 1)
    logits = torch.randn(rows, vocab, generator=gen)
    hot = torch.randint(0, vocab, (rows, 8), generator=gen)
    # log(V) + [0.5, 3.5): the boosted tokens hold most of the mass, as in a trained model
    boost = torch.rand(rows, 8, generator=gen) * 3.0 + 0.5 + math.log(vocab)
    logits.scatter_(1, hot, boost)
    n = batch * k
    row_of_draft = (torch.arange(n) // k) * (k + 1) + torch.arange(n) % k
    top = logits[row_of_draft].argmax(dim=1)
    other = hot[row_of_draft, torch.randint(0, 8, (n,), generator=gen)]
    agree = torch.rand(n, generator=gen) < 0.75
    drafts = torch.where(agree, top, other).to(torch.int32)
    out = {
        "target_logits": logits.to(dtype),
        "draft_token_ids": drafts,
        "cu_num_draft_tokens": torch.arange(0, n + 1, k, dtype=torch.int32),
        "num_speculative_tokens": k,
    }
    if mode != "greedy":
        out["temperature"] = torch.ones(batch, dtype=torch.float32)
        out["seeds"] = torch.arange(batch, dtype=torch.int64) * 1000003 + seed
        out["offsets"] = torch.full((batch,), 4096, dtype=torch.int64)
    if mode == "probs":
        noisy = logits[row_of_draft] + torch.randn(n, vocab, generator=gen) * 0.5
        out["draft_probs"] = torch.softmax(noisy, dim=-1)
    return out


def paged_state(
    batch: int,
    k: int,
    *,
    block_size: int = 16,
    max_model_len: int = 8192,
    seed: int = 0,
) -> dict:
    """A paged-KV engine state in decode: ragged lengths, a shuffled block table, drafts.

    Returns the persistent tensors (``token_ids``, ``num_tokens``, ``num_prompt_tokens``,
    ``block_table``) for ``R = batch`` state rows, a permuted ``req_indices`` (batch row ->
    state row), per-row drafts with ``0 .. k`` real entries, and a verify outcome
    (``output_token_ids`` ``[B, k+1]``, ``num_emitted``) shaped like ``rejection_sample``'s.
    """
    gen = torch.Generator().manual_seed(seed)
    R = batch
    max_blocks = max_model_len // block_size
    num_tokens = torch.randint(64, max_model_len - 2 * (k + 1), (R,), generator=gen).to(torch.int32)
    num_prompt = (num_tokens.float() * 0.8).to(torch.int32)
    # each row's history: its own code snippet, repeated (the content is irrelevant here)
    snippet = torch.from_numpy(token_stream()[: R * 64].copy()).view(R, 64)
    token_ids = snippet.repeat(1, max_model_len // 64).contiguous()
    perm = torch.randperm(R * max_blocks, generator=gen).to(torch.int32)
    block_table = perm.view(R, max_blocks).contiguous()
    req_indices = torch.randperm(R, generator=gen).to(torch.int32)
    num_drafts = torch.randint(0, k + 1, (batch,), generator=gen).to(torch.int32)
    slots = torch.arange(k)[None, :]
    drafts = torch.randint(0, DEFAULT_VOCAB, (batch, k), generator=gen).to(torch.int32)
    drafts = torch.where(slots < num_drafts[:, None], drafts, -1).to(torch.int32)
    num_emitted = (torch.randint(0, k + 1, (batch,), generator=gen) % (num_drafts + 1) + 1).to(
        torch.int32
    )
    out_slots = torch.arange(k + 1)[None, :]
    output = torch.randint(0, DEFAULT_VOCAB, (batch, k + 1), generator=gen).to(torch.int32)
    output = torch.where(out_slots < num_emitted[:, None], output, -1).to(torch.int32)
    stop = torch.full((batch, 4), -1, dtype=torch.int32)
    stop[:, 0] = 2  # an EOS id that shows up now and then in `output`
    stop[::3, 1] = output[::3, 0].clamp(min=0)  # a third of the rows stop on their first token
    # a fifth of the rows reach their max_tokens budget during this step
    max_tokens = torch.full((batch,), 4096, dtype=torch.int32)
    done_soon = req_indices[::5].long()
    max_tokens[::5] = num_tokens[done_soon] - num_prompt[done_soon] + 1
    return {
        "token_ids": token_ids,
        "num_tokens": num_tokens,
        "num_prompt_tokens": num_prompt,
        "block_table": block_table,
        "req_indices": req_indices,
        "draft_token_ids": drafts,
        "num_draft_tokens": num_drafts,
        "output_token_ids": output,
        "num_emitted": num_emitted,
        "stop_token_ids": stop,
        "min_tokens": torch.zeros(batch, dtype=torch.int32),
        "max_tokens": max_tokens,
        "block_size": block_size,
        "max_model_len": max_model_len,
        "k": k,
    }
