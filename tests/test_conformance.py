"""Every op, every tier: the conformance suite over tests/conformance.py's registry.

For each case: reference == CPU path == Triton launcher (interpreter without a GPU), the
launcher writes every output slot (poisoned allocations), ``torch.library.opcheck``, the
typed wrapper under ``torch.compile(fullgraph=True)``, and the fake's shapes and dtypes.
"""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from specdec_kernels.kernels import _utils
from specdec_kernels.ops._library import OPS
from tests.conformance import CASES, OpCase

IDS = [c.name for c in CASES]
PARAMS = pytest.mark.parametrize("case", CASES, ids=IDS)


def _family(op: str) -> str:
    return OPS[op].cuda.split(":")[0].rsplit(".", 1)[1]


def _impl(path: str, op: str):
    if path == "cpu":
        return OPS[op].cpu
    layer = "kernels" if path == "triton" else path
    return getattr(importlib.import_module(f"specdec_kernels.{layer}.{_family(op)}"), op)


def _map(x, f):
    if isinstance(x, torch.Tensor):
        return f(x)
    if isinstance(x, list):
        return [_map(t, f) for t in x]
    return x


def _on(args: dict, device) -> dict:
    return {k: _map(v, lambda t: t.to(device)) for k, v in args.items()}


def _outputs(case: OpCase, args: dict, out) -> dict:
    """The op's outputs and its mutated arguments, on the CPU, in comparable form."""
    out = () if out is None else out if isinstance(out, tuple) else (out,)
    got = {f"out{i}": t.cpu() for i, t in enumerate(out)}
    for name in case.mutated:
        state = _map(args[name], lambda t: t.cpu())
        got[name] = case.canon.get(name, lambda s: s)(state)
    return got


def _run(case: OpCase, path: str, device=None) -> dict:
    args = case.make()
    if path == "triton":
        args = _on(args, device)
    return _outputs(case, args, _impl(path, case.op)(**args))


def _assert_same(got: dict, want: dict, what: str) -> None:
    assert got.keys() == want.keys(), what
    for key in want:
        g, w = got[key], want[key]
        if isinstance(w, torch.Tensor):
            assert g.dtype == w.dtype and g.shape == w.shape, (what, key, g, w)
            if w.is_floating_point():
                torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5, msg=f"{what} {key}")
            else:
                assert torch.equal(g, w), (what, key, g, w)
        elif isinstance(w, list) and w and isinstance(w[0], torch.Tensor):
            _assert_same(dict(enumerate(g)), dict(enumerate(w)), f"{what} {key}")
        else:
            assert g == w, (what, key, g, w)


def test_every_registered_op_has_a_case():
    assert set(OPS) == {c.op for c in CASES}, "add the new op's cases to tests/conformance.py"
    assert len(set(IDS)) == len(IDS)


@PARAMS
def test_reference_cpu_and_triton_agree(case, kernel_device):
    want = _run(case, "reference")
    _assert_same(_run(case, "cpu"), want, "cpu")
    _assert_same(_run(case, "triton", kernel_device), want, "triton")
    public = case.make()
    got = _outputs(case, public, case.public(public))
    # the wrapper maps outputs the caller did not ask for to None (and leaves them out)
    _assert_same(got, {key: want[key] for key in got}, "public")


@PARAMS
@pytest.mark.parametrize("poison", [-77, 12345])
def test_launcher_writes_every_output_slot(case, poison, monkeypatch, kernel_device):
    def poisoned(shape, dtype, device):
        if dtype.is_floating_point:
            fill = float("nan")
        elif dtype == torch.bool:
            fill = True
        else:  # the poison, saturated to the dtype
            info = torch.iinfo(dtype)
            fill = max(min(poison, info.max), info.min)
        return torch.full(shape, fill, dtype=dtype, device=device)

    monkeypatch.setattr(_utils, "_empty", poisoned)
    _assert_same(_run(case, "triton", kernel_device), _run(case, "reference"), "poisoned")


def _split(op: str, args: dict) -> tuple[tuple, dict]:
    schema = getattr(torch.ops.specdec, op).default._schema
    pos = tuple(args[a.name] for a in schema.arguments if not a.kwarg_only)
    kw = {a.name: args[a.name] for a in schema.arguments if a.kwarg_only}
    return pos, kw


@PARAMS
def test_opcheck(case):
    pos, kw = _split(case.op, case.make())
    torch.library.opcheck(getattr(torch.ops.specdec, case.op).default, pos, kw)


@PARAMS
def test_wrapper_compiles_fullgraph(case):
    eager_args, compiled_args = case.make(), case.make()
    want = _outputs(case, eager_args, case.public(eager_args))
    torch._dynamo.reset()
    compiled = torch.compile(case.public, fullgraph=True, backend="aot_eager")
    _assert_same(_outputs(case, compiled_args, compiled(compiled_args)), want, "compiled")


@PARAMS
def test_fake_has_the_real_shapes_and_dtypes(case):
    args = case.make()
    real = getattr(torch.ops.specdec, case.op)(**copy.deepcopy(args))
    real = () if real is None else real if isinstance(real, tuple) else (real,)
    with FakeTensorMode() as mode:
        fake_args = {k: _map(v, mode.from_tensor) for k, v in args.items()}
        fake = getattr(torch.ops.specdec, case.op)(**fake_args)
    fake = () if fake is None else fake if isinstance(fake, tuple) else (fake,)
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in real]


@PARAMS
def test_wrapper_calling_the_cpu_path_directly_equals_the_dispatcher(case, monkeypatch):
    # in eager mode on plain CPU tensors the wrappers skip the dispatcher (ops/_library.call)
    from specdec_kernels.ops import _library

    direct_args, dispatched_args = case.make(), case.make()
    assert _library.calls_cpu_directly(direct_args)
    want = _outputs(case, direct_args, case.public(direct_args))
    monkeypatch.setattr(_library, "calls_cpu_directly", lambda kwargs: False)
    _assert_same(_outputs(case, dispatched_args, case.public(dispatched_args)), want, "dispatched")


def test_the_dispatcher_is_skipped_only_in_plain_eager_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    from specdec_kernels.ops._library import calls_cpu_directly

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    t = torch.zeros(3)
    assert calls_cpu_directly({"a": t, "b": [t, t], "n": 3, "s": None})
    assert not calls_cpu_directly({"a": torch.zeros(3, requires_grad=True)})
    assert not calls_cpu_directly({"a": [t, torch.zeros(3, device="meta")]})
    with torch.device("cpu"):  # a torch-function mode
        assert not calls_cpu_directly({"a": t})
    with Passthrough():
        assert not calls_cpu_directly({"a": t})
    with FakeTensorMode() as mode:
        assert not calls_cpu_directly({"a": mode.from_tensor(t)})
    assert not calls_cpu_directly({"a": torch.nn.Parameter(t, requires_grad=False)})
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert not calls_cpu_directly({"a": t})  # a trace shows the op's event


def test_a_profiled_call_records_the_ops_event():
    from specdec_kernels.ops import ngram_propose

    tokens = torch.tensor([[7, 8, 9, 10, 7, 8]], dtype=torch.int32)
    n = torch.tensor([6], dtype=torch.int32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        ngram_propose(tokens, n, min_n=1, max_n=2, num_speculative_tokens=3)
    assert any(e.name == "specdec::ngram_propose" for e in prof.events())
