"""``ProcessingState``: the per-request parameters of :func:`process_logits` kept by the
library, one row per state row, for an engine that verifies every step with the same
requests in the same state rows (a persistent batch, as vLLM keeps it). Contract:
``docs/design.md``, "``ProcessingState``".

A :class:`LogitsProcessing` is built, checked and converted each call: for plain CPU
tensors that is ~16 us of a call whose plain verification costs ~20 us at B = 1. The
state's parameters are checked when a request is set and held in arrays the library owns
(not resizable by anyone else), so a verify call checks and converts only what changes per
step: the token buffer's views, ``req_indices`` and the grammar mask.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch

from specdec_kernels.cpu import rejection as _cpu
from specdec_kernels.cpu._jit import NONE_F32_2D, NONE_I32, NONE_I32_2D, NONE_I32_3D, np_
from specdec_kernels.ops._library import calls_cpu_directly, plain_cpu, refused
from specdec_kernels.ops._processing_args import prepare
from specdec_kernels.ops._validation import (
    check_capacity,
    check_int,
    check_real_f32,
    check_req_indices,
    check_sequence,
    check_shape,
    check_state_tensor,
    check_tensor,
    check_token_list,
)
from specdec_kernels.ops.processing import LogitsProcessing

_INT32_MAX = 2**31 - 1


class StateBatch(NamedTuple):
    """One verify call's view of a :class:`ProcessingState` (:meth:`ProcessingState.batch`),
    for ``rejection_sample(..., processing=...)``."""

    state: ProcessingState
    req_indices: torch.Tensor | None
    grammar_mask: torch.Tensor | None

    def logits_processing(self, B: int) -> LogitsProcessing:
        """The same processing as a :class:`LogitsProcessing` for a batch of ``B`` requests
        (the parameters gathered into batch order on the state's device, no host sync), for
        :func:`process_logits` and the routes other than the fused CPU kernel."""
        return self.state._gathered(B, self.req_indices, self.grammar_mask)

    def checked(self, B: int, n_drafts: int, V: int) -> StateBatch:
        """This batch after the per-call checks for ``B`` requests, ``n_drafts`` drafts and
        logits of width ``V`` (``rejection_sample`` runs them first, on every route):
        ``req_indices`` and ``grammar_mask`` made contiguous. Raises ``ValueError``."""
        req = self.state._check_call(B, n_drafts, V, self.req_indices, self.grammar_mask)
        grammar = None if self.grammar_mask is None else self.grammar_mask.contiguous()
        return StateBatch(self.state, req, grammar)


class ProcessingState:
    """Per state row: the repetition, frequency and presence penalties, logit bias,
    allowed tokens, bad words, min_tokens and stop tokens of :func:`process_logits`, bound
    to the engine's token buffer. Contract: ``docs/design.md``, "``ProcessingState``".

    Parameters
    ----------
    token_ids, num_tokens, num_prompt_tokens : torch.Tensor
        The engine's token buffer (int32 ``[R, L_max]``, ``[R]``, ``[R]``), read at each
        call as :class:`LogitsProcessing` reads it; state row ``r`` of the parameters is
        the request in its row ``r``. Its shapes must not change afterwards.
    vocab_size : int
        ``V``: the target logits' width at every call.
    max_logit_bias, max_bad_words, max_bad_word_tokens, max_stop_tokens : int
        Capacity per request (0: the feature is off). ``max_bad_word_tokens <= L_max``.
    allowed_tokens : bool
        Keep an allowed-token set per request.
    keep_counts : bool
        CPU: keep each row's history counts (int32 ``[R, V]``: ``4 R V`` bytes), brought up
        to date at each one-kernel verify call from the tokens appended since, so a greedy
        row's penalty checks need no pass over the history, nor does a sampled or logprobs
        row's processing for histories of at least ``V / 2`` tokens. Requires that a row's
        tokens below ``num_tokens`` change only when the row gets a new request, with
        :meth:`set_request` then, and :meth:`move_request` when a request moves; one
        verify call at a time per state.

    Raises
    ------
    ValueError
        A token buffer :func:`process_logits` would refuse, or not contiguous, or of no
        rows; a capacity not an int ``>= 0``; ``vocab_size`` outside ``[1, 2**31)``;
        ``max_bad_word_tokens`` above ``L_max`` or 0 with bad words; ``keep_counts`` with
        a token buffer not on the CPU.

    Examples
    --------
    >>> tokens = torch.tensor([[0, 2]], dtype=torch.int32)  # prompt [0], output [2]
    >>> state = ProcessingState(tokens, torch.tensor([2], dtype=torch.int32),
    ...                         torch.tensor([1], dtype=torch.int32), vocab_size=3)
    >>> from specdec_kernels.ops import rejection_sample
    >>> state.set_request(0, repetition_penalty=2.0)
    >>> logits = torch.tensor([[2.0, 1.0, -1.0], [2.0, 1.0, -1.0]])
    >>> out = rejection_sample(logits, torch.tensor([1], dtype=torch.int32),
    ...                        torch.tensor([0, 1], dtype=torch.int32), num_speculative_tokens=1,
    ...                        processing=state.batch())
    >>> out.output_token_ids.tolist()  # row 0: [1.0, 1.0, -2.0], ties to the lowest id
    [[0, -1]]
    """

    def __init__(
        self, token_ids, num_tokens, num_prompt_tokens, *, vocab_size: int,
        max_logit_bias: int = 0, max_bad_words: int = 0, max_bad_word_tokens: int = 0,
        max_stop_tokens: int = 0, allowed_tokens: bool = False, keep_counts: bool = False,
    ) -> None:  # fmt: skip
        token_ids = check_state_tensor("token_ids", token_ids, dtype=torch.int32, ndim=2,
                                       device=getattr(token_ids, "device", None))  # fmt: skip
        R, L_max = token_ids.shape
        if R < 1:
            raise ValueError("token_ids must have at least one row")
        for name, t in (("num_tokens", num_tokens), ("num_prompt_tokens", num_prompt_tokens)):
            t = check_state_tensor(name, t, dtype=torch.int32, ndim=1, device=token_ids.device)
            check_shape(name, t, (R,), "one entry per row of token_ids")
        V = check_int("vocab_size", vocab_size, min_value=1, max_value=_INT32_MAX)
        M = check_int("max_logit_bias", max_logit_bias, min_value=0)
        S = check_int("max_bad_words", max_bad_words, min_value=0)
        Wb = check_int("max_bad_word_tokens", max_bad_word_tokens, min_value=0)
        T = check_int("max_stop_tokens", max_stop_tokens, min_value=0)
        for name, flag in (("allowed_tokens", allowed_tokens), ("keep_counts", keep_counts)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be a bool, got {type(flag).__name__}")
        if keep_counts and token_ids.device.type != "cpu":
            raise ValueError("keep_counts is for a CPU token buffer (the CUDA path counts anew)")
        if S and not 1 <= Wb <= L_max:
            raise ValueError(
                f"max_bad_word_tokens must lie in [1, L_max = token_ids.shape[1] = {L_max}] "
                f"with bad words, got {Wb}"
            )
        self.vocab_size, self.device = V, token_ids.device
        self._buffer = (token_ids, num_tokens, num_prompt_tokens)
        self._shapes = tuple(t.shape for t in self._buffer)
        W = (V + 31) // 32
        a = {  # the library's own arrays (numpy-backed tensors cannot be resized)
            "repetition_penalty": np.ones(R, np.float32),
            "frequency_penalty": np.zeros(R, np.float32),
            "presence_penalty": np.zeros(R, np.float32),
            "logit_bias_ids": np.full((R, M), -1, np.int32) if M else None,
            "logit_bias_values": np.zeros((R, M), np.float32) if M else None,
            "allowed_token_mask": np.full((R, W), -1, np.int32) if allowed_tokens else None,
            "bad_word_ids": np.full((R, S, Wb), -1, np.int32) if S else None,
            "min_tokens": np.zeros(R, np.int32) if T else None,
            "stop_token_ids": np.full((R, T), -1, np.int32) if T else None,
        }
        self._counts = (NONE_I32_2D, NONE_I32_2D)
        if keep_counts:  # the history counts per row, and how far they go (-1: from the start)
            self._counts = (np.zeros((R, V), np.int32), np.full((R, 2), -1, np.int32))
        self._arrays = a
        on_cpu = self.device.type == "cpu"
        self._tensors = {
            n: None if x is None else torch.from_numpy(x) if on_cpu
            else torch.from_numpy(x).to(self.device)
            for n, x in a.items()
        }  # fmt: skip
        opt = {n: NONE for n, NONE in (("logit_bias_ids", NONE_I32_2D),
               ("logit_bias_values", NONE_F32_2D), ("allowed_token_mask", NONE_I32_2D),
               ("bad_word_ids", NONE_I32_3D), ("min_tokens", NONE_I32),
               ("stop_token_ids", NONE_I32_2D))}  # fmt: skip
        x = {n: opt[n] if a[n] is None else a[n] for n in opt}
        # the CPU kernels' TENSORS tuple (cpu/processing.py) around the per-call entries
        self._head = (a["repetition_penalty"], a["frequency_penalty"], a["presence_penalty"],
                      True, x["logit_bias_ids"], x["logit_bias_values"],
                      x["allowed_token_mask"], allowed_tokens)  # fmt: skip
        self._tail = (x["bad_word_ids"], x["min_tokens"], x["stop_token_ids"], bool(T), True,
                      *self._counts, keep_counts)  # fmt: skip

    @property
    def num_rows(self) -> int:
        """``R``, the token buffer's rows."""
        return self._shapes[0][0]

    def set_request(
        self, row: int, *, repetition_penalty: float = 1.0, frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0, logit_bias: Mapping[int, float] | None = None,
        allowed_token_ids: Sequence[int] | None = None,
        bad_words: Sequence[Sequence[int]] = (), min_tokens: int = 0,
        stop_token_ids: Sequence[int] = (),
    ) -> None:  # fmt: skip
        """Set state row ``row``'s parameters (vLLM ``SamplingParams`` names; a request
        admitted to that row, or changed); those not given are neutral. ``bad_words``:
        token sequences; ``stop_token_ids`` (EOS among them unless the request ignores
        it) are banned while the output has fewer than ``min_tokens`` tokens.

        Raises
        ------
        ValueError
            ``row`` outside ``[0, R)``; ``repetition_penalty <= 0`` or a value not finite;
            an id outside ``[0, V)``; more entries than the state's capacity for them
            (a feature the state was built without counts as capacity 0); an empty
            ``allowed_token_ids``, an empty bad word, ``min_tokens < 0``. Nothing is
            written then.
        """
        R, V, a = self.num_rows, self.vocab_size, self._arrays
        check_int("row", row, min_value=0)
        if row >= R:
            raise ValueError(f"row must lie in [0, R = {R}), got {row}")
        rp = check_real_f32("repetition_penalty", repetition_penalty)
        if not rp > 0:
            raise ValueError(f"repetition_penalty must be > 0 in float32 (1 = off), got {rp}")
        fp = check_real_f32("frequency_penalty", frequency_penalty)
        pp = check_real_f32("presence_penalty", presence_penalty)
        if logit_bias is not None and not isinstance(logit_bias, Mapping):
            raise ValueError(f"logit_bias must be a mapping, got {type(logit_bias).__name__}")
        bias = dict(logit_bias or {})
        check_capacity("logit_bias", len(bias), a["logit_bias_ids"], 1, "max_logit_bias")
        bias_ids = check_token_list("logit_bias", list(bias), V)
        bias_values = [check_real_f32(f"logit_bias[{t}]", bias[t]) for t in bias]
        if allowed_token_ids is not None:
            if a["allowed_token_mask"] is None:
                raise ValueError("allowed_token_ids needs a state built with allowed_tokens=True")
            allowed = check_token_list("allowed_token_ids", allowed_token_ids, V)
            if not allowed:
                raise ValueError("allowed_token_ids must not be empty (None: every token)")
        words = [check_token_list("bad_words", w, V)
                 for w in check_sequence("bad_words", bad_words)]  # fmt: skip
        check_capacity("bad_words", len(words), a["bad_word_ids"], 1, "max_bad_words")
        for w in words:
            if not w:
                raise ValueError("bad_words must not hold an empty word")
            check_capacity("a bad word", len(w), a["bad_word_ids"], 2, "max_bad_word_tokens")
        min_tokens = check_int("min_tokens", min_tokens, min_value=0, max_value=_INT32_MAX)
        stops = check_token_list("stop_token_ids", stop_token_ids, V)
        if min_tokens and a["min_tokens"] is None:
            raise ValueError("min_tokens needs a state built with max_stop_tokens >= 1")
        if a["min_tokens"] is not None:  # (without min_tokens the stop tokens do nothing)
            check_capacity("stop_token_ids", len(stops), a["stop_token_ids"], 1, "max_stop_tokens")

        # checked: write the row (numpy: no torch op per entry)
        a["repetition_penalty"][row], a["frequency_penalty"][row] = rp, fp
        a["presence_penalty"][row] = pp
        if a["logit_bias_ids"] is not None:
            a["logit_bias_ids"][row] = -1
            a["logit_bias_values"][row] = 0.0
            a["logit_bias_ids"][row, : len(bias_ids)] = bias_ids
            a["logit_bias_values"][row, : len(bias_ids)] = bias_values
        if a["allowed_token_mask"] is not None:
            mask = a["allowed_token_mask"][row]
            if allowed_token_ids is None:
                mask[:] = -1
            else:
                bits = np.zeros(mask.shape[0] * 32, np.uint8)
                bits[allowed] = 1
                mask[:] = np.packbits(bits, bitorder="little").view(np.int32)
        if a["bad_word_ids"] is not None:
            a["bad_word_ids"][row] = -1
            for s, w in enumerate(words):
                a["bad_word_ids"][row, s, : len(w)] = w
        if a["min_tokens"] is not None:
            a["min_tokens"][row] = min_tokens
            a["stop_token_ids"][row] = -1
            a["stop_token_ids"][row, : len(stops)] = stops
        self._counts[1][row : row + 1] = -1  # a new request: its history counted anew
        self._sync(row, row)

    def clear_request(self, row: int) -> None:
        """Make state row ``row`` neutral (every parameter off)."""
        self.set_request(row)

    def move_request(self, src: int, dst: int) -> None:
        """Copy state row ``src``'s parameters to row ``dst`` (a persistent batch that
        moves a request to condense its rows moves its parameters with it). Raises
        ``ValueError`` for a row outside ``[0, R)``."""
        for name, row in (("src", src), ("dst", dst)):
            check_int(name, row, min_value=0)
            if row >= self.num_rows:
                raise ValueError(f"{name} must lie in [0, R = {self.num_rows}), got {row}")
        for x in (*self._arrays.values(), *self._counts):
            if x is not None and x.shape[0]:
                x[dst] = x[src]
        self._sync(dst, dst)

    def batch(self, req_indices=None, grammar_mask=None) -> StateBatch:
        """This call's processing: the batch's state rows (``req_indices``, int32 ``[B]``,
        -1 for padding; default ``arange(B)``) and, if given, the grammar mask per logits
        row (int32 ``[>= N + B, ceil(V / 32)]``, :func:`process_logits`' ``grammar_mask``).
        Checked with the rest of the call."""
        return StateBatch(self, req_indices, grammar_mask)

    def _sync(self, lo: int, hi: int) -> None:
        """Rows ``lo .. hi`` of the device copies (CPU tensors share the arrays)."""
        if self.device.type == "cpu":
            return
        for n, t in self._tensors.items():
            if t is not None:
                t[lo : hi + 1].copy_(torch.from_numpy(self._arrays[n][lo : hi + 1]))

    def _buffer_checked(self) -> tuple:
        """The token buffer, its shapes as at construction (else ``ValueError``)."""
        for name, t, shape in zip(("token_ids", "num_tokens", "num_prompt_tokens"),
                                  self._buffer, self._shapes, strict=True):  # fmt: skip
            if t.shape != shape:
                raise ValueError(
                    f"{name} changed shape since the ProcessingState was built: "
                    f"{tuple(shape)} -> {tuple(t.shape)}"
                )
        return self._buffer

    def _kernel_tuple(self, req_indices, grammar_mask) -> tuple:
        """The CPU kernels' processing tuple (``cpu/processing.py``'s ``TENSORS``) for a
        call checked by :meth:`StateBatch.checked` (values: in the kernel)."""
        token_ids, num_tokens, num_prompt = self._buffer
        return (np_(token_ids), np_(num_tokens), np_(num_prompt),
                NONE_I32 if req_indices is None else np_(req_indices), req_indices is not None,
                *self._head, NONE_I32_2D if grammar_mask is None else np_(grammar_mask),
                grammar_mask is not None, *self._tail)  # fmt: skip

    def _check_call(self, B, n_drafts, V, req_indices, grammar_mask):
        """:meth:`StateBatch.checked`'s checks; returns ``req_indices`` contiguous."""
        token_ids = self._buffer_checked()[0]
        device = self.device
        if V != self.vocab_size:
            raise ValueError(
                f"target_logits must have the state's vocabulary V = {self.vocab_size}, got {V}"
            )
        check_req_indices(req_indices, "len(cu_num_draft_tokens) - 1", B, token_ids.shape[0],
                          device)  # fmt: skip
        if grammar_mask is not None:
            W = (V + 31) // 32
            g = check_tensor("grammar_mask", grammar_mask, dtype=torch.int32, ndim=2,
                             device=device)  # fmt: skip
            if g.shape[1] != W or g.shape[0] < n_drafts + B:
                raise ValueError(
                    f"grammar_mask must be int32 [>= len(draft_token_ids) + B = "
                    f"{n_drafts + B}, ceil(V / 32) = {W}], got {tuple(g.shape)}"
                )
        return None if req_indices is None else req_indices.contiguous()

    def _gathered(self, B: int, req_indices, grammar_mask) -> LogitsProcessing:
        token_ids, num_tokens, num_prompt = self._buffer_checked()
        R = token_ids.shape[0]
        check_req_indices(req_indices, "B", B, R, self.device)
        if req_indices is None:
            rows = torch.arange(B, device=self.device)
        else:  # (padding rows -1: any row's values, their logits are copied; a row out of
            rows = req_indices.long().clamp(0, R - 1)  # range: refused by the value checks)
        # (R >= 1: checked at construction)
        p = {n: None if t is None else t.index_select(0, rows) for n, t in self._tensors.items()}
        return LogitsProcessing(token_ids, num_tokens, num_prompt, req_indices,
                                grammar_mask=grammar_mask, **p)  # fmt: skip


def verify_fused_cpu(kwargs, processing, proc, proc_checks, value_checks):
    """``rejection_sample(..., processing=...)``'s one-kernel CPU route
    (``cpu/rejection.py``'s ``rejection_sample_processed``): ``kwargs``, its kernel's
    arguments; ``proc`` and ``proc_checks``, :func:`prepare`'s result for a
    :class:`LogitsProcessing` (None for a :class:`StateBatch`); ``value_checks``, the
    verification's own. The kernel's outputs, or None where the route does not apply
    (anything but plain CPU tensors in eager mode)."""
    if not calls_cpu_directly(kwargs):
        return None
    if proc is not None:
        pt = {n: proc[n] for n in LogitsProcessing._fields}
        if not plain_cpu(pt.values()):
            return None
        checks = [c for c in (proc_checks, value_checks) if c is not None]  # both or none
    else:
        state, req, grammar = processing
        if not plain_cpu((*state._buffer, req, grammar)):
            return None
        drafts, cu, logits = (kwargs[n] for n in ("draft_token_ids", "cu_num_draft_tokens",
                                                  "target_logits"))  # fmt: skip
        B = cu.shape[0] - 1
        pt = state._kernel_tuple(req, grammar)

        def state_checks() -> None:  # the same values' checks as a LogitsProcessing
            lp = processing.logits_processing(B)
            prepare(logits, drafts, cu, *lp, validate=True)[0]()

        checks = [] if value_checks is None else [state_checks, value_checks]
    result = _cpu.rejection_sample_processed(**kwargs, check=bool(checks), processing=pt)
    if result is None:
        refused("rejection_sample", lambda: [c() for c in checks])
    return result
