"""Numba n-gram proposer: one KMP pass per request, requests in parallel (``prange``).

This is the kind of proposer a CPU-side engine runs (vLLM's V1 n-gram proposer matches the
reversed history with a KMP prefix function under ``numba.njit(parallel=True)``); the code
here is written from the algorithm, not copied, and follows docs/design.md's semantics exactly
so its drafts can be compared with ``ngram_propose`` token for token.

Reverse the history: ``rev[x] = seq[L-1-x]``. The suffix n-gram ``seq[L-n:L]`` reversed is
the prefix ``rev[:n]``, and an occurrence ``seq[i:i+n]`` of it (``i <= L-n-1``) is an
occurrence of ``rev[:n]`` ending at ``p = L-1-i >= n`` in ``rev``. So one KMP scan of the
text ``rev[1:]`` for the pattern ``rev[:P]`` (``P = min(max_n, L-1)``) gives, at every ``p``,
the longest suffix n-gram (up to ``P``) that starts at ``i = L-1-p``. The largest state over
the scan is the longest matching ``n``; among the positions that reach it, the last ``p``
is the smallest ``i`` (``tie_break="first"``) and the first ``p`` the largest (``"last"``).
The pattern is at most ``max_n`` tokens, so the prefix table is tiny and the scan is one
sequential read of the history, O(L) per request.
"""

from __future__ import annotations

import os
import types

import numba
import numpy as np

# numba's OpenMP layer can bring a second OpenMP runtime into a process that already has
# torch's, two thread pools competing for the same cores; the work-queue layer is numba's
# own pool. NUMBA_THREADING_LAYER overrides this choice.
if os.environ.get("NUMBA_THREADING_LAYER", "workqueue") == "workqueue":
    numba.config.THREADING_LAYER = "workqueue"


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _propose_row(seq, length, min_n, max_n, tie_last, cap, out):
    """Write the drafts of one history into ``out`` (pre-filled with -1); return their count."""
    P = min(max_n, length - 1)
    if P < min_n or cap <= 0:
        return 0
    last = length - 1
    lps = np.zeros(P, dtype=np.int64)
    q = 0
    for x in range(1, P):  # prefix function of the pattern rev[:P]
        c = seq[last - x]
        while q > 0 and c != seq[last - q]:
            q = lps[q - 1]
        if c == seq[last - q]:
            q += 1
        lps[x] = q
    best = 0
    best_p = -1
    q = 0
    for p in range(1, length):  # scan the text rev[1:]
        c = seq[last - p]
        while q > 0 and c != seq[last - q]:
            q = lps[q - 1]
        if c == seq[last - q]:
            q += 1
        if q > best or (q == best and q > 0 and not tie_last):
            best = q
            best_p = p
        if q == P:
            if tie_last:
                break  # the most recent window of the longest possible n
            q = lps[q - 1]
    if best < min_n:
        return 0
    start = last - best_p + best  # i + n: the token after the matched window
    m = min(cap, length - start)
    for t in range(m):
        out[t] = seq[start + t]
    return m


def _propose_batch_py(token_ids, num_tokens, rows, caps, min_n, max_n, k, max_model_len, tie_last):
    B = rows.shape[0]
    drafts = np.full((B, k), -1, dtype=np.int32)
    counts = np.zeros(B, dtype=np.int32)
    for b in numba.prange(B):
        r = rows[b]
        if r < 0:
            continue
        length = num_tokens[r]
        cap = min(k, caps[b])
        if max_model_len > 0:
            cap = min(cap, max_model_len - length)
        counts[b] = _propose_row(token_ids[r], length, min_n, max_n, tie_last, cap, drafts[b])
    return drafts, counts


def _renamed(fn, name: str):
    """``fn``'s code under another name. numba's disk cache names an entry by the function's
    qualified name and signature, not by its ``parallel`` flag: two builds of one function
    would load each other's machine code (the serial build then ran the parallel one, whose
    one-thread launch on the work-queue pool cost ~250 us a call instead of ~10 us)."""
    return types.FunctionType(
        fn.__code__.replace(co_name=name, co_qualname=name), fn.__globals__, name
    )


_OPTS = {"cache": True, "nogil": True, "boundscheck": False}
# Parallel over requests; the serial build (same code, prange runs as range) is used when
# numba is limited to one thread, so no worker threads run beside the timed thread.
_propose_batch_parallel = numba.njit(parallel=True, **_OPTS)(_propose_batch_py)
_propose_batch_serial = numba.njit(parallel=False, **_OPTS)(
    _renamed(_propose_batch_py, "_propose_batch_serial_py")
)


def ngram_propose_numba(
    token_ids: np.ndarray,
    num_tokens: np.ndarray,
    req_indices: np.ndarray | None = None,
    *,
    min_n: int,
    max_n: int,
    num_speculative_tokens: int,
    max_model_len: int | None = None,
    max_draft_tokens: np.ndarray | None = None,
    tie_break: str = "first",
) -> tuple[np.ndarray, np.ndarray]:
    """Same arguments and results as ``ngram_propose``, on numpy arrays (int32).

    Returns ``(drafts int32 [B, k] padded with -1, num_drafts int32 [B])``.
    """
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    rows = np.arange(B, dtype=np.int32) if req_indices is None else req_indices
    caps = (
        np.full(B, num_speculative_tokens, dtype=np.int32)
        if max_draft_tokens is None
        else max_draft_tokens
    )
    batch_fn = _propose_batch_parallel if numba.get_num_threads() > 1 else _propose_batch_serial
    return batch_fn(
        token_ids,
        num_tokens,
        rows,
        caps,
        min_n,
        max_n,
        num_speculative_tokens,
        0 if max_model_len is None else max_model_len,
        tie_break == "last",
    )
