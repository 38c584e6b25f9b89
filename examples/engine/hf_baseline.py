"""Run (c) of the demo: transformers' own ``generate``, with prompt lookup, on the same weights.

The baseline a user of transformers would run: one request at a time (batch 1), greedy or
sampled with transformers' random numbers, ``prompt_lookup_num_tokens=k`` for n-gram
speculation. Counts its forward calls with hooks, so the table can show tokens per step.
"""

from __future__ import annotations

import sys
import time

import torch

from examples.engine.report import Row


def run_hf(hf, prompts, params, *, k, args, stop_ids, tag=""):
    """transformers' prompt-lookup decoding, batch 1 (run (c))."""
    from tqdm import tqdm

    # forward calls (steps) and the time of the first one of each generate (its prefill)
    calls, in_generate, started, prefill = [0], [0], [0.0], [0.0]

    def pre_hook(*_):
        started[0] = time.perf_counter()

    def hook(*_):
        calls[0] += 1
        in_generate[0] += 1
        if in_generate[0] == 1:
            prefill[0] += time.perf_counter() - started[0]

    handles = [hf.register_forward_pre_hook(pre_hook), hf.register_forward_hook(hook)]
    outs, tokens, seconds = [], 0, 0.0
    total = sum(p.max_tokens for p in params)
    with (
        torch.inference_mode(),
        tqdm(total=total, desc="(c) transformers" + tag, unit="tok", file=sys.stderr) as bar,
    ):
        # warm-up (not timed)
        hf.generate(
            torch.tensor([prompts[0]]), max_new_tokens=2, do_sample=False, pad_token_id=stop_ids[0]
        )
        calls[0], prefill[0] = 0, 0.0
        for ids, sp in zip(prompts, params, strict=True):
            in_generate[0] = 0
            kw = dict(do_sample=False)
            if sp.temperature > 0:
                torch.manual_seed(sp.seed)
                kw = dict(do_sample=True, temperature=sp.temperature, top_p=sp.top_p, top_k=0)
            if k > 0:
                kw.update(prompt_lookup_num_tokens=k, max_matching_ngram_size=args.max_n)
            x = torch.tensor([ids])
            t0 = time.perf_counter()
            y = hf.generate(
                x,
                max_new_tokens=sp.max_tokens,
                eos_token_id=list(stop_ids),
                pad_token_id=stop_ids[0],
                **kw,
            )
            seconds += time.perf_counter() - t0
            out = y[0, len(ids) :].tolist()
            outs.append(out)
            tokens += len(out)
            bar.update(len(out))
    for h in handles:
        h.remove()
    steps = calls[0]
    label = (
        f"(c) transformers generate(prompt_lookup_num_tokens={k})"
        if k
        else "(c) transformers generate()"
    )
    return outs, Row(
        label,
        1,
        k,
        tokens,
        seconds,
        tokens / max(steps, 1),
        (tokens - steps) / max(steps, 1),
        prefill[0],
        temperature=params[0].temperature,
    )
