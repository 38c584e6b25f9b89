"""The demo's report: the results table, the token-for-token verdicts, the results file.

Pure formatting over the runs :mod:`examples.engine.cli` made (no model, no engine here),
so every line of the report can be unit-tested with made-up numbers.
"""

from __future__ import annotations

import os
import platform
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from examples.engine.stats import Throughput


@dataclass
class Row(Throughput):
    """One run of the table."""

    label: str
    batch: int
    k: int
    tokens: int
    seconds: float
    tokens_per_step: float
    accepted_per_step: float
    prefill_seconds: float
    temperature: float = 0.0
    base: str | None = None
    """label of the run whose tokens/s this one's speedup is against (None: the table's first)"""
    verified_per_step: float = 0.0
    """draft tokens verified per request per step (what the draft policy chose)"""


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


def first_divergence(score, prompt, a: list[int], b: list[int]):
    """``None`` if equal, else (index, token_a, token_b, logit gap) at the first difference.

    ``score(ids)`` returns the logits of a teacher-forced pass (``Llama.score``); the gap is
    ``logit[token_a] - logit[token_b]`` after the prompt plus the common prefix, so a gap
    near 0 means a near tie that rounding decided. ``score=None``: no gap (NaN).
    """
    if a == b:
        return None
    i = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    ta = a[i] if i < len(a) else None
    tb = b[i] if i < len(b) else None
    gap = float("nan")
    if score is not None and ta is not None and tb is not None:
        logits = score(prompt + a[:i])[-1]
        gap = float(logits[ta] - logits[tb])
    return i, ta, tb, gap


