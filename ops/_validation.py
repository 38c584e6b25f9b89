"""Input checks shared by the public op wrappers.

Policy (DESIGN.md): dtype, device, ndim and shape checks always run; checks that need
tensor *values* run only on CPU tensors or when the caller passes ``validate=True``, and
never while ``torch.compile`` traces or a CUDA graph captures (a GPU op must not
synchronise with the host). Every failure is a ``ValueError`` naming the argument.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def check_tensor(
    name: str,
    t: object,
    *,
    dtype: torch.dtype | Sequence[torch.dtype],
    ndim: int,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Check that ``t`` is a tensor with the given dtype(s), ndim and (optionally) device."""
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


def check_int(name: str, value: object, *, min_value: int | None = None) -> int:
    """Check that ``value`` is a Python int (not bool) and at least ``min_value``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a Python int, got {type(value).__name__}")
    if min_value is not None and value < min_value:
        raise ValueError(f"{name} must be >= {min_value}, got {value}")
    return value


def _is_capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def should_check_values(tensors: Sequence[torch.Tensor | None], validate: bool | None) -> bool:
    """Whether the value checks run: CPU tensors or ``validate=True``; never when tracing/capturing.

    ``validate=False`` turns them off even on CPU.
    """
    if torch.compiler.is_compiling():
        return False
    present = [t for t in tensors if t is not None]
    if any(_is_capturing(t) for t in present):
        return False
    if validate is not None:
        return bool(validate)
    return all(t.device.type == "cpu" for t in present)


def check_req_indices_values(
    req_indices: torch.Tensor | None, R: int, *, unique: bool = False, what: str = "state rows"
) -> None:
    """Value check of ``req_indices``: in ``[-1, R)`` and (optionally) unique apart from -1."""
    if req_indices is None or req_indices.numel() == 0:
        return
    lo, hi = int(req_indices.min()), int(req_indices.max())
    if lo < -1 or hi >= R:
        raise ValueError(
            f"req_indices must lie in [-1, {R}) ({what}; -1 = padding), got values in [{lo}, {hi}]"
        )
    if unique:
        live = req_indices[req_indices >= 0]
        if live.unique().numel() != live.numel():
            raise ValueError("req_indices must be unique (apart from -1 padding rows)")


def check_value_range(name: str, values: torch.Tensor, lo: int, hi: int, what: str = "") -> None:
    """Value check: every entry of ``values`` in ``[lo, hi]``."""
    if values.numel() == 0:
        return
    vmin, vmax = int(values.min()), int(values.max())
    if vmin < lo or vmax > hi:
        extra = f" ({what})" if what else ""
        raise ValueError(f"{name} must lie in [{lo}, {hi}]{extra}, got values in [{vmin}, {vmax}]")
