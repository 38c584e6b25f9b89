"""The example engine's draft policy: how many proposed drafts a request verifies.

``fixed`` verifies every proposed draft in a static ``B * (k + 1)`` pass (what a
CUDA-graph engine with a fixed k runs); ``none`` drafts nothing (plain decoding, the same
as ``k = 0``); ``adaptive`` (the default) verifies what ``plan_draft_lengths`` finds worth
its cost, in a pass sized to the plan. This module holds what the adaptive policy knows:
the acceptance estimates on the device, the cost model of the verify pass (measured at
start-up by :meth:`DraftPolicy.calibrate`, its intercept re-estimated from the engine's own
step times) and the host-side token budget of the next pass. The op calls themselves are
in ``examples/engine/step.py``.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections import deque

import torch

from examples.engine.kv_cache import PagedKVCache
from specdec_kernels.ops import compute_slot_mapping, new_acceptance_stats

DRAFT_POLICIES = ("none", "fixed", "adaptive")


def drafting_error(draft_policy, k, min_n, max_n, scoring, corpus_tokens) -> str | None:
    """What is wrong with an engine's drafting arguments, or None."""
    if draft_policy not in DRAFT_POLICIES:
        return f"draft_policy must be one of {DRAFT_POLICIES}, got {draft_policy!r}"
    if k < 0:
        return f"num_speculative_tokens must be >= 0, got {k}"
    if not 1 <= min_n <= max_n:
        return f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}"
    if scoring not in ("longest", "frequency"):
        return f"scoring must be 'longest' or 'frequency', got {scoring!r}"
    if scoring == "frequency" and not min_n < max_n <= 1024:
        return (
            f"scoring='frequency' needs min_n < max_n <= 1024 (max_n is the depth: context "
            f"plus drafts), got min_n={min_n}, max_n={max_n}"
        )
    if scoring == "frequency" and 0 < corpus_tokens < 8 * (min_n + 2):
        return f"a frequency corpus needs >= 8 (min_n + 2) slots, got {corpus_tokens}"
    return None


ACCEPTANCE_PRIOR = 0.8
"""The acceptance estimate of a newly admitted request (adaptive policy). Optimistic on
purpose: a position is only observed while the drafts before it match, so a request
throttled to few drafts keeps the prior at its deeper positions; a request whose drafts
do not match learns that at position 0 within a few steps and stops drafting."""


def theil_sen(grid: list[int], times: list[float]) -> tuple[float, float]:
    """``(a, b)`` of ``time = a + b * n`` by the Theil-Sen estimator (median of the pairwise
    slopes, then the median intercept), ``a, b >= 0``.

    Robust to a few passes a busy machine slowed down, where a piecewise table (or its
    running maximum) would carry one slow sample into every larger size and make drafts
    look dearer than they are.
    """
    g = torch.tensor(grid, dtype=torch.float64)
    t = torch.tensor(times, dtype=torch.float64)
    i, j = torch.triu_indices(len(grid), len(grid), offset=1)
    b = float(((t[j] - t[i]) / (g[j] - g[i])).median().clamp(min=0)) if len(grid) > 1 else 0.0
    a = max(float((t - b * g).median()), float(t.min()) * 1e-3)
    return a, b