def format_table(rows: list[Row]) -> str:
    """Markdown table; each row's speedup is its tokens/s over its ``base`` run's (default:
    the first row)."""
    by_label = {r.label: r for r in rows}
    head = (
        "| run | batch | k | temperature | new tokens | seconds | tokens/s | decode tokens/s "
        "| tokens/step | drafts verified/step | accepted drafts/step | speedup |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        base = by_label.get(r.base, rows[0]) if r.base else rows[0]
        sp = r.tokens_per_s / base.tokens_per_s if base.tokens_per_s else float("nan")
        ref = base.label.split(" ", 1)[0]  # "(a)"
        lines.append(
            f"| {r.label} | {r.batch} | {r.k} | {r.temperature:g} | {r.tokens} | "
            f"{r.seconds:.2f} | {r.tokens_per_s:.1f} | {r.decode_tokens_per_s:.1f} | "
            f"{r.tokens_per_step:.2f} | {r.verified_per_step:.2f} | {r.accepted_per_step:.2f} | "
            f"{sp:.2f}x vs {ref} |"
        )
    return "\n".join(lines)


def identical_line(
    what: str,
    base: list[list[int]],
    other: list[list[int]],
    names,
    *,
    suffix: str = "",
    score=None,
    prompts=None,
) -> str:
    """``- <what>: n/N prompts identical token for token<suffix>`` and, with ``score``, the
    first divergence of every prompt that differs (index, tokens, logit gap)."""
    diffs = []
    for i, (a, b) in enumerate(zip(base, other, strict=True)):
        d = first_divergence(score, prompts[i] if prompts else None, a, b)
        if d is not None:
            diffs.append((i, d))
    line = f"- {what}: {len(base) - len(diffs)}/{len(base)} prompts identical token for token"
    line += suffix
    for i, (j, ta, tb, gap) in diffs:
        line += f"; {names[i]}: first divergence at output token {j} ({ta} vs {tb})"
        if gap == gap:
            line += f", logit gap {gap:.3g}"
    return line


def logprobs_line(what: str, base, other) -> str:
    """``- <what>: ...``: how far the per-token logprobs of two runs' completions agree (the
    tokens they share: up to each pair's first divergence)."""
    same = total = 0
    worst = 0.0
    for a, b in zip(base, other, strict=True):
        for ta, tb, la, lb in zip(a.token_ids, b.token_ids, a.logprobs, b.logprobs, strict=False):
            if ta != tb:
                break
            total += 1
            same += la[1] == lb[1] and list(la[2]) == list(lb[2])
            shared = la[2].keys() & lb[2].keys()  # near-ties may swap an id at the N-th place
            pairs = [(la[0], lb[0])] + [(la[2][t], lb[2][t]) for t in shared]
            worst = max([worst] + [0.0 if x == y else abs(x - y) for x, y in pairs])  # -inf
    return (
        f"- {what}: ranks and top-N ids identical for {same}/{total} tokens, logprobs within "
        f"{worst:.2g}"
    )


def speedup_summary(plain: Row, spec: Row, what: str) -> str:
    return (
        f"{what}: {spec.tokens_per_s / plain.tokens_per_s:.2f}x tokens/s end to end, "
        f"{spec.decode_tokens_per_s / plain.decode_tokens_per_s:.2f}x in the decode steps "
        f"({spec.tokens_per_step:.2f} tokens per step)"
    )


def verdict_lines(
    tokens: dict[str, list[list[int]]],
    names: list[str],
    *,
    k: int,
    batch: int,
    kind: str,
    greedy: bool,
    score=None,
    prompts=None,
    sampled_temperature: float = 0.0,
) -> list[str]:
    """Token-for-token comparisons of the runs (keys ``"a"`` .. ``"g"`` of ``tokens``):
    (b), (d), (e) against (a); (c) transformers against (a) when greedy; (g) against (f)."""
    lines = [
        identical_line(
            f"{what} vs (a)",
            tokens["a"],
            tokens[key],
            names,
            suffix=f" ({kind})",
            score=score,
            prompts=prompts,
        )
        for what, key in (
            ("(b) speculation, batch 1", "b"),
            (f"(d) no speculation, batch {batch}", "d"),
            (f"(e) speculation, batch {batch}", "e"),
        )
    ]
    if "c" in tokens:
        if greedy:
            same = sum(a == b for a, b in zip(tokens["a"], tokens["c"], strict=True))
            lines.append(
                f"- (c) transformers vs (a): {same}/{len(names)} prompts identical "
                "token for token (different kernels: a near-tie may round the other way)"
            )
        else:
            lines.append(
                "- (c) transformers samples with its own random numbers: its tokens are "
                "not comparable with (a)'s"
            )
    if "g" in tokens:
        lines.append(
            identical_line(
                f"(g) vs (f), sampled at temperature {sampled_temperature:g}, k={k} vs 0",
                tokens["f"],
                tokens["g"],
                names,
                suffix=" (coupled verification: speculation does not change sampled outputs)",
            )
        )
    return lines


def summary_lines(rows: dict[str, Row], *, k: int, sampled_temperature: float = 0.0) -> list[str]:
    """The speed-ups the README quotes: (b) over (a) and, if run, (g) over (f)."""
    lines = [speedup_summary(rows["a"], rows["b"], f"n-gram speculation (k={k}) vs none, batch 1")]
    if "g" in rows:
        lines.append(
            speedup_summary(
                rows["f"],
                rows["g"],
                f"sampled at temperature {sampled_temperature:g}, n-gram speculation "
                f"(k={k}) vs none, batch 1",
            )
        )
    return lines


def per_prompt_table(names: list[str], comps_a, comps_b) -> list[str]:
    """Prompt length, new tokens and steps without (a) and with (b) speculation."""
    lines = [
        "| prompt | prompt tokens | new tokens | steps (a) | steps (b) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, ca, cb in zip(names, comps_a, comps_b, strict=True):
        lines.append(
            f"| {name} | {cb.prompt_len} | {len(cb.token_ids)} | {ca.steps} | {cb.steps} |"
        )
    return lines


def results_markdown(
    *,
    title: str,
    command: str,
    machine: str,
    table: str,
    summaries: list[str],
    verdict: list[str],
    repeats: int,
    per_prompt: list[str],
) -> str:
    """The results file ``bench/results/<date>-engine-<machine>.md``."""
    return "\n".join(
        [
            f"# {title}",
            "",
            f"Command: `{command}`",
            "",
            machine,
            "",
            table,
            "",
            *[s + "." for s in summaries],
            "",
            *verdict,
            "",
            f"seconds and tokens/s: wall time of the fastest of {repeats} interleaved "
            "repeats of each run, prefill included (model loading and a warm-up "
            "excluded); decode tokens/s: the same tokens over the time "
            "outside prefill forwards (transformers: outside the first forward of each "
            "generate). tokens/step: output tokens per request per forward pass "
            "(transformers: per `forward` call, its prefill included); accepted "
            "drafts/step: draft tokens the verifier kept per request per step; speedup: "
            "tokens/s over the named run's.",
            "",
            *per_prompt,
            "",
        ]
    )
