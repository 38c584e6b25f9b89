"""What one :meth:`Engine.generate` call returns besides the tokens: its counters."""

from __future__ import annotations

from dataclasses import dataclass, field


class Throughput:
    """Tokens per second of a run that has ``tokens``, ``seconds`` and ``prefill_seconds``."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Throughput of the decode steps alone (prefill time excluded)."""
        t = self.seconds - self.prefill_seconds
        return self.tokens / t if t > 0 else 0.0


@dataclass
class Completion:
    index: int
    prompt_len: int
    token_ids: list[int]
    finish_reason: str
    steps: int
    logprobs: list[tuple] | None = None
    """With ``SamplingParams.logprobs = N``: per output token ``(logprob, rank, {id:
    logprob} of the top N)``, in the engine's ``logprobs_mode`` (default ``raw_logprobs``:
    before any processing, vLLM's default)."""


@dataclass
class RunStats(Throughput):
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

    def add_step(self, back, n_query: int, seconds: float, *, full: bool) -> None:
        """Count one decode step from its read-back (see ``examples/engine/step.py``)."""
        _, n_com, _, n_emit, n_draft, n_verified, _ = back
        B = len(n_com)
        self.host_reads += 1
        self.steps += 1
        self.request_steps += B
        self.query_tokens += n_query
        self.batch_sizes.append(B)
        self.tokens += sum(n_com)
        self.drafts += sum(n_draft)
        self.verified += sum(n_verified)
        # drafts kept and committed (a stop token or the budget may cut the block)
        self.accepted += sum(max(min(e - 1, c), 0) for e, c in zip(n_emit, n_com, strict=True))
        if full:
            self.full_steps += 1
            self.full_tokens += sum(n_com)
            self.full_seconds += seconds

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
