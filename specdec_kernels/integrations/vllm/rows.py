"""Which request holds each of vLLM's persistent-batch rows, read from the rows themselves.

vLLM passes a ``custom_class`` proposer no request ids, and between steps it admits
requests into rows, condenses (moves the last rows into holes), swaps rows, and removes
preempted or unscheduled requests (to re-add them later, maybe elsewhere). The proposer's
own-history index must follow: a row is **the same request as last step** iff its length
did not shrink and its first ``SIGNATURE`` tokens and the ``SIGNATURE`` tokens before the
length indexed last step are those it had then; it is then extended with its new tokens,
and rebuilt from vLLM's buffer otherwise (admission, a moved, swapped or resumed request).
A different request that passes the check has the same tokens at both ends of the indexed
history and the same length; its drafts could then be another occurrence's (only ever a
draft: verification keeps every output exact). One numba call per step (two with
histories), O(new tokens + ``SIGNATURE``) per row.

With a corpus, the tracker also keeps a copy of every row's history (what vLLM's buffer
may have overwritten by the time a request is seen to have left) and reports the
histories of the requests that left (not those that only moved to another row): the
caller decides which are finished documents.
"""

from __future__ import annotations

import numba
import numpy as np

SIGNATURE = 16
"""Tokens compared at each end of a row's indexed history."""

_njit = numba.njit(cache=True, nogil=True, boundscheck=False)
"""The row tracker's kernels: cached, GIL released, like the library's CPU kernels."""


@_njit
def _track(token_ids, num_tokens, B, seen, head, tail, state):
    """``state[r]``: 0 unchanged, 1 extend, 2 rebuild (rows < B: the caller treats a
    rebuilt row that held a request as that request having left; its old history is still
    in ``histories``); 3 left (rows >= B that held a request)."""
    R, W = token_ids.shape
    S = head.shape[1]
    for r in range(seen.shape[0]):
        state[r] = 0
        if r >= B:
            if seen[r] > 0:
                state[r] = 3
            continue
        L = min(max(np.int64(num_tokens[r]), 0), W)
        n = seen[r]
        same = 0 <= n <= L
        if same:
            h = min(S, n)
            for t in range(h):
                if token_ids[r, t] != head[r, t] or token_ids[r, n - h + t] != tail[r, t]:
                    same = False
                    break
        if same:
            state[r] = 1 if L > n else 0
        else:
            state[r] = 2
        h = min(S, L)
        for t in range(h):
            head[r, t] = token_ids[r, t]
            tail[r, t] = token_ids[r, L - h + t]


@_njit
def _in_batch(token_ids, num_tokens, B, h):
    """Whether a row of this step's batch continues history ``h`` (at least as long, the
    same ``SIGNATURE`` tokens at its start and before ``len(h)``): a request that only
    moved (condense, swap), not one that left."""
    n = h.shape[0]
    s = min(SIGNATURE, n)
    for b in range(B):
        if min(np.int64(num_tokens[b]), token_ids.shape[1]) < n:
            continue
        same = True
        for t in range(s):
            if token_ids[b, t] != h[t] or token_ids[b, n - s + t] != h[n - s + t]:
                same = False
                break
        if same:
            return True
    return False


@_njit
def _copy_new(token_ids, num_tokens, B, seen, histories, state):
    for r in range(B):
        L = min(max(np.int64(num_tokens[r]), 0), token_ids.shape[1])
        lo = 0 if state[r] == 2 else seen[r]
        for t in range(max(lo, 0), L):
            histories[r, t] = token_ids[r, t]


class RowTracker:
    """The indexed length and the end tokens of every row, for ``R`` rows of ``L`` tokens."""

    def __init__(self, R: int, L: int, *, keep_histories: bool):
        self.seen = np.full(R, -1, dtype=np.int64)  # indexed length; -1: no request
        self.head = np.zeros((R, SIGNATURE), dtype=np.int32)
        self.tail = np.zeros((R, SIGNATURE), dtype=np.int32)
        self.histories = np.zeros((R, L), dtype=np.int32) if keep_histories else None
        self.state = np.zeros(R, dtype=np.int8)

    def update(self, token_ids: np.ndarray, num_tokens: np.ndarray, B: int):
        """Rows ``0 .. B-1`` hold this step's requests. Returns ``(rebuild, extend, left)``:
        the rows to index from scratch and to extend (int32 arrays), and the histories of
        the requests that left (only with ``keep_histories``): no longer in any row of the
        batch (a request that moved to another row has not left)."""
        seen, state = self.seen, self.state
        _track(token_ids, num_tokens, B, seen, self.head, self.tail, state)
        rebuild = np.flatnonzero(state == 2).astype(np.int32)
        extend = np.flatnonzero(state == 1).astype(np.int32)
        left = []
        if self.histories is not None:
            gone = np.flatnonzero((state == 3) | ((state == 2) & (seen > 0)))
            left = [self.histories[r, : seen[r]].copy() for r in gone]
            left = [h for h in left if not _in_batch(token_ids, num_tokens, B, h)]
            _copy_new(token_ids, num_tokens, B, seen, self.histories, state)
        seen[:B] = np.minimum(np.maximum(num_tokens[:B], 0), token_ids.shape[1])
        seen[B:] = -1
        return rebuild, extend, left
