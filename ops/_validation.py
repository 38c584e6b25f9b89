"""Input checks shared by the public op wrappers.

Policy (``docs/design.md``, "Validation"): dtype, device, ndim and shape checks always
run; checks that need tensor *values* run only on CPU tensors or when the caller passes
``validate=True``, and never while ``torch.compile`` traces or a CUDA graph captures (a
GPU op must not synchronise with the host). Every failure is a ``ValueError`` naming the
argument.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
import torch

from specdec_kernels.cpu import checks as _cpu_checks
from specdec_kernels.cpu._jit import NONE_I32, np_, opt

_ONE_PASS_DTYPES = (torch.int32, torch.int64, torch.float32, torch.float64)
"""The dtypes of CPU tensors checked in one numba pass (``cpu/checks.py``)."""


def check_tensor(
    name: str,
    t: object,
    *,
    dtype: torch.dtype | Sequence[torch.dtype],
    ndim: int,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Check that ``t`` is a tensor with the given dtype(s), ndim and (optionally) device."""
    if (  # the common case, answered in a few attribute reads (a call's fixed cost)
        type(t) is torch.Tensor
        and (
            t.dtype is dtype
            if type(dtype) is torch.dtype
            else type(dtype) is tuple and t.dtype in dtype
        )
        and t.dim() == ndim
        and (device is None or t.device == device)
    ):
        return t
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dtypes = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
    if t.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{name} must have dtype {want}, got {str(t.dtype).replace('torch.', '')}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device} (like the other inputs), got {t.device}")
    return t


