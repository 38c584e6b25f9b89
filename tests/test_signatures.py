"""Every copy of an op's signature agrees with its schema.

An op's parameters are written in its schema (``ops/<family>.py``), its fake, its CPU
function, its Triton launcher and its reference, and the typed wrapper calls
``torch.ops.specdec.<op>`` with them. This test ties the copies together: each function
takes exactly the schema's parameter names in the schema's order, with the schema's
keyword-only ones after ``*``, and every ``torch.ops.specdec.<op>(...)`` call in ``ops/``
passes every argument by keyword, with exactly the schema's names in its order.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
import torch

from specdec_kernels.ops._library import OPS

OPS_DIR = Path(__file__).resolve().parents[1] / "ops"


def schema_params(op: str) -> list[tuple[str, bool]]:
    """``[(name, keyword_only)]`` of the op's schema."""
    schema = getattr(torch.ops.specdec, op).default._schema
    return [(a.name, a.kwarg_only) for a in schema.arguments]


def signature_mismatches(params: list[tuple[str, bool]], fn) -> list[str]:
    """How ``fn``'s parameters differ from the schema's (empty: they agree)."""
    sig = inspect.signature(fn).parameters.values()
    got = [(p.name, p.kind is inspect.Parameter.KEYWORD_ONLY) for p in sig]
    if got == params:
        return []
    return [f"{getattr(fn, '__qualname__', fn)} takes {got}, the schema {params}"]


def implementations(op: str) -> dict[str, object]:
    info = OPS[op]
    module, name = info.cuda.split(":")
    family = module.rsplit(".", 1)[1]
    return {
        "fake": info.fake,
        "cpu": info.cpu,
        "launcher": getattr(importlib.import_module(module), name),
        "reference": getattr(importlib.import_module(f"specdec_kernels.reference.{family}"), op),
    }


def _op_name(func: ast.expr) -> str | None:
    """``name`` for a call of ``torch.ops.specdec.name`` (or ``.name.default``)."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    parts.reverse()
    if parts[:3] == ["torch", "ops", "specdec"] and len(parts) in (4, 5):
        return parts[3]
    return None


def _called_ops(node: ast.Call) -> tuple[list[str], list]:
    """``(ops, positional arguments)`` of ``call("<op>", ...)`` (``ops/_library.py``; also
    ``call("<op>" if ... else "<op>", ...)``, both ops checked) or of
    ``torch.ops.specdec.<op>(...)``; ``([], [])`` for any other call. A ``call`` whose op
    is not spelled out cannot be checked: ``["?"]``."""
    func, args = node.func, node.args
    if isinstance(func, ast.Name) and func.id == "call" and args:
        name = args[0]
        names = [name.body, name.orelse] if isinstance(name, ast.IfExp) else [name]
        if all(isinstance(n, ast.Constant) and isinstance(n.value, str) for n in names):
            return [n.value for n in names], args[1:]
        return ["?"], args[1:]
    op = _op_name(func)
    return ([op], args) if op else ([], [])


def call_mismatches(source: str, where: str) -> tuple[list[str], set[str]]:
    """Problems of the op calls (``call("<op>", ...)``, ``torch.ops.specdec.<op>(...)``) in
    ``source``, and the ops called."""
    problems, called = [], set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        ops, args = _called_ops(node)
        for op in ops:
            at = f"{where}:{node.lineno} {op}"
            if op == "?":
                problems.append(f"{at}: the op's name is not a string literal")
                continue
            called.add(op)
            if args:
                problems.append(f"{at}: passes {len(args)} argument(s) by position")
            names = [kw.arg for kw in node.keywords if kw.arg != "value_checks"]  # call()'s
            if None in names:
                problems.append(f"{at}: passes **kwargs")
            want = [name for name, _ in schema_params(op)]
            if names != want:
                problems.append(f"{at}: passes {names}, the schema has {want}")
    return problems, called


@pytest.mark.parametrize("op", list(OPS))
def test_every_copy_of_the_signature_matches_the_schema(op):
    params = schema_params(op)
    problems = []
    for what, fn in implementations(op).items():
        problems += [f"{what}: {p}" for p in signature_mismatches(params, fn)]
    assert not problems, "\n".join(problems)


def test_wrappers_call_every_op_by_keyword_with_the_schema_names():
    problems, called = [], set()
    for path in sorted(OPS_DIR.glob("*.py")):
        p, c = call_mismatches(path.read_text(), path.name)
        problems += p
        called |= c
    assert not problems, "\n".join(problems)
    assert called == set(OPS), f"no wrapper calls {sorted(set(OPS) - called)}"


def test_the_checks_fail_on_a_changed_copy():
    params = schema_params("ngram_propose")
    cpu = implementations("ngram_propose")["cpu"]
    assert signature_mismatches(params, cpu) == []

    def swapped(token_ids, req_indices, num_tokens, max_draft_tokens, index, corpus, *, min_n,
                max_n, num_speculative_tokens, max_model_len, tie_break):  # fmt: skip
        pass

    def renamed(token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, *, min_n,
                max_n, k, max_model_len, tie_break):  # fmt: skip
        pass

    def positional(token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, min_n,
                   max_n, num_speculative_tokens, max_model_len, tie_break):  # fmt: skip
        pass

    for changed in (swapped, renamed, positional):
        assert signature_mismatches(params, changed), changed.__name__

    source = (OPS_DIR / "ngram.py").read_text()
    assert call_mismatches(source, "ngram.py")[0] == []
    for old, new in [
        ("token_ids=token_ids,", "token_ids,"),  # by position (then out of order too)
        ("tie_break=tie_break,", ""),  # one left out
        ("tie_break=tie_break,", "tie_break=tie_break, validate=True,"),  # one too many
        ("min_n=min_n,\n        max_n=max_n,", "max_n=max_n,\n        min_n=min_n,"),  # order
    ]:
        assert old in source, old
        problems, _ = call_mismatches(source.replace(old, new, 1), "ngram.py")
        assert problems, (old, new)
