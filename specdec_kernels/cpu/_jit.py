"""The CPU path's compiler and its bridge to torch: numba kernels on numpy views.

Every CPU implementation is one ``@jit`` (numba ``njit``) kernel over numpy views of the
op's tensors, called once per op: no per-element Python and no train of small torch ops,
so a call costs the dispatcher plus a few microseconds (``docs/design.md``, "CPU path").

- ``cache=True``: compiled code is written to numba's cache (``__pycache__`` beside this
  package when it is writable, else numba's user-wide cache directory, or
  ``NUMBA_CACHE_DIR``), so only the first call on a machine pays the compile.
- ``nogil=True``: kernels release the GIL; they keep no global state (scratch buffers
  are per thread), so two Python threads may call the ops at once. No ``parallel=True``:
  one thread per call (never more than ``torch.get_num_threads()``), no thread pool to
  break in a forked worker.
- ``boundscheck=False``: every index a kernel computes from tensor values is guarded in
  the kernel (rows outside the state are skipped, lengths clamped to the buffers, probes
  bounded), so bad unchecked values (with the shapes the wrappers check) cannot touch
  memory outside the arrays.
- ``error_model="numpy"``: float division by zero gives inf/NaN as in torch, no exception.

numba has no float16 or bfloat16 on the CPU: kernels read bfloat16 as its 16-bit pattern
(``uint16``, widened exactly to float32 in the kernel); float16 is widened by torch first.
"""

from __future__ import annotations

import hashlib
import pathlib
import threading

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload


def _digest(paths) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


_HERE = pathlib.Path(__file__).parent
_SOURCES = _digest([*sorted(_HERE.glob("*.py")), _HERE.parent / "constants.py"])
"""A digest of every ``cpu/`` source and of ``constants.py`` (kernels freeze its values
when they compile): part of each kernel's cache stamp (below)."""


def jit_with(*fastmath: str):
    """The decorator of CPU kernels, with LLVM's fast-math ``fastmath`` flags (``"reassoc"``
    lets a float sum vectorise, ``"contract"`` fuses multiply-adds); each use says why."""
    njit = numba.njit(
        cache=True, nogil=True, boundscheck=False, error_model="numpy", fastmath=set(fastmath)
    )
    return lambda f: _stamped(njit(f))


def _stamped(kernel):
    """``kernel`` with ``_SOURCES`` in its cache stamp. numba's on-disk cache is valid while
    the kernel's own file is unchanged, but a kernel inlines helpers from other ``cpu/``
    modules and the package's constants: without the digest, editing only those would leave
    callers' stale code in the cache. (numba internals: where they differ, numba's own
    stamp stays.)"""
    cache_file = getattr(getattr(kernel, "_cache", None), "_cache_file", None)
    if cache_file is not None and hasattr(cache_file, "_source_stamp"):
        cache_file._source_stamp = (cache_file._source_stamp, _SOURCES)
    return kernel


jit = jit_with()
"""The decorator of every CPU kernel: strict IEEE float arithmetic."""


@intrinsic
def float_bits(typingctx, x):
    """The int32 bit pattern of a float32 (an LLVM bitcast: in a register, so it vectorises)."""
    if x != types.float32:
        return None
    return types.int32(types.float32), lambda ctx, b, sig, args: b.bitcast(args[0], ir.IntType(32))


@intrinsic
def bits_float(typingctx, x):
    """The float32 of an int32 bit pattern (``float_bits``' inverse)."""
    if x != types.int32:
        return None
    return types.float32(types.int32), lambda ctx, b, sig, args: b.bitcast(args[0], ir.FloatType())


def _borrow(context, builder, ty, value):
    """``value`` (of numba type ``ty``) with no reference count: an array's ``meminfo``
    and ``parent`` set to null; a scalar as it is."""
    if not isinstance(ty, types.Array):
        return value
    view = context.make_array(ty)(context, builder, value=value)
    view.meminfo = cgutils.get_null_value(view.meminfo.type)
    view.parent = cgutils.get_null_value(view.parent.type)
    return view._getvalue()


_SCALARS = (types.Number, types.Boolean)
"""What a tuple passed to :func:`borrowed` may hold besides arrays: values numba does not
reference-count. Anything else (a nested tuple, a string, a list) is refused when the
kernel compiles: returned as it is, it would be released once more than it was counted."""