def check_shape(name: str, t: torch.Tensor, expected: Sequence[int], what: str = "") -> None:
    """Check ``t.shape == expected``; ``what`` explains where the expected sizes come from."""
    if tuple(t.shape) != tuple(expected):
        extra = f" ({what})" if what else ""
        raise ValueError(f"{name} must have shape {tuple(expected)}{extra}, got {tuple(t.shape)}")


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def check_int(
    name: str, value: object, *, min_value: int | None = None, max_value: int | None = None
) -> int:
    """Check that ``value`` is a Python int (not bool) in ``[min_value, max_value]``.

    Every int must also fit the schema's int64: a larger one would otherwise reach the
    dispatcher and fail there with a ``RuntimeError``.
    """
    if (
        type(value) is int
        and (min_value is None or value >= min_value)
        and (max_value is None or value <= max_value)
        and INT64_MIN <= value <= INT64_MAX
    ):
        return value  # the common case first (a call's fixed cost)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a Python int, got {type(value).__name__}")
    if min_value is not None and value < min_value:
        raise ValueError(f"{name} must be >= {min_value}, got {value}")
    if max_value is not None and value > max_value:
        raise ValueError(f"{name} must be <= {max_value}, got {value}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"{name} must fit in int64 (|{name}| < 2**63), got {value}")
    return value


def check_token_state(token_ids: object, num_tokens: object) -> tuple[torch.Tensor, torch.Tensor]:
    """The persistent state every op reads: int32 ``token_ids [R, L_max]`` and int32
    ``num_tokens [R]`` on the same device."""
    token_ids = check_tensor("token_ids", token_ids, dtype=torch.int32, ndim=2)
    num_tokens = check_tensor(
        "num_tokens", num_tokens, dtype=torch.int32, ndim=1, device=token_ids.device
    )
    check_shape("num_tokens", num_tokens, (token_ids.shape[0],), "one length per row of token_ids")
    return token_ids, num_tokens


def check_n_range(min_n: object, max_n: object) -> None:
    """The n-gram lengths ``1 <= min_n <= max_n``."""
    check_int("min_n", min_n, min_value=1)
    check_int("max_n", max_n, min_value=1)
    if min_n > max_n:
        raise ValueError(f"min_n must be <= max_n, got min_n={min_n}, max_n={max_n}")


def check_state_tensor(
    name: str, t: object, *, dtype: torch.dtype, ndim: int, device: torch.device
) -> torch.Tensor:
    """:func:`check_tensor` for a tensor of a state object, which must also be contiguous
    (keywords spelled out: a ``**kw`` pass-through costs a call's fixed cost ~0.4 us)."""
    t = check_tensor(name, t, dtype=dtype, ndim=ndim, device=device)
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (it is state updated in place)")
    return t


def check_optional_tensor(name: str, t: object, **kw) -> torch.Tensor | None:
    """:func:`check_tensor` for an optional argument: ``None`` passes."""
    return None if t is None else check_tensor(name, t, **kw)


def check_req_indices(
    req_indices: torch.Tensor | None, B_name: str, B: int | None, R: int | None, device
) -> int | None:
    """Shape check of ``req_indices`` against the batch size; returns the batch size B.

    Without ``req_indices`` batch row ``b`` uses state row ``b``, so ``B <= R`` (``R``
    None: the number of state rows is not known from the inputs).
    """
    if req_indices is None:
        if B is not None and R is not None and B > R:
            raise ValueError(
                f"without req_indices batch row b uses state row b, so {B_name} ({B}) must be "
                f"<= the number of state rows ({R})"
            )
        return B
    req_indices = check_tensor("req_indices", req_indices, dtype=torch.int32, ndim=1, device=device)
    if B is not None:
        check_shape("req_indices", req_indices, (B,), f"one state row per batch row, {B_name}")
    return req_indices.shape[0]


def batch_state_rows(req_indices: torch.Tensor | None, B: int) -> torch.Tensor | slice:
    """The state rows of the batch's real rows, for value checks: an index for ``x[rows]``
    (int64 rows, or the slice of the first ``B`` rows without ``req_indices``: a view)."""
    if req_indices is None:
        return slice(0, B)
    rows = req_indices.long()
    return rows[rows >= 0]


def check_batch_lengths(
    num_tokens: torch.Tensor,
    req_indices: torch.Tensor | None,
    B: int,
    L_max: int,
    *,
    other: torch.Tensor | None = None,
) -> tuple[int, int]:
    """Value check: the lengths of the batch's state rows lie in ``[0, L_max]`` (only the
    rows in the batch are read, so only they must be consistent). Returns the ``(min,
    max)`` of ``num_tokens - other`` over those rows (``(0, 0)`` without ``other``)."""
    return check_rows_range(
        "num_tokens", num_tokens, req_indices, B, 0, L_max,
        "token_ids.shape[1], for the rows in the batch", other=other,
    )  # fmt: skip


def check_rows_range(
    name: str,
    values: torch.Tensor,
    req_indices: torch.Tensor | None,
    B: int,
    lo: int,
    hi: int,
    what: str,
    *,
    other: torch.Tensor | None = None,
) -> tuple[int, int]:
    """Value check: the integer ``values`` of the batch's state rows (``req_indices``, -1
    skipped; the first ``B`` rows without) lie in ``[lo, hi]``. Returns the ``(min, max)``
    of ``values - other`` over those rows (``(0, 0)`` without ``other`` or rows)."""
    n, vmin, vmax, dlo, dhi = rows_stats(values, req_indices, B, other)
    if n and not (lo <= vmin and vmax <= hi):
        raise ValueError(
            f"{name} must lie in [{lo}, {hi}] ({what}), got values in [{vmin}, {vmax}]"
        )
    return dlo, dhi


def rows_stats(
    values: torch.Tensor,
    req_indices: torch.Tensor | None,
    B: int,
    other: torch.Tensor | None = None,
) -> tuple[int, int, int, int, int]:
    """``(n, min, max, min of the gap, max of the gap)`` of the integer ``values`` of the
    batch's ``n`` state rows, the gap being ``values - other`` (0 without ``other``). CPU
    tensors: one numba pass (``cpu/checks.py``), no index tensor built."""
    if (
        values.is_cpu
        and (req_indices is None or req_indices.is_cpu)
        and (other is None or other.is_cpu)
    ):
        return _cpu_checks.rows_range(
            np_(values), opt(req_indices, NONE_I32), req_indices is not None, B,
            opt(other, NONE_I32), other is not None,
        )  # fmt: skip
    rows = batch_state_rows(req_indices, B)
    picked = values[rows]
    if not picked.numel():
        return 0, 0, 0, 0, 0
    gap = picked - other[rows] if other is not None else None
    dlo, dhi = (int(gap.min()), int(gap.max())) if gap is not None else (0, 0)
    return picked.numel(), int(picked.min()), int(picked.max()), dlo, dhi


def should_check_values(tensors: Sequence[torch.Tensor | None], validate: bool | None) -> bool:
    """Whether the value checks run: CPU tensors or ``validate=True``; never when tracing/capturing.

    ``validate=False`` turns them off even on CPU.
    """
    if torch.compiler.is_compiling():
        return False
    all_cpu = True
    for t in tensors:
        if t is None or t.is_cpu:
            continue
        if t.is_cuda and torch.cuda.is_current_stream_capturing():
            return False
        all_cpu = False
    return all_cpu if validate is None else bool(validate)


def check_req_indices_values(
    req_indices: torch.Tensor | None,
    R: int | None,
    *,
    unique: bool = False,
    what: str = "state rows",
) -> None:
    """Value check of ``req_indices``: in ``[-1, R)`` (``R`` None: ``>= -1``) and
    (optionally) unique apart from -1."""
    if req_indices is None or req_indices.numel() == 0:
        return
    if req_indices.is_cpu:
        lo, hi = (int(v) for v in _cpu_checks.value_range(np_(req_indices))[:2])
    else:
        lo, hi = int(req_indices.min()), int(req_indices.max())
    if lo < -1 or (R is not None and hi >= R):
        want = f"[-1, {R})" if R is not None else ">= -1"
        raise ValueError(
            f"req_indices must lie in {want} ({what}; -1 = padding), got values in [{lo}, {hi}]"
        )
    if unique:
        live = req_indices[req_indices >= 0]
        if live.unique().numel() != live.numel():
            raise ValueError("req_indices must be unique (apart from -1 padding rows)")


def check_prefix_sum(name: str, cu: torch.Tensor, k: int, what: str, hint: str = "") -> int:
    """Value check of an exclusive prefix sum of counts (``cu_num_draft_tokens``): ``cu[0]
    == 0`` and every count ``cu[b+1] - cu[b]`` in ``[0, k]``. Returns ``cu[-1]``. CPU
    tensors: one numba pass (``cpu/checks.py``)."""
    if cu.device.type == "cpu":
        first, last, lo, hi = (int(v) for v in _cpu_checks.counts_range(np_(cu)))
    else:
        first, last = int(cu[0]), int(cu[-1])
        counts = cu[1:] - cu[:-1]
        lo, hi = (int(counts.min()), int(counts.max())) if counts.numel() else (0, 0)
    if first != 0:
        raise ValueError(f"{name}[0] must be 0, got {first}: {hint}")
    if lo < 0 or hi > k:
        raise ValueError(
            f"{name}[b+1] - {name}[b] must lie in [0, {k}] ({what}), got values in [{lo}, {hi}]"
        )
    return last


def check_value_range(
    name: str,
    values: torch.Tensor,
    lo: float,
    hi: float,
    what: str = "",
    *,
    lo_open: bool = False,
) -> None:
    """Value check: every entry of ``values`` in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``).

    Integer and floating tensors alike; NaN is never in range (pass ``hi=FLOAT32_MAX`` to
    require finite values).
    """
    if values.numel() == 0:
        return
    if values.device.type == "cpu" and values.dim() == 1 and values.dtype in _ONE_PASS_DTYPES:
        vmin, vmax, has_nan = _cpu_checks.value_range(np_(values))
        if not has_nan and (vmin > lo if lo_open else vmin >= lo) and vmax <= hi:
            return
        if has_nan:
            shown = "a NaN"
        elif values.is_floating_point():
            shown = f"values in [{float(vmin):.6g}, {float(vmax):.6g}]"
        else:
            shown = f"values in [{int(vmin)}, {int(vmax)}]"
    elif values.is_floating_point():
        too_low = values <= lo if lo_open else values < lo
        if not bool((too_low | (values > hi) | torch.isnan(values)).any()):
            return
        if bool(torch.isnan(values).any()):
            shown = "a NaN"
        else:
            shown = f"values in [{float(values.min()):.6g}, {float(values.max()):.6g}]"
    else:
        vmin, vmax = int(values.min()), int(values.max())
        if (vmin > lo if lo_open else vmin >= lo) and vmax <= hi:
            return
        shown = f"values in [{vmin}, {vmax}]"
    lo_s, hi_s = (f"{lo:.6g}", f"{hi:.6g}") if values.is_floating_point() else (str(lo), str(hi))
    extra = f" ({what})" if what else ""
    raise ValueError(
        f"{name} must lie in {'(' if lo_open else '['}{lo_s}, {hi_s}]{extra}, got {shown}"
    )


def check_real_f32(name: str, v) -> float:
    """``v`` as the float32 a state keeps (a Python float): a real number (numpy's too, not
    bool), finite in float32 (a value that rounds to 0 is 0)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    with np.errstate(over="ignore"):
        x = np.float32(float(v)) if abs(v) <= FLOAT32_MAX else np.float32(np.inf)
    if not abs(x) <= FLOAT32_MAX:
        raise ValueError(f"{name} must be finite in float32, got {v!r}")
    return float(x)


def check_sequence(name: str, values) -> list:
    """``values`` (a sequence or numpy array, not a string) as a list."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise ValueError(f"{name} must be a sequence, got {type(values).__name__}")
    return list(values)


def check_token_list(name: str, ids, V: int) -> list[int]:
    """``ids`` (a sequence of ints, numpy's too) as a list of token ids in ``[0, V)``."""
    out = check_sequence(name, ids)
    for t in out:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < V:
            raise ValueError(f"{name} must hold token ids in [0, V = {V}), got {t!r}")
    return [int(t) for t in out]


def check_capacity(name: str, n: int, array, axis: int, option: str) -> None:
    """``n`` entries fit ``array.shape[axis]`` (``array`` None: a capacity of 0)."""
    cap = 0 if array is None else array.shape[axis]
    if n > cap:
        raise ValueError(f"{name} has {n} entries, more than the state's {option} = {cap}")
