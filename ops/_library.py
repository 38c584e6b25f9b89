"""The one ``torch.library.Library`` of this project and its registration helper.

Every op family module (``ops/<family>.py``) defines its schema here with :func:`define`
and registers, directly and without wrappers, a CPU function (``specdec_kernels/cpu``),
a CUDA function (``specdec_kernels/kernels``, the Triton launcher) and a fake (shape
only, built with ``new_empty``). All three take the schema's arguments as they are
written: tensors positionally, the Python ints, bools and strings after the ``*`` as
keywords. See ``docs/design.md``, "Layers".

Triton is imported only when the first CUDA tensor reaches an op, so the package imports
and runs its CPU path on machines where Triton is not installed (macOS, CPU-only
Windows).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import NamedTuple

import torch

NAMESPACE = "specdec"

lib = torch.library.Library(NAMESPACE, "DEF")


class OpInfo(NamedTuple):
    """What :func:`define` registered for one op (read by the signature and conformance tests)."""

    schema: str
    cpu: Callable
    cuda: str
    """``"specdec_kernels.kernels.<family>:<launcher>"``; ``<family>`` also names the
    reference (``specdec_kernels.reference.<family>``) and the CPU module."""
    fake: Callable
    cpu_checked: Callable | None = None
    """``cpu`` that first runs the wrapper's value checks inside its kernel and returns None
    when one fails, else the op's result (True for an op without outputs; see
    :func:`call`): for ops whose CPU call is a few microseconds."""


OPS: dict[str, OpInfo] = {}
"""Every op of the namespace by name, in the order they were defined."""


def _lazy(target: str) -> Callable:
    """A CUDA impl that imports ``"package.module:function"`` on its first call."""
    module, attr = target.split(":")
    resolved: list[Callable] = []

    def cuda_impl(*args, **kwargs):
        if not resolved:
            try:
                resolved.append(getattr(importlib.import_module(module), attr))
            except ImportError as err:
                raise RuntimeError(
                    f"specdec_kernels needs Triton for CUDA tensors ({err}); "
                    "pip install triton, or pass CPU tensors"
                ) from err
        return resolved[0](*args, **kwargs)

    cuda_impl.__name__ = cuda_impl.__qualname__ = f"cuda:{target}"
    return cuda_impl


def define(
    schema: str, *, cpu: Callable, cuda: str, fake: Callable, cpu_checked: Callable | None = None
) -> None:
    """Define ``specdec::<name>`` from ``schema`` and register its CPU, CUDA and fake impls.

    ``cuda`` names the Triton launcher as ``"specdec_kernels.kernels.<family>:<name>"``;
    it is imported at the first CUDA call (see the module docstring). ``cpu_checked``:
    see :class:`OpInfo`.
    """
    name = schema.split("(", 1)[0]
    OPS[name] = OpInfo(schema, cpu, cuda, fake, cpu_checked)
    lib.define(schema)
    lib.impl(name, cpu, "CPU")
    lib.impl(name, _lazy(cuda), "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)


def _no_index_output(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    return None


def define_index_updates(family: str, cpu, names: tuple[str, ...]) -> None:
    """Define the ops that update an own-history index in place, build and extend (the
    n-gram index's and the frequency index's share the schema ``<name>(token_ids,
    num_tokens, req_indices, index!, *, min_n, max_n) -> ()``); ``cpu`` is the family's
    CPU module (``<name>`` and ``<name>_checked``)."""
    for name in names:
        define(
            f"{name}(Tensor token_ids, Tensor num_tokens, Tensor? req_indices, "
            "Tensor(a!)[] index, *, int min_n, int max_n) -> ()",
            cpu=getattr(cpu, name),
            cuda=f"specdec_kernels.kernels.{family}:{name}",
            fake=_no_index_output,
            cpu_checked=getattr(cpu, f"{name}_checked"),
        )


_SCALARS = frozenset({int, float, bool, str, type(None)})
"""The non-tensor argument types of a schema: nothing to look at (the common case first)."""


def plain_cpu(values) -> bool:
    """Whether every value may reach the CPU function straight: not a tensor, or a plain
    CPU tensor that no autograd, subclass (fake, functional) or transform needs to see
    (lists and tuples: their items)."""
    for v in values:
        kind = type(v)
        if kind is torch.Tensor:
            if not v.is_cpu or v.requires_grad:
                return False
        elif kind in _SCALARS:
            continue
        elif isinstance(v, torch.Tensor) or (isinstance(v, (list, tuple)) and not plain_cpu(v)):
            return False
    return True


def call(name: str, *, value_checks: Callable[[], None] | None = None, **kwargs):
    """``torch.ops.specdec.<name>(**kwargs)``, the way every public wrapper calls its op.

    In plain eager mode on CPU tensors it calls the registered CPU function itself: what
    the dispatcher would run, without its ~5-8 us (most of a small CPU call). Anything
    the dispatcher exists for goes through it: ``torch.compile`` and ``torch.export``
    tracing, ``torch.jit`` tracing, a dispatch or torch-function mode (fake tensors,
    ``with torch.device(...)``), a running ``torch.profiler``, functorch transforms, tensor
    subclasses, tensors that require grad, other devices.

    ``value_checks``: the wrapper's value checks (raising ``ValueError``), run before the
    op; None: none to run. For an op with a ``cpu_checked`` function, the plain CPU call
    runs them inside the kernel instead and calls ``value_checks`` only when the kernel
    refuses the values, to raise the wrapper's error (``RuntimeError`` if it does not: the
    copies disagree)."""
    if calls_cpu_directly(kwargs):
        info = OPS[name]
        if value_checks is not None and info.cpu_checked is not None:
            result = info.cpu_checked(**kwargs)
            if result is not None:
                return None if result is True else result
            refused(name, value_checks)
        if value_checks is not None:
            value_checks()
        return info.cpu(**kwargs)
    if value_checks is not None:
        value_checks()
    return getattr(torch.ops.specdec, name)(**kwargs)


def refused(name: str, value_checks: Callable[[], None]) -> None:
    """A CPU kernel refused the values: ``value_checks`` raise the wrapper's ``ValueError``
    (``RuntimeError`` if they pass: the kernel's and the wrapper's copies disagree)."""
    value_checks()
    raise RuntimeError(
        f"specdec::{name}: its CPU kernel refused values that the wrapper's checks accept; the "
        "two copies of the checks disagree (a bug: please report it)"
    )


def calls_cpu_directly(kwargs: dict) -> bool:
    """Whether :func:`call` skips the dispatcher for these arguments (see there)."""
    return (
        not torch.compiler.is_compiling()  # first: tracing folds it, skipping the rest
        and torch._C._len_torch_dispatch_stack() == 0
        and not torch._C._is_torch_function_mode_enabled()
        and not torch._C._are_functorch_transforms_active()
        and torch._C._get_tracing_state() is None
        and not torch._C._autograd._profiler_enabled()  # a trace shows the op's event
        and plain_cpu(kwargs.values())
    )