@intrinsic
def borrowed(typingctx, x):
    """In a kernel: ``x``, an array or a flat tuple of arrays and scalars, as views that
    numba does not reference-count (a null ``meminfo``, as for a constant array). numba
    counts a reference to an array each time a call passes it (two atomic operations, ~40
    ns each here, where LLVM does not inline the callee); a kernel that passes arrays to a
    function per row borrows them once at its start. Only a kernel's own arguments: the
    Python caller holds them until the call returns, while numba may free an array the
    kernel allocates after its last counted use, under a borrowed view. A borrowed view
    must not outlive the call (returned, stored)."""
    if isinstance(x, types.Array):
        return x(x), lambda context, builder, sig, args: _borrow(context, builder, x, args[0])
    if not isinstance(x, types.BaseTuple) or not all(
        isinstance(t, (types.Array, *_SCALARS)) for t in x.types
    ):
        return None

    def codegen(context, builder, sig, args):
        value = args[0]
        for i, ty in enumerate(x.types):
            item = _borrow(context, builder, ty, builder.extract_value(value, i))
            value = builder.insert_value(value, item, i)
        return value

    return x(x), codegen


def as_float32(v):
    """A float32 value, or a bfloat16 bit pattern (uint16) widened to float32 exactly; in a
    kernel (``overload`` picks the conversion by type at compile time)."""
    raise NotImplementedError("as_float32 runs inside numba kernels only")


@overload(as_float32)
def _as_float32(v):
    if v == types.uint16:
        return lambda v: bits_float(np.int32(np.uint32(v) << 16))  # wraps to the sign bit
    return lambda v: np.float32(v)


NONE_I32 = np.zeros(0, dtype=np.int32)
NONE_I64 = np.zeros(0, dtype=np.int64)
NONE_F32 = np.zeros(0, dtype=np.float32)
NONE_I32_2D = np.zeros((0, 0), dtype=np.int32)
NONE_I64_2D = np.zeros((0, 0), dtype=np.int64)
NONE_F32_2D = np.zeros((0, 0), dtype=np.float32)
NONE_U16_2D = np.zeros((0, 0), dtype=np.uint16)
NONE_I32_3D = np.zeros((0, 0, 0), dtype=np.int32)
NONE_I32_4D = np.zeros((0, 0, 0, 0), dtype=np.int32)
"""What a kernel gets for an absent optional tensor, beside a ``has_<x>`` flag: one
compiled kernel serves calls with and without it (a ``None`` would compile one per
combination)."""


def np_(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor (no copy; any strides)."""
    return t.detach().numpy() if t.requires_grad else t.numpy()


def opt(t: torch.Tensor | None, none: np.ndarray) -> np.ndarray:
    """``np_(t)``, or the empty placeholder ``none`` for an absent tensor."""
    return none if t is None else np_(t)


def outputs(*specs: tuple) -> tuple[list[torch.Tensor], list[np.ndarray]]:
    """Uninitialised CPU outputs, one per ``(shape, numpy dtype)``: the tensors and their
    numpy views (``np.empty`` + ``torch.from_numpy`` costs half of ``torch.empty`` +
    ``.numpy()``, which shows in a call of a few microseconds)."""
    arrays = [np.empty(shape, dtype) for shape, dtype in specs]
    return list(map(torch.from_numpy, arrays)), arrays


def float_rows(t: torch.Tensor, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(f32, u16)`` views of the first ``n`` rows of fp32, bf16 or fp16 rows ``[., V]``
    (``n`` clamped to ``[0, rows]``): the other dtype's view is an empty placeholder (both
    for ``t = None``).

    bfloat16 goes as its bit pattern (the kernel widens it); float16 is widened to float32
    by torch (numba has no float16 on the CPU); strided rows are made contiguous. Rows are
    cut in numpy where no copy is needed (a torch slice costs more than a numpy one).
    """
    if t is None:
        return NONE_F32_2D, NONE_U16_2D
    n = max(0, min(n, t.shape[0]))
    t = t.detach()
    if t.dtype == torch.float16 or not t.is_contiguous():
        t = t[:n].contiguous()
    if t.dtype == torch.bfloat16:
        return NONE_F32_2D, t.view(torch.int16).numpy().view(np.uint16)[:n]
    return t.float().numpy()[:n], NONE_U16_2D


_SCRATCH = threading.local()


def scratch(n: int) -> np.ndarray:
    """A float32 working buffer of at least ``n`` entries, reused from call to call in each
    thread (a fresh multi-MiB array page-faults in on every call)."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.shape[0] < n:
        buf = np.empty(max(n, 1 << 16), dtype=np.float32)
        _SCRATCH.buf = buf
    return buf


def zeroed_i32(n: int) -> np.ndarray:
    """An int32 buffer of at least ``n`` zeros, reused from call to call in each thread; a
    kernel that writes it must leave it all zero again (``cpu/processing.py``'s counts)."""
    buf = getattr(_SCRATCH, "zeros", None)
    if buf is None or buf.shape[0] < n:
        buf = np.zeros(max(n, 1 << 16), dtype=np.int32)
        _SCRATCH.zeros = buf
    return buf
