"""A batched decoding engine whose every decode step is made of specdec-kernels ops.

Requests of different prompt lengths are admitted into free state rows as others finish
(continuous batching). Admission fills the KV cache for the prompt minus its last token
(prefill); from then on every step is the same sequence of library calls::

    ngram_propose [-> plan_draft_lengths] -> prepare_verify_inputs -> model forward
        -> rejection_sample -> commit_accepted_tokens [-> update_acceptance_stats]

with ``k = 0`` (no speculation) running the same ops. The draft policy decides how many
of the proposed drafts a request verifies: ``fixed`` all of them, ``none`` none (plain
decoding), ``adaptive`` what ``plan_draft_lengths`` finds worth its cost, from a cost
table of the verify pass the engine measures on its own model (:meth:`Engine.calibrate`)
and acceptance estimates it keeps on the device. The step has no
Python loop over tokens and reads exactly one small tensor back to the host (the new
lengths, committed counts and finish reasons, which the host needs to allocate KV blocks
and retire requests). Output tokens stay on the device until the run ends.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from examples.engine.kv_cache import PagedKVCache
from examples.engine.llama import Llama
from specdec_kernels.ops import (
    FINISH_REASON_NAMES,
    commit_accepted_tokens,
    compute_slot_mapping,
    corpus_append,
    new_acceptance_stats,
    new_corpus,
    new_ngram_index,
    ngram_index_build,
    ngram_index_extend,
    ngram_index_propose,
    ngram_propose,
    plan_draft_lengths,
    prepare_verify_inputs,
    rejection_sample,
    sampling_offsets,
    update_acceptance_stats,
)

DRAFT_POLICIES = ("none", "fixed", "adaptive")
ACCEPTANCE_PRIOR = 0.8
"""The acceptance estimate of a newly admitted request (adaptive policy). Optimistic on
purpose: a position is only observed while the drafts before it match, so a request
throttled to few drafts keeps the prior at its deeper positions; a request whose drafts
do not match learns that at position 0 within a few steps and stops drafting."""


@dataclass
class SamplingParams:
    """Per-request decoding parameters (``temperature = 0``: greedy)."""

    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


@dataclass
class Completion:
    index: int
    prompt_len: int
    token_ids: list[int]
    finish_reason: str
    steps: int


@dataclass
class RunStats:
    """Counters of one :meth:`Engine.generate` call."""

    steps: int = 0
    """decode steps (forward passes over the running batch), prefill not counted"""
    request_steps: int = 0
    """sum over steps of the number of requests in the step"""
    tokens: int = 0
    """output tokens committed"""
    drafts: int = 0
    """draft tokens proposed"""
    verified: int = 0
    """draft tokens verified (the plan's choice; = drafts unless the policy is adaptive)"""
    query_tokens: int = 0
    """query tokens the verify passes ran, padding rows included (static ``B * (k + 1)``
    per step unless the policy is adaptive, whose passes are sized to its plans)"""
    accepted: int = 0
    """draft tokens accepted by the verifier and committed"""
    prefill_tokens: int = 0
    seconds: float = 0.0
    """wall time of the whole call"""
    prefill_seconds: float = 0.0
    """part of it spent in prefill forwards"""
    host_reads: int = 0
    """device-to-host reads made inside decode steps (one per step by construction)"""
    full_steps: int = 0
    """decode steps that ran with every state row busy (the batch full)"""
    full_tokens: int = 0
    """tokens committed in those steps"""
    full_seconds: float = 0.0
    """wall time of those steps"""
    batch_sizes: list[int] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Throughput of the decode steps alone (prefill time excluded)."""
        t = self.seconds - self.prefill_seconds
        return self.tokens / t if t > 0 else 0.0

    @property
    def full_batch_tokens_per_s(self) -> float:
        """Decode throughput over the steps where the batch was full (0 if none was)."""
        return self.full_tokens / self.full_seconds if self.full_seconds else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens committed per request per step (1.0 without speculation)."""
        return self.tokens / self.request_steps if self.request_steps else 0.0

    @property
    def verified_per_step(self) -> float:
        """Draft tokens verified per request per step."""
        return self.verified / self.request_steps if self.request_steps else 0.0

    @property
    def accepted_per_step(self) -> float:
        """Accepted draft tokens per request per step."""
        return self.accepted / self.request_steps if self.request_steps else 0.0


@dataclass
class _Running:
    index: int
    row: int
    prompt_len: int
    num_tokens: int  # host copy, refreshed by the step's single read-back
    blocks: list[int]
    steps: int = 0


def _theil_sen(grid: list[int], times: list[float]) -> tuple[float, float]:
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


class EngineError(ValueError):
    """A request the engine cannot serve (the message says why)."""


class Engine:
    """Continuous-batching decoder with n-gram speculation on a paged KV cache.

    Parameters
    ----------
    model : Llama
    max_batch_size : int
        State rows ``R``: requests decoded together.
    max_model_len : int
        Prompt + output tokens per request (width of the persistent ``token_ids``).
    num_speculative_tokens : int
        ``k >= 0``; 0 decodes without speculation through the same ops.
    min_n, max_n : int
        n-gram lengths the proposer tries.
    block_size : int
        Tokens per KV block.
    stop_token_ids : sequence of int
        Tokens that end a request (committed, then the request finishes).
    draft_policy : {"fixed", "adaptive", "none"}
        How many proposed drafts a request verifies: all (``fixed``), what
        ``plan_draft_lengths`` finds worth its cost (``adaptive``; needs a cost table,
        :meth:`calibrate` measures one on first use), or none (``none``: plain decoding,
        the same as ``num_speculative_tokens=0``).
    verify_cost : torch.Tensor, optional
        float32 ``[T + 1]``, the cost of a verify pass of ``n`` tokens (seconds), for the
        adaptive policy. Default: measured by :meth:`calibrate`.
    corpus_tokens : int
        ``> 0``: draft with the own-history index and a shared corpus of this many tokens
        (``ngram_index_propose``); every finished request (prompt + output) is appended to
        it, so later requests can draft from earlier ones. 0 (default): ``ngram_propose``.
    """

    def __init__(
        self,
        model: Llama,
        *,
        max_batch_size: int = 8,
        max_model_len: int = 1024,
        num_speculative_tokens: int = 4,
        min_n: int = 1,
        max_n: int = 3,
        block_size: int = 16,
        stop_token_ids: tuple[int, ...] | list[int] = (),
        draft_policy: str = "fixed",
        verify_cost: torch.Tensor | None = None,
        corpus_tokens: int = 0,
    ):
        if draft_policy not in DRAFT_POLICIES:
            raise EngineError(f"draft_policy must be one of {DRAFT_POLICIES}, got {draft_policy!r}")
        if num_speculative_tokens < 0:
            raise EngineError(f"num_speculative_tokens must be >= 0, got {num_speculative_tokens}")
        if not 1 <= min_n <= max_n:
            raise EngineError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        if max_batch_size < 1:
            raise EngineError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if not 2 <= max_model_len <= model.cfg.max_position_embeddings:
            raise EngineError(
                f"max_model_len must lie in [2, {model.cfg.max_position_embeddings}] "
                f"(the model's context), got {max_model_len}"
            )
        self.model = model
        self.draft_policy = draft_policy
        self.k = 0 if draft_policy == "none" else num_speculative_tokens
        self.adaptive = draft_policy == "adaptive" and self.k > 0
        self.min_n, self.max_n = min_n, max_n
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.R = R = max_batch_size
        dev = self.device = model.device
        self.max_blocks = PagedKVCache.blocks_needed(max_model_len, block_size)
        # Enough blocks for every row at full length: admission never waits on memory.
        self.cache = model.new_kv_cache(R * self.max_blocks, block_size)

        # Persistent per-row state (docs/design.md, "Terms"), indexed by the state row r.
        i32 = dict(dtype=torch.int32, device=dev)
        self.token_ids = torch.zeros((R, max_model_len), **i32)
        self.num_tokens = torch.zeros((R,), **i32)
        self.num_prompt_tokens = torch.zeros((R,), **i32)
        self.block_table = torch.full((R, self.max_blocks), -1, **i32)
        self.max_tokens = torch.zeros((R,), **i32)
        self.temperature = torch.zeros((R,), dtype=torch.float32, device=dev)
        self.top_p = torch.ones((R,), dtype=torch.float32, device=dev)
        self.seeds = torch.zeros((R,), dtype=torch.int64, device=dev)
        stops = sorted(set(int(t) for t in stop_token_ids)) or [-1]
        self.stop_token_ids = torch.tensor(stops, **i32).expand(R, -1).contiguous()
        # Adaptive policy: acceptance estimates per state row and match length, on device.
        self.acceptance = new_acceptance_stats(
            R, self.k, num_classes=max_n, prior=ACCEPTANCE_PRIOR, device=dev
        )
        self.verify_cost = verify_cost
        self.calibration_seconds = 0.0
        self._recent_share: deque[float] = deque(maxlen=4)  # drafts per request, last plans
        self.cost_intercept = self.cost_slope = None  # set by calibrate()
        # Shared corpus (issue 11): the own-history index replaces the per-step rescan.
        self.index = self.corpus = None
        if corpus_tokens > 0:
            self.index = new_ngram_index(R, max_model_len, min_n=min_n, max_n=max_n, device=dev)
            self.corpus = new_corpus(corpus_tokens, min_n=min_n, max_n=max_n, device=dev)

    def _set_cost(self, intercept: float) -> None:
        n = torch.arange(self.R * (self.k + 1) + 1, dtype=torch.float64)
        self.verify_cost = (intercept + self.cost_slope * n).float().to(self.device)

    # ------------------------------------------------------------------ cost model

    @torch.inference_mode()
    def calibrate(self, *, context_len: int = 256, repeats: int = 5) -> torch.Tensor:
        """Measure the verify pass of this model on this machine; returns the cost table.

        Times ``Llama.forward`` (logits included) of a full batch, ``R`` requests of
        ``context_len`` cached tokens each, over ``n`` query tokens for 7 values of ``n``
        from ``R`` to ``R * (k + 1)`` laid out as :meth:`generate` lays out a verify pass
        (the fastest of ``repeats`` after a warm-up: on a shared machine the minimum is
        the least disturbed estimate), and fits ``a + b * n`` to them (Theil-Sen):
        ``verify_cost[n]`` in seconds, float32 ``[R * (k + 1) + 1]``, non-decreasing. The
        planner compares passes over one batch of requests, so ``b`` must be what one more
        verified draft costs; passes over fewer requests are left out of the fit because
        each request adds its attention over the cache, which a draft does not (mixing
        them in once doubled ``b`` and throttled the drafts). A decode step costs more
        than its forward (the proposal, sampling, commit and the host read do not depend
        on the drafts), so :meth:`generate` re-estimates the intercept ``a`` from the
        engine's own step times (median of ``step time - b * tokens`` over the last 32
        steps) and keeps the slope.
        Uses the engine's KV blocks, so call it between :meth:`generate` calls. Stores the
        table and the time it took (``calibration_seconds``).
        """
        t_start = time.perf_counter()
        R, k, dev = self.R, self.k, self.device
        ctx = max(1, min(context_len, self.max_model_len - k - 1))
        grid = sorted({R + round(i * R * k / 6) for i in range(7)})
        blocks = self.cache.allocator.allocate(
            R * PagedKVCache.blocks_needed(ctx + k + 1, self.block_size)
        )
        per_row = len(blocks) // R
        table = torch.tensor(blocks, dtype=torch.int32, device=dev).view(R, per_row)
        times = []
        try:
            for n in grid:
                lens = [n // R + (1 if b < n % R else 0) for b in range(R)]
                pos = torch.cat([torch.arange(ctx, ctx + m, device=dev) for m in lens])
                qsl = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=dev)
                slots = compute_slot_mapping(
                    table,
                    pos,
                    qsl,
                    block_size=self.block_size,
                    max_model_len=self.max_model_len,
                )
                ids = torch.zeros(n, dtype=torch.int32, device=dev)

                def run(ids=ids, pos=pos, slots=slots, qsl=qsl, n=n):
                    self.model.forward(
                        ids, pos, slots, qsl, table, self.cache,
                        max_query_len=min(k + 1, n - R + 1), max_seq_len=ctx + k + 1,
                    )  # fmt: skip

                run()
                samples = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    run()
                    samples.append(time.perf_counter() - t0)
                times.append(min(samples))
        finally:
            self.cache.allocator.free(blocks)
        self.cost_intercept, self.cost_slope = _theil_sen(grid, times)
        self._set_cost(self.cost_intercept)
        self.calibration_seconds = time.perf_counter() - t_start
        return self.verify_cost

    # ------------------------------------------------------------------ host side

    def check_prompt(self, index: int, prompt_len: int, params: SamplingParams) -> None:
        if prompt_len < 1:
            raise EngineError(f"prompt {index} is empty")
        if prompt_len >= self.max_model_len:
            raise EngineError(
                f"prompt {index} has {prompt_len} tokens, max_model_len is "
                f"{self.max_model_len}: shorten it or raise --max-model-len"
            )
        if params.max_tokens < 1:
            raise EngineError(f"max_tokens must be >= 1, got {params.max_tokens}")
        if params.temperature < 0 or not params.temperature < float("inf"):
            raise EngineError(f"temperature must be finite and >= 0, got {params.temperature}")
        if not 0 < params.top_p <= 1:
            raise EngineError(f"top_p must lie in (0, 1], got {params.top_p}")

    def _grow_blocks(self, reqs: list[_Running]) -> None:
        """Give each request the KV blocks for every position this step can write."""
        rows, cols, ids = [], [], []
        for q in reqs:
            need = PagedKVCache.blocks_needed(
                min(q.num_tokens + self.k, self.max_model_len), self.block_size
            )
            if need > len(q.blocks):
                new = self.cache.allocator.allocate(need - len(q.blocks))
                rows += [q.row] * len(new)
                cols += range(len(q.blocks), need)
                ids += new
                q.blocks += new
        if ids:
            dev = self.device
            self.block_table[torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)] = (
                torch.tensor(ids, dtype=torch.int32, device=dev)
            )

    def _admit(self, waiting, free_rows, prompts, params, running, stats) -> None:
        new: list[_Running] = []
        while waiting and free_rows:
            i = waiting.popleft()
            r = free_rows.pop()
            p, sp = prompts[i], params[i]
            n = len(p)
            self.token_ids[r, :n] = torch.tensor(p, dtype=torch.int32, device=self.device)
            self.num_tokens[r] = n
            self.num_prompt_tokens[r] = n
            self.max_tokens[r] = sp.max_tokens
            self.temperature[r] = sp.temperature
            self.top_p[r] = sp.top_p
            self.seeds[r] = sp.seed
            self.acceptance[r] = ACCEPTANCE_PRIOR
            new.append(_Running(index=i, row=r, prompt_len=n, num_tokens=n, blocks=[]))
        if not new:
            return
        if self.index is not None:  # index the prompts of the admitted rows
            rows_new = torch.tensor([q.row for q in new], dtype=torch.int32, device=self.device)
            ngram_index_build(self.token_ids, self.num_tokens, self.index, rows_new)
        self._grow_blocks(new)
        running += new
        # Prefill: KV for positions 0 .. L-2; the last prompt token is the first query
        # token of the request's first decode step.
        lens = [q.prompt_len - 1 for q in new]
        if sum(lens) == 0:
            return
        dev = self.device
        ids = torch.cat([self.token_ids[q.row, : q.prompt_len - 1] for q in new])
        positions = torch.cat([torch.arange(n, device=dev) for n in lens])
        qsl = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=dev)
        req_indices = torch.tensor([q.row for q in new], dtype=torch.int32, device=dev)
        slots = compute_slot_mapping(
            self.block_table,
            positions,
            qsl,
            req_indices,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
        )
        t0 = time.perf_counter()
        self.model.forward(
            ids,
            positions,
            slots,
            qsl,
            self.block_table[req_indices.long()],
            self.cache,
            max_query_len=max(lens),
            max_seq_len=max(lens),
            compute_logits=False,
        )
        stats.prefill_tokens += sum(lens)
        stats.prefill_seconds += time.perf_counter() - t0

    # ------------------------------------------------------------------ device step

    def _step(self, running: list[_Running], sampled: bool, use_top_p: bool):
        """One decode step for the running requests; returns the host read-back."""
        dev = self.device
        k = self.k
        req_indices = torch.tensor([q.row for q in running], dtype=torch.int32, device=dev)
        rows = req_indices.long()
        # k = 0 (plain decoding) runs the same ops: no drafts, one query token per request.
        if self.index is not None:
            drafts, num_drafts, match_len, _ = ngram_index_propose(
                self.token_ids,
                self.num_tokens,
                self.index,
                req_indices,
                num_speculative_tokens=k,
                corpus=self.corpus,
                max_model_len=self.max_model_len,
            )
        else:
            drafts, num_drafts, match_len = ngram_propose(
                self.token_ids,
                self.num_tokens,
                req_indices,
                min_n=self.min_n,
                max_n=self.max_n,
                num_speculative_tokens=k,
                max_model_len=self.max_model_len,
            )
        adaptive = self.adaptive
        B = len(running)
        planned = num_drafts
        n_query = B * (k + 1)  # the pass's static size: every proposed draft has a row
        wanted = planned
        if adaptive:
            # The host sizes the pass before the step from the plans it has read back
            # (no extra read); the planner keeps its plan inside that size. The plan
            # without the size cap is read back too: it is what the next budget follows.
            n_query = self.token_budget(B)

            def plan(cap):
                return plan_draft_lengths(
                    num_drafts,
                    match_len,
                    self.acceptance,
                    self.verify_cost,
                    req_indices,
                    max_num_tokens=cap,
                    validate=False,  # the engine's own state: no per-step value checks
                ).num_draft_tokens

            planned = wanted = plan(None)
            if n_query < min(B * (k + 1), self.verify_cost.shape[0] - 1):
                planned = plan(n_query)
        vi = prepare_verify_inputs(
            self.token_ids,
            self.num_tokens,
            drafts,
            planned,
            self.block_table,
            req_indices,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
        )
        # Host-side bound on the KV length (no read-back needed: lengths are known).
        max_seq_len = max(q.num_tokens for q in running) + k
        # query_start_loc[B] <= n_query: the rows past n_query are padding, never run
        logits = self.model.forward(
            vi.input_ids[:n_query],
            vi.positions[:n_query],
            vi.slot_mapping[:n_query],
            vi.query_start_loc,
            self.block_table[rows],
            self.cache,
            max_query_len=min(k + 1, n_query - B + 1),
            max_seq_len=max_seq_len,
        )
        rs = rejection_sample(
            logits,
            vi.flat_draft_token_ids[: n_query - B],
            vi.cu_num_draft_tokens,
            num_speculative_tokens=k,
            temperature=self.temperature[rows] if sampled else None,
            top_p=self.top_p[rows] if sampled and use_top_p else None,
            seeds=self.seeds[rows] if sampled else None,
            offsets=sampling_offsets(self.num_tokens, req_indices) if sampled else None,
        )
        cm = commit_accepted_tokens(
            self.token_ids,
            self.num_tokens,
            rs.output_token_ids,
            rs.num_emitted,
            req_indices,
            stop_token_ids=self.stop_token_ids[rows],
            num_prompt_tokens=self.num_prompt_tokens,
            max_tokens=self.max_tokens[rows],
            max_model_len=self.max_model_len,
        )
        if self.index is not None:  # the committed tokens' n-grams; finished rows join the corpus
            ngram_index_extend(self.token_ids, self.num_tokens, self.index, req_indices)
            done = torch.where(cm.finished, req_indices, -1).to(torch.int32)
            corpus_append(self.corpus, self.token_ids, self.num_tokens, done)
        if adaptive:  # learn from the drafts as proposed, verified or not
            update_acceptance_stats(
                self.acceptance,
                drafts,
                num_drafts,
                match_len,
                rs.output_token_ids,
                rs.num_emitted,
                req_indices,
                validate=False,
            )
        # The step's one device-to-host read: new lengths, committed counts, finish
        # reasons, and (for statistics) emitted, drafted and verified counts.
        back = torch.stack(
            [
                self.num_tokens[rows],
                cm.num_committed,
                cm.finish_reason.to(torch.int32),
                rs.num_emitted,
                num_drafts,
                planned,
                wanted,
            ]
        ).tolist()
        return back, n_query

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

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams],
        *,
        progress=None,
    ) -> tuple[list[Completion], RunStats]:
        """Decode every prompt; returns completions in prompt order and the run's counters.

        ``progress`` is an optional tqdm-like object; it is advanced by committed tokens.
        """
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise EngineError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
            self.check_prompt(i, len(p), sp)
        sampled = any(sp.temperature > 0 for sp in params)
        use_top_p = any(sp.top_p < 1 for sp in params)

        if self.adaptive and self.verify_cost is None:
            self.calibrate()  # once per engine; its time is reported apart
        stats = RunStats()
        self._recent_share.clear()
        overheads: deque[float] = deque(maxlen=32)  # step time - slope * tokens (adaptive)
        t0 = time.perf_counter()
        waiting = deque(range(len(prompts)))
        free_rows = list(range(self.R - 1, -1, -1))
        running: list[_Running] = []
        finished: dict[int, tuple] = {}
        while waiting or running:
            self._admit(waiting, free_rows, prompts, params, running, stats)
            t_step = time.perf_counter()
            self._grow_blocks(running)
            back, n_query = self._step(running, sampled, use_top_p)
            full = len(running) == self.R
            stats.host_reads += 1
            stats.steps += 1
            stats.request_steps += len(running)
            stats.query_tokens += n_query
            stats.batch_sizes.append(len(running))
            n_tok, n_com, reason, n_emit, n_draft, n_verified, n_wanted = back
            if self.adaptive:  # drafts per request the uncapped plan wanted
                self._recent_share.append(sum(n_wanted) / len(running))
            still = []
            for b, q in enumerate(running):
                q.num_tokens = n_tok[b]
                q.steps += 1
                stats.tokens += n_com[b]
                stats.drafts += n_draft[b]
                stats.verified += n_verified[b]
                # drafts kept and committed (a stop token or the budget may cut the block)
                stats.accepted += max(min(n_emit[b] - 1, n_com[b]), 0)  # drafts kept and committed
                if reason[b]:
                    # Keep the output on the device; read it back once, after the run.
                    out = self.token_ids[q.row, q.prompt_len : q.num_tokens].clone()
                    finished[q.index] = (q, out, FINISH_REASON_NAMES[reason[b]])
                    self.cache.allocator.free(q.blocks)
                    self.block_table[q.row] = -1
                    free_rows.append(q.row)
                else:
                    still.append(q)
            running = still
            if self.cost_slope is not None and self.adaptive:
                overheads.append(time.perf_counter() - t_step - self.cost_slope * n_query)
                a = statistics.median(overheads)
                if abs(a - self.cost_intercept) > 0.05 * self.cost_intercept:
                    self.cost_intercept = max(a, 1e-6)
                    self._set_cost(self.cost_intercept)
            if full:
                stats.full_steps += 1
                stats.full_tokens += sum(n_com)
                stats.full_seconds += time.perf_counter() - t_step
            if progress is not None:
                progress.update(sum(n_com))
                progress.set_postfix(
                    tok_per_step=f"{stats.tokens_per_step:.2f}", batch=len(still), refresh=False
                )
        stats.seconds = time.perf_counter() - t0
        completions = []
        for i in range(len(prompts)):
            q, out, why = finished[i]
            completions.append(Completion(i, q.prompt_len, out.tolist(), why, q.steps))
        return completions, stats