class DraftPolicy:
    """The state of one engine's draft policy (see the module docstring).

    ``acceptance`` float32 ``[R, max_n, k]`` (``new_acceptance_stats``, one class per
    match length) and ``verify_cost`` float32 ``[R * (k + 1) + 1]`` (seconds of a verify
    pass of ``n`` tokens) are what ``plan_draft_lengths`` reads.
    """

    def __init__(self, name, *, k, num_rows, num_classes, device, verify_cost=None):
        self.name = name
        self.k = k
        self.R = num_rows
        self.adaptive = name == "adaptive" and k > 0
        self.acceptance = new_acceptance_stats(
            num_rows, k, num_classes=num_classes, prior=ACCEPTANCE_PRIOR, device=device
        )
        self.verify_cost = verify_cost
        self.device = device
        self.calibration_seconds = 0.0
        self.intercept = self.slope = None  # the cost model, set by calibrate()
        self._recent_share: deque[float] = deque(maxlen=4)  # drafts per request, last plans
        self._overheads: deque[float] = deque(maxlen=32)  # step time - slope * tokens

    def admit(self, row: int) -> None:
        """A new request in state row ``row`` starts from the prior."""
        self.acceptance[row] = ACCEPTANCE_PRIOR

    def start_run(self) -> None:
        self._recent_share.clear()
        self._overheads.clear()

    def _set_cost(self, intercept: float) -> None:
        n = torch.arange(self.R * (self.k + 1) + 1, dtype=torch.float64)
        self.verify_cost = (intercept + self.slope * n).float().to(self.device)

    def token_budget(self, batch: int) -> int:
        """Query tokens of the next adaptive verify pass, chosen on the host from the plans
        of recent steps (read back with each step's results, so it costs no extra read).

        Room for ``batch * share`` drafts, ``share`` the most drafts per request that any of
        the last 4 uncapped plans wanted (``k`` before the first): a plan that wants no
        drafts leads to a pass of ``batch`` tokens, plain decoding's, and a request whose
        drafts start to pay again (its estimates learn from the proposed drafts, verified
        or not) raises the next budget. A plan cut by the budget loses its lowest-gain
        drafts, the ones closest to not paying for themselves, so a tight budget costs
        little, while every padding row of a static ``batch * (k + 1)`` pass costs a
        verify token for nothing. Never more than ``verify_cost`` covers. A CUDA-graph
        engine would round this up to a captured size.
        """
        share = max(self._recent_share, default=self.k)
        most = min(batch * (self.k + 1), self.verify_cost.shape[0] - 1)
        return max(batch, min(most, batch + math.ceil(batch * share - 1e-9)))

    def after_step(self, wanted: list[int], n_query: int, seconds: float) -> None:
        """Learn from a step: what its uncapped plan wanted, and what the step cost.

        The intercept of the cost model is the median of ``step time - slope * tokens``
        over the last 32 steps (the proposal, sampling, commit and the host read cost the
        same with or without drafts, so the forward alone underestimates a step).
        """
        if not self.adaptive:
            return
        self._recent_share.append(sum(wanted) / len(wanted))
        if self.slope is None:
            return
        self._overheads.append(seconds - self.slope * n_query)
        a = statistics.median(self._overheads)
        if abs(a - self.intercept) > 0.05 * self.intercept:
            self.intercept = max(a, 1e-6)
            self._set_cost(self.intercept)

    @torch.inference_mode()
    def calibrate(self, engine, *, context_len: int = 256, repeats: int = 5) -> torch.Tensor:
        """Measure the verify pass of ``engine``'s model on this machine; the cost table.

        Times ``Llama.forward`` (logits included) of a full batch, ``R`` requests of
        ``context_len`` cached tokens each, over ``n`` query tokens for 7 values of ``n``
        from ``R`` to ``R * (k + 1)`` laid out as the engine lays out a verify pass (the
        fastest of ``repeats`` after a warm-up), and fits ``a + b * n`` (Theil-Sen):
        ``verify_cost[n]`` in seconds, non-decreasing. The planner compares passes over
        one batch, so ``b`` must be what one more verified draft costs; passes over fewer
        requests are left out because each request adds its attention over the cache,
        which a draft does not (mixing them in once doubled ``b`` and throttled the
        drafts). Uses the engine's KV blocks, so call it between ``generate`` calls.
        """
        t_start = time.perf_counter()
        R, k, dev, bs = self.R, self.k, self.device, engine.block_size
        ctx = max(1, min(context_len, engine.max_model_len - k - 1))
        grid = sorted({R + round(i * R * k / 6) for i in range(7)})
        blocks = engine.cache.allocator.allocate(R * PagedKVCache.blocks_needed(ctx + k + 1, bs))
        table = torch.tensor(blocks, dtype=torch.int32, device=dev).view(R, -1)
        times = []
        try:
            for n in grid:
                lens = [n // R + (1 if b < n % R else 0) for b in range(R)]
                pos = torch.cat([torch.arange(ctx, ctx + m, device=dev) for m in lens])
                qsl = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=dev)
                slots = compute_slot_mapping(
                    table, pos, qsl, block_size=bs, max_model_len=engine.max_model_len
                )
                ids = torch.zeros(n, dtype=torch.int32, device=dev)
                samples = []
                for rep in range(repeats + 1):  # the first is a warm-up
                    t0 = time.perf_counter()
                    engine.model.forward(
                        ids, pos, slots, qsl, table, engine.cache,
                        max_query_len=min(k + 1, n - R + 1), max_seq_len=ctx + k + 1,
                    )  # fmt: skip
                    if rep:
                        samples.append(time.perf_counter() - t0)
                times.append(min(samples))
        finally:
            engine.cache.allocator.free(blocks)
        self.intercept, self.slope = theil_sen(grid, times)
        self._set_cost(self.intercept)
        self.calibration_seconds = time.perf_counter() - t_start
        return self.verify_cost
