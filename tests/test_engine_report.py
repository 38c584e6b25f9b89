"""The demo's report (examples/engine/report.py) on made-up runs: no model needed."""

from __future__ import annotations

import math

from examples.engine.report import (
    Row,
    first_divergence,
    format_table,
    logprobs_line,
    per_prompt_table,
    results_markdown,
    summary_lines,
    verdict_lines,
)


def _row(label, k, tokens, seconds, temperature=0.0, base=None, batch=1):
    return Row(label, batch, k, tokens, seconds, 1.0 + k / 2, k / 2, 0.5, temperature, base)


ROWS = {
    "a": _row("(a) engine, no speculation", 0, 100, 10.0),
    "b": _row("(b) engine, n-gram speculation", 4, 100, 5.0),
    "d": _row("(d) engine, no speculation", 0, 100, 4.0, batch=8),
    "e": _row("(e) engine, n-gram speculation", 4, 100, 2.5, batch=8),
    "f": _row("(f) engine, no speculation, sampled", 0, 100, 12.5, 0.8),
    "g": _row(
        "(g) engine, n-gram speculation, sampled",
        4,
        100,
        8.0,
        0.8,
        "(f) engine, no speculation, sampled",
    ),
}


def test_table_has_a_row_per_run_and_speedups_against_the_named_base():
    table = format_table(list(ROWS.values()))
    lines = table.splitlines()
    assert len(lines) == 2 + len(ROWS)
    assert "| temperature |" in lines[0] and lines[0].count("|") == lines[2].count("|")
    by_run = {line.split(" | ")[0][2:]: line for line in lines[2:]}
    assert by_run["(b) engine, n-gram speculation"].endswith("| 2.00x vs (a) |")
    assert by_run["(e) engine, n-gram speculation"].endswith("| 4.00x vs (a) |")
    assert by_run["(f) engine, no speculation, sampled"].endswith("| 0.80x vs (a) |")
    assert by_run["(g) engine, n-gram speculation, sampled"].endswith("| 1.56x vs (f) |")
    assert "| 0.8 |" in by_run["(g) engine, n-gram speculation, sampled"]


def test_verdict_counts_identical_prompts_and_names_the_first_divergence():
    same = [[1, 2, 3], [4, 5]]
    tokens = {"a": same, "b": same, "d": same, "e": [[1, 2, 3], [4, 6]], "f": same, "g": same}
    lines = verdict_lines(
        tokens,
        ["p0", "p1"],
        k=4,
        batch=8,
        kind="greedy, float64",
        greedy=True,
        sampled_temperature=0.8,
    )
    want = "- (b) speculation, batch 1 vs (a): 2/2 prompts identical token for token"
    assert lines[0] == want + " (greedy, float64)"
    assert lines[2].startswith("- (e) speculation, batch 8 vs (a): 1/2 prompts identical")
    assert lines[2].endswith("; p1: first divergence at output token 1 (5 vs 6)")
    assert lines[-1].startswith("- (g) vs (f), sampled at temperature 0.8, k=4 vs 0: 2/2 prompts")
    assert "coupled verification" in lines[-1]
    # transformers: compared when greedy, said to be incomparable when sampled
    tokens["c"] = [[1, 2, 3], [9]]
    greedy = verdict_lines(tokens, ["p0", "p1"], k=4, batch=8, kind="", greedy=True)
    assert "- (c) transformers vs (a): 1/2 prompts identical" in "\n".join(greedy)
    sampled = verdict_lines(tokens, ["p0", "p1"], k=4, batch=8, kind="", greedy=False)
    assert any("not comparable" in line for line in sampled)


def test_first_divergence_reports_the_logit_gap():
    def score(ids):
        return [[0.0] * 10 for _ in ids[:-1]] + [[float(t) for t in range(10)]]

    assert first_divergence(score, [7], [1, 2], [1, 2]) is None
    assert first_divergence(score, [7], [1, 5, 2], [1, 3]) == (1, 5, 3, 2.0)
    i, ta, tb, gap = first_divergence(None, None, [1], [1, 4])
    assert (i, ta, tb) == (1, None, 4) and math.isnan(gap)


def test_summaries_and_results_file():
    summaries = summary_lines(ROWS, k=4, sampled_temperature=0.8)
    assert summaries[0].startswith("n-gram speculation (k=4) vs none, batch 1: 2.00x tokens/s")
    assert summaries[1].startswith("sampled at temperature 0.8, n-gram speculation (k=4) vs none")
    assert "1.56x tokens/s end to end" in summaries[1]
    assert len(summary_lines({k: ROWS[k] for k in "ab"}, k=4)) == 1  # no sampled runs

    class C:
        def __init__(self, n, steps):
            self.prompt_len, self.token_ids, self.steps = 9, [0] * n, steps

    per_prompt = per_prompt_table(["p0"], [C(5, 5)], [C(5, 2)])
    assert per_prompt[-1] == "| p0 | 9 | 5 | 5 | 2 |"
    text = results_markdown(
        title="T",
        command="python -m examples.engine",
        machine="M",
        table=format_table(list(ROWS.values())),
        summaries=summaries,
        verdict=["- v"],
        repeats=2,
        per_prompt=per_prompt,
    )
    assert text.startswith("# T\n\nCommand: `python -m examples.engine`\n\nM\n")
    assert "(g) engine, n-gram speculation, sampled" in text and summaries[1] + "." in text
    assert "fastest of 2 interleaved repeats" in text


def test_logprobs_line_counts_agreeing_tokens_and_survives_swapped_top_ids():
    from examples.engine.stats import Completion

    a = Completion(0, 3, [5, 6, 7], "length", 3, [(-0.1, 1, {5: -0.1, 2: -2.0}),
                   (-0.2, 1, {6: -0.2, 1: -3.0}), (-0.3, 1, {7: -0.3, 4: -4.0})])  # fmt: skip
    b = Completion(0, 3, [5, 6, 8], "length", 1, [(-0.1, 1, {5: -0.1, 2: -2.0}),
                   (-0.25, 1, {6: -0.25, 9: -3.0}), (-0.5, 2, {8: -0.5, 7: -0.4})])  # fmt: skip
    line = logprobs_line("logprobs, (b) vs (a)", [a], [b])
    # two shared tokens (the third differs); the second's top ids differ (1 vs 9)
    want = "ranks and top-N ids identical for 1/2 tokens, logprobs within 0.05"
    assert line == f"- logprobs, (b) vs (a): {want}"
