"""The main job: the example engine with and without n-gram speculation on a real model.

``python -m examples.engine`` decodes the embedded prompts (``prompts.json``) with

(a) this engine without speculation (k = 0), batch 1;
(b) this engine with n-gram speculation (k drafts), batch 1;
(c) transformers' ``generate(prompt_lookup_num_tokens=k)`` on the same weights, batch 1;
(d), (e) this engine without and with speculation at ``--batch-size``;
(f), (g) this engine without and with speculation, batch 1, sampled at
``--sampled-temperature`` (0.8; seeds ``--seed + i``, ``--top-p``);

prints every completion and a table (tokens/s, tokens and accepted drafts per step),
states whether the outputs with speculation equal those without, token for token (greedy
and, by coupled verification, sampled; at the first greedy divergence, if any, it reports
the logit gap), and writes the table to ``bench/results/<date>-engine-<machine>.md``. The
report itself is :mod:`examples.engine.report`.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch

from examples.engine.args import (
    DEFAULT_PROMPTS,
    DTYPES,
    UsageError,
    build_parser,
    check_args,
    load_prompts,
    tokenize,
)
from examples.engine.hf_baseline import run_hf
from examples.engine.model import ModelError
from examples.engine.report import (
    Row,
    format_table,
    identical_line,
    load_average,
    logprobs_line,
    machine_name,
    per_prompt_table,
    results_markdown,
    summary_lines,
    verdict_lines,
    write_atomic,
)

__all__ = ["DEFAULT_PROMPTS", "load_prompts", "machine_name", "main", "tokenize", "write_atomic"]


def new_engine(model, *, k, batch, args, stop_ids, verify_costs=None, corpus=0):
    """The engine of one run; with speculation it follows ``--draft-policy``, and the adaptive
    policy's cost table is measured once per batch size (``verify_costs`` caches it)."""
    from examples.engine.engine import Engine

    policy = args.draft_policy if k > 0 else "fixed"
    eng = Engine(
        model,
        max_batch_size=batch,
        max_model_len=args.max_model_len,
        num_speculative_tokens=k,
        min_n=args.min_n,
        max_n=args.max_n,
        stop_token_ids=stop_ids,
        draft_policy=policy,
        corpus_tokens=corpus,
        scoring=args.scoring,
        logprobs_mode=args.logprobs_mode,
    )
    if policy == "adaptive":
        costs = verify_costs if verify_costs is not None else {}
        if (batch, k) not in costs:
            costs[(batch, k)] = (eng.calibrate(), eng.calibration_seconds)
        eng.verify_cost = costs[(batch, k)][0]
    return eng


