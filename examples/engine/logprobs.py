"""Per-token logprobs of the example engine (``SamplingParams.logprobs = N``, vLLM's name):
the committed tokens' own logprob and rank and the top N of their rows, from
``top_logprobs`` in the engine's ``logprobs_mode`` (vLLM's four settings), kept on the device
per state row and read back once per finished request.
"""

from __future__ import annotations

import torch

from specdec_kernels.ops import top_logprobs


class LogprobsBuffer:
    """Device buffers ``[R, max_model_len + 1, ...]`` indexed by token position; column
    ``max_model_len`` takes the writes of slots that committed nothing."""

    def __init__(self, R: int, max_model_len: int, N: int, device, mode: str = "raw_logprobs"):
        L = max_model_len + 1
        self.N, self.trash, self.mode = N, max_model_len, mode
        self.processed = mode.startswith("processed")
        self.token_lp = torch.zeros((R, L), dtype=torch.float32, device=device)
        self.rank = torch.zeros((R, L), dtype=torch.int32, device=device)
        self.ids = torch.full((R, L, N), -1, dtype=torch.int32, device=device)
        self.values = torch.zeros((R, L, N), dtype=torch.float32, device=device)

    def record(self, logits, cu, rs, num_committed, req_indices, start, **sampling) -> None:
        """Store the step's committed slots: slot ``j < num_committed[b]`` is the token at
        position ``start[b] + j`` of state row ``req_indices[b]`` (no host read). ``logits``:
        the raw rows, or in the processed modes the processed ones; ``sampling``: the
        temperature and filters ``rejection_sample`` took."""
        lp = top_logprobs(logits, rs.output_token_ids, rs.num_emitted, cu, num_logprobs=self.N,
                          logprobs_mode=self.mode, validate=False, **sampling)  # fmt: skip
        B, K1 = rs.output_token_ids.shape
        j = torch.arange(K1, device=cu.device)
        pos = start.long()[:, None] + j
        pos = torch.where(j < num_committed[:, None], pos, self.trash).clamp(max=self.trash)
        rows = req_indices.long()[:, None].expand(B, K1)
        self.token_lp[rows, pos] = lp.token_logprobs
        self.rank[rows, pos] = lp.token_ranks
        self.ids[rows, pos] = lp.top_token_ids
        self.values[rows, pos] = lp.top_logprobs

    def take(self, row: int, start: int, end: int) -> tuple[torch.Tensor, ...]:
        """Copies of positions ``start .. end - 1`` of a state row (on the device: the row
        is reused once its request finishes)."""
        return tuple(t[row, start:end].clone() for t in (self.token_lp, self.rank, self.ids,
                                                          self.values))  # fmt: skip


def as_lists(taken: tuple[torch.Tensor, ...], n: int) -> list[tuple]:
    """``(logprob, rank, {id: logprob} of the top n)`` per token of :meth:`LogprobsBuffer.take`."""
    lp, rank, ids, values = (t.tolist() for t in taken)
    return [
        (a, r, dict(zip(i[:n], v[:n], strict=True)))
        for a, r, i, v in zip(lp, rank, ids, values, strict=True)
    ]
