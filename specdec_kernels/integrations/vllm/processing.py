"""vLLM's penalties, bad words, allowed tokens, ``min_tokens`` and logit bias as the inputs
of :func:`specdec_kernels.ops.process_logits` (the rejection plugin's verify step).

vLLM 0.33.0's ``SamplingMetadata`` holds them as host lists and per-request tensors; they
become one token buffer (each request's padded prompt, then its output), packed bitmasks
and padded id tensors. Host-built tensors go to a CUDA device from pinned memory without
blocking (as vLLM's own ``async_tensor_h2d``), so the host never waits for the queued
forward. The prompt keeps vLLM's padding (``vocab_size``, outside ``[0, V)``), which the op
ignores, so every request's output starts at the same column.

Where vLLM's rejection sampler differs from the op (logit bias on draft rows, ``min_tokens``
at the bonus row): ``docs/design.md``, "``process_logits``". One more, of rounding only:
the op's repetition penalty divides (vLLM's CUDA kernel); vLLM's CPU path multiplies by
``1 / p``, which can differ by one ulp.

vLLM imports happen inside the functions, so this module imports without vLLM."""

from __future__ import annotations

from typing import Any

import torch

from specdec_kernels.ops import token_bitmask


def _processor(sampling_metadata: Any, kind: str) -> Any:
    """vLLM's built-in logits processor ``kind`` ("min_tokens" or "logit_bias") if loaded."""
    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinTokensLogitsProcessor,
    )

    cls = {"min_tokens": MinTokensLogitsProcessor, "logit_bias": LogitBiasLogitsProcessor}[kind]
    procs = sampling_metadata.logitsprocs
    for proc in (*procs.argmax_invariant, *procs.non_argmax_invariant):
        if type(proc) is cls:
            return proc
    return None


def min_tokens_entries(sampling_metadata: Any) -> dict:
    """``{batch row: (min_tokens, output ids, stop ids, uses structured output)}`` of the
    requests below their ``min_tokens`` (vLLM's ``MinTokensLogitsProcessor`` state)."""
    proc = _processor(sampling_metadata, "min_tokens")
    return {} if proc is None else proc.min_toks


def logit_biases(sampling_metadata: Any) -> dict:
    """``{batch row: {token id: bias}}`` (vLLM's ``LogitBiasLogitsProcessor`` state)."""
    proc = _processor(sampling_metadata, "logit_bias")
    return {} if proc is None else proc.biases


def needs_processing(sampling_metadata: Any) -> bool:
    """Whether any request of the batch has a feature :func:`process_inputs` maps."""
    sm = sampling_metadata
    return bool(
        not sm.no_penalties
        or sm.bad_words_token_ids
        or sm.allowed_token_ids_mask is not None
        or min_tokens_entries(sm)
        or logit_biases(sm)
    )


def _h2d(t: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on ``device``: from pinned memory, not blocking, on CUDA."""
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _padded(rows: list[list[int]], width: int, device) -> torch.Tensor:
    out = torch.full((len(rows), max(width, 1)), -1, dtype=torch.int32)
    for i, ids in enumerate(rows):
        if ids:
            out[i, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
    return _h2d(out, device)


def process_inputs(sampling_metadata: Any, batch_size: int, device) -> dict:
    """The fields of :class:`specdec_kernels.ops.LogitsProcessing` (``process_logits``'
    arguments after the logits and drafts: ``token_ids``, ``num_tokens``,
    ``num_prompt_tokens`` and the features) for one vLLM verify step, as a dict.

    Output tokens: ``sampling_metadata.output_token_ids[b]`` (vLLM fills it when penalties
    or bad words are on), else the list ``min_tokens`` keeps for the request, else none.
    """
    sm = sampling_metadata
    B = batch_size
    min_toks = min_tokens_entries(sm)
    outputs = []
    for b in range(B):
        if b < len(sm.output_token_ids):
            outputs.append(list(sm.output_token_ids[b]))
        elif b in min_toks:
            outputs.append(list(min_toks[b][1]))
        else:
            outputs.append([])
    bad = None
    if sm.bad_words_token_ids:
        words = [sm.bad_words_token_ids.get(b, []) for b in range(B)]
        S = max(1, max(map(len, words)))
        Lw = max(1, max((len(w) for ws in words for w in ws), default=1))
        bad = torch.full((B, S, Lw), -1, dtype=torch.int32)
        for b, ws in enumerate(words):
            for s, w in enumerate(ws):
                bad[b, s, : len(w)] = torch.tensor(w, dtype=torch.int32)
    with_prompt = not sm.no_penalties and sm.prompt_token_ids is not None
    prompt = sm.prompt_token_ids[:B].to(device=device, dtype=torch.int32) if with_prompt else None
    P = 0 if prompt is None else prompt.shape[1]
    out_width = max(map(len, outputs), default=0)
    if bad is not None:  # the op takes no word longer than a token_ids row
        out_width = max(out_width, bad.shape[2] - P)
    out_tokens = _padded(outputs, out_width, device)
    token_ids = out_tokens if prompt is None else torch.cat([prompt, out_tokens], dim=1)
    lengths = _h2d(torch.tensor([P + len(o) for o in outputs], dtype=torch.int32), device)
    kw: dict[str, Any] = dict(
        token_ids=token_ids,
        num_tokens=lengths,
        num_prompt_tokens=torch.full((B,), P, dtype=torch.int32, device=device),
    )
    if not sm.no_penalties:
        kw.update(
            repetition_penalty=sm.repetition_penalties[:B].to(device, torch.float32),
            frequency_penalty=sm.frequency_penalties[:B].to(device, torch.float32),
            presence_penalty=sm.presence_penalties[:B].to(device, torch.float32),
        )
    if bad is not None:
        kw["bad_word_ids"] = _h2d(bad, device)
    if sm.allowed_token_ids_mask is not None:  # True marks a token that is not allowed
        kw["allowed_token_mask"] = token_bitmask(~sm.allowed_token_ids_mask[:B].to(device))
    if min_toks:
        stops = [sorted(min_toks[b][2]) if b in min_toks else [] for b in range(B)]
        minimum = [min_toks[b][0] if b in min_toks else 0 for b in range(B)]
        kw["min_tokens"] = _h2d(torch.tensor(minimum, dtype=torch.int32), device)
        kw["stop_token_ids"] = _padded(stops, max(map(len, stops), default=0), device)
    biases = logit_biases(sm)
    if biases:
        entries = [sorted(biases.get(b, {}).items()) for b in range(B)]
        M = max(1, max(map(len, entries)))
        ids = torch.full((B, M), -1, dtype=torch.int32)
        values = torch.zeros((B, M), dtype=torch.float32)
        for b, row in enumerate(entries):
            for m, (t, v) in enumerate(row):
                ids[b, m], values[b, m] = t, v
        kw.update(logit_bias_ids=_h2d(ids, device), logit_bias_values=_h2d(values, device))
    return kw
