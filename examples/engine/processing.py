"""The example engine's logits processing state: per state row, what ``process_logits``
takes (penalties, logit bias, allowed tokens, bad words, min_tokens), sized for one
``generate`` call from its requests' parameters. ``None`` when no request uses any of them:
the step then skips the op.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_kernels.ops import token_bitmask


@dataclass
class ProcessingState:
    repetition_penalty: torch.Tensor  # float32 [R]
    frequency_penalty: torch.Tensor  # float32 [R]
    presence_penalty: torch.Tensor  # float32 [R]
    logit_bias_ids: torch.Tensor | None  # int32 [R, M], -1 padded
    logit_bias_values: torch.Tensor | None  # float32 [R, M]
    allowed_token_mask: torch.Tensor | None  # int32 [R, ceil(V / 32)]
    bad_word_ids: torch.Tensor | None  # int32 [R, S, W], -1 padded
    min_tokens: torch.Tensor | None  # int32 [R]

    @staticmethod
    def uses_any(params) -> bool:
        return any(
            sp.repetition_penalty != 1.0
            or sp.frequency_penalty != 0.0
            or sp.presence_penalty != 0.0
            or sp.logit_bias
            or sp.allowed_token_ids is not None
            or sp.bad_words
            or sp.min_tokens > 0
            for sp in params
        )

    @classmethod
    def for_run(cls, params, R: int, V: int, device) -> ProcessingState | None:
        """Zeroed state rows sized for ``params`` (a row is filled at admission)."""
        if not cls.uses_any(params):
            return None
        f32 = dict(dtype=torch.float32, device=device)
        i32 = dict(dtype=torch.int32, device=device)
        M = max((len(sp.logit_bias or {}) for sp in params), default=0)
        S = max((len(sp.bad_words) for sp in params), default=0)
        Lw = max((len(w) for sp in params for w in sp.bad_words), default=0)
        return cls(
            repetition_penalty=torch.ones(R, **f32),
            frequency_penalty=torch.zeros(R, **f32),
            presence_penalty=torch.zeros(R, **f32),
            logit_bias_ids=torch.full((R, M), -1, **i32) if M else None,
            logit_bias_values=torch.zeros((R, M), **f32) if M else None,
            allowed_token_mask=(
                torch.full((R, (V + 31) // 32), -1, **i32)
                if any(sp.allowed_token_ids is not None for sp in params)
                else None
            ),
            bad_word_ids=torch.full((R, S, Lw), -1, **i32) if S else None,
            min_tokens=torch.zeros(R, **i32) if any(sp.min_tokens for sp in params) else None,
        )

    def admit(self, r: int, sp, V: int) -> None:
        """State row ``r`` takes request parameters ``sp``."""
        self.repetition_penalty[r] = sp.repetition_penalty
        self.frequency_penalty[r] = sp.frequency_penalty
        self.presence_penalty[r] = sp.presence_penalty
        if self.logit_bias_ids is not None:
            self.logit_bias_ids[r] = -1
            self.logit_bias_values[r] = 0.0
            for m, (t, v) in enumerate(sorted((sp.logit_bias or {}).items())):
                self.logit_bias_ids[r, m], self.logit_bias_values[r, m] = t, v
        if self.allowed_token_mask is not None:
            allowed = torch.ones(V, dtype=torch.bool)
            if sp.allowed_token_ids is not None:
                allowed.zero_()
                allowed[sp.allowed_token_ids] = True
            self.allowed_token_mask[r] = token_bitmask(allowed)
        if self.bad_word_ids is not None:
            self.bad_word_ids[r] = -1
            for s, w in enumerate(sp.bad_words):
                self.bad_word_ids[r, s, : len(w)] = torch.tensor(w, dtype=torch.int32)
        if self.min_tokens is not None:
            self.min_tokens[r] = sp.min_tokens

    def min_tokens_of(self, r: torch.Tensor) -> torch.Tensor | None:
        """``commit_accepted_tokens``' ``min_tokens`` (a stop token ends no request before)."""
        return None if self.min_tokens is None else self.min_tokens[r]

    def kwargs(self, r: torch.Tensor, stop_token_ids: torch.Tensor) -> dict:
        """``process_logits``' keyword arguments for the batch's state rows ``r``."""
        kw = dict(
            repetition_penalty=self.repetition_penalty[r],
            frequency_penalty=self.frequency_penalty[r],
            presence_penalty=self.presence_penalty[r],
        )
        if self.logit_bias_ids is not None:
            kw.update(
                logit_bias_ids=self.logit_bias_ids[r], logit_bias_values=self.logit_bias_values[r]
            )
        if self.allowed_token_mask is not None:
            kw["allowed_token_mask"] = self.allowed_token_mask[r]
        if self.bad_word_ids is not None:
            kw["bad_word_ids"] = self.bad_word_ids[r]
        if self.min_tokens is not None:
            kw.update(min_tokens=self.min_tokens[r], stop_token_ids=stop_token_ids[r])
        return kw
