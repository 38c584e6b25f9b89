"""A batched decoding engine whose every decode step is made of specdec-kernels ops.

Requests of different prompt lengths are admitted into free state rows as others finish
(continuous batching). Admission fills the KV cache for the prompt minus its last token
(prefill); from then on every step is the same sequence of library calls::

    ngram_propose -> prepare_verify_inputs -> model forward -> rejection_sample
        -> commit_accepted_tokens

with ``k = 0`` (no speculation) running the same ops minus the proposer. The step has no
Python loop over tokens and reads exactly one small tensor back to the host (the new
lengths, committed counts and finish reasons, which the host needs to allocate KV blocks
and retire requests). Output tokens stay on the device until the run ends.
"""

from __future__ import annotations

import itertools
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
    ngram_propose,
    prepare_verify_inputs,
    rejection_sample,
    sampling_offsets,
)


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
    accepted: int = 0
    """draft tokens accepted by the verifier and committed"""
    prefill_tokens: int = 0
    seconds: float = 0.0
    """wall time of the whole call"""
    prefill_seconds: float = 0.0
    """part of it spent in prefill forwards"""
    host_reads: int = 0
    """device-to-host reads made inside decode steps (one per step by construction)"""
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
    def tokens_per_step(self) -> float:
        """Tokens committed per request per step (1.0 without speculation)."""
        return self.tokens / self.request_steps if self.request_steps else 0.0

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
    ):
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
        self.k = num_speculative_tokens
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
            new.append(_Running(index=i, row=r, prompt_len=n, num_tokens=n, blocks=[]))
        if not new:
            return
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
        drafts, num_drafts, _ = ngram_propose(
            self.token_ids,
            self.num_tokens,
            req_indices,
            min_n=self.min_n,
            max_n=self.max_n,
            num_speculative_tokens=k,
            max_model_len=self.max_model_len,
        )
        vi = prepare_verify_inputs(
            self.token_ids,
            self.num_tokens,
            drafts,
            num_drafts,
            self.block_table,
            req_indices,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
        )
        # Host-side bound on the KV length (no read-back needed: lengths are known).
        max_seq_len = max(q.num_tokens for q in running) + k
        logits = self.model.forward(
            vi.input_ids,
            vi.positions,
            vi.slot_mapping,
            vi.query_start_loc,
            self.block_table[rows],
            self.cache,
            max_query_len=k + 1,
            max_seq_len=max_seq_len,
        )
        rs = rejection_sample(
            logits,
            vi.flat_draft_token_ids,
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
        # The step's one device-to-host read: new lengths, committed counts, finish
        # reasons, and (for statistics) emitted and drafted counts.
        back = torch.stack(
            [
                self.num_tokens[rows],
                cm.num_committed,
                cm.finish_reason.to(torch.int32),
                rs.num_emitted,
                num_drafts,
            ]
        ).tolist()
        return back

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

        stats = RunStats()
        t0 = time.perf_counter()
        waiting = deque(range(len(prompts)))
        free_rows = list(range(self.R - 1, -1, -1))
        running: list[_Running] = []
        finished: dict[int, tuple] = {}
        while waiting or running:
            self._admit(waiting, free_rows, prompts, params, running, stats)
            self._grow_blocks(running)
            back = self._step(running, sampled, use_top_p)
            stats.host_reads += 1
            stats.steps += 1
            stats.request_steps += len(running)
            stats.batch_sizes.append(len(running))
            n_tok, n_com, reason, n_emit, n_draft = back
            still = []
            for b, q in enumerate(running):
                q.num_tokens = n_tok[b]
                q.steps += 1
                stats.tokens += n_com[b]
                stats.drafts += n_draft[b]
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