def run_engine(
    model,
    prompts,
    params,
    *,
    label,
    k,
    batch,
    args,
    stop_ids,
    show=True,
    tag="",
    base=None,
    verify_costs=None,
    corpus=0,
):
    from tqdm import tqdm

    eng = new_engine(
        model,
        k=k,
        batch=batch,
        args=args,
        stop_ids=stop_ids,
        verify_costs=verify_costs,
        corpus=corpus,
    )
    total = sum(p.max_tokens for p in params)
    with tqdm(total=total, desc=label + tag, unit="tok", file=sys.stderr, disable=not show) as bar:
        comps, stats = eng.generate(prompts, params, progress=bar)
        bar.total = stats.tokens  # requests may stop early
        bar.refresh()
    assert stats.host_reads == stats.steps  # one device-to-host read per step
    row = Row(
        label,
        batch,
        k,
        stats.tokens,
        stats.seconds,
        stats.tokens_per_step,
        stats.accepted_per_step,
        stats.prefill_seconds,
        temperature=params[0].temperature,
        base=base,
        verified_per_step=stats.verified_per_step,
    )
    return comps, stats, row


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    named = load_prompts(args.prompts)

    from examples.engine.engine import Engine, EngineError, SamplingParams
    from examples.engine.llama import Llama, LlamaConfig
    from examples.engine.model import load_model, stop_token_ids

    load_before = load_average()
    t0 = time.perf_counter()
    loaded = load_model(args.model_path)
    tok = loaded.tokenizer
    prompts = [tokenize(tok, text) for _, text in named]
    stop_ids = stop_token_ids(loaded)
    dtype = DTYPES[args.dtype]
    model = Llama(LlamaConfig.from_dict(loaded.config), loaded.state_dict, dtype=dtype)
    processing = dict(  # the same for every request and run
        repetition_penalty=args.repetition_penalty,
        frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty,
        logit_bias=args.logit_bias or None,
        allowed_token_ids=args.allowed_token_ids,
        bad_words=[tok(w, add_special_tokens=False)["input_ids"] for w in
                   filter(None, args.bad_words.split("|"))],
        min_tokens=args.min_tokens,
        logprobs=args.logprobs,
    )  # fmt: skip
    params = [
        SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed + i,
            **processing,
        )
        for i in range(len(prompts))
    ]
    # Reject bad prompts before any run starts.
    probe = Engine(
        model,
        max_batch_size=1,
        max_model_len=args.max_model_len,
        num_speculative_tokens=args.k,
        min_n=args.min_n,
        max_n=args.max_n,
    )
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        try:
            probe.check_prompt(i, len(p), sp)
        except EngineError as e:
            raise UsageError(f"{e} (prompt {named[i][0]!r})") from None
    del probe
    load_s = time.perf_counter() - t0
    print(
        f"model: {loaded.path} ({args.dtype}, loaded in {load_s:.1f} s); "
        f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} "
        f"tokens; k={args.k}, n in [{args.min_n}, {args.max_n}], {args.scoring} scoring; "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )

    # The adaptive policy's cost model: forward passes of 1 .. B*(k+1) tokens, timed once
    # per batch size before any run (reported apart, not part of any run's time).
    verify_costs: dict = {}
    if args.k > 0 and args.draft_policy == "adaptive":
        for bb in sorted({1, args.batch_size}):
            new_engine(
                model, k=args.k, batch=bb, args=args, stop_ids=stop_ids, verify_costs=verify_costs
            )
        calib = ", ".join(f"batch {b}: {s:.1f} s" for (b, _), (_, s) in verify_costs.items())
        print(f"verify-cost calibration ({calib})", flush=True)

    # Warm-up (not timed): first calls allocate and pick kernels.
    for kk in sorted({0, args.k}):
        run_engine(
            model,
            prompts[:1],
            [SamplingParams(max_tokens=4)],
            label="warm-up",
            k=kk,
            batch=1,
            args=args,
            stop_ids=stop_ids,
            show=False,
            verify_costs=verify_costs,
        )

    # Every run is repeated --repeats times, interleaved, and the fastest repeat is kept:
    # on a small shared machine a single run can be slowed down by anything else running.
    B = args.batch_size
    T_s = args.sampled_temperature
    sampled = [
        SamplingParams(
            max_tokens=args.max_tokens,
            temperature=T_s,
            top_p=args.top_p,
            seed=args.seed + i,
            **processing,
        )
        for i in range(len(prompts))
    ]
    plan = [  # key, label, k, batch, params, base of the speedup column
        ("a", "(a) engine, no speculation", 0, 1, params, None),
        ("b", "(b) engine, n-gram speculation", args.k, 1, params, None),
        ("c", None, args.k, 1, params, None),
        ("d", "(d) engine, no speculation", 0, B, params, None),
        ("e", "(e) engine, n-gram speculation", args.k, B, params, None),
    ]
    if T_s > 0:
        plan += [
            ("f", "(f) engine, no speculation, sampled", 0, 1, sampled, None),
            ("g", "(g) engine, n-gram speculation, sampled", args.k, 1, sampled, "(f)"),
        ]
    if args.corpus > 0 and args.k > 0:  # finished requests feed the later ones' drafts
        plan.append(
            ("h", "(h) engine, n-gram speculation + shared corpus", args.k, 1, params, None)
        )
    hf = None
    from examples.engine.processing import Processing

    if Processing.uses_any(params) and not args.skip_hf:
        print("run (c) skipped: transformers' generate gets none of the processing flags")
    elif not args.skip_hf:
        from examples.engine.model import load_hf_model

        hf = load_hf_model(loaded.path, dtype)
    runs = {}
    for rep in range(args.repeats):
        tag = f" [{rep + 1}/{args.repeats}]" if args.repeats > 1 else ""
        for key, label, kk, bb, pp, base in plan:
            if key == "c":
                if hf is None:
                    continue
                outs, row = run_hf(hf, prompts, pp, k=kk, args=args, stop_ids=stop_ids, tag=tag)
                result = (outs, None, row)
            else:
                result = run_engine(
                    model,
                    prompts,
                    pp,
                    label=label,
                    k=kk,
                    batch=bb,
                    args=args,
                    stop_ids=stop_ids,
                    tag=tag,
                    base=base,
                    verify_costs=verify_costs,
                    corpus=args.corpus if key == "h" else 0,
                )
            if key not in runs or result[2].tokens_per_s > runs[key][2].tokens_per_s:
                runs[key] = result
    if "g" in runs:  # the label the table shows for its base
        runs["g"][2].base = runs["f"][2].label

    comps_a, comps_b = runs["a"][0], runs["b"][0]
    out = []
    for (name, _), c in zip(named, comps_b, strict=True):
        out.append(
            f"--- {name} ({c.prompt_len} prompt tokens, {len(c.token_ids)} new, "
            f"{c.finish_reason}, {c.steps} steps with k={args.k}, "
            f"{comps_a[c.index].steps} without)"
        )
        out.append(tok.decode(c.token_ids, skip_special_tokens=True))
    print("\n".join(out), flush=True)

    table = format_table([runs[key][2] for key in "abcdefgh" if key in runs])
    tokens = {key: [c.token_ids for c in r[0]] if key != "c" else r[0] for key, r in runs.items()}
    greedy = args.temperature == 0
    verdict = verdict_lines(
        tokens,
        [n for n, _ in named],
        k=args.k,
        batch=B,
        kind=f"greedy, {args.dtype}" if greedy else f"temperature {args.temperature}",
        greedy=greedy,
        score=model.score if greedy else None,  # the logit gap at a greedy divergence
        prompts=prompts,
        sampled_temperature=T_s,
    )
    if "h" in tokens:
        verdict.append(
            identical_line(
                "(h) speculation + shared corpus, batch 1 vs (a)",
                tokens["a"],
                tokens["h"],
                [n for n, _ in named],
                suffix=f" ({'greedy' if greedy else 'sampled'}, {args.dtype})",
                score=model.score if greedy else None,
                prompts=prompts,
            )
        )
    if args.logprobs is not None:
        verdict.append(logprobs_line("logprobs, (b) vs (a)", runs["a"][0], runs["b"][0]))
    summaries = summary_lines(
        {key: r[2] for key, r in runs.items()}, k=args.k, sampled_temperature=T_s
    )
    print()
    print(table)
    print()
    print("\n".join(summaries))
    print("\n".join(verdict), flush=True)

    if not args.no_results:
        now = datetime.datetime.now(datetime.timezone.utc)
        threads = torch.get_num_threads()
        path = args.results_dir / f"{now.date().isoformat()}-engine-{machine_name(threads)}.md"
        import transformers

        flags = sys.argv[1:] if argv is None else list(argv)
        per_prompt = per_prompt_table([n for n, _ in named], comps_a, comps_b)
        machine = (
            f"Machine: {machine_name(threads)} ({os.cpu_count()} cores, {threads} torch "
            f"threads; load average {load_before} before, {load_average()} after); "
            f"torch {torch.__version__}, transformers {transformers.__version__}; weights "
            f"{args.dtype}; {len(prompts)} prompts ({args.prompts.name}), max "
            f"{args.max_tokens} new tokens each, k={args.k} (draft policy "
            f"{args.draft_policy}), n in [{args.min_n}, "
            f"{args.max_n}], temperature {args.temperature} ((f), (g): {T_s:g}, seeds "
            f"{args.seed} + prompt index), top-p {args.top_p}."
        )
        text = results_markdown(
            title="Example engine: n-gram speculative decoding on SmolLM2-135M-Instruct "
            f"({now:%Y-%m-%d %H:%M} UTC)",
            command=" ".join(["python -m examples.engine", *flags]),
            machine=machine,
            table=table,
            summaries=summaries,
            verdict=verdict,
            repeats=args.repeats,
            per_prompt=per_prompt,
        )
        write_atomic(path, text)
        print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from examples.engine.engine import EngineError
    from examples.engine.kv_cache import OutOfBlocksError

    try:
        return run(argv)
    except (UsageError, ModelError, EngineError, OutOfBlocksError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted (nothing written)", file=sys.stderr)
        return 130
