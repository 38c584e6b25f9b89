"""README.md stays true: its Python example runs and prints what its comments say."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_example_runs_and_matches_its_comments():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no Python example"
    scope: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)  # noqa: S102
    assert scope["out"].draft_token_ids.tolist() == [[4, 1]]
    assert torch.equal(scope["out"].num_draft_tokens, torch.tensor([2], dtype=torch.int32))


def test_one_step_by_hand_runs_and_speculation_keeps_the_tokens():
    text = README.read_text()
    section = text[text.index("## One step, by hand") :]
    block = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    assert 25 <= len([line for line in block.splitlines() if line.strip()]) <= 40  # ~30
    scope: dict = {}
    exec(compile(block, "README.md (One step, by hand)", "exec"), scope)  # noqa: S102
    # the block asserts it too; checked here so that a changed block cannot drop it
    assert torch.equal(scope["spec"], scope["plain"])
    assert scope["spec_steps"] < scope["plain_steps"]
    for op in ("ngram_propose", "plan_draft_lengths", "prepare_verify_inputs",
               "rejection_sample", "commit_accepted_tokens", "ngram_index_extend",
               "update_acceptance_stats", "ngram_index_build"):  # fmt: skip
        assert f"ops.{op}(" in block, op


def test_readme_opens_with_the_two_commands():
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), flags=re.S).group(1)
    assert first_block.splitlines()[0].startswith("make demo")
    assert first_block.splitlines()[1].startswith("make test")
