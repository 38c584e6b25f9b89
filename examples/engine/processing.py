"""The example engine's logits processing: the library's ``ProcessingState`` (penalties,
logit bias, allowed tokens, bad words, min_tokens per state row, bound to the engine's
token buffer) sized for one ``generate`` call from its requests' parameters, and the
``min_tokens`` per row that ``commit_accepted_tokens`` reads. ``None`` when no request uses
any of them: the step then passes no processing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_kernels.ops import ProcessingState


@dataclass
class Processing:
    state: ProcessingState
    min_tokens: torch.Tensor | None  # int32 [R], for commit_accepted_tokens
    stop_token_ids: list[int]  # banned while a request's output is below its min_tokens

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
    def for_run(cls, params, eng, V: int) -> Processing | None:
        """A state over ``eng``'s token buffer with room for ``params`` (a row is set at
        admission)."""
        if not cls.uses_any(params):
            return None
        stops = [t for t in eng.stop_token_ids[0].tolist() if t >= 0]
        min_tokens = any(sp.min_tokens for sp in params)
        state = ProcessingState(
            eng.token_ids, eng.num_tokens, eng.num_prompt_tokens, vocab_size=V,
            max_logit_bias=max((len(sp.logit_bias or {}) for sp in params), default=0),
            max_bad_words=max((len(sp.bad_words) for sp in params), default=0),
            max_bad_word_tokens=max((len(w) for sp in params for w in sp.bad_words), default=0),
            max_stop_tokens=max(len(stops), 1) if min_tokens else 0,
            allowed_tokens=any(sp.allowed_token_ids is not None for sp in params),
            # rows change only at admission, which sets the row: counts can be kept
            keep_counts=eng.token_ids.device.type == "cpu",
        )  # fmt: skip
        R, dev = eng.num_tokens.shape[0], eng.num_tokens.device
        counts = torch.zeros(R, dtype=torch.int32, device=dev) if min_tokens else None
        return cls(state, counts, stops)

    def admit(self, r: int, sp) -> None:
        """State row ``r`` takes request parameters ``sp``."""
        self.state.set_request(
            r, repetition_penalty=sp.repetition_penalty, frequency_penalty=sp.frequency_penalty,
            presence_penalty=sp.presence_penalty, logit_bias=sp.logit_bias,
            allowed_token_ids=sp.allowed_token_ids, bad_words=sp.bad_words,
            min_tokens=sp.min_tokens, stop_token_ids=self.stop_token_ids if sp.min_tokens else (),
        )  # fmt: skip
        if self.min_tokens is not None:
            self.min_tokens[r] = sp.min_tokens

    def min_tokens_of(self, r: torch.Tensor) -> torch.Tensor | None:
        """``commit_accepted_tokens``' ``min_tokens`` (a stop token ends no request before)."""
        return None if self.min_tokens is None else self.min_tokens[r]
