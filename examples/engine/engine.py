"""A batched decoding engine whose every decode step is made of specdec-kernels ops.

Requests of different prompt lengths are admitted into free state rows as others finish
(continuous batching). Admission fills the KV cache for the prompt minus its last token
(prefill); from then on every step is the same sequence of library calls, written out in
``examples/engine/step.py`` (the file to read first)::

    ngram_propose [-> plan_draft_lengths] -> prepare_verify_inputs -> model forward
        -> rejection_sample -> commit_accepted_tokens [-> ngram_index_extend, corpus_append]
        [-> update_acceptance_stats]

The draft policy (``examples/engine/policy.py``) decides how many of the proposed drafts a
request verifies; run statistics are ``examples/engine/stats.py``. Output tokens stay on
the device until the run ends.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from examples.engine.kv_cache import PagedKVCache
from examples.engine.llama import Llama
from examples.engine.logprobs import LogprobsBuffer, as_lists
from examples.engine.policy import DRAFT_POLICIES, DraftPolicy, drafting_error
from examples.engine.processing import Processing
from examples.engine.stats import Completion, RunStats
from examples.engine.step import decode_step
from specdec_kernels.ops import (
    FINISH_REASON_NAMES,
    compute_slot_mapping,
    new_corpus,
    new_ngram_index,
    ngram_index_build,
)
from specdec_kernels.ops.logprobs import LOGPROBS_MODES

__all__ = ["DRAFT_POLICIES", "Completion", "Engine", "EngineError", "RunStats", "SamplingParams"]


@dataclass
class SamplingParams:
    """Per-request decoding parameters (``temperature = 0``: greedy; vLLM's names)."""

    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[list[int]] = field(default_factory=list)  # token ids of each word
    min_tokens: int = 0  # the stop tokens are banned until this many output tokens
    logprobs: int | None = None  # the top-N logprobs of every output token (None: none)


@dataclass
class _Running:
    index: int
    row: int
    prompt_len: int
    num_tokens: int  # host copy, refreshed by the step's single read-back
    blocks: list[int]
    steps: int = 0


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
    draft_policy : {"adaptive", "fixed", "none"}
        How many proposed drafts a request verifies (``examples/engine/policy.py``): what
        ``plan_draft_lengths`` finds worth its cost (``adaptive``, the default; needs a
        cost table, :meth:`calibrate` measures one on first use), all (``fixed``), or none
        (``none``: plain decoding, the same as ``num_speculative_tokens=0``).
    verify_cost : torch.Tensor, optional
        float32 ``[T + 1]``, the cost of a verify pass of ``n`` tokens (seconds), for the
        adaptive policy. Default: measured by :meth:`calibrate`.
    corpus_tokens : int
        ``> 0``: draft with an own-history index and a shared corpus of this many tokens
        (``ngram_propose(index=..., corpus=...)``); every finished request (prompt +
        output) is appended to it, so later requests can draft from earlier ones. 0
        (default): ``ngram_propose`` scans the histories.
    scoring : {"longest", "frequency"}
        ``ngram_propose``'s rule: the longest matching n-gram (default), or the most
        frequent continuations over a frequency index (``max_n`` is then its depth D:
        context plus drafts; the corpus, if any, is a frequency corpus).
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
        draft_policy: str = "adaptive",
        verify_cost: torch.Tensor | None = None,
        corpus_tokens: int = 0,
        scoring: str = "longest",
        logprobs_mode: str = "raw_logprobs",
    ):
        err = drafting_error(draft_policy, num_speculative_tokens, min_n, max_n, scoring,
                             corpus_tokens)  # fmt: skip
        if err is not None:
            raise EngineError(err)
        if logprobs_mode not in LOGPROBS_MODES:
            raise EngineError(
                f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}"
            )
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
        self.min_n, self.max_n, self.scoring = min_n, max_n, scoring
        self.logprobs_mode = logprobs_mode
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
        self.policy = DraftPolicy(
            draft_policy, k=self.k, num_rows=R, num_classes=max_n, device=dev,
            verify_cost=verify_cost,
        )  # fmt: skip
        # Shared corpus: an own-history index replaces the per-step rescan.
        self.processing: Processing | None = None  # sized by each generate call
        self.logprobs: LogprobsBuffer | None = None  # likewise, when a request asks for them
        self.index = self.corpus = None
        nk = dict(min_n=min_n, max_n=max_n, scoring=scoring, device=dev)
        if scoring == "frequency" or corpus_tokens > 0:  # kept up to date by each commit
            self.index = new_ngram_index(R, max_model_len, **nk)
        if corpus_tokens > 0:
            self.corpus = new_corpus(corpus_tokens, **nk)

    @property
    def adaptive(self) -> bool:
        return self.policy.adaptive

    @property
    def verify_cost(self) -> torch.Tensor | None:
        return self.policy.verify_cost

    @verify_cost.setter
    def verify_cost(self, cost: torch.Tensor | None) -> None:
        self.policy.verify_cost = cost

    @property
    def calibration_seconds(self) -> float:
        return self.policy.calibration_seconds

    def calibrate(self, *, context_len: int = 256, repeats: int = 5) -> torch.Tensor:
        """Measure this engine's verify pass and keep the cost table
        (:meth:`DraftPolicy.calibrate`); call it between :meth:`generate` calls."""
        return self.policy.calibrate(self, context_len=context_len, repeats=repeats)

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
        if not 0 < params.repetition_penalty < float("inf"):
            raise EngineError(f"repetition_penalty must be > 0, got {params.repetition_penalty}")
        if params.min_tokens < 0:
            raise EngineError(f"min_tokens must be >= 0, got {params.min_tokens}")
        finite = [params.frequency_penalty, params.presence_penalty]
        finite += list((params.logit_bias or {}).values())
        if not all(abs(x) < float("inf") for x in finite):  # NaN fails too
            raise EngineError("frequency_penalty, presence_penalty and logit_bias values: finite")
        if params.allowed_token_ids is not None and not params.allowed_token_ids:
            raise EngineError("allowed_token_ids must hold at least one token id")
        V = self.model.cfg.vocab_size
        ids = [*(params.logit_bias or {}), *(params.allowed_token_ids or [])]
        ids += [t for w in params.bad_words for t in w]
        if any(not 0 <= t < V for t in ids):
            raise EngineError(f"token ids of logit_bias, allowed_token_ids, bad_words: [0, {V})")
        if any(not w or len(w) > self.max_model_len for w in params.bad_words):
            raise EngineError(f"a bad word has 1 to max_model_len = {self.max_model_len} tokens")
        if params.logprobs is not None and not 0 <= params.logprobs <= V:
            raise EngineError(f"logprobs must lie in [0, V = {V}], got {params.logprobs}")

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
            if self.processing is not None:
                self.processing.admit(r, sp)
            self.policy.admit(r)
            new.append(_Running(index=i, row=r, prompt_len=n, num_tokens=n, blocks=[]))
        if not new:
            return
        if self.index is not None:  # index the prompts of the admitted rows
            rows_new = torch.tensor([q.row for q in new], dtype=torch.int32, device=self.device)
            ngram_index_build(self.token_ids, self.num_tokens, rows_new, index=self.index)
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
        V = self.model.cfg.vocab_size
        self.processing = Processing.for_run(params, self, V)
        N = max((sp.logprobs for sp in params if sp.logprobs is not None), default=None)
        self.logprobs = (
            None
            if N is None
            else LogprobsBuffer(self.R, self.max_model_len, N, self.device, self.logprobs_mode)
        )

        if self.adaptive and self.verify_cost is None:
            self.calibrate()  # once per engine; its time is reported apart
        stats = RunStats()
        self.policy.start_run()
        t0 = time.perf_counter()
        waiting = deque(range(len(prompts)))
        free_rows = list(range(self.R - 1, -1, -1))
        running: list[_Running] = []
        finished: dict[int, tuple] = {}
        while waiting or running:
            self._admit(waiting, free_rows, prompts, params, running, stats)
            t_step = time.perf_counter()
            self._grow_blocks(running)
            rows = [q.row for q in running]
            max_len = max(q.num_tokens for q in running)
            back, n_query = decode_step(self, rows, max_len, sampled=sampled, use_top_p=use_top_p)
            full = len(running) == self.R
            n_tok, n_com, reason = back[:3]
            still = []
            for b, q in enumerate(running):
                q.num_tokens = n_tok[b]
                q.steps += 1
                if reason[b]:
                    # Keep the output on the device; read it back once, after the run.
                    out = self.token_ids[q.row, q.prompt_len : q.num_tokens].clone()
                    lps = self.logprobs and self.logprobs.take(q.row, q.prompt_len, q.num_tokens)
                    finished[q.index] = (q, out, FINISH_REASON_NAMES[reason[b]], lps)
                    self.cache.allocator.free(q.blocks)
                    self.block_table[q.row] = -1
                    free_rows.append(q.row)
                else:
                    still.append(q)
            running = still
            seconds = time.perf_counter() - t_step
            stats.add_step(back, n_query, seconds, full=full)
            self.policy.after_step(back[6], n_query, seconds)  # what the uncapped plan wanted
            if progress is not None:
                progress.update(sum(n_com))
                progress.set_postfix(
                    tok_per_step=f"{stats.tokens_per_step:.2f}", batch=len(still), refresh=False
                )
        stats.seconds = time.perf_counter() - t0
        completions = []
        for i in range(len(prompts)):
            q, out, why, lps = finished[i]
            n = params[i].logprobs
            lp = None if n is None else as_lists(lps, n)
            completions.append(Completion(i, q.prompt_len, out.tolist(), why, q.steps, lp))
        return completions, stats
